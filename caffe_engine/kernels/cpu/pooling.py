"""MAX and AVE pooling on the CPU: Caffe's loops in Numba, vectorised along an output row.

Caffe: src/caffe/layers/pooling_layer.cpp. For each output row, a vector of outputs at a time
holds its windows in registers (:func:`.simd.pool_window`, strides 1 and 2; other strides
element by element), the window cells visited in Caffe's scan order (window rows, then columns)
and cells outside the input left out lane by lane:

* MAX keeps Caffe's strict ``>`` from ``-FLT_MAX`` per output (the first maximum wins, NaN never
  wins) and the argmax ``h * W + w`` (int32, -1 when nothing beat ``-FLT_MAX``);
* AVE adds the window's values in the same order and divides by Caffe's pool size;
* backward adds in the order of the outputs, as Caffe: MAX ``dx[argmax] += dy``, AVE
  ``dy / size`` over each window (an input position receives its terms from the outputs in
  increasing order).

Results equal the reference kernels' bit for bit. The parts of a call split the (image, channel)
planes.
"""
import numpy
from numba import njit

from ..reference.pooling import ave_divisors
from . import simd

f32 = numpy.float32
FLT_MAX = f32(numpy.finfo(f32).max)
_max_window1, _max_window2 = simd.pool_window("max", 1), simd.pool_window("max", 2)
_sum_window1, _sum_window2 = simd.pool_window("sum", 1), simd.pool_window("sum", 2)
_fill = simd.fill
_spread = simd.window_spread
simd_width = simd.vector_width()


@njit(cache=True, nogil=True, error_model="numpy")
def max_forward(x, y, argmax, planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw, t, threads):
    """``y`` (planes, OH, OW) = MAX pooling of ``x`` (planes, H, W); ``argmax`` likewise: one
    output row's windows at a time in registers (:func:`simd.pool_window`; strides above 2 element
    by element)."""
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        xb = p * H * W
        for oh in range(OH):
            hs = oh * sh - ph
            he = min(hs + kh, H)
            hs = max(hs, 0)
            row = (p * OH + oh) * OW
            first = hs * W - pw
            if sw == 1:
                _max_window1(x, xb + first, W, he - hs, kw, -pw, W, y, argmax, row, OW, first)
            elif sw == 2:
                _max_window2(x, xb + first, W, he - hs, kw, -pw, W, y, argmax, row, OW, first)
            else:
                for o in range(OW):
                    ws = o * sw - pw
                    best = -FLT_MAX
                    arg = -1
                    for h in range(hs, he):
                        for w in range(max(ws, 0), min(ws + kw, W)):
                            v = x[xb + h * W + w]
                            if v > best:
                                best = v
                                arg = h * W + w
                    y[row + o] = best
                    argmax[row + o] = arg


@njit(cache=True, nogil=True, error_model="numpy")
def max_backward(dy, argmax, dx, planes, H, W, OH, OW, t, threads):
    """``dx`` (planes, H, W) = 0, then ``dx[argmax] += dy`` output by output."""
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        xb = p * H * W
        _fill(dx, xb, H * W, f32(0))
        yb = p * OH * OW
        for o in range(OH * OW):
            a = argmax[yb + o]
            if a >= 0:
                dx[xb + a] += dy[yb + o]


@njit(cache=True, nogil=True, error_model="numpy")
def ave_forward(x, y, divisor, planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw, t, threads):
    """``y`` (planes, OH, OW) = AVE pooling of ``x``, ``divisor`` Caffe's (OH, OW) pool sizes
    (windows summed in registers as :func:`max_forward`)."""
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        xb = p * H * W
        for oh in range(OH):
            hs = oh * sh - ph
            he = min(hs + kh, H)
            hs = max(hs, 0)
            row = (p * OH + oh) * OW
            first = hs * W - pw
            if sw == 1:
                _sum_window1(x, xb + first, W, he - hs, kw, -pw, W, y, row, OW)
            elif sw == 2:
                _sum_window2(x, xb + first, W, he - hs, kw, -pw, W, y, row, OW)
            else:
                for o in range(OW):
                    ws = o * sw - pw
                    total = f32(0)
                    for h in range(hs, he):
                        for w in range(max(ws, 0), min(ws + kw, W)):
                            total += x[xb + h * W + w]
                    y[row + o] = total
            for o in range(OW):
                y[row + o] /= divisor[oh * OW + o]


