"""Per-channel elementwise passes of BatchNorm and Scale, in array code: the reference.

Every array is an (outer, C, inner) float32 view (C-contiguous; ``y`` may be ``x`` itself, in
place), every per-channel operand a (C,) vector broadcast over outer and inner. Each function is
the NumPy/CuPy sequence the layers ran before these became kernels, one rounding per operation
in the order written (Caffe: src/caffe/layers/batch_norm_layer.cpp, scale_layer.cpp,
bias_layer.cpp); the cpu set's fused passes (:mod:`..cpu.channelwise`) do the same operations in
the same order element by element, so both give the same bits.
"""
import numpy

from ...backend import get_array_module
from . import neuron

f32 = numpy.float32


def _c(v):
    return v.reshape(1, -1, 1)


def center(x, mean, y, square=None):
    """``y = x - mean``; and ``square = y * y`` when given (BatchNorm's variance pass)."""
    xp = get_array_module(x)
    xp.subtract(x, _c(mean), out=y)
    if square is not None:
        xp.multiply(y, y, out=square)


def normalize(y, std, copy=None):
    """``y /= std``; and ``copy[...] = y`` when given (BatchNorm's ``x_norm``)."""
    y /= _c(std)
    if copy is not None:
        copy[...] = y


def batch_norm_grad(y, dy, dot, total, factor, std, dx):
    """``dx = ((y * dot + total) * factor + dy) / std`` (BatchNorm's gradient with batch
    statistics; ``dx`` may be ``dy``)."""
    xp = get_array_module(y)
    if xp.may_share_memory(dx, dy):       # in place: dy is read after dx is first written
        dy = dy.copy()
    xp.multiply(y, _c(dot), out=dx)
    xp.add(_c(total), dx, out=dx)
    dx *= factor
    dx += dy
    dx /= _c(std)


def scale_shift(x, scale, bias, y):
    """``y = x * scale``, then ``y += bias`` when ``bias`` is given (Scale's forward)."""
    xp = get_array_module(x)
    xp.multiply(x, _c(scale), out=y)
    if bias is not None:
        xp.add(y, _c(bias), out=y)


def scale_grad(dy, x, scale, product=None, dx=None):
    """``product = dy * x`` (for the scale's gradient), then ``dx = dy * scale``, each when given
    (``dx`` may be ``dy``; ``product`` may be ``x``)."""
    xp = get_array_module(dy)
    if product is not None:
        xp.multiply(dy, x, out=product)
    if dx is not None:
        xp.multiply(dy, _c(scale), out=dx)


def channel_sum(a, alpha=None):
    """Per-channel sums (C,) float32 of ``a`` over positions, then items: each (item, channel)
    plane summed (NumPy's pairwise order), times ``alpha`` when given, then added over items in
    order -- Caffe's two gemv calls (src/caffe/layers/batch_norm_layer.cpp)."""
    per_item = a.sum(axis=2, dtype=f32)
    if alpha is not None:
        per_item *= alpha
    return per_item.sum(axis=0, dtype=f32)


def batch_norm_stats(x, inv):
    """BatchNorm's batch ``(mean, var)``, (C,) each: ``channel_sum(x, inv)`` and
    ``channel_sum((x - mean) ** 2, inv)`` (the biased variance; ``inv`` = 1 / (outer * inner))."""
    xp = get_array_module(x)
    mean = channel_sum(x, inv)
    work = xp.empty_like(x)
    center(x, mean, work, work)
    return mean, channel_sum(work, inv)


def batch_norm_forward(x, mean, std, x_norm, y, scale=None, bias=None, slope=None):
    """``x_norm = (x - mean) / std`` and ``y`` = the same, then (when given) times ``scale``,
    plus ``bias`` (an in-place Scale after the BatchNorm), then ReLU with ``slope`` (an
    in-place ReLU after those): the BatchNorm, Scale and ReLU layers' forward passes in turn.
    ``y`` may be ``x``."""
    center(x, mean, y)
    normalize(y, std, x_norm)
    if scale is not None:
        scale_shift(y, scale, bias, y)
    if slope is not None:
        neuron.relu_forward(y, y, slope)


def batch_norm_stats_forward(x, inv, eps, x_norm, y, std, scale=None, bias=None, slope=None):
    """BatchNorm's forward with batch statistics: ``(mean, var) = batch_norm_stats(x, inv)``,
    ``std = sqrt(var + eps)`` (float32, written into the (C,) vector ``std``), then
    ``batch_norm_forward`` (with the Scale's and ReLU's operands when given; ``y`` may be
    ``x``). Returns ``(mean, var)``, (C,) float32 each (the layer updates its running
    statistics from them)."""
    xp = get_array_module(x)
    mean, var = batch_norm_stats(x, inv)
    std[...] = var + eps
    xp.sqrt(std, out=std)
    batch_norm_forward(x, mean, std, x_norm, y, scale, bias, slope)
    return mean, var


def batch_norm_backward(dy, x_norm, std, dx, factor=None, scale=None, y=None, slope=None):
    """The gradient through (ReLU at ``y`` with ``slope``, then a Scale by ``scale``, when
    given, then) BatchNorm: the layers' backward passes in turn, all in place on one blob's
    diff (``dx`` may be ``dy``; ``dy`` is then overwritten on the way, as those layers do).

    ``factor`` = -1 / (outer * inner) with batch statistics; None with global statistics
    (``dx = dxn / std``). Returns ``(bias_sum, scale_sum)``: the per-channel sums of the Scale's
    bias and scale gradients (``channel_sum`` of ``g`` and of ``g * x_norm``, ``g`` the ReLU's
    gradient; ``scale_sum`` None without ``scale``)."""
    xp = get_array_module(dy)
    g = dx if dx is dy else xp.array(dy)
    if slope is not None:
        neuron.relu_backward(y, g, g, slope)
    bias_sum = channel_sum(g)
    scale_sum = None
    if scale is not None:
        product = xp.empty_like(g)
        scale_grad(g, x_norm, scale, product, g)
        scale_sum = channel_sum(product)
    if factor is None:
        xp.divide(g, _c(std), out=dx)
        return bias_sum, scale_sum
    work = xp.multiply(x_norm, g)
    dot = channel_sum(work)
    total = channel_sum(g)
    batch_norm_grad(x_norm, g, dot, total, factor, std, dx)
    return bias_sum, scale_sum
