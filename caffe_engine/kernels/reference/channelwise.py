"""Per-channel elementwise passes of BatchNorm and Scale, in array code: the reference.

Every array is an (outer, C, inner) float32 view (C-contiguous; ``y`` may be ``x`` itself, in
place), every per-channel operand a (C,) vector broadcast over outer and inner. Each function is
the NumPy/CuPy sequence the layers ran before these became kernels, one rounding per operation
in the order written (Caffe: src/caffe/layers/batch_norm_layer.cpp, scale_layer.cpp,
bias_layer.cpp); the cpu set's fused passes (:mod:`..cpu.channelwise`) do the same operations in
the same order element by element, so both give the same bits.
"""
from ...backend import get_array_module


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
