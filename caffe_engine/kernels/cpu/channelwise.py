"""Per-channel elementwise passes of BatchNorm and Scale on the CPU, in Numba, fused and split
between threads: the operations of :mod:`..reference.channelwise` in the same order element by
element (one rounding each, no fused multiply-add), so the results equal the reference's bit for
bit; what changes is how often the arrays travel from memory (the reference makes a pass per
operation: BatchNorm's gradient five, and a copy of ``dy`` when in place).

Arrays are (outer, C, inner) float32 views, C-contiguous, passed flat with ``C`` and ``inner``;
``y`` may be ``x`` (in place), as each element is read before it is written; the BatchNorm
loops then store into the array they read (:func:`_same`), which LLVM vectorises, where a store
into a second array that overlaps the one read leaves the loop scalar. Work is split
between the team's threads when the arrays hold at least :data:`PARALLEL_MIN` floats.

* ``channel_sum``, ``batch_norm_forward`` (global statistics), ``scale_shift`` and
  ``scale_grad`` (one pass each) split the planes (outer * C) between the threads and sweep
  memory in order.
* ``batch_norm_stats_forward`` and ``batch_norm_backward`` are channel-ordered: each thread
  owns a range of channels and takes them a group at a time (:data:`GROUP_FLOATS` floats of
  each item's planes, so that each item's run is long enough for the hardware prefetchers).
  For a group it makes all the passes back to back -- the forward: the planes' sums, the
  means, the centered squares' sums, the variances and ``std``, then ``x_norm`` and ``y``; the
  backward: the planes' four product sums, the sums over items, then ``dx`` -- so that the
  group is read from memory once and from the cache after that. The sums over items are taken
  per channel as NumPy takes them in the reference's ``channel_sum`` (:func:`_over_items`).
"""
import numba
import numpy
from numba import njit

from . import simd
from .neuron import relu, relu_grad

f32 = numpy.float32
#: Arrays of at least this many floats are split between threads.
PARALLEL_MIN = 1 << 15


#: Floats of one item's planes that the channel-ordered passes take together (a group of
#: channels): long runs keep the hardware prefetchers streaming.
GROUP_FLOATS = 1 << 15

#: Levels of :func:`_pairwise`'s tree it has room for (plenty: a level halves the run).
PAIRWISE_DEPTH = 64


@njit(cache=True, nogil=True, error_model="numpy")
def _leaf(src, s0, stride, n, k, out, o0):
    # NumPy's pairwise_sum for n <= 128: below 8 floats in turn; else eight running sums over
    # blocks of 8, combined in pairs, then the rest in turn.
    if n < 8:
        for j in range(k):
            res = f32(-0.0)
            b = s0 + j * stride
            for i in range(b, b + n):
                res += src[i]
            out[o0 + j] = res
        return
    if k == 4:
        simd.leaf8x4(src, s0, stride, n, out, o0)
    else:
        simd.leaf8(src, s0, stride, n, out, o0)
    whole = n - n % 8
    for j in range(k):
        res = out[o0 + j]
        b = s0 + j * stride
        for i in range(b + whole, b + n):
            res += src[i]
        out[o0 + j] = res


@njit(cache=True, nogil=True, error_model="numpy")
def _pairwise(src, s0, stride, n, k, out, o0, values, frames):
    """``out[o0 + j]`` = the float32 sum of ``src[s0 + j stride:][:n]`` for ``j < k`` (k = 1 or
    4), as NumPy's ``add.reduce`` sums a contiguous axis (its ``pairwise_sum``: runs of up to
    128 floats as :func:`_leaf`; longer ones as the sum of their two halves, split at a multiple
    of 8), so that the results have NumPy's bits. The k runs go side by side (independent
    chains of vector adds). The recursion is walked with explicit stacks (Numba's cache cannot
    reload a recursive function): ``values`` 4 * :data:`PAIRWISE_DEPTH` floats, ``frames``
    (:data:`PAIRWISE_DEPTH`, 3) int64."""
    sp = 0
    frames[0, 0], frames[0, 1], frames[0, 2] = s0, n, 0
    vp = 0
    while sp >= 0:
        start, m, stage = frames[sp, 0], frames[sp, 1], frames[sp, 2]
        if m <= 128:
            _leaf(src, start, stride, m, k, values, vp * 4)
            vp += 1
            sp -= 1
            continue
        half = m // 2
        half -= half % 8
        if stage == 0:
            frames[sp, 2] = 1
            sp += 1
            frames[sp, 0], frames[sp, 1], frames[sp, 2] = start, half, 0
        elif stage == 1:
            frames[sp, 2] = 2
            sp += 1
            frames[sp, 0], frames[sp, 1], frames[sp, 2] = start + half, m - half, 0
        else:
            vp -= 1
            for j in range(k):
                values[(vp - 1) * 4 + j] = values[(vp - 1) * 4 + j] + values[vp * 4 + j]
            sp -= 1
    for j in range(k):
        out[o0 + j] = values[j]


