"""2-D convolution on the CPU: an indirect ("implicit") GEMM in Numba, with no column matrix.

The input is first copied once into a zero-padded buffer split by stride phase, with chunks of
``NB`` images innermost (:func:`pack`)::

    xt[nc, c, a, b, h', w', i] = xpad[nc NB + i, c, h' sh + a, w' sw + b]

(for stride 1 and ``NB = 1`` just the padded input). In chunk ``nc``, output position
``(oh, ow, i)`` has the "wide" number ``q = (oh Ws + ow) NB + i`` (``Ws`` the phase width: ``ow``
runs past ``OW``, and those positions are computed and dropped) and reads kernel offset
``k = (c, kh, kw)`` at ``xt[chunk + offset[k] + q]`` (``kh dh = ri sh + a``,
``kw dw = rj sw + b``). For every offset the inputs of consecutive positions are consecutive
floats, so the GEMM micro-kernel of :mod:`.simd` reads them in place through the table
``offset``: Caffe's column matrix is never built.

The positions are cut into blocks (:func:`plan_blocks`): parts of one output row when a row
holds enough valid positions (``OW NB``; none dropped then), else runs of whole rows. Each
thread takes its own run of consecutive blocks, of about equal work (:func:`my_blocks`):

* forward: ``out[m, q] = sum_k W[m, k] xt[offset[k] + q]``; the block is written into the NCHW
  top with the bias;
* weight gradient: ``dW^T[k, m] += sum_q xt[offset[k] + q] dy^T[q, m]`` (the top diff gathered
  transposed once per block, 0 at the dropped positions), summed per thread and added to the
  diff in thread order;
* backward data, stride 1: the correlation of the padded top diff with the flipped, transposed
  filters: the forward kernel on another geometry;
* backward data otherwise: ``dcol = W^T dy`` then Caffe's col2im, which adds one contiguous run
  per kernel offset; each thread owns whole input channels, so no two threads add into one.

``NB`` trades the dropped positions (``Ws - OW`` of every ``Ws`` in multi-row blocks, and the
micro-kernel width's rounding of short rows) against the cost of interleaving images in
:func:`pack`; :class:`Conv2dPlan` picks it per layer (:func:`choose_chunk`).

Sums run in another order than Caffe's per-image BLAS calls (slices of ``kc`` terms, fused
multiply-adds); the golden tests allow BLAS's rounding for convolutions. For a given thread
count the results are deterministic.

Arrays are passed flat (1-D float32, C order) with element offsets: no array view is made
inside a parallel loop (a view's reference count is one cache line shared by every thread).
"""
import functools

import numba
import numpy
from numba import njit

from . import simd

f32 = numpy.float32
_W = simd.vector_width()
#: The micro-kernel tile: MR rows (output channels; kernel offsets in the weight gradient) by
#: NR floats (output positions; output channels in the weight gradient). With AVX-512 an 8 x 48
#: tile (24 accumulators) ran at 120-135 GFLOP/s on one core of the development machine where
#: 6 x 64 ran at 80 (L1-resident operands; OpenBLAS's sgemm: 92 on one core).
MR, _NV = (8, 3) if _W == 16 else (6, 2)
NR = _NV * _W
#: The narrow tile of the weight gradient, for output channel counts that NR would pad a lot
#: (14 x 32 ran at 125-135 GFLOP/s there).
MR_NARROW, _NV_NARROW = (14, 2) if _W == 16 else (6, 1)
NR_NARROW = _NV_NARROW * _W
_mk = simd.microkernel(MR, _NV)
_mk_b_indirect = simd.microkernel(MR, _NV, b_indirect=True, a_packed=True)
#: ... and prefetching, a micro-kernel width ahead, the rows of B it reads (the next strip's)
_mk_b_indirect_pf = simd.microkernel(MR, _NV, b_indirect=True, a_packed=True, prefetch=NR)
_mk_a_indirect = simd.microkernel(MR, _NV, True, False)
_mk_a_indirect_narrow = simd.microkernel(MR_NARROW, _NV_NARROW, True, False)
_copy, _fill, _add_into, _copy_plus = simd.copy, simd.fill, simd.add_into, simd.copy_plus
_gather_plus, _scatter_copy = simd.gather_plus, simd.scatter_copy
_total = simd.total
_NO_INDEX = numpy.zeros(1, numpy.int64)


