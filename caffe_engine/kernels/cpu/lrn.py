"""ACROSS_CHANNELS local response normalisation on the CPU: Caffe's running window over the
channels in Numba, vectorised along each image's positions.

Caffe: src/caffe/layers/lrn_layer.cpp (``CrossChannelForward_cpu``,
``CrossChannelBackward_cpu``). The arithmetic is the reference kernels' (and Caffe's) step for
step: the window sum adds the head channel's ``alpha / size * x^2`` and then the tail's negative;
the backward window adds ``dy * top / scale`` the same way. The powers (``scale ** -beta``) are
NumPy's, as in the reference (its float32 ``power`` is elementwise, so a slice's values are the
whole array's), so the results equal the reference kernels' bit for bit.

The parts of a call split the images. Each part walks its images a block of channels at a time
(:attr:`LRNPlan.block_channels`, :data:`BLOCK_BYTES` of each array: the block is still in the
caches at its next step): the block's scale (Numba), its ``scale ** -beta`` (NumPy, without the GIL) and the
product with ``x`` (forward); or ``scale ** -beta * dy`` and then the window term (backward).
The window sums run on from block to block, so their additions are the ones of one pass.
Fewer images than parts: the scale (or the window term) by images, the powers by elements.

The scale (Caffe's ``scale_``) lives from ``forward`` to ``backward``: in a buffer the net
places (:meth:`LRNPlan.keep_saved_in`, the train net's gradient arena) or in one the plan
allocates at its first call for a shape. WITHIN_CHANNEL runs the reference code.
"""
import math

import numba
import numpy
from numba import njit

from ..reference.lrn import LRNPlan as ReferenceLRNPlan

f32 = numpy.float32

#: Bytes of one array a part handles per block of channels: a block's arrays are still in the
#: caches at its next step, and the steps' Python calls are few. Measured on the development
#: machine (1 MiB L2 a core), (32, 192, 56, 56) on two threads: 128 KiB to a whole image per
#: block within 15%, 512 KiB the fastest.
BLOCK_BYTES = 512 << 10


@njit(cache=True, nogil=True, error_model="numpy")
def across_scale(x, scale, C, P, c0, c1, size, a, k):
    """Channels ``c0 <= c < c1`` of one image's ``scale`` (C * P,) = ``k + a * (window sum of
    x^2)`` as Caffe's running sum (``a = alpha / size``, float32); channel ``c0 - 1`` of
    ``scale`` must hold its value already (the previous block's)."""
    pad = (size - 1) // 2
    u = numba.uint64
    start = c0
    if c0 == 0 and c1 > 0:
        for p in range(u(P)):
            scale[p] = k
        for j in range(size):
            c = j - pad
            if 0 <= c < C:
                src = u(c * P)
                for p in range(u(P)):
                    v = x[src + p]
                    scale[p] += a * (v * v)
        start = 1
    for c in range(start, c1):
        dst = u(c * P)
        prev = dst - u(P)
        head = c + size - 1 - pad
        tail = c - 1 - pad
        hb = u(head * P) if head < C else u(0)
        tb = u(tail * P) if tail >= 0 else u(0)
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
def across_backward(x, y, dy, scale, dx, ring, accum, C, P, c0, c1, size, cache_ratio):
    """Channels ``c0 <= c < c1`` of one image's ``dx`` (C * P,), holding ``scale ** -beta * dy``
    on entry, ``+= -cache_ratio * x * (window sum of dy * y / scale)``; the window is Caffe's
    running sum, carried in ``accum`` (P,) from block to block (started at ``c0 == 0``).

    Each channel's ratio ``dy * y / scale`` is computed once, when it enters the window, into
    row ``c % size`` of ``ring`` (size * P,), and read again when it leaves (Caffe's
    ``padded_ratio`` holds them all): the loops then touch few arrays, which LLVM vectorises."""
    pad = (size - 1) // 2
    u = numba.uint64
    if c0 == 0:
        for p in range(u(P)):
            accum[p] = 0
        for j in range(size - 1):
            c = j - pad
            if 0 <= c < C:
                _ratio(dy, y, scale, ring, u(P), u(c * P), u((c % size) * P))
                row = u((c % size) * P)
                for p in range(u(P)):
                    accum[p] += ring[row + p]
    for c in range(c0, c1):
        head = c + size - 1 - pad
        tail = c - pad
        dst = u(c * P)
        hr = u((head % size) * P)
        tr = u((tail % size) * P) if tail >= 0 else u(0)
        if head < C:
            _ratio(dy, y, scale, ring, u(P), u(head * P), hr)
        _window_channel(x, dx, ring, accum, u(P), dst, hr, tr, head < C, tail >= 0,
                        -cache_ratio)