@njit(cache=True, nogil=True, error_model="numpy")
def _plane_sums(x, out, inner, t, parts):
    planes = out.shape[0]
    values = numpy.empty(4 * PAIRWISE_DEPTH, f32)
    frames = numpy.empty((PAIRWISE_DEPTH, 3), numpy.int64)
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        _pairwise(x, p * inner, 0, inner, 1, out, p, values, frames)
        out[p] = f32(0) + out[p]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _normalized(v, m, s, a, has_scale, b, has_bias, slope, has_relu):
    # One element of BatchNorm's output (x_norm), then of the Scale's and the ReLU's.
    v = v - m
    v = v / s
    out = v
    if has_scale:
        out = out * a
        if has_bias:
            out = out + b
    if has_relu:
        out = relu(out, slope)
    return v, out


@njit(cache=True, nogil=True, error_model="numpy")
def _normalize_plane(x, base, n, m, s, a, has_scale, b, has_bias, slope, has_relu, x_norm, y,
                     in_place):
    # One plane of the output. In place (``y`` is ``x``) the loop stores into ``x`` itself:
    # LLVM vectorises a store to the array it reads at the same index, where a store to a
    # second array that may overlap it leaves the loop scalar (2x slower).
    if in_place:
        for i in range(base, base + n):
            x_norm[i], x[i] = _normalized(x[i], m, s, a, has_scale, b, has_bias, slope,
                                          has_relu)
    else:
        for i in range(base, base + n):
            x_norm[i], y[i] = _normalized(x[i], m, s, a, has_scale, b, has_bias, slope,
                                          has_relu)


@njit(cache=True, nogil=True, error_model="numpy")
def _normalize_affine(x, mean, std, scale, has_scale, bias, has_bias, slope, has_relu, x_norm,
                      y, in_place, C, inner, t, parts):
    planes = x.shape[0] // inner
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        a = scale[c] if has_scale else f32(1)
        b = bias[c] if has_bias else f32(0)
        _normalize_plane(x, numba.uint64(p * inner), numba.uint64(inner), mean[c], std[c], a,
                         has_scale, b, has_bias, slope, has_relu, x_norm, y, in_place)


@njit(cache=True, nogil=True, error_model="numpy")
def _over_items(sums, s0, outer, C, alpha, has_alpha, values, frames):
    # ``_combine`` of one channel's per-plane sums ``sums[s0:s0 + outer]``, as NumPy sums the
    # item axis of the (outer, C) array: from 0, the rows in turn when C >= 2 (the inner loop
    # runs over channels); when C == 1 the items are one contiguous run, summed pairwise.
    if has_alpha:
        for n in range(s0, s0 + outer):
            sums[n] = sums[n] * alpha
    if C == 1:      # (the run's sum is written over its first float, after it is read)
        _pairwise(sums, s0, 0, outer, 1, sums, s0, values, frames)
        return f32(0) + sums[s0]
    total = f32(0)
    for n in range(s0, s0 + outer):
        total = total + sums[n]
    return total


@njit(cache=True, nogil=True, error_model="numpy")
def _group_plane_sums(x, mean, squares, c0, c1, outer, C, inner, sums, work, values, frames):
    # sums[(c - c0) * outer + k] = the float32 sum of plane (k, c) for the group's channels
    # c0 <= c < c1 (of its centered squares (x - mean[c]) ** 2 when ``squares``), item by
    # item, so that each item's run of the group's planes is read in one sweep.
    n = numba.uint64(inner)
    for k in range(outer):
        for c in range(c0, c1):
            p = (k * C + c) * inner
            s = (c - c0) * outer + k
            if squares:
                m = mean[c]
                base = numba.uint64(p)
                for i in range(n):
                    v = x[base + i] - m
                    work[i] = v * v
                _pairwise(work, 0, 0, inner, 1, sums, s, values, frames)
            else:
                _pairwise(x, p, 0, inner, 1, sums, s, values, frames)
            sums[s] = f32(0) + sums[s]


