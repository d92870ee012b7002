"""Caffe's solver step of one learnable param on the CPU, fused into one pass in Numba.

Per element, in float32 and in exactly the order of the reference step
(:func:`..reference.solver.step`, Caffe's): normalise by ``iter_size``, add the weight decay
(L2: ``decay * data``; L1: ``decay * sign(data)``), apply the update rule to the gradient and
its history, and ``data -= update``; ``diff`` keeps the update value. Results equal the
reference kernels' bit for bit (no operation is fused into a multiply-add). Large params are
split between threads. The kernel switches on the rules' codes declared in
:mod:`..update_rules` (compiled in as constants: the Numba cache keeps them); :data:`IMPLEMENTED`
names the rules it has a branch for.
"""
import math

import numba
import numpy
from numba import njit

from ..reference.solver import adam_correction
from ..update_rules import RULES, require

f32 = numpy.float32
#: The rules :func:`_element` has a branch for.
IMPLEMENTED = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
_SGD = RULES["SGD"].code
_NESTEROV = RULES["Nesterov"].code
_ADAGRAD = RULES["AdaGrad"].code
_RMSPROP = RULES["RMSProp"].code
_ADADELTA = RULES["AdaDelta"].code
_ADAM = RULES["Adam"].code
#: Params of at least this many floats are split between threads.
PARALLEL_MIN = 1 << 16


@njit(cache=True, inline="always", error_model="numpy")
def _element(rule, g, w, v0, v1, rate, m, m2, delta, rms, correction, decay, l1, scale):
    """One element's step on scalars (no arrays here: an inlined function taking arrays would
    count references on every call): returns (update, new history 0, new history 1). ``rule``
    is a declared code of :data:`IMPLEMENTED` (:func:`make_step` checks it)."""
    if scale != f32(1):
        g = g * scale
    if decay != f32(0):
        g = g + (decay * numpy.sign(w) if l1 else w * decay)
    if rule == _SGD:            # SGD: h = m h + rate g; g = h
        v0 = v0 * m + g * rate
        g = v0
    elif rule == _NESTEROV:     # Nesterov: h' = m h + rate g; g = (1 + m) h' - m h
        old = v0
        v0 = old * m + g * rate
        g = old * -m + v0 * (f32(1) + m)
    elif rule == _ADAGRAD:      # AdaGrad: h += g g; g = rate g / (sqrt(h) + delta)
        v0 = v0 + g * g
        g = (g / (numpy.sqrt(v0) + delta)) * rate
    elif rule == _RMSPROP:      # RMSProp: h = d h + (1 - d) g g; g = rate g / (sqrt(h) + delta)
        v0 = v0 * rms + (g * g) * (f32(1) - rms)
        g = (g / (numpy.sqrt(v0) + delta)) * rate
    elif rule == _ADADELTA:     # AdaDelta
        v0 = v0 * m + (g * g) * (f32(1) - m)
        g = g * numpy.sqrt((v1 + delta) / (v0 + delta))
        v1 = v1 * m + (g * g) * (f32(1) - m)
        g = g * rate
    elif rule == _ADAM:         # Adam
        v0 = v0 * m + g * (f32(1) - m)
        v1 = v1 * m2 + (g * g) * (f32(1) - m2)
        g = (v0 / (numpy.sqrt(v1) + delta)) * correction
    return g, v0, v1


@njit(cache=True, nogil=True, error_model="numpy")
def step_part(rule, two, data, diff, h0, h1, rate, m, m2, delta, rms, correction, decay, l1,
              scale, t, parts):
    """The fused step over part ``t`` of ``parts`` of one param's elements (flat float32);
    ``two``: the rule keeps two history sets (``h1`` is read and written)."""
    n = data.shape[0]
    for i in range(numba.uint64(n * t // parts), numba.uint64(n * (t + 1) // parts)):
        w = data[i]
        g, v0, v1 = _element(rule, diff[i], w, h0[i], h1[i] if two else f32(0), rate, m, m2,
                             delta, rms, correction, decay, l1, scale)
        h0[i] = v0
        if two:
            h1[i] = v1
        diff[i] = g
        data[i] = w - g


def make_step(rule, team):
    """The cpu set's ``update(rule)``: same signature and results as the reference step.

    Raises:
        ValueError: ``rule`` is not declared in :mod:`..update_rules`, or not
            :data:`IMPLEMENTED` here.
    """
    declared = require(rule, "cpu", IMPLEMENTED)
    code, two = declared.code, declared.history_sets > 1

    def step(data, diff, history, local_rate, hyper, decay, l1, iter_scale):
        d, g = data.reshape(-1), diff.reshape(-1)
        h0 = history[0].reshape(-1)
        h1 = history[1].reshape(-1) if len(history) > 1 else h0
        correction = f32(0)
        if rule == "Adam":
            correction = f32(f32(local_rate) * adam_correction(hyper))
        args = (code, two, d, g, h0, h1, f32(local_rate), f32(hyper.momentum),
                f32(hyper.momentum2), f32(hyper.delta), f32(hyper.rms_decay), correction,
                f32(decay), bool(l1), f32(iter_scale))
        team.run(step_part, *args, parts=None if d.shape[0] >= PARALLEL_MIN else 1)
    return step


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _sumsq_pair(data, diff):
    """Sums of squares of two flat float32 arrays of one length, in one pass, in float64
    (reassociation lets the compiler vectorise the two sums)."""
    sw = 0.0
    sg = 0.0
    for i in range(data.shape[0]):
        w = numpy.float64(data[i])
        gr = numpy.float64(diff[i])
        sw += w * w
        sg += gr * gr
    return sw, sg


def param_norms(data, diff):
    """The cpu set's ``param_norms``: as :func:`..reference.solver.param_norms` (float64 sums,
    one float32 rounding), one pass over both arrays, serial (LARC reads each param once per
    iteration, far less than the step itself)."""
    sw, sg = _sumsq_pair(data.reshape(-1), diff.reshape(-1))
    return f32(math.sqrt(sw)), f32(math.sqrt(sg))