@njit(cache=True, nogil=True, error_model="numpy")
def _ratio(dy, y, scale, ring, P, src, row):
    """``ring[row:row + P] = dy * y / scale`` of the channel at ``src``."""
    for p in range(P):
        ring[row + p] = (dy[src + p] * y[src + p]) / scale[src + p]


@njit(cache=True, nogil=True, error_model="numpy")
def _window_channel(x, dx, ring, accum, P, dst, hr, tr, head, tail, neg_ratio):
    """One channel of :func:`across_backward`: add the head's ratio (``head``), use the window,
    subtract the tail's (``tail``). One loop per case, without branches inside."""
    if head and tail:
        for p in range(P):
            acc = accum[p] + ring[hr + p]
            dx[dst + p] += neg_ratio * (x[dst + p] * acc)
            accum[p] = acc - ring[tr + p]
    elif head:
        for p in range(P):
            acc = accum[p] + ring[hr + p]
            dx[dst + p] += neg_ratio * (x[dst + p] * acc)
            accum[p] = acc
    elif tail:
        for p in range(P):
            acc = accum[p]
            dx[dst + p] += neg_ratio * (x[dst + p] * acc)
            accum[p] = acc - ring[tr + p]
    else:
        for p in range(P):
            dx[dst + p] += neg_ratio * (x[dst + p] * accum[p])


def _share(count, t, parts):
    """Part ``t`` of ``parts`` of ``range(count)``: (start, stop)."""
    return count * t // parts, count * (t + 1) // parts


def _forward_part(x, y, scale, blocks, consts, powers, t, parts):
    """Part ``t``: its images' scale, ``y = scale ** -beta`` and ``y *= x``, block by block
    (arrays (N, C * P)); with ``powers`` false the scale only."""
    C, P, size, a, k, neg_beta = consts
    for n in range(*_share(x.shape[0], t, parts)):
        xn, yn, sn = x[n], y[n], scale[n]
        for c0, c1 in blocks:
            across_scale(xn, sn, C, P, c0, c1, size, a, k)
            if powers:
                numpy.power(sn[c0 * P:c1 * P], neg_beta, out=yn[c0 * P:c1 * P])
                yn[c0 * P:c1 * P] *= xn[c0 * P:c1 * P]


def _backward_part(x, y, dy, scale, dx, window, blocks, consts, powers, t, parts):
    """Part ``t``: its images' ``dx = scale ** -beta * dy`` (with ``powers``) and the window
    term, block by block (arrays (N, C * P); ``window`` (parts, (size + 1) * P) each part's
    ratios and window sums)."""
    C, P, size, cache_ratio, neg_beta = consts
    ring, accum = window[t, :size * P], window[t, size * P:]
    for n in range(*_share(x.shape[0], t, parts)):
        dxn = dx[n]
        for c0, c1 in blocks:
            if powers:
                numpy.power(scale[n, c0 * P:c1 * P], neg_beta, out=dxn[c0 * P:c1 * P])
                dxn[c0 * P:c1 * P] *= dy[n, c0 * P:c1 * P]
            across_backward(x[n], y[n], dy[n], scale[n], dxn, ring, accum, C, P, c0, c1, size,
                            cache_ratio)


def _power_part(scale, neg_beta, other, out, t, parts):
    """Part ``t`` of the flat arrays: ``out = scale ** -beta`` then ``out *= other``."""
    lo, hi = _share(scale.size, t, parts)
    numpy.power(scale[lo:hi], neg_beta, out=out[lo:hi])
    out[lo:hi] *= other[lo:hi]