@njit(cache=True, nogil=True, error_model="numpy")
def _stats_normalize(x, inv, eps, scale, has_scale, bias, has_bias, slope, has_relu, x_norm,
                     y, in_place, mean, var, std, outer, C, inner, group, t, parts):
    # Group by group of ``group`` channels (of this part's channels): the planes' sums, the
    # means, the centered squares' sums, the variances, std, then the output -- the group's
    # outer * group * inner floats read from memory once and twice more from the cache.
    lo, hi = C * t // parts, C * (t + 1) // parts
    group = max(1, min(group, hi - lo))
    values = numpy.empty(4 * PAIRWISE_DEPTH, f32)
    frames = numpy.empty((PAIRWISE_DEPTH, 3), numpy.int64)
    sums = numpy.empty(group * outer, f32)
    work = numpy.empty(inner, f32)
    for c0 in range(lo, hi, group):
        c1 = min(hi, c0 + group)
        _group_plane_sums(x, mean, False, c0, c1, outer, C, inner, sums, work, values, frames)
        for c in range(c0, c1):
            mean[c] = _over_items(sums, (c - c0) * outer, outer, C, inv, True, values, frames)
        _group_plane_sums(x, mean, True, c0, c1, outer, C, inner, sums, work, values, frames)
        for c in range(c0, c1):
            v = _over_items(sums, (c - c0) * outer, outer, C, inv, True, values, frames)
            var[c], std[c] = v, numpy.sqrt(v + eps)
        for k in range(outer):
            for c in range(c0, c1):
                a = scale[c] if has_scale else f32(1)
                b = bias[c] if has_bias else f32(0)
                _normalize_plane(x, numba.uint64((k * C + c) * inner), numba.uint64(inner),
                                 mean[c], std[c], a, has_scale, b, has_bias, slope, has_relu,
                                 x_norm, y, in_place)


@njit(cache=True, nogil=True, error_model="numpy")
def _product_sums(dy, y, x_norm, base, n, a, has_scale, slope, has_relu, g0, g1, g2, g3):
    # One plane's four products in the work rows: g (the bias's gradient), g * x_norm (the
    # scale's), x_norm * dxn and dxn (BatchNorm's), g the ReLU's gradient and dxn = g * scale
    # the BatchNorm top's -- one loop each, so that each vectorises.
    for k in range(n):
        g = dy[base + k]
        g0[k] = relu_grad(g, y[base + k], slope) if has_relu else g
    for k in range(n):
        g1[k] = g0[k] * x_norm[base + k]
    for k in range(n):
        g3[k] = g0[k] * a if has_scale else g0[k]
    for k in range(n):
        g2[k] = x_norm[base + k] * g3[k]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _gradient(g, yv, xn, a, has_scale, slope, has_relu, dot, total, factor, batch, s):
    # One element of the bottom's gradient from the top's ``g``.
    if has_relu:
        g = relu_grad(g, yv, slope)
    d = g * a if has_scale else g
    if batch:
        v = xn * dot
        v = total + v
        v = v * factor
        v = v + d
        return v / s
    return d / s


@njit(cache=True, nogil=True, error_model="numpy")
def _gradient_plane(dy, y, x_norm, base, n, a, has_scale, slope, has_relu, dot, total, factor,
                    batch, s, dx, in_place):
    # One plane of ``dx``; in place (``dx`` is ``dy``) stored into ``dy`` itself, which LLVM
    # vectorises (see :func:`_normalize_plane`).
    if in_place:
        for i in range(base, base + n):
            dy[i] = _gradient(dy[i], y[i], x_norm[i], a, has_scale, slope, has_relu, dot,
                              total, factor, batch, s)
    else:
        for i in range(base, base + n):
            dx[i] = _gradient(dy[i], y[i], x_norm[i], a, has_scale, slope, has_relu, dot,
                              total, factor, batch, s)


@njit(cache=True, nogil=True, error_model="numpy")
def _backward_channels(dy, y, x_norm, scale, has_scale, slope, has_relu, factor, batch, std, dx,
                       in_place, out, work, flat_work, outer, C, inner, group, t, parts):
    # Group by group of ``group`` channels: each plane's four products (this thread's rows of
    # ``work`` (threads, 4, inner), ``flat_work`` the same memory flat) summed side by side as
    # NumPy would, the sums over items into ``out`` (4, C), then the group's ``dx`` from the
    # cache.
    lo, hi = C * t // parts, C * (t + 1) // parts
    group = max(1, min(group, hi - lo))
    values = numpy.empty(4 * PAIRWISE_DEPTH, f32)
    frames = numpy.empty((PAIRWISE_DEPTH, 3), numpy.int64)
    sums = numpy.empty(4 * group * outer, f32)
    four = numpy.empty(4, f32)
    n = numba.uint64(inner)
    g0, g1, g2, g3 = work[t, 0], work[t, 1], work[t, 2], work[t, 3]
    for c0 in range(lo, hi, group):
        c1 = min(hi, c0 + group)
        for k in range(outer):
            for c in range(c0, c1):
                a = scale[c] if has_scale else f32(1)
                _product_sums(dy, y, x_norm, numba.uint64((k * C + c) * inner), n, a,
                              has_scale, slope, has_relu, g0, g1, g2, g3)
                _pairwise(flat_work, t * 4 * inner, inner, inner, 4, four, 0, values, frames)
                for j in range(4):
                    sums[(j * group + c - c0) * outer + k] = f32(0) + four[j]
        for c in range(c0, c1):
            for j in range(4):
                out[j, c] = _over_items(sums, (j * group + c - c0) * outer, outer, C, f32(1),
                                        False, values, frames)
        for k in range(outer):
            for c in range(c0, c1):
                a = scale[c] if has_scale else f32(1)
                _gradient_plane(dy, y, x_norm, numba.uint64((k * C + c) * inner), n, a,
                                has_scale, slope, has_relu, out[2, c], out[3, c], factor, batch,
                                std[c], dx, in_place)


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


