"""The ReLU layer's elementwise passes on the CPU, in Numba, split between threads.

Same arithmetic as :mod:`..reference.neuron` element by element (``max(x, 0)`` keeps NaN, the
gradient multiplies by 1 or 0), so the results equal the reference kernels' bit for bit.
Arrays of at least :data:`PARALLEL_MIN` floats are split between the team's threads.
"""
import numba
import numpy
from numba import njit

f32 = numpy.float32
#: Arrays of at least this many floats are split between threads.
PARALLEL_MIN = 1 << 15


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def relu(v, slope):
    """ReLU of one value: ``v`` where ``v > 0`` (or NaN), else 0 or ``v * slope``."""
    if slope == f32(0):
        return v if (v > f32(0) or v != v) else f32(0)
    return v if v > f32(0) else v * slope


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def relu_grad(g, x, slope):
    """ReLU's gradient of one value: ``g`` times 1 where ``x > 0``, else 0 (or ``slope``)."""
    if slope == f32(0):
        return g * (f32(1) if x > f32(0) else f32(0))
    return g if x > f32(0) else g * slope


@njit(cache=True, nogil=True, error_model="numpy")
def _relu_forward(x, y, slope, t, threads):
    n = x.shape[0]
    for i in range(numba.uint64(n * t // threads), numba.uint64(n * (t + 1) // threads)):
        y[i] = relu(x[i], slope)


@njit(cache=True, nogil=True, error_model="numpy")
def _relu_backward(x, dy, dx, slope, t, threads):
    n = x.shape[0]
    for i in range(numba.uint64(n * t // threads), numba.uint64(n * (t + 1) // threads)):
        dx[i] = relu_grad(dy[i], x[i], slope)


def relu_forward(x, y, negative_slope, team):
    """``y`` = ReLU(``x``), as the reference (C-contiguous NumPy float32 arrays)."""
    team.run(_relu_forward, x.reshape(-1), y.reshape(-1), f32(negative_slope),
             parts=None if x.size >= PARALLEL_MIN else 1)


def relu_backward(x, dy, dx, negative_slope, team):
    """``dx`` = the gradient of ReLU at ``x``, as the reference."""
    team.run(_relu_backward, x.reshape(-1), dy.reshape(-1), dx.reshape(-1), f32(negative_slope),
             parts=None if x.size >= PARALLEL_MIN else 1)
