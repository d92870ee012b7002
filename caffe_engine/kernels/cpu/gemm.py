"""A packed single-precision GEMM on the CPU in Numba (the InnerProduct layer's products).

``C (m x n) = A (m x k) B (k x n)`` (or ``C +=``), each operand and C addressed through two
strides, so any of them may be transposed. The standard blocking: each part of the product (a
range of C's column panels, or of its row tiles when there are more of those) packs its panels
of B ``kc`` rows at a time (NR columns each), then for each row tile of MR rows packs that
tile's rows of A once and runs the register-tiled micro-kernel of :mod:`.simd` over its
panels. Tiles at the edges of C, and every tile of a transposed C, go
through a small buffer; whole tiles of a row-major A are read in place. :func:`product` picks,
for ``c = op(a) op(b)``, whether to compute C or its transpose (into scratch memory), so that
fewer floats are packed from strided reads.

All the engine's products then run on one thread pool: OpenBLAS's own threads, spinning between
calls, halved the speed of LeNet's iteration next to the Numba kernels' threads on two cores.
Each element of C is a sum over ``k`` in slices of ``kc`` terms (one fused multiply-add per
term); for a given ``kc`` the result does not depend on the thread count.
"""
import numba
import numpy
from numba import njit

from . import simd
from .conv import MR, NR

