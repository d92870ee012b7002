"""Per-channel elementwise passes of BatchNorm and Scale on the CPU, in Numba, fused and split
between threads: the operations of :mod:`..reference.channelwise` in the same order element by
element (one rounding each, no fused multiply-add), so the results equal the reference's bit for
bit; what changes is that each function reads and writes every array once (the reference makes
a pass per operation: BatchNorm's gradient five, and a copy of ``dy`` when in place).

Arrays are (outer, C, inner) float32 views, C-contiguous, passed flat with ``C`` and ``inner``;
``y`` may be ``x`` (in place), as each element is read before it is written. Planes (outer, C)
are split between the team's threads when the arrays hold at least :data:`PARALLEL_MIN` floats.
"""
import numba
import numpy
from numba import njit

f32 = numpy.float32
#: Arrays of at least this many floats are split between threads.
PARALLEL_MIN = 1 << 15


@njit(cache=True, nogil=True, error_model="numpy")
def _center(x, mean, y, square, has_square, C, inner, t, parts):
    planes = x.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        m = mean[p % C]
        base = numba.uint64(p * inner)
        for i in range(base, base + numba.uint64(inner)):
            v = x[i] - m
            y[i] = v
            if has_square:
                square[i] = v * v


@njit(cache=True, nogil=True, error_model="numpy")
def _normalize(y, std, copy, has_copy, C, inner, t, parts):
    planes = y.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        s = std[p % C]
        base = numba.uint64(p * inner)
        for i in range(base, base + numba.uint64(inner)):
            v = y[i] / s
            y[i] = v
            if has_copy:
                copy[i] = v


@njit(cache=True, nogil=True, error_model="numpy")
def _batch_norm_grad(y, dy, dot, total, factor, std, dx, C, inner, t, parts):
    planes = y.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        d, tot, s = dot[c], total[c], std[c]
        base = numba.uint64(p * inner)
        for i in range(base, base + numba.uint64(inner)):
            v = y[i] * d
            v = tot + v
            v = v * factor
            v = v + dy[i]
            dx[i] = v / s


@njit(cache=True, nogil=True, error_model="numpy")
def _scale_shift(x, scale, bias, has_bias, y, C, inner, t, parts):
    planes = x.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        s = scale[c]
        b = bias[c] if has_bias else f32(0)
        base = numba.uint64(p * inner)
        for i in range(base, base + numba.uint64(inner)):
            v = x[i] * s
            if has_bias:
                v = v + b
            y[i] = v


@njit(cache=True, nogil=True, error_model="numpy")
def _scale_grad(dy, x, scale, product, has_product, dx, has_dx, C, inner, t, parts):
    planes = dy.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        s = scale[p % C]
        base = numba.uint64(p * inner)
        for i in range(base, base + numba.uint64(inner)):
            g = dy[i]
            if has_product:
                product[i] = g * x[i]
            if has_dx:
                dx[i] = g * s


def _flat(a):
    return a.reshape(-1)


def _parts(a):
    return None if a.size >= PARALLEL_MIN else 1


def center(x, mean, y, square, team):
    """As :func:`..reference.channelwise.center`, in one pass."""
    _, C, inner = x.shape
    team.run(_center, _flat(x), mean, _flat(y), _flat(square if square is not None else y),
             square is not None, C, inner, parts=_parts(x))


def normalize(y, std, copy, team):
    """As :func:`..reference.channelwise.normalize`, in one pass."""
    _, C, inner = y.shape
    team.run(_normalize, _flat(y), std, _flat(copy if copy is not None else y),
             copy is not None, C, inner, parts=_parts(y))


def batch_norm_grad(y, dy, dot, total, factor, std, dx, team):
    """As :func:`..reference.channelwise.batch_norm_grad`, in one pass (no copy of ``dy``)."""
    _, C, inner = y.shape
    team.run(_batch_norm_grad, _flat(y), _flat(dy), dot, total, f32(factor), std, _flat(dx), C,
             inner, parts=_parts(y))


def scale_shift(x, scale, bias, y, team):
    """As :func:`..reference.channelwise.scale_shift`, in one pass."""
    _, C, inner = x.shape
    team.run(_scale_shift, _flat(x), scale, bias if bias is not None else scale,
             bias is not None, _flat(y), C, inner, parts=_parts(x))


def scale_grad(dy, x, scale, product, dx, team):
    """As :func:`..reference.channelwise.scale_grad`, in one pass."""
    _, C, inner = dy.shape
    team.run(_scale_grad, _flat(dy), _flat(x if x is not None else dy), scale,
             _flat(product if product is not None else dy), product is not None,
             _flat(dx if dx is not None else dy), dx is not None, C, inner, parts=_parts(dy))
