"""ACROSS_CHANNELS local response normalisation on the CPU: Caffe's running window over the
channels in Numba, vectorised along each image's positions.

Caffe: src/caffe/layers/lrn_layer.cpp (``CrossChannelForward_cpu``,
``CrossChannelBackward_cpu``). The arithmetic is the reference kernels' (and Caffe's) step for
step: the window sum adds the head channel's ``alpha / size * x^2`` and then the tail's negative;
the backward window adds ``dy * top / scale`` the same way. The powers (``scale ** -beta``) are
NumPy's, as in the reference, so the results equal the reference kernels' bit for bit.
WITHIN_CHANNEL runs the reference code. The parts of a call split the images.
"""
import numba
import numpy
from numba import njit

from ..reference.lrn import LRNPlan as ReferenceLRNPlan

f32 = numpy.float32


@njit(cache=True, nogil=True, error_model="numpy")
def across_scale(x, scale, N, C, P, size, a, k, t, threads):
    """``scale`` (N, C, P) = ``k + a * (window sum of x^2)`` as Caffe's running sum
    (``a = alpha / size``, float32)."""
    pad = (size - 1) // 2
    u = numba.uint64
    for n in range(N * t // threads, N * (t + 1) // threads):
        base = u(n * C * P)
        for p in range(u(P)):
            scale[base + p] = k
        for j in range(size):
            c = j - pad
            if 0 <= c < C:
                src = base + u(c * P)
                for p in range(u(P)):
                    v = x[src + p]
                    scale[base + p] += a * (v * v)
        for c in range(1, C):
            dst = base + u(c * P)
            prev = dst - u(P)
            head = c + size - 1 - pad
            tail = c - 1 - pad
            hb = base + u(head * P) if head < C else base
            tb = base + u(tail * P) if tail >= 0 else base
            for p in range(u(P)):
                s = scale[prev + p]
                if head < C:
                    v = x[hb + p]
                    s += a * (v * v)
                if tail >= 0:
                    v = x[tb + p]
                    s += -a * (v * v)
                scale[dst + p] = s


@njit(cache=True, nogil=True, error_model="numpy")
def across_backward(x, y, dy, scale, dx, N, C, P, size, cache_ratio, t, threads):
    """``dx`` (N, C, P), holding ``scale ** -beta * dy`` on entry, ``+= -cache_ratio * x *
    (window sum of dy * y / scale)``, the window kept as Caffe's running sum."""
    pad = (size - 1) // 2
    u = numba.uint64
    accum = numpy.empty(P, numpy.float32)
    for n in range(N * t // threads, N * (t + 1) // threads):
        base = u(n * C * P)
        for p in range(u(P)):
            accum[p] = 0
        for j in range(size - 1):
            c = j - pad
            if 0 <= c < C:
                src = base + u(c * P)
                for p in range(u(P)):
                    accum[p] += (dy[src + p] * y[src + p]) / scale[src + p]
        for c in range(C):
            head = c + size - 1 - pad
            tail = c - pad
            dst = base + u(c * P)
            hb = base + u(head * P) if head < C else base
            tb = base + u(tail * P) if tail >= 0 else base
            for p in range(u(P)):
                acc = accum[p]
                if head < C:
                    acc += (dy[hb + p] * y[hb + p]) / scale[hb + p]
                dx[dst + p] += -cache_ratio * (x[dst + p] * acc)
                if tail >= 0:
                    acc -= (dy[tb + p] * y[tb + p]) / scale[tb + p]
                accum[p] = acc


class LRNPlan(ReferenceLRNPlan):
    """The reference plan (:class:`..reference.lrn.LRNPlan`) with the channel loops of
    ACROSS_CHANNELS in Numba; NumPy float32 arrays, C-contiguous."""

    def __init__(self, geometry, team):
        super().__init__(geometry)
        self.team = team

    def _across_forward(self, x, y):
        n, c = x.shape[:2]
        p = x.size // max(1, n * c)
        self.scale = numpy.empty(x.shape, f32)
        self.team.run(across_scale, x.reshape(-1), self.scale.reshape(-1), n, c, p, self.size,
                      f32(self.alpha / f32(self.size)), self.k)
        numpy.power(self.scale, -self.beta, out=y)
        y *= x

    def _across_backward(self, x, y, dy, dx):
        n, c = x.shape[:2]
        p = x.size // max(1, n * c)
        numpy.power(self.scale, -self.beta, out=dx)
        dx *= dy
        cache_ratio = f32(2.0 * float(self.alpha) * float(self.beta) / self.size)
        self.team.run(across_backward, x.reshape(-1), y.reshape(-1), dy.reshape(-1),
                      self.scale.reshape(-1), dx.reshape(-1), n, c, p, self.size, cache_ratio)
