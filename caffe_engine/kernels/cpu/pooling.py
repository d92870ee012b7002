"""MAX and AVE pooling on the CPU: Caffe's loops in Numba, vectorised over outputs.

Caffe: src/caffe/layers/pooling_layer.cpp. Forward holds a vector of outputs' windows at a time
in registers, the window cells visited in Caffe's scan order (window rows, then columns) and
cells outside the input left out lane by lane, in one of two ways:

* a plane's outputs as one flat run of whole vectors (:class:`FlatTables`,
  :func:`.simd.pool_flat`): where short rows (GoogLeNet's 28, 14 and 7 wide planes) would
  leave most of a vector empty. Each window cell lies at a constant offset from its output in
  the plane (stride 1, "same" pooling) or in the plane's stride phases (a copy that splits the
  rows and columns by their remainder modulo the stride);
* otherwise one output row at a time (:func:`.simd.pool_window`, strides 1 and 2; other strides
  element by element).

In both:

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
_max_flat, _sum_flat = simd.pool_flat("max"), simd.pool_flat("sum")
_fill, _copy, _split_pairs = simd.fill, simd.copy, simd.split_pairs
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
def split_phases(x, x0, H, W, sh, sw, plane, Q, buf, b0):
    """Copy the plane ``x[x0:x0 + H W]`` into its ``sh sw`` stride phases, ``plane`` floats
    apart, rows ``Q`` floats apart: ``buf[b0 + (a sw + b) plane + R Q + C] = x[x0 + (sh R + a) W
    + sw C + b]``. Rows are written in increasing order, whole vectors with stride 2 (a
    phase's ``plane`` leaves a vector's room past its last row)."""
    for h in range(H):
        a, R = h % sh, h // sh
        d = b0 + a * sw * plane + R * Q
        if sw == 1:
            _copy(buf, d, x, x0 + h * W, W)
        elif sw == 2:
            _split_pairs(buf, d, d + plane, x, x0 + h * W, W, len(x) - x0 - h * W)
        else:
            for b in range(min(sw, W)):
                src = x0 + h * W + b
                for C in range((W - b + sw - 1) // sw):
                    buf[d + b * plane + C] = x[src + sw * C]


@njit(cache=True, nogil=True, error_model="numpy")
def max_forward_flat(x, y, argmax, planes, H, W, OH, OW, sh, sw, plane, Q, offsets, where,
                     valid, origin, buf, ybuf, abuf, t, threads):
    """``y``, ``argmax`` (planes, OH, OW) = MAX pooling of ``x`` (planes, H, W), each plane's
    outputs one flat run of rows ``Q`` apart (:func:`simd.pool_flat`, the tables of
    :class:`FlatTables`) read from the plane's stride phases (:func:`split_phases`, this part's
    share of ``buf``) unless ``x`` is already laid out so; through this part's share of
    ``ybuf``/``abuf`` when ``Q > OW``."""
    n = OH * Q
    b0, y0 = t * (len(buf) // threads), t * (len(ybuf) // threads)
    copy = sh > 1 or sw > 1 or Q != W
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        src, s0 = x, p * H * W
        if copy:
            split_phases(x, s0, H, W, sh, sw, plane, Q, buf, b0)
            src, s0 = buf, b0
        if Q == OW:
            _max_flat(src, s0, offsets, where, len(offsets), valid, origin, y, argmax,
                      p * n, n)
            continue
        _max_flat(src, s0, offsets, where, len(offsets), valid, origin, ybuf, abuf, y0, n)
        for oh in range(OH):
            for ow in range(OW):
                y[(p * OH + oh) * OW + ow] = ybuf[y0 + oh * Q + ow]
                argmax[(p * OH + oh) * OW + ow] = abuf[y0 + oh * Q + ow]


@njit(cache=True, nogil=True, error_model="numpy")
def ave_forward_flat(x, y, divisor, planes, H, W, OH, OW, sh, sw, plane, Q, offsets, valid,
                     buf, ybuf, t, threads):
    """``y`` (planes, OH, OW) = AVE pooling of ``x`` (planes, H, W), the windows' sums as
    :func:`max_forward_flat`, then divided by Caffe's pool sizes ``divisor`` (OH, OW)."""
    n = OH * Q
    b0, y0 = t * (len(buf) // threads), t * (len(ybuf) // threads)
    copy = sh > 1 or sw > 1 or Q != W
    for p in range(planes * t // threads, planes * (t + 1) // threads):
        src, s0 = x, p * H * W
        if copy:
            split_phases(x, s0, H, W, sh, sw, plane, Q, buf, b0)
            src, s0 = buf, b0
        if Q == OW:
            _sum_flat(src, s0, offsets, len(offsets), valid, y, p * n, n)
            for o in range(n):
                y[p * n + o] /= divisor[o]
            continue
        _sum_flat(src, s0, offsets, len(offsets), valid, ybuf, y0, n)
        for oh in range(OH):
            for ow in range(OW):
                y[(p * OH + oh) * OW + ow] = ybuf[y0 + oh * Q + ow] / divisor[oh * OW + ow]


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


def cell_masks(inside):
    """:func:`simd.pool_flat`'s ``valid``: ``inside`` (outputs, cells) bool, the outputs a
    multiple of the vector width, as uint8 bit masks, a vector of outputs per entry, the
    entries of a vector's cells consecutive."""
    n, cells = inside.shape
    lanes = inside.reshape(n // simd_width, simd_width, cells).transpose(0, 2, 1)
    return numpy.packbits(lanes, axis=2, bitorder="little").reshape(-1)


class FlatTables:
    """A plane's outputs as one flat run of whole vectors (:func:`simd.pool_flat`).

    The plane is read through its stride phases (:func:`split_phases`): phase ``(a, b)`` holds
    the inputs ``(sh R + a, sw C + b)`` at ``(R, C)``, rows of ``Q`` floats, with ``Q = max(OW,
    ceil(W / sw))``, phases ``plane`` floats apart; outputs ``(oh, ow)`` run at ``e = oh Q +
    ow`` (the lanes ``ow >= OW`` are left out). Window cell ``(i, j)`` (``c = i kw + j``,
    Caffe's scan order), with ``i - ph = sh qi + a`` and ``j - pw = sw qj + b``, is then phase
    ``(a, b)``'s ``(oh + qi, ow + qj)``: the constant offset ``offsets[c]`` (int64) from ``e``.
    With stride 1 and ``Q == W`` the phase is the plane itself (no copy: "same" pooling,
    Caffe's inception pools).

    ``where`` (int32, cells) ``(i - ph) W + (j - pw)`` and ``origin`` (int32, the run) ``sh oh W
    + sw ow``: the argmax is their sum. ``valid`` the cells inside the input (Caffe's window
    clipped to ``[0, H) x [0, W)``), as :func:`cell_masks`; the run padded to whole passes.
    """

    def __init__(self, g, threads):
        (H, W), (OH, OW) = g.in_hw, g.out_hw
        (kh, kw), (sh, sw), (ph, pw) = g.kernel, g.stride, g.pad
        self.Q = max(OW, -(-W // sw))
        #: floats a phase: its rows and a vector's room
        self.plane = -(-H // sh) * self.Q + simd_width
        n = OH * self.Q
        span = simd.FLAT_CHUNKS * simd_width
        i, j = numpy.divmod(numpy.arange(kh * kw), kw)
        (qi, a), (qj, b) = numpy.divmod(i - ph, sh), numpy.divmod(j - pw, sw)
        self.offsets = ((a * sw + b) * self.plane + qi * self.Q + qj).astype(numpy.int64)
        self.where = ((i - ph) * W + (j - pw)).astype(numpy.int32)
        oh, ow = numpy.divmod(numpy.arange(n), self.Q)
        h = sh * oh[:, None] + i[None, :] - ph
        w = sw * ow[:, None] + j[None, :] - pw
        inside = numpy.zeros((-(-n // span) * span, kh * kw), bool)
        inside[:n] = (ow[:, None] < OW) & (h >= 0) & (h < H) & (w >= 0) & (w < W)
        self.valid = cell_masks(inside)
        self.origin = numpy.zeros(len(inside), numpy.int32)
        self.origin[:n] = sh * oh * W + sw * ow
        copy = (sh, sw) != (1, 1) or self.Q != W
        #: the parts' scratch: phases, and outputs when ``Q > OW``
        self.buf = numpy.empty(threads * (sh * sw * self.plane if copy else 1), f32)
        self.ybuf = numpy.empty(threads * (n if self.Q > OW else 1), f32)
        self.abuf = numpy.empty(len(self.ybuf), numpy.int32)

    def args(self, g):
        """The geometry and tables :func:`max_forward_flat` takes after ``planes``."""
        return g.in_hw + g.out_hw + g.stride + (self.plane, self.Q)

    @staticmethod
    def fits(g):
        """True when the flat run pays: at most 32 cells a window, at least half the run's
        lanes outputs, two vectors of outputs a plane, and strides above 1 only on rows of at
        most two vectors (wider rows fill the vectors of :func:`max_forward` already, and the
        phases' copy costs more than it saves there)."""
        W, (OH, OW) = g.in_hw[1], g.out_hw
        Q = max(OW, -(-W // g.stride[1]))
        return (g.kernel[0] * g.kernel[1] <= 32 and 2 * OW >= Q and OH * OW >= 2 * simd_width
                and (g.stride == (1, 1) or OW <= 2 * simd_width))


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
        self.flat = FlatTables(g, team.threads) if FlatTables.fits(g) else None
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
            self._max_forward(x.reshape(-1), y.reshape(-1))
            if mask is not None:
                mask.reshape(-1)[...] = self.argmax
        elif self.flat is not None:
            f = self.flat
            self.team.run(ave_forward_flat, x.reshape(-1), y.reshape(-1), self.divisor,
                          self.planes, *f.args(self.geometry), f.offsets, f.valid, f.buf,
                          f.ybuf)
        else:
            self.team.run(ave_forward, x.reshape(-1), y.reshape(-1), self.divisor, self.planes,
                          *self.dims, *self.window)

    def _max_forward(self, x, y):
        f = self.flat
        if f is not None:
            self.team.run(max_forward_flat, x, y, self.argmax, self.planes,
                          *f.args(self.geometry), f.offsets, f.where, f.valid, f.origin, f.buf,
                          f.ybuf, f.abuf)
        else:
            self.team.run(max_forward, x, y, self.argmax, self.planes, *self.dims,
                          *self.window)

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
