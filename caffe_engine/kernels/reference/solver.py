"""The solver step of one learnable param, in Caffe's arithmetic order (the reference kernels).

Caffe: src/caffe/solvers/sgd_solver.cpp (``Normalize``, ``Regularize``) and
src/caffe/solvers/{sgd,nesterov,adagrad,rmsprop,adadelta,adam}_solver.cpp, the CPU branch of
each ``ComputeUpdateValue``, then ``Blob::Update`` (``data -= diff``). :func:`step` runs them
for one param; each rule receives the gradient (``diff``, already clipped, normalised by
``iter_size`` and regularised), rewrites it in place into the step subtracted from the weights,
and updates its history arrays.

All arithmetic is float32, one operation after the other in Caffe's order, because each
BLAS/``caffe_*`` call rounds its result to float32:

* ``caffe_cpu_axpby(n, a, x, b, y)`` is ``y *= b`` then ``y += a * x`` (BLAS ``sscal`` then
  ``saxpy``, as Caffe's ``cblas_saxpby`` fallback does);
* ``caffe_powx(x, 2)`` is ``x * x`` and ``caffe_powx(x, 0.5)`` is ``sqrt(x)``;
* ``caffe_cpu_scale(n, a, x, y)`` and ``caffe_cpu_axpby(n, a, x, 0, y)`` are ``y = a * x``;
* the scalar hyper-parameters are float32 (``Dtype``), ``1 - momentum`` is computed in float32.

Arguments common to every rule:
    diff: float32 array, the param's gradient; overwritten with the update value.
    history: list of float32 arrays of ``diff``'s shape (one or two, see each rule).
    local_rate: float32, ``rate * lr_mult``.
    hyper: :class:`..update_rules.Hyper` (float32 scalars read from the SolverParameter).
    work: list of two float32 scratch arrays of ``diff``'s shape (Caffe's ``update_`` and
        ``temp_``), contents undefined on entry and exit.

The functions run on NumPy or CuPy arrays alike (``xp`` from the arrays). Each rule's codes,
history sets and hyper-parameters are declared in :mod:`..update_rules`; :data:`KERNELS` maps
the declared names to the functions here.
"""
import math

import numpy

from ...backend import get_array_module
from ..update_rules import require

f32 = numpy.float32


def _axpby(a, x, b, y, scratch):
    """``y = a * x + b * y`` as Caffe's CPU axpby: ``y *= b``, then ``y += a * x`` (float32)."""
    xp = get_array_module(y)
    y *= b
    xp.multiply(x, a, out=scratch)
    y += scratch


def sgd(diff, history, local_rate, hyper, work):
    """Momentum SGD: ``h = momentum * h + local_rate * g``; ``g = h``. One history set."""
    h = history[0]
    _axpby(local_rate, diff, hyper.momentum, h, work[0])
    diff[...] = h


def nesterov(diff, history, local_rate, hyper, work):
    """Nesterov momentum: ``h' = momentum * h + local_rate * g``;
    ``g = (1 + momentum) * h' - momentum * h``. One history set."""
    h, update = history[0], work[0]
    momentum = hyper.momentum
    update[...] = h
    _axpby(local_rate, diff, momentum, h, work[1])
    _axpby(f32(1) + momentum, h, -momentum, update, work[1])
    diff[...] = update


def adagrad(diff, history, local_rate, hyper, work):
    """AdaGrad: ``h += g * g``; ``g = local_rate * g / (sqrt(h) + delta)``. One history set."""
    xp = get_array_module(diff)
    h, update = history[0], work[0]
    xp.multiply(diff, diff, out=update)
    h += update
    xp.sqrt(h, out=update)
    update += hyper.delta
    xp.divide(diff, update, out=update)
    xp.multiply(update, local_rate, out=diff)


def rmsprop(diff, history, local_rate, hyper, work):
    """RMSProp: ``h = rms_decay * h + (1 - rms_decay) * g * g``;
    ``g = local_rate * g / (sqrt(h) + delta)``. One history set."""
    xp = get_array_module(diff)
    h, update = history[0], work[0]
    decay = hyper.rms_decay
    xp.multiply(diff, diff, out=update)
    _axpby(f32(1) - decay, update, decay, h, work[1])
    xp.sqrt(h, out=update)
    update += hyper.delta
    xp.divide(diff, update, out=update)
    xp.multiply(update, local_rate, out=diff)


