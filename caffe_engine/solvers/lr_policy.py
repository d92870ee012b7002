"""Learning-rate policies: a dict of small functions of (solver param, iteration, step state).

Caffe: src/caffe/solvers/sgd_solver.cpp (SGDSolver::GetLearningRate). Rates are computed as
Caffe computes them: in float32 where Caffe's expression is float, so printed rates match.
C++'s overloads decide the precision: ``pow(float, int)`` promotes to double (step, exp,
multistep: the product with ``base_lr`` is then taken in double and rounded once), while
``pow(float, float)`` and ``exp(float)`` stay in float (inv, poly, sigmoid). Checked against
every ``lr`` Caffe printed in the training fixtures. ``multistep`` is the only stateful policy: it advances ``current_step`` (saved in the
``.solverstate``) and logs each advance.
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
        CaffeError: unknown or missing lr_policy.
    """
    fn = POLICIES.get(param.lr_policy)
    if fn is None:
        raise CaffeError(f"solver: unknown lr_policy '{param.lr_policy}' "
                         f"(known: {', '.join(sorted(POLICIES))})")
    with numpy.errstate(all="ignore"):     # an infinite or NaN rate, as Caffe's float math
        return fn(param, iteration, state)