class LRNPlan(ReferenceLRNPlan):
    """The reference plan (:class:`..reference.lrn.LRNPlan`) with ACROSS_CHANNELS on the team's
    threads (see the module docstring); NumPy float32 arrays, C-contiguous.

    Attributes:
        saved_bytes: bytes of the scale ``forward`` keeps for ``backward`` (float32, the
            geometry's shape; 0 for WITHIN_CHANNEL, which keeps the reference's arrays).
        block_channels: channels a part handles at a time (about ``block_bytes``, by default
            :data:`BLOCK_BYTES`, of each array).

    Raises:
        RuntimeError: ACROSS_CHANNELS ``backward`` before any ``forward``.
    """

    def __init__(self, geometry, team, block_bytes=BLOCK_BYTES):
        super().__init__(geometry)
        self.team = team
        count = math.prod(int(d) for d in geometry.shape)
        self.saved_bytes = 0 if geometry.within else 4 * count
        positions = count // max(1, int(geometry.shape[0]) * int(geometry.shape[1]))
        self.block_channels = max(1, block_bytes // (4 * max(1, positions)))
        self._kept = None        # the scale's memory placed by the net (keep_saved_in)
        self._own = None         # the scale's memory of the plan's own, when not placed
        self._window = None      # backward's ratios and window sums, one row per part

    def keep_saved_in(self, buffer):
        """Keep the scale in ``buffer`` (a flat array of at least :attr:`saved_bytes` bytes)
        from the next ``forward`` on, instead of memory of the plan's own."""
        if self.saved_bytes:
            self._kept = buffer.view(numpy.uint8)[:self.saved_bytes].view(f32)
            self._own = None     # freed once the next forward no longer holds it as the scale

    def _scale_for(self, shape):
        """The scale's array of ``shape``: the placed buffer when it has that size, else the
        plan's own, allocated when the shape changes."""
        if self._kept is not None and self._kept.size == math.prod(shape):
            return self._kept.reshape(shape)
        if self._own is None or self._own.shape != shape:
            self._own = numpy.empty(shape, f32)
        return self._own

    def _layout(self, x):
        """(N, C, P) of ``x`` and the channel blocks ``[(c0, c1), ...]``."""
        n, c = x.shape[:2]
        p = x.size // max(1, n * c)
        step = self.block_channels
        return n, c, p, [(c0, min(c, c0 + step)) for c0 in range(0, c, step)]

    def _across_forward(self, x, y):
        n, c, p, blocks = self._layout(x)
        scale = self.scale = self._scale_for(x.shape)
        if x.size == 0:
            return
        fused = n >= self.team.threads
        consts = (c, p, self.size, f32(self.alpha / f32(self.size)), self.k, -self.beta)
        self.team.run(_forward_part, x.reshape(n, -1), y.reshape(n, -1), scale.reshape(n, -1),
                      blocks, consts, fused, parts=n)
        if not fused:
            self.team.run(_power_part, scale.reshape(-1), -self.beta, x.reshape(-1),
                          y.reshape(-1))

    def _across_backward(self, x, y, dy, dx):
        if self.scale is None or self.scale.shape != x.shape:
            raise RuntimeError("LRN: backward needs the scale of a forward call of its shape")
        n, c, p, blocks = self._layout(x)
        if x.size == 0:
            return
        threads = self.team.threads
        if self._window is None or self._window.shape != (threads, (self.size + 1) * p):
            self._window = numpy.empty((threads, (self.size + 1) * p), f32)
        fused = n >= threads
        if not fused:
            self.team.run(_power_part, self.scale.reshape(-1), -self.beta, dy.reshape(-1),
                          dx.reshape(-1))
        cache_ratio = f32(2.0 * float(self.alpha) * float(self.beta) / self.size)
        self.team.run(_backward_part, x.reshape(n, -1), y.reshape(n, -1), dy.reshape(n, -1),
                      self.scale.reshape(n, -1), dx.reshape(n, -1), self._window, blocks,
                      (c, p, self.size, cache_ratio, -self.beta), fused, parts=n)