def _same(a, b):
    """Whether ``b`` is ``a``'s memory (an in-place pass): the kernels then store into the
    array they read (see :func:`_normalize_plane`)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape)


def _parts(a):
    return None if a.size >= PARALLEL_MIN else 1


def _group(inner):
    """Channels taken together: enough for each item's run of them to be GROUP_FLOATS long."""
    return max(1, GROUP_FLOATS // max(inner, 1))


def _combine(per_plane, outer, C, alpha):
    """Per-plane sums (outer * C,) to per-channel ones as the reference's ``channel_sum``."""
    per_item = per_plane.reshape(outer, C)
    if alpha is not None:
        per_item *= alpha
    return per_item.sum(axis=0, dtype=f32)


def channel_sum(x, alpha, team):
    """As :func:`..reference.channelwise.channel_sum`, the same bits."""
    outer, C, inner = x.shape
    out = numpy.empty(outer * C, f32)
    team.run(_plane_sums, _flat(x), out, inner, parts=_parts(x))
    return _combine(out, outer, C, alpha)


def batch_norm_forward(x, mean, std, x_norm, y, scale, bias, slope, team):
    """As :func:`..reference.channelwise.batch_norm_forward`, in one pass."""
    _, C, inner = x.shape
    team.run(_normalize_affine, _flat(x), mean, std, scale if scale is not None else mean,
             scale is not None, bias if bias is not None else mean, bias is not None,
             f32(slope if slope is not None else 0), slope is not None, _flat(x_norm), _flat(y),
             _same(x, y), C, inner, parts=_parts(x))


def batch_norm_stats_forward(x, inv, eps, x_norm, y, std, scale, bias, slope, team):
    """As :func:`..reference.channelwise.batch_norm_stats_forward`, the same bits: channel by
    channel, each thread its share of the channels, so that of the three reads of a channel's
    planes (sums, centered squares, output) only the first comes from memory.

    ``x``, ``x_norm``, ``y``: (N, C, inner) float32, C-contiguous (``y`` may be ``x``); ``std``
    a (C,) float32 vector written; ``scale``/``bias`` (C,) or None, ``slope`` a float or None.
    Returns ``(mean, var)``, (C,) float32 each."""
    outer, C, inner = x.shape
    mean, var = numpy.empty(C, f32), numpy.empty(C, f32)
    team.run(_stats_normalize, _flat(x), f32(inv), f32(eps),
             scale if scale is not None else mean, scale is not None,
             bias if bias is not None else mean, bias is not None,
             f32(slope if slope is not None else 0), slope is not None, _flat(x_norm), _flat(y),
             _same(x, y), mean, var, std, outer, C, inner, _group(inner), parts=_parts(x))
    return mean, var


def batch_norm_backward(dy, x_norm, std, dx, factor, scale, y, slope, team):
    """As :func:`..reference.channelwise.batch_norm_backward`, the same bits: channel by
    channel (each thread its share), the sums of each plane's products (in a per-thread work
    area, summed as NumPy would), the channel's sums over items, then its ``dx`` while its
    planes are still in the cache."""
    outer, C, inner = dy.shape
    has_scale, has_relu = scale is not None, slope is not None
    batch = factor is not None
    out = numpy.empty((4, C), f32)
    work = numpy.empty((team.threads, 4, inner), f32)
    team.run(_backward_channels, _flat(dy), _flat(y if has_relu else dy), _flat(x_norm),
             scale if has_scale else std, has_scale, f32(slope if has_relu else 0), has_relu,
             f32(factor if batch else 0), batch, std, _flat(dx), _same(dy, dx), out, work,
             work.reshape(-1),
             outer, C, inner, _group(inner), parts=_parts(dy))
    return out[0], (out[1] if has_scale else None)


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
