"""Learning-rate policies: a dict of small functions of (solver param, iteration, step state).

Caffe: src/caffe/solvers/sgd_solver.cpp (SGDSolver::GetLearningRate). Rates are computed as
Caffe computes them: in float32 where Caffe's expression is float, so printed rates match.
C++'s overloads decide the precision: ``pow(float, int)`` promotes to double (step, exp,
multistep: the product with ``base_lr`` is then taken in double and rounded once), while
``pow(float, float)`` and ``exp(float)`` stay in float (inv, poly, sigmoid). Checked against
every ``lr`` Caffe printed in the training fixtures. ``multistep`` is the only stateful policy: it advances ``current_step`` (saved in the
``.solverstate``) and logs each advance.

NVIDIA Caffe's (NVCaffe's) additions, read when set (their defaults leave every rate as BVLC's):

* warm-up: for ``iter < rampup_interval`` the policy is set aside and the rate ramps from
  ``rampup_lr`` to ``base_lr``: ``rampup_lr + (base_lr - rampup_lr) * alpha^rampup_power`` with
  ``alpha = iter / rampup_interval``. NVCaffe's ramp is quadratic (its ``alpha * alpha``;
  ``rampup_power`` 2, the default, which is not an NVCaffe field); ``rampup_power: 1`` is the
  linear warm-up of Goyal et al. 2017 ("Accurate, Large Minibatch SGD", section 2.2). From
  ``rampup_interval`` on, the policy runs at the true ``iter`` (not shifted by the ramp), so a
  ``poly`` or ``step`` schedule continues where it would have been. ``step``/``multistep``
  advance ``current_step`` only after the ramp, as NVCaffe.
* ``min_lr``: rates below it are raised to it (ramp included); with ``lr_policy: "poly"`` and
  ``min_lr`` > 0 the rate is NVCaffe's ``(base_lr - min_lr) * (1 - iter/max_iter)^power + min_lr``.

NVCaffe: src/caffe/solvers/sgd_solver.cpp (its SGDSolver::GetLearningRate), float arithmetic.
"""
import math

import numpy

from ..errors import CaffeError
from ..log import logger

f32 = numpy.float32


def _fixed(p, it, state):
    return f32(p.base_lr)


def _step(p, it, state):
    if p.stepsize <= 0:
        raise CaffeError("solver: lr_policy 'step' needs stepsize > 0")
    state["current_step"] = it // p.stepsize
    return _times_pow_double(p, state["current_step"])


def _pow(base, exponent):
    """C's ``pow`` in double: ``math.pow``'s value, and where ``math.pow`` raises, C's result
    (NaN for a negative base to a fractional power, an infinity for an overflow or for zero to
    a negative power): Caffe trains on with such a rate, it does not stop."""
    try:
        return math.pow(base, exponent)
    except (ValueError, OverflowError):
        with numpy.errstate(all="ignore"):
            return float(numpy.power(numpy.float64(base), numpy.float64(exponent)))


def _times_pow_double(p, exponent):
    """``base_lr * pow(gamma, n)`` with an int ``n``: evaluated in double, rounded to float."""
    return f32(float(f32(p.base_lr)) * _pow(float(f32(p.gamma)), exponent))


def _exp(p, it, state):
    return _times_pow_double(p, it)


def _inv(p, it, state):
    base = f32(1) + f32(p.gamma) * f32(it)
    return f32(f32(p.base_lr) * f32(_pow(float(base), -float(f32(p.power)))))


def _multistep(p, it, state):
    step = state.get("current_step", 0)
    if step < len(p.stepvalue) and it >= p.stepvalue[step]:
        step += 1
        logger.info("MultiStep Status: Iteration %d, step = %d", it, step)
    state["current_step"] = step
    return _times_pow_double(p, step)


def _poly(p, it, state):
    if p.min_lr:     # NVCaffe's: from base_lr down to min_lr
        if f32(p.base_lr) < f32(p.min_lr):
            raise CaffeError(f"solver: lr_policy 'poly' needs base_lr >= min_lr "
                             f"(got {p.base_lr:g} < {p.min_lr:g})")
        max_iter = f32(p.max_iter) if p.max_iter > 0 else f32(1)
        frac = f32(1) - f32(it) / max_iter
        span = f32(p.base_lr) - f32(p.min_lr)
        return f32(span * f32(_pow(float(frac), float(f32(p.power))))) + f32(p.min_lr)
    frac = f32(1) - f32(it) / f32(p.max_iter)
    return f32(f32(p.base_lr) * f32(_pow(float(frac), float(f32(p.power)))))


def _sigmoid(p, it, state):
    z = -f32(p.gamma) * (f32(it) - f32(p.stepsize))
    return f32(f32(p.base_lr) * (f32(1) / (f32(1) + numpy.exp(z, dtype=f32))))


POLICIES = {
    "fixed": _fixed,
    "step": _step,
    "exp": _exp,
    "inv": _inv,
    "multistep": _multistep,
    "poly": _poly,
    "sigmoid": _sigmoid,
}


def learning_rate(param, iteration, state):
    """The rate for ``iteration`` under ``param.lr_policy`` (float32).

    Args:
        param: caffe_pb2.SolverParameter.
        iteration: int, the solver's ``iter``.
        state: dict holding ``current_step`` (read and updated by step/multistep).

    Raises:
        CaffeError: unknown or missing lr_policy; a bad warm-up or ``min_lr``
            (:func:`check_warmup`); poly with ``base_lr`` < ``min_lr``.
    """
    fn = POLICIES.get(param.lr_policy)
    if fn is None:
        raise CaffeError(f"solver: unknown lr_policy '{param.lr_policy}' "
                         f"(known: {', '.join(sorted(POLICIES))})")
    check_warmup(param)
    with numpy.errstate(all="ignore"):     # an infinite or NaN rate, as Caffe's float math
        if iteration < param.rampup_interval:
            rate = warmup_rate(param, iteration)
        else:
            rate = fn(param, iteration, state)
        if param.min_lr and rate < f32(param.min_lr):
            rate = f32(param.min_lr)
        return rate


def check_warmup(param):
    """Refuse warm-up and ``min_lr`` values NVCaffe's schedule cannot use.

    Raises:
        CaffeError: ``min_lr`` < 0 (NVCaffe's CHECK), ``rampup_interval`` < 0, or
            ``rampup_power`` <= 0 (not a ramp), each naming its field.
    """
    if not param.min_lr >= 0:
        raise CaffeError(f"solver: min_lr must be >= 0 (got {param.min_lr:g})")
    if param.rampup_interval < 0:
        raise CaffeError(f"solver: rampup_interval must be >= 0 (got {param.rampup_interval})")
    if param.rampup_interval and not param.rampup_power > 0:
        raise CaffeError(f"solver: rampup_power must be > 0 (got {param.rampup_power:g})")


def warmup_rate(param, iteration):
    """The warm-up rate at ``iteration`` (< ``rampup_interval``), float32:
    ``rampup_lr + (base_lr - rampup_lr) * alpha^rampup_power``, ``alpha = iter / interval``.

    Power 2 is NVCaffe's ramp, evaluated in its order (``((base_lr - rampup_lr) * alpha) *
    alpha``, then ``+ rampup_lr``); power 1 is linear.
    """
    alpha = f32(iteration) / f32(param.rampup_interval)
    start = f32(param.rampup_lr)
    span = f32(param.base_lr) - start
    power = f32(param.rampup_power)
    if power == f32(2):
        return start + f32(span * alpha) * alpha
    if power == f32(1):
        return start + span * alpha
    return start + span * numpy.power(alpha, power, dtype=f32)