def round_up(value, step):
    """``value`` rounded up to a multiple of ``step``."""
    return -(-value // step) * step


# ------------------------------------------------------------------------------------------------
# The packed layout
# ------------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, error_model="numpy")
def pack(x, xt, N, C, H, W, ph, pw, sh, sw, Hs, Ws, NB, t, threads):
    """``xt`` (ceil(N / NB), C, sh, sw, Hs, Ws, NB) = ``x`` (N, C, H, W) zero-padded by
    (ph, pw), split by stride phase, chunks of NB images innermost (images past N: 0).
    Threads split the (chunk, channel) planes."""
    zero = f32(0)
    plane = H * W
    chunks = (N + NB - 1) // NB
    jobs = chunks * C
    scalar = sh == 1 and sw == 1 and (NB > 1 or W < SHORT_ROW)
    for job in range(jobs * t // threads, jobs * (t + 1) // threads):
        nc = job // C
        c = job - nc * C
        if scalar:
            _pack_plane(x, xt, job, nc, c, N, C, H, W, ph, pw, Hs, Ws, NB)
            continue
        for a in range(sh):
            for b in range(sw):
                base = ((job * sh + a) * sw + b) * Hs * Ws * NB
                # columns w' with 0 <= w' sw + b - pw < W
                lo = min(Ws, max(0, (pw - b + sw - 1) // sw))
                hi = min(Ws, max(lo, (W - 1 + pw - b) // sw + 1))
                for r in range(Hs):
                    h = r * sh + a - ph
                    row = base + r * Ws * NB
                    if h < 0 or h >= H:
                        _fill(xt, row, Ws * NB, zero)
                        continue
                    _fill(xt, row, lo * NB, zero)
                    _fill(xt, row + hi * NB, (Ws - hi) * NB, zero)
                    for i in range(NB):
                        n = nc * NB + i
                        dst = row + lo * NB + i
                        if n >= N:
                            for e in range(hi - lo):
                                xt[numba.uint64(dst + e * NB)] = zero
                            continue
                        src = (n * C + c) * plane + h * W + lo * sw + b - pw
                        if NB == 1 and sw == 1:
                            _copy(xt, dst, x, src, hi - lo)
                        elif sw == 1:
                            _scatter_copy(xt, dst, NB, x, src, hi - lo)
                        else:
                            for e in range(hi - lo):
                                xt[numba.uint64(dst + e * NB)] = x[numba.uint64(src + e * sw)]


#: Rows shorter than this are packed float by float (:func:`_pack_plane`) rather than by
#: vector copies: GoogLeNet's 7x7 planes packed at 1.2 ns a float by copies of 7, at 0.5 ns
#: float by float, on one core of the development machine.
SHORT_ROW = 32


@njit(cache=True, nogil=True, error_model="numpy")
def _pack_plane(x, xt, job, nc, c, N, C, H, W, ph, pw, Hs, Ws, NB):
    """:func:`pack`'s plane ``job`` (chunk ``nc``, channel ``c``) of an unstrided layout:
    the padding zeroed, then each image's plane copied float by float to every NB-th float
    (vector scatters of short rows with NB > 1 ran 2.5-4 times slower)."""
    u = numba.uint64
    zero = f32(0)
    base = job * Hs * Ws * NB
    row_wide = Ws * NB
    rows = max(0, min(H, Hs - ph))      # the input rows and columns inside the layout
    cols = max(0, min(W, Ws - pw))
    for r in range(Hs):
        row = base + r * row_wide
        if r < ph or r >= ph + rows:
            _fill(xt, row, row_wide, zero)
            continue
        _fill(xt, row, pw * NB, zero)
        _fill(xt, row + (pw + cols) * NB, (Ws - pw - cols) * NB, zero)
    for i in range(NB):
        n = nc * NB + i
        src = (n * C + c) * H * W
        for h in range(rows):
            dst = base + (h + ph) * row_wide + pw * NB + i
            if n >= N:
                for e in range(cols):
                    xt[u(dst + e * NB)] = zero
                continue
            for e in range(cols):
                xt[u(dst + e * NB)] = x[u(src + h * W + e)]


@njit(cache=True, nogil=True, error_model="numpy")
def unpack(xt, x, N, C, H, W, ph, pw, sh, sw, Hs, Ws, NB, t, threads):
    """The inverse of :func:`pack`: ``x`` (N, C, H, W) = the interior of ``xt``."""
    plane = H * W
    chunks = (N + NB - 1) // NB
    jobs = chunks * C
    for job in range(jobs * t // threads, jobs * (t + 1) // threads):
        nc = job // C
        c = job - nc * C
        for h in range(H):
            a = (h + ph) % sh
            r = (h + ph) // sh
            for i in range(min(NB, N - nc * NB)):
                dst = ((nc * NB + i) * C + c) * plane + h * W
                if NB == 1 and sw == 1:
                    _copy(x, dst, xt, ((job * sh + a) * Hs + r) * Ws + pw, W)
                    continue
                if sw == 1:
                    _gather_plus(x, dst, xt, (((job * sh + a) * Hs + r) * Ws + pw) * NB + i, NB,
                                 W, f32(-0.0))   # + (-0) leaves every float as it is
                    continue
                for b in range(sw):   # the columns w = w0 + sw e of phase b
                    w0 = (b - pw) % sw
                    src = ((((job * sh + a) * sw + b) * Hs + r) * Ws + (w0 + pw) // sw) * NB + i
                    for e in range((W - w0 + sw - 1) // sw):
                        x[numba.uint64(dst + w0 + sw * e)] = xt[numba.uint64(src + NB * e)]


def pack_panels(a, out):
    """``a`` (G, R, K) into ``out`` as the micro-kernel's packed panels (G, Rpad / MR, K, MR),
    ``Rpad = round_up(R, MR)``, zero rows after R: a panel's MR values of one k are adjacent,
    so the micro-kernel reads its A operand as one stream."""
    G, R, K = a.shape
    rpad = round_up(R, MR)
    view = out[:G * rpad * K].reshape(G, rpad // MR, K, MR)
    full = R // MR
    view[:, :full] = a[:, :full * MR].reshape(G, full, MR, K).transpose(0, 1, 3, 2)
    if rpad > full * MR:
        view[:, full] = 0
        view[:, full, :, :R - full * MR] = a[:, full * MR:].transpose(0, 2, 1)
    return out


def offsets(channels, kernel, dilation, stride, Hs, Ws, NB, count):
    """The offset table: for Caffe's column-matrix row ``k = (c kh + i) kw + j`` the position of
    its input relative to output position 0 of a chunk in the layout of :func:`pack`;
    ``count - channels kh kw`` zero entries after (padding rows of the micro-kernel)."""
    (kh, kw), (dh, dw), (sh, sw) = kernel, dilation, stride
    table = numpy.zeros(max(count, 1), numpy.int64)
    k = 0
    for c in range(channels):
        for i in range(kh):
            ri, a = divmod(i * dh, sh)
            for j in range(kw):
                rj, b = divmod(j * dw, sw)
                table[k] = ((((c * sh + a) * sw + b) * Hs + ri) * Ws + rj) * NB
                k += 1
    return table


def plan_blocks(N, OH, OW, Ws, NB, columns, runs=False):
    """The blocks of output positions: (chunk, first wide position, positions) int64 arrays.

    A row of a chunk holds ``OW NB`` valid positions. When that is at least two micro-kernel
    widths (and not ``runs``), each row is cut into ``ceil(OW NB / columns)`` parts of whole
    micro-kernel widths (the last one short), and no dropped position is computed. Otherwise a
    block is a run of whole rows of the wide numbering (``Ws NB`` positions a row), about
    ``columns`` long.
    """
    row_valid, row_wide = OW * NB, Ws * NB
    chunks, starts, lengths = [], [], []
    for nc in range(-(-N // NB)):
        if row_valid >= 2 * NR and not runs:
            parts = max(1, -(-row_valid // max(columns, NR)))
            size = round_up(-(-row_valid // parts), NR)
            for oh in range(OH):
                for p0 in range(0, row_valid, size):
                    chunks.append(nc)
                    starts.append(oh * row_wide + p0)
                    lengths.append(min(size, row_valid - p0))
        else:
            rows = max(1, columns // row_wide)
            for oh in range(0, OH, rows):
                chunks.append(nc)
                starts.append(oh * row_wide)
                lengths.append((min(OH, oh + rows) - oh - 1) * row_wide + row_valid)
    as_array = lambda v: numpy.array(v, numpy.int64)
    return as_array(chunks), as_array(starts), as_array(lengths)


# Memoized: a pure function of ints, asked for every chunk candidate of every layer, and again
# for each layer of the same output size and for the test net (VGG-16: 416 calls, 80 distinct).
@functools.lru_cache(maxsize=None)
def computed_positions(N, OH, OW, Ws, NB, columns):
    """Positions the micro-kernel computes for all blocks (valid, dropped and rounding)."""
    _, _, lengths = plan_blocks(N, OH, OW, Ws, NB, columns)
    return int(sum(round_up(int(n), NR) for n in lengths))


@njit(cache=True, nogil=True, inline="always")
def _boundary(lengths, part, parts):
    """The first block of part ``part`` of ``parts``: the blocks cut into consecutive runs of
    about equal work (each block's micro-kernel widths), a block going to the part that holds
    the larger half of it."""
    n = lengths.shape[0]
    if part <= 0:
        return 0
    if part >= parts:
        return n
    total = 0
    for i in range(n):
        total += (lengths[i] + NR - 1) // NR
    # block i starts part ``part`` when its middle lies past the part's share of the work
    done = 0
    for i in range(n):
        cost = (lengths[i] + NR - 1) // NR
        if 2 * (done * parts) + cost * parts > 2 * total * part:
            return i
        done += cost
    return n


@njit(cache=True, nogil=True, inline="always")
def my_blocks(lengths, t, threads):
    """``range`` of the blocks part ``t`` of ``threads`` takes (:func:`_boundary`): consecutive
    blocks of about equal work. Striding (every ``threads``-th block) gave one thread all the
    short blocks where a chunk cuts into an even count of them (ResNet-50's 28x28 layers: 9,
    9, 9 and 1 rows an image, 504 against 300 positions computed)."""
    return range(_boundary(lengths, t, threads), _boundary(lengths, t + 1, threads))


def forward_blocks(N, OH, OW, Ws, NB, columns):
    """The blocks for :func:`forward` alone, whose sums do not depend on them: those of
    :func:`plan_blocks`, or its runs of whole rows where those compute fewer positions and a run
    holds two rows or more (GoogLeNet's conv1, 112 valid of 115 wide positions a row: parts
    of 144 computed a row, runs of two rows 240 for 224, 17% fewer)."""
    parts = plan_blocks(N, OH, OW, Ws, NB, columns)
    if OW * NB < 2 * NR or 2 * Ws * NB > columns:
        return parts
    runs = plan_blocks(N, OH, OW, Ws, NB, columns, runs=True)
    computed = [sum(round_up(int(n), NR) for n in b[2]) for b in (parts, runs)]
    return runs if computed[1] < computed[0] else parts


def choose_chunk(N, C, M, OH, OW, Ws, kernel_dim, columns, tuning, in_place=False):
    """Images per chunk (``NB``) for a layer: the candidate of ``tuning.chunk_candidates``
    with the least estimated time. A micro-kernel position costs ``kernel_dim * M`` fused
    multiply-adds at ``tuning.gemm_rate``; each input float packed costs ``tuning.copy_cost``
    seconds (none for NB = 1 ``in_place``, a 1x1 convolution); each output float written back
    ``tuning.copy_cost`` with NB = 1 (vector copies) and ``tuning.interleave_cost`` with more
    (a gather of every NB-th float). ``tuning.images_per_chunk`` forces it."""
    if tuning.images_per_chunk:
        return max(1, min(N, tuning.images_per_chunk))
    best = None
    for nb in tuning.chunk_candidates:
        if nb > N and nb != 1:
            continue
        gemm = computed_positions(N, OH, OW, Ws, nb, columns) * kernel_dim * M * 2
        gemm /= tuning.gemm_rate
        inputs = 0 if (in_place and nb == 1) else C * (OH + 4) * Ws * N * tuning.copy_cost
        outputs = M * OH * OW * N * (tuning.copy_cost if nb == 1 else tuning.interleave_cost)
        cost = gemm + inputs + outputs
        if best is None or cost < best[0]:
            best = (cost, nb)
    return best[1]


def flip_pays(geometry):
    """Whether a stride-1 convolution's data gradient should be the convolution of the top diff
    with the flipped filters rather than ``W^T dy`` and col2im: that convolution runs over the
    input's positions with the top's channels, col2im's product over the output's positions
    (plus its scattered adds), so it pays unless the input has clearly more positions (a
    "valid" convolution: LeNet's 12x12 -> 8x8 makes 2.25 times the multiply-adds)."""
    inside = geometry.in_spatial[0] * geometry.in_spatial[1]
    outside = geometry.out_spatial[0] * geometry.out_spatial[1]
    return inside <= 1.25 * outside


@njit(cache=True, error_model="numpy")
def _row_spans(s, length, row_wide, row_valid):
    """The rows a block of wide positions ``[s, s + length)`` covers, as (row, first within-row
    position, end within-row position, that first position's place in the block), the
    within-row positions ``ow NB + i`` cut at ``row_valid``."""
    spans = []
    e = 0
    oh = s // row_wide
    p = s - oh * row_wide
    while e < length:
        hi = min(row_valid, p + length - e)
        if hi > p:
            spans.append((oh, p, hi, e))
        e += row_wide - p
        p = 0
        oh += 1
    return spans


# ------------------------------------------------------------------------------------------------
# Forward (and backward data of stride-1 convolutions, as a forward on the top diff)
# ------------------------------------------------------------------------------------------------
def forward_scratch(M, G, lengths, skew):
    """Floats of one thread's scratch area for :func:`forward`."""
    return round_up(M // G, MR) * (round_up(int(lengths.max()), NR) + skew)


@njit(cache=True, nogil=True, error_model="numpy")
def forward(xt, offs, wp, bias, has_bias, y, N, C, M, G, OH, OW, Hs, Ws, sh, sw, NB, Kg,
            chunks, starts, lengths, kc, skew, ws, ws_stride, t, threads):
    """``y`` (N, M, OH, OW) = conv(x, W) (+ bias), from ``xt`` (:func:`pack` of x, then slack)
    and ``offs`` (:func:`offsets`, at least Kg entries).

    ``wp``: the weights packed by :func:`pack_panels` as (G, Mgpad / MR, Kg, MR),
    ``Mgpad = round_up(M / G, MR)``; ``chunks``/``starts``/``lengths``: :func:`plan_blocks`.
    Part ``t`` of ``threads`` takes a run of consecutive blocks (:func:`my_blocks`) and its own
    ``ws_stride`` floats of ``ws``.
    """
    Mg = M // G
    Cg = C // G
    mgpad = (Mg + MR - 1) // MR * MR
    group_size = Cg * sh * sw * Hs * Ws * NB
    row_wide = Ws * NB
    plane = OH * OW
    out = t * ws_stride
    for blk in my_blocks(lengths, t, threads):
        nc = chunks[blk]
        s = starts[blk]
        length = lengths[blk]
        npad = (length + NR - 1) // NR * NR
        ld = npad + skew
        for g in range(G):
            base = (nc * G + g) * group_size + s
            for k0 in range(0, Kg, kc):
                k1 = min(Kg, k0 + kc)
                for j0 in range(0, npad, NR):
                    # the first row tile also prefetches the next strip's rows of the input
                    # (read in place from memory by a 1x1 convolution: 4-9 % faster there)
                    _mk_b_indirect_pf(wp, g * mgpad * Kg + k0 * MR, 0, _NO_INDEX, 0, xt,
                                      base + j0, 0, offs, k0, ws, out + j0, ld, k1 - k0,
                                      k0 > 0)
                    for m0 in range(MR, mgpad, MR):
                        _mk_b_indirect(wp, (g * mgpad + m0) * Kg + k0 * MR, 0, _NO_INDEX,
                                       0, xt, base + j0, 0, offs, k0,
                                       ws, out + m0 * ld + j0, ld, k1 - k0, k0 > 0)
            # out[m, q - s] -> y[n, g Mg + m, oh, ow], dropping ow >= OW, image by image
            # (each image's run of y written in order)
            for oh, lo, hi, e0 in _row_spans(s, length, row_wide, OW * NB):
                for i in range(min(NB, N - nc * NB)):
                    n = nc * NB + i
                    ow_lo = max(0, (lo - i + NB - 1) // NB)
                    ow_hi = (hi - i + NB - 1) // NB
                    src0 = out + e0 + ow_lo * NB + i - lo
                    for m in range(Mg):
                        mm = g * Mg + m
                        b = bias[mm] if has_bias else f32(0)
                        dst = (n * M + mm) * plane + oh * OW + ow_lo
                        src = src0 + m * ld
                        if NB == 1:
                            _copy_plus(y, dst, ws, src, ow_hi - ow_lo, b)
                        else:
                            _gather_plus(y, dst, ws, src, NB, ow_hi - ow_lo, b)


# ------------------------------------------------------------------------------------------------
# Weight and bias gradients
# ------------------------------------------------------------------------------------------------
def weight_grad_tile(M, G):
    """(rows, columns) of the micro-kernel tile the weight gradient uses: the narrow one when
    it pads the group's output channels less."""
    mg = M // G
    return (MR_NARROW, NR_NARROW) if round_up(mg, NR_NARROW) < round_up(mg, NR) else (MR, NR)


def weight_grad_scratch(C, M, G, kh, kw, lengths):
    """Floats of one thread's scratch area for :func:`weight_grad` (its partial sum first)."""
    mr, nr = weight_grad_tile(M, G)
    mgv = round_up(M // G, nr)
    return G * round_up(C // G * kh * kw, mr) * mgv + int(lengths.max()) * mgv


@njit(cache=True, nogil=True, error_model="numpy")
def weight_grad(xt, offs, dy, N, C, M, G, OH, OW, Hs, Ws, sh, sw, NB, Kg, narrow,
                chunks, starts, lengths, ws, ws_stride, t, threads):
    """The weight gradient of the batch, from ``xt``/``offs`` as in :func:`forward` (``offs``
    padded with zeros to ``Kgpad`` entries) and the top diff ``dy`` (N, M, OH, OW).

    Part ``t`` of ``threads`` sums its blocks into its own ``dW^T`` (G, Kgpad, Mgv) at the
    start of its scratch area, with the tile of :func:`weight_grad_tile` (``narrow``);
    :func:`weight_grad_sum` then adds the parts to ``dw_acc`` in part order.
    """
    mr = MR_NARROW if narrow else MR
    nr = NR_NARROW if narrow else NR
    Mg = M // G
    Cg = C // G
    kgpad = (Kg + mr - 1) // mr * mr
    mgv = (Mg + nr - 1) // nr * nr
    part = G * kgpad * mgv
    group_size = Cg * sh * sw * Hs * Ws * NB
    row_wide = Ws * NB
    plane = OH * OW
    u = numba.uint64
    zero = f32(0)
    acc = t * ws_stride
    dyt = acc + part
    _fill(ws, acc, part, zero)
    for blk in my_blocks(lengths, t, threads):
        nc = chunks[blk]
        s = starts[blk]
        length = lengths[blk]
        for g in range(G):
            # dy^T of the block: dyt[q - s, m], 0 at the dropped positions and past N;
            # written position by position, each row of dyt in order (a vector scatter per
            # channel, a store to another cache line per float, ran 2-6 times slower)
            if length > OW * NB or nc * NB + NB > N:
                _fill(ws, dyt, length * mgv, zero)
            for oh, lo, hi, e0 in _row_spans(s, length, row_wide, OW * NB):
                for i in range(min(NB, N - nc * NB)):
                    n = nc * NB + i
                    ow_lo = max(0, (lo - i + NB - 1) // NB)
                    ow_hi = (hi - i + NB - 1) // NB
                    row0 = dyt + (e0 + ow_lo * NB + i - lo) * mgv
                    src = ((n * M + g * Mg) * OH + oh) * OW + ow_lo
                    for j in range(ow_hi - ow_lo):
                        dst = row0 + j * NB * mgv
                        for m in range(Mg):
                            ws[u(dst + m)] = dy[u(src + j + m * plane)]
            base = (nc * G + g) * group_size + s
            for k0 in range(0, kgpad, mr):
                for m0 in range(0, mgv, nr):
                    c0 = acc + (g * kgpad + k0) * mgv + m0
                    if narrow:
                        _mk_a_indirect_narrow(xt, base, 0, offs, k0, ws, dyt + m0, mgv,
                                              _NO_INDEX, 0, ws, c0, mgv, length, True)
                    else:
                        _mk_a_indirect(xt, base, 0, offs, k0, ws, dyt + m0, mgv, _NO_INDEX,
                                       0, ws, c0, mgv, length, True)


@njit(cache=True, nogil=True, error_model="numpy")
def weight_grad_sum(dw_acc, M, G, Kg, narrow, threads, ws, ws_stride):
    """``dw_acc`` (M, Kg) += the parts of :func:`weight_grad`, in part order."""
    mr = MR_NARROW if narrow else MR
    nr = NR_NARROW if narrow else NR
    Mg = M // G
    kgpad = (Kg + mr - 1) // mr * mr
    mgv = (Mg + nr - 1) // nr * nr
    for t in range(threads):
        acc = t * ws_stride
        for g in range(G):
            for m in range(Mg):
                row = (g * Mg + m) * Kg
                for k in range(Kg):
                    dw_acc[row + k] += ws[acc + (g * kgpad + k) * mgv + m]


@njit(cache=True, nogil=True, error_model="numpy")
def bias_grad(dy, db, N, M, P, t, threads):
    """``db`` (M,) += the sum of ``dy`` (N, M, P) over images and positions: per channel, the
    images' position sums (each in :func:`simd.total`'s order) in image order."""
    for m in range(M * t // threads, M * (t + 1) // threads):
        s = f32(0)
        for n in range(N):
            s += _total(dy, (n * M + m) * P, P)
        db[m] += s


# ------------------------------------------------------------------------------------------------
# Backward data through col2im
# ------------------------------------------------------------------------------------------------
def col2im_scratch(lengths, kc, skew):
    """Floats of one thread's scratch area for :func:`backward_data_col2im`."""
    return round_up(kc, MR) * (round_up(int(lengths.max()), NR) + skew)


@njit(cache=True, nogil=True, error_model="numpy")
def backward_data_col2im(dyt, offs, wtp, dxt, N, C, M, G, OH, Hs, Ws, sh, sw, NB, Kg, kh, kw,
                         chunks, starts, lengths, kc, skew, ws, ws_stride, t, threads):
    """``dxt``, the input gradient in the layout of :func:`pack`, = col2im(W^T dy); overwritten
    (the caller unpacks it with :func:`unpack`).

    ``dyt``: the top diff packed as (chunks, M, 1, 1, OH, Ws, NB), 0 at ``ow >= OW`` (then
    slack); ``wtp``: the transposed weights as (G, Kgpad, Mg), zero rows after Kg (rows are
    sliced by channel, at any row, so they are not packed in panels); ``kc`` a multiple of MR. Thread ``t`` owns input channels ``C t / threads`` to
    ``C (t + 1) / threads`` (of every chunk): it zeroes them, then for every block multiplies
    their rows of the column matrix, at most ``kc`` rows at a time, and adds each row back as
    one run.
    """
    Mg = M // G
    Cg = C // G
    khw = kh * kw
    kgpad = (Kg + MR - 1) // MR * MR
    channel_size = sh * sw * Hs * Ws * NB
    top_channel = OH * Ws * NB
    n_chunks = (N + NB - 1) // NB
    dcol = t * ws_stride
    c_lo = C * t // threads
    c_hi = C * (t + 1) // threads
    for nc in range(n_chunks):
        _fill(dxt, (nc * C + c_lo) * channel_size, (c_hi - c_lo) * channel_size, f32(0))
    c = c_lo
    while c < c_hi:
        g = c // Cg
        # the rows of channels c .. c_end - 1 (one group), at most kc (or one channel's)
        c_end = min(c_hi, (g + 1) * Cg, c + max(1, kc // khw))
        k0 = (c - g * Cg) * khw
        k1 = (c_end - g * Cg) * khw
        for blk in range(starts.shape[0]):
            nc = chunks[blk]
            s = starts[blk]
            length = lengths[blk]
            npad = (length + NR - 1) // NR * NR
            ld = npad + skew
            top = (nc * M + g * Mg) * top_channel + s
            for kk in range(k0, k1, kc):
                kk1 = min(k1, kk + kc)
                kpad = (kk1 - kk + MR - 1) // MR * MR
                for j0 in range(0, npad, NR):
                    for r0 in range(0, kpad, MR):
                        _mk(wtp, (g * kgpad + kk + r0) * Mg, Mg, _NO_INDEX, 0,
                            dyt, top + j0, top_channel, _NO_INDEX, 0,
                            ws, dcol + r0 * ld + j0, ld, Mg, False)
                for k in range(kk, kk1):
                    _add_into(dxt, (nc * C + g * Cg) * channel_size + s + offs[k], ws,
                              dcol + (k - kk) * ld, length)
        c = c_end