@njit(cache=True, nogil=True, error_model="numpy")
def ave_backward(dy, dx, divisor, share, planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw, t,
                 threads):
    """``dx`` (planes, H, W): Caffe's ``dy / size`` added over every window from 0, outputs in
    increasing order, each input row summed in registers (:func:`simd.window_spread`) from a
    plane's ``dy / size`` laid out in ``share``: this part's ``len(share) // threads`` floats,
    rows of :func:`spread_row` floats, output ``o`` at ``kw + sw o`` and zeros elsewhere."""
    part = len(share) // threads
    step = spread_row(W, OW, kw, sw, pw)
    base = t * part
    _fill(share, base, part, f32(0))
    base += kw
    first = numpy.empty(H, numpy.int64)   # output rows [first, last) hold input row h
    last = numpy.empty(H, numpy.int64)
    for h in range(H):
        first[h] = max(0, (h + ph - kh + sh) // sh)
        last[h] = max(first[h], min(OH, (h + ph) // sh + 1))
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        for oh in range(OH):
            for o in range(OW):
                share[base + oh * step + o * sw] = (dy[(p * OH + oh) * OW + o]
                                                    / divisor[oh * OW + o])
        for h in range(H):
            _spread(dx, (p * H + h) * W, W, share, base + first[h] * step, step,
                    last[h] - first[h], kw, pw)


@njit(cache=True, inline="always")
def spread_row(W, OW, kw, sw, pw):
    """Floats per output row in :func:`ave_backward`'s ``share``: ``kw`` zeros, the row's
    outputs ``sw`` apart, zeros to a whole vector past the input row's last term; a multiple
    of 16 (a cache line)."""
    return (kw + max(OW * sw, W + pw) + simd_width + 15) // 16 * 16


class PoolPlan:
    """One pooling geometry (:class:`...geometry.PoolGeometry`) on NumPy float32 arrays.

    ``x``/``dx`` (N, C, H, W), ``y``/``dy``/``mask`` (N, C, OH, OW), C-contiguous. MAX keeps the
    argmax (int32, Caffe's ``max_idx_``) from ``forward`` for ``backward`` and writes it as float
    into ``mask`` (Caffe's second top) unless ``mask`` is None.
    """

    def __init__(self, geometry, team):
        g = self.geometry = geometry
        self.team = team
        self.planes = g.num * g.channels
        self.dims = g.in_hw + g.out_hw
        self.window = g.kernel + g.stride + g.pad
        self.is_max = g.method == 0
        self.argmax = None
        #: bytes of the argmax ``forward`` keeps for ``backward`` (0: AVE keeps nothing)
        self.saved_bytes = 4 * self.planes * g.out_hw[0] * g.out_hw[1] if self.is_max else 0
        self.divisor = ave_divisors(g.in_hw, g.out_hw, g.kernel, g.stride, g.pad).reshape(-1)
        # ave_backward's scratch per part: a plane's rows, parts a cache line apart
        self.share_floats = (g.out_hw[0] * spread_row(g.in_hw[1], g.out_hw[1], g.kernel[1],
                                                      g.stride[1], g.pad[1]) + 16)

    def keep_saved_in(self, buffer):
        """Keep the argmax in ``buffer`` (a flat array of at least :attr:`saved_bytes` bytes)
        from the next ``forward`` on, instead of memory of the plan's own."""
        self.argmax = buffer.view(numpy.uint8)[:self.saved_bytes].view(numpy.int32)

    def forward(self, x, y, mask=None):
        if self.is_max:
            if self.argmax is None:
                self.argmax = numpy.empty(self.saved_bytes // 4, numpy.int32)
            self.team.run(max_forward, x.reshape(-1), y.reshape(-1), self.argmax, self.planes,
                          *self.dims, *self.window)
            if mask is not None:
                mask.reshape(-1)[...] = self.argmax
        else:
            self.team.run(ave_forward, x.reshape(-1), y.reshape(-1), self.divisor, self.planes,
                          *self.dims, *self.window)

    def backward(self, dy, dx):
        if self.is_max:
            if self.argmax is None:
                raise RuntimeError("pooling: MAX backward needs the argmax of a forward call")
            self.team.run(max_backward, dy.reshape(-1), self.argmax, dx.reshape(-1), self.planes,
                          *self.dims)
        else:
            share = numpy.empty(self.team.threads * self.share_floats, f32)
            self.team.run(ave_backward, dy.reshape(-1), dx.reshape(-1), self.divisor, share,
                          self.planes, *self.dims, *self.window)