def adadelta(diff, history, local_rate, hyper, work):
    """AdaDelta. Two history sets: ``history[0]`` the running mean of squared gradients,
    ``history[1]`` that of squared updates (Caffe keeps them at ``i`` and ``n + i``)::

        hg = momentum * hg + (1 - momentum) * g * g
        g  = g * sqrt((hu + delta) / (hg + delta))
        hu = momentum * hu + (1 - momentum) * g * g
        g  = local_rate * g
    """
    xp = get_array_module(diff)
    hg, hu = history
    update, temp = work
    momentum = hyper.momentum
    one_minus = f32(1) - momentum
    xp.multiply(diff, diff, out=update)
    _axpby(one_minus, update, momentum, hg, temp)
    xp.add(hu, hyper.delta, out=update)
    xp.add(hg, hyper.delta, out=temp)
    xp.divide(update, temp, out=update)
    xp.sqrt(update, out=update)
    diff *= update
    xp.multiply(diff, diff, out=update)
    _axpby(one_minus, update, momentum, hu, temp)
    diff *= local_rate


def adam_correction(hyper):
    """Adam's bias correction ``sqrt(1 - beta2^t) / (1 - beta1^t)`` with ``t = iter + 1``.

    Caffe evaluates ``pow(float, int)`` in double (C++ promotes it), so the whole expression is
    double and rounded to float32 once. Where Python's math raises (``momentum2`` > 1: the root
    of a negative number; ``momentum`` 1: a division by zero; a power past the largest double)
    the value is C's, NaN or an infinity, and Caffe trains on with it.
    """
    t = hyper.t
    b1, b2 = float(hyper.momentum), float(hyper.momentum2)
    with numpy.errstate(all="ignore"):
        try:
            value = math.sqrt(1.0 - math.pow(b2, t)) / (1.0 - math.pow(b1, t))
        except (ValueError, OverflowError, ZeroDivisionError):
            b1t, b2t = numpy.power(numpy.float64(b1), t), numpy.power(numpy.float64(b2), t)
            value = numpy.sqrt(numpy.float64(1.0) - b2t) / (numpy.float64(1.0) - b1t)
        return f32(value)


def adam(diff, history, local_rate, hyper, work):
    """Adam. Two history sets: ``history[0]`` = m (first moment), ``history[1]`` = v (second)::

        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        g = (local_rate * correction) * m / (sqrt(v) + delta)

    with ``beta1 = momentum``, ``beta2 = momentum2`` and :func:`adam_correction`.
    """
    xp = get_array_module(diff)
    m, v = history
    temp, scratch = work
    beta1, beta2 = hyper.momentum, hyper.momentum2
    _axpby(f32(1) - beta1, diff, beta1, m, scratch)
    xp.multiply(diff, diff, out=temp)
    _axpby(f32(1) - beta2, temp, beta2, v, scratch)
    xp.sqrt(v, out=temp)
    temp += hyper.delta
    xp.divide(m, temp, out=temp)
    xp.multiply(temp, f32(local_rate * adam_correction(hyper)), out=diff)


def kernel(rule):
    """The function of update rule ``rule`` (a name declared in :mod:`..update_rules`).

    Raises:
        ValueError: ``rule`` is not declared, or has no function in :data:`KERNELS`.
    """
    require(rule, "reference", KERNELS)
    return KERNELS[rule]


def step(rule, data, diff, history, local_rate, hyper, decay, l1, iter_scale):
    """One param's whole solver step, as Caffe's ApplyUpdate does it for one param:

    ``diff *= iter_scale`` (Normalize, when ``iter_scale != 1``); ``diff += decay * data`` or,
    with ``l1``, ``decay * sign(data)`` (Regularize, when ``decay != 0``); the update ``rule``
    (a name of :data:`KERNELS`); then ``data -= diff`` (``Blob::Update``). ``diff`` keeps the
    update value, as in Caffe. Two scratch arrays shaped like ``diff`` are made per call.

    Raises:
        ValueError: as :func:`kernel`.
    """
    update = kernel(rule)
    xp = get_array_module(diff)
    work = [xp.empty_like(diff), xp.empty_like(diff)]
    if iter_scale != 1:
        diff *= iter_scale
    if decay:
        scratch = work[0]
        if l1:
            xp.sign(data, out=scratch)
            scratch *= decay
        else:
            xp.multiply(data, decay, out=scratch)
        diff += scratch
    update(diff, history, local_rate, hyper, work)
    data -= diff


def param_norms(data, diff):
    """The L2 norms ``(||data||, ||diff||)`` of one param, as float32 scalars (LARC's, see
    :mod:`caffe_engine.solvers.larc`).

    The sums of squares are accumulated in float64 (a float32 running sum over the 400,000
    weights of LeNet's ip1 would lose digits), then rooted and rounded to float32 once.
    """
    xp = get_array_module(data)
    w = data.ravel().astype(xp.float64)
    gr = diff.ravel().astype(xp.float64)
    return f32(math.sqrt(float(xp.dot(w, w)))), f32(math.sqrt(float(xp.dot(gr, gr))))


#: update rule name (:data:`..update_rules.RULES`) -> its function here
KERNELS = {
    "SGD": sgd,
    "Nesterov": nesterov,
    "AdaGrad": adagrad,
    "RMSProp": rmsprop,
    "AdaDelta": adadelta,
    "Adam": adam,
}
