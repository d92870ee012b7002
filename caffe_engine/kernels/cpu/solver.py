"""Caffe's solver step of one learnable param on the CPU, fused into one pass in Numba.

Per element, in float32 and in exactly the order of the reference step
(:func:`..reference.solver.step`, Caffe's): normalise by ``iter_size``, add the weight decay
(L2: ``decay * data``; L1: ``decay * sign(data)``), apply the update rule to the gradient and
its history, and ``data -= update``; ``diff`` keeps the update value. Results equal the
reference kernels' bit for bit (no operation is fused into a multiply-add). Large params are
split between threads.
"""
import math

import numba
import numpy
from numba import njit

from ..reference.solver import RULES, adam_correction

f32 = numpy.float32
#: Update rule -> the code the kernel switches on.
CODES = {name: code for code, name in enumerate(RULES)}
#: Params of at least this many floats are split between threads.
PARALLEL_MIN = 1 << 16


@njit(cache=True, inline="always", error_model="numpy")
def _element(rule, g, w, v0, v1, rate, m, m2, delta, rms, correction, decay, l1, scale):
    """One element's step on scalars (no arrays here: an inlined function taking arrays would
    count references on every call): returns (update, new history 0, new history 1)."""
    if scale != f32(1):
        g = g * scale
    if decay != f32(0):
        g = g + (decay * numpy.sign(w) if l1 else w * decay)
    if rule == 0:        # SGD: h = m h + rate g; g = h
        v0 = v0 * m + g * rate
        g = v0
    elif rule == 1:      # Nesterov: h' = m h + rate g; g = (1 + m) h' - m h
        old = v0
        v0 = old * m + g * rate
        g = old * -m + v0 * (f32(1) + m)
    elif rule == 2:      # AdaGrad: h += g g; g = rate g / (sqrt(h) + delta)
        v0 = v0 + g * g
        g = (g / (numpy.sqrt(v0) + delta)) * rate
    elif rule == 3:      # RMSProp: h = d h + (1 - d) g g; g = rate g / (sqrt(h) + delta)
        v0 = v0 * rms + (g * g) * (f32(1) - rms)
        g = (g / (numpy.sqrt(v0) + delta)) * rate
    elif rule == 4:      # AdaDelta
        v0 = v0 * m + (g * g) * (f32(1) - m)
        g = g * numpy.sqrt((v1 + delta) / (v0 + delta))
        v1 = v1 * m + (g * g) * (f32(1) - m)
        g = g * rate
    else:                # Adam
        v0 = v0 * m + g * (f32(1) - m)
        v1 = v1 * m2 + (g * g) * (f32(1) - m2)
        g = (v0 / (numpy.sqrt(v1) + delta)) * correction
    return g, v0, v1


@njit(cache=True, nogil=True, error_model="numpy")
def step_part(rule, data, diff, h0, h1, rate, m, m2, delta, rms, correction, decay, l1, scale,
              t, parts):
    """The fused step over part ``t`` of ``parts`` of one param's elements (flat float32)."""
    n = data.shape[0]
    two = rule >= 4
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
    """The cpu set's ``update(rule)``: same signature and results as the reference step."""
    code = CODES[rule]

    def step(data, diff, history, local_rate, hyper, decay, l1, iter_scale):
        d, g = data.reshape(-1), diff.reshape(-1)
        h0 = history[0].reshape(-1)
        h1 = history[1].reshape(-1) if len(history) > 1 else h0
        correction = f32(0)
        if rule == "Adam":
            correction = f32(f32(local_rate) * adam_correction(hyper))
        args = (code, d, g, h0, h1, f32(local_rate), f32(hyper.momentum), f32(hyper.momentum2),
                f32(hyper.delta), f32(hyper.rms_decay), correction, f32(decay), bool(l1),
                f32(iter_scale))
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