f32 = numpy.float32
_mk_packed = simd.microkernel(MR, NR // simd.vector_width(), a_packed=True)
_mk_rows = simd.microkernel(MR, NR // simd.vector_width())
_copy, _fill = simd.copy, simd.fill
_NO_INDEX = numpy.zeros(1, numpy.int64)
#: Products of fewer floating-point operations run on the caller's thread alone.
PARALLEL_FLOPS = 1 << 20



@njit(cache=True, nogil=True, inline="always")
def _part_share(m, n, t, parts):
    """Part ``t`` of ``parts``'s column panels ``[p_lo, p_hi)`` and row tiles ``[i_lo, i_hi)``
    of an (m x n) C: the panels split when there are at least as many as tiles, else the
    tiles."""
    panels = (n + NR - 1) // NR
    tiles = (m + MR - 1) // MR
    if panels >= tiles:
        return panels * t // parts, panels * (t + 1) // parts, 0, tiles
    return 0, panels, tiles * t // parts, tiles * (t + 1) // parts

@njit(cache=True, nogil=True, error_model="numpy")
def gemm(a, a_row, a_col, b, b_row, b_col, c, ldc, m, n, k, accumulate, kc, nc, ws,
         ws_stride, t, parts):
    """``c[i ldc + j] (+)= sum_t A[i, t] B[t, j]`` for ``i < m``, ``j < n``, where
    ``A[i, t] = a[i a_row + t a_col]`` and ``B[t, j] = b[t b_row + j b_col]``: part ``t`` of
    ``parts`` (the longer of C's row tiles and column panels split between the parts), ``nc``
    column panels at a time.

    ``ws``: ``parts`` areas of ``ws_stride`` floats (:func:`scratch`): the part's packed panels
    of B, a packed tile of A and an edge tile of C.
    """
    p_lo, p_hi, i_lo, i_hi = _part_share(m, n, t, parts)
    own = t * ws_stride
    for c_lo in range(p_lo, p_hi, nc):
        _gemm_panels(a, 0, a_row, a_col, b, 0, b_row, b_col, c, ldc, m, n, k, accumulate, kc,
                     ws, own, c_lo, min(c_lo + nc, p_hi), i_lo, i_hi, nc)


@njit(cache=True, nogil=True, error_model="numpy")
def _gemm_panels(a, a0, a_row, a_col, b, b0, b_row, b_col, c, ldc, m, n, k, accumulate, kc, ws,
                 own, p_lo, p_hi, i_lo, i_hi, nc):
    """:func:`gemm` on C's column panels ``[p_lo, p_hi)`` and row tiles ``[i_lo, i_hi)``: all of
    ``k``, ``kc`` rows of B at a time, packed into ``ws`` from ``own`` on (``nc`` panels' room,
    then A's tile, then the edge tile); A and B start at elements ``a0`` and ``b0`` of ``a``
    and ``b``. Each element's sum over ``k`` is the same whatever columns a call covers."""
    u = numba.uint64
    zero = f32(0)
    ap = own + kc * nc * NR
    edge = ap + kc * MR
    for k0 in range(0, k, kc):
        kl = min(kc, k - k0)
        acc = accumulate or k0 > 0
        for p in range(p_lo, p_hi):
            base = own + (p - p_lo) * kc * NR
            cols = min(NR, n - p * NR)
            if b_col == 1:
                for r in range(kl):
                    _copy(ws, base + r * NR, b, b0 + (k0 + r) * b_row + p * NR, cols)
                    _fill(ws, base + r * NR + cols, NR - cols, zero)
            else:
                for jj in range(NR):
                    j = p * NR + jj
                    src = u((b0 + k0 * b_row + j * b_col) if jj < cols else 0)
                    for r in range(u(kl)):
                        ws[u(base) + r * u(NR) + u(jj)] = (b[src + r * u(b_row)] if jj < cols
                                                          else zero)
        for tile in range(i_lo, i_hi):
            i0 = tile * MR
            rows = min(MR, m - i0)
            # A's rows are read in place when they are contiguous and the tile is whole, else
            # packed (transposed A, or the last rows)
            in_place = a_col == 1 and rows == MR
            if not in_place:
                for ii in range(MR):
                    src = u((a0 + (i0 + ii) * a_row + k0 * a_col) if ii < rows else 0)
                    for r in range(u(kl)):
                        ws[u(ap) + r * u(MR) + u(ii)] = (a[src + r * u(a_col)]
                                                        if ii < rows else zero)
            for p in range(p_lo, p_hi):
                j0 = p * NR
                cols = min(NR, n - j0)
                whole = rows == MR and cols == NR
                panel = own + (p - p_lo) * kc * NR
                dst, d0, ldd = (c, i0 * ldc + j0, ldc) if whole else (ws, edge, NR)
                if in_place:
                    _mk_rows(a, a0 + i0 * a_row + k0, a_row, _NO_INDEX, 0, ws, panel, NR,
                             _NO_INDEX, 0, dst, d0, ldd, kl, acc and whole)
                else:
                    _mk_packed(ws, ap, 0, _NO_INDEX, 0, ws, panel, NR, _NO_INDEX, 0,
                               dst, d0, ldd, kl, acc and whole)
                if whole:
                    continue
                for ii in range(rows):
                    for jj in range(cols):
                        at = (i0 + ii) * ldc + j0 + jj
                        value = ws[edge + ii * NR + jj]
                        c[at] = c[at] + value if acc else value


@njit(cache=True, nogil=True, error_model="numpy")
def gemm_images(a, a_image, a_row, a_col, b, b_image, b_row, b_col, c, ldc, m, n, k, images,
                transposed, kc, nc, ws, ws_stride, target, t, parts):
    """For each image ``i`` in order, :func:`gemm` with A and B starting at elements
    ``i a_image`` and ``i b_image``: ``c += A_i B_i`` (accumulating), or with ``transposed``
    ``target`` (m x n) ``= A_i B_i``, then ``c[j ldc + r] += target[r, j]`` (C^T added, one
    float32 add per element). Part ``t`` owns the same panels or tiles for every image, so it
    reads back only what it wrote: one hand-off for all images, the bits of one :func:`gemm`
    call (and NumPy's ``c += target.T``) per image."""
    p_lo, p_hi, i_lo, i_hi = _part_share(m, n, t, parts)
    own = t * ws_stride
    for image in range(images):
        a0, b0 = image * a_image, image * b_image
        for c_lo in range(p_lo, p_hi, nc):
            if transposed:
                _gemm_panels(a, a0, a_row, a_col, b, b0, b_row, b_col, target, n, m, n, k,
                             False, kc, ws, own, c_lo, min(c_lo + nc, p_hi), i_lo, i_hi, nc)
            else:
                _gemm_panels(a, a0, a_row, a_col, b, b0, b_row, b_col, c, ldc, m, n, k, True,
                             kc, ws, own, c_lo, min(c_lo + nc, p_hi), i_lo, i_hi, nc)
        if transposed:
            for r in range(i_lo * MR, min(i_hi * MR, m)):
                for j in range(p_lo * NR, min(p_hi * NR, n)):
                    c[j * ldc + r] += target[r * n + j]


def panel_room(m, n, nc, parts):
    """Column panels of B a part of :func:`gemm` packs at a time: ``nc``, or fewer when the
    part owns fewer (at least 1, also for an empty C)."""
    panels, tiles = -(-n // NR), -(-m // MR)
    own = -(-panels // parts) if panels >= tiles else panels
    return max(1, min(own, nc))


def scratch(kc, room):
    """Floats of one part's scratch area of :func:`gemm` (``room``: :func:`panel_room`)."""
    return kc * room * NR + kc * MR + MR * NR


def panels_at_once(kc, tuning):
    """Column panels of B packed at a time: ``tuning.gemm_pack_bytes`` of packed B (at least
    one panel). Bounds the scratch memory (a whole row of panels of fc6's data gradient in
    VGG-16 was 98 MB) without changing any sum: each element of C still adds its ``k`` terms
    in the same ``kc`` slices."""
    return max(1, tuning.gemm_pack_bytes // (4 * kc * NR))


def product(a, b, c, accumulate, tuning, workspace, team, trans_a=False, trans_b=False):
    """``c (+)= op(a) op(b)`` for 2-D float32 NumPy arrays (``c`` C-contiguous, ``op`` the
    transpose where asked), split between ``team``'s threads when it is large enough, in
    slices of ``tuning.gemm_kc`` rows.

    Computes C, or C^T = op(b)^T op(a)^T into scratch memory (then added or copied into ``c``),
    whichever packs fewer floats from strided reads (A is packed along its rows, B along its
    columns).
    """
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    a_row, a_col = (1, a.shape[1]) if trans_a else (a.shape[1], 1)
    b_row, b_col = (1, b.shape[1]) if trans_b else (b.shape[1], 1)
    strided = (m * k if a_col != 1 else 0) + (k * n if b_col != 1 else 0)
    swapped = (m * k if a_row != 1 else 0) + (k * n if b_row != 1 else 0)
    target, acc = c, accumulate
    if swapped < strided:
        m, n = n, m
        a_row, a_col, b_row, b_col = b_col, b_row, a_col, a_row
        a, b = b, a
        target, acc = workspace.get("gemm_t", m * n)[:m * n].reshape(m, n), False
    kc = max(1, min(tuning.gemm_kc, k))
    parts = team.threads if 2 * m * n * k >= PARALLEL_FLOPS else 1
    nc = panel_room(m, n, panels_at_once(kc, tuning), parts)
    per_part = scratch(kc, nc)
    ws = workspace.get("gemm", parts * per_part)
    team.run(gemm, numpy.ascontiguousarray(a).reshape(-1), a_row, a_col,
             numpy.ascontiguousarray(b).reshape(-1), b_row, b_col, target.reshape(-1), n, m, n,
             k, acc, kc, nc, ws, per_part, parts=parts)
    if target is not c:
        if accumulate:
            c += target.T
        else:
            c[...] = target.T


def sum_products_bt(a, b, c, tuning, workspace, team):
    """``c (M x N) += a[i] (M x K) b[i]^T (K x N)`` for each image ``i`` in order: the sums of
    :func:`product` ``(a[i], b[i], c, True, trans_b=True)`` called image after image (C or
    C^T computed as it picks), in one hand-off to ``team``. ``a`` (images, M, K) and ``b``
    (images, N, K) C-contiguous float32, ``c`` C-contiguous."""
    images, m, k = a.shape
    n = b.shape[1]
    # product()'s choice: B^T is packed from strided reads, A^T (computing C^T) A's rows
    transposed = m * k < k * n
    kc = max(1, min(tuning.gemm_kc, k))
    if transposed:
        args = (b.reshape(-1), n * k, k, 1, a.reshape(-1), m * k, 1, k)
        m, n = n, m
    else:
        args = (a.reshape(-1), m * k, k, 1, b.reshape(-1), n * k, 1, k)
    parts = team.threads if 2 * m * n * k * images >= PARALLEL_FLOPS else 1
    nc = panel_room(m, n, panels_at_once(kc, tuning), parts)
    per_part = scratch(kc, nc)
    ws = workspace.get("gemm", parts * per_part)
    target = workspace.get("gemm_t", m * n) if transposed else ws
    team.run(gemm_images, *args, c.reshape(-1), c.shape[1], m, n, k, images, transposed, kc,
             nc, ws, per_part, target, parts=parts)
