"""Depthwise 2-D convolution on the CPU, in Numba: a direct kernel for ``group == channels ==
num_output`` (MobileNet's 3x3 convolutions, Caffe's depthwise-as-group convolution).

Caffe runs such a layer as ``group`` matrix products of one row each (src/caffe/layers/
base_conv_layer.cpp: ``conv_im2col`` then one GEMM per group), so each product multiplies a
1 x (kh kw) row by a (kh kw) x (OH OW) column matrix: an im2col copy of the input per product,
and a GEMM too thin to use a register tile. The layer is memory-bound (2 kh kw FLOPs per output
against one input read), so it is computed here directly, a plane at a time: the padded plane
split into its stride phases (stride 2 by vector shuffles, :func:`simd.deinterleave`), and every
output's taps summed in registers, a vector of outputs at a time (:func:`simd.taps_rows`: one
load and one fused multiply-add a tap, one store an output). The data gradient is the same
kernel read backwards: each float of the padded input's gradient gathers the taps of its phase
over the top diff (laid out with zeros around it), written once, instead of each tap adding its
multiple of the top diff into the gradient; the weight gradient is one shifted dot product a
tap over the plane (:func:`simd.dot_taps_rows`).

Every kernel is split between the team's threads by planes (image, channel); the weight
gradient by channels, so no two threads write the same weight (images outer, so that each
thread streams its planes in memory order). Summation order: the forward sums the taps (row by
row of the kernel, fused multiply-adds from +0) and then adds the bias, as the reference's product
then bias; the data gradient sums, for each input, the taps that read it in the same order (the
same operations, bit for bit, as adding tap by tap); the weight gradient sums each image's
positions (in per-vector-lane partial sums, then pairwise) and adds image by image, Caffe's order
of images. The results equal the reference kernels' within float32 rounding of the sums
(``tests/kernels/test_cpu_vs_reference.py``, ``tests/kernels/test_cpu_depthwise.py``), and
do not depend on the number of threads.

Scratch: each thread's buffers are made once, by the plan; the zero padding around a plane is
written once a call (every plane writes the same places).

Arrays: ``x``/``dx`` (N, C, H, W), ``y``/``dy`` (N, C, OH, OW), ``w``/``dw`` (C, 1, kh, kw),
``bias``/``db`` (C,); float32, C-contiguous, passed flat.
"""
import numpy
from numba import njit

from . import conv, simd

f32 = numpy.float32
#: Kernels whose output has fewer floats run on the caller's thread alone.
PARALLEL_MIN = 1 << 14


def is_depthwise(geometry):
    """Whether a 2-D convolution is depthwise (one input and one output channel a group)."""
    g = geometry
    return (len(g.kernel) == 2 and g.group > 1 and g.channels == g.group
            and g.num_output == g.group)


# ------------------------------------------------------------------------------------------------
# Whole planes at a time ("wide" layout): any stride, short rows
# ------------------------------------------------------------------------------------------------
# A plane's zero-padded input is split into its stride phases, each phase a plane of Hq x Wq
# floats (phase (a, b) holds padded rows a, a + sh, ... and columns b, b + sw, ...). Tap (i, j)
# then reads phase (i dh % sh, j dw % sw) shifted by (i dh // sh, j dw // sw): output (oh, ow)
# reads the phases at oh Wq + ow plus the tap's place, the same table of places for every output.


def wide_shape(shape):
    """(Hq, Wq, plane floats with slack) of a geometry's ``shape`` tuple (see DepthwisePlan)."""
    H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw = shape
    Hq = -(-(H + 2 * ph) // sh)
    Wq = -(-(W + 2 * pw) // sw)
    rows = max(Hq, OH + (dh * (kh - 1)) // sh)
    return Hq, Wq, (rows + 1) * Wq + (dw * (kw - 1)) // sw + 16


@njit(cache=True, nogil=True, error_model="numpy")
def _phases(src, s0, dst, H, W, ph, pw, sh, sw, Wq, phase):
    """Plane ``src[s0:]`` (H, W) split into the sh x sw phases of its zero padding in ``dst``
    (each ``phase`` floats apart). Writes the plane's floats only: the padding's places, the same
    for every plane, are zeroed once by the caller."""
    if sh == 1 and sw == 1:
        for r in range(H):
            simd.copy(dst, (r + ph) * Wq + pw, src, s0 + r * W, W)
        return
    for r in range(H):
        pr = r + ph
        a, q = pr % sh, pr // sh
        if sw == 2:     # the even columns to phase (a, pw % 2), the odd ones to the other
            row = q * Wq + a * 2 * phase
            simd.deinterleave(dst, row + (pw % 2) * phase + pw // 2,
                              dst, row + (1 - pw % 2) * phase + (pw + 1) // 2, src, s0 + r * W,
                              W)
            continue
        for b in range(sw):
            c0 = (b - pw) % sw          # the first column of phase b
            if c0 < W:
                at = (a * sw + b) * phase + q * Wq + (c0 + pw) // sw
                # + -0.0 keeps every value's bits
                simd.gather_plus(dst, at, src, s0 + r * W + c0, sw, (W - 1 - c0) // sw + 1,
                                 f32(-0.0))


def forward_taps(shape, floats):
    """Where each tap (i, j), row by row of the kernel, starts reading in the phases: phase
    (i dh % sh, j dw % sw), shifted by (i dh // sh, j dw // sw); int64 (kh kw,)."""
    H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw = shape
    Wq = wide_shape(shape)[1]
    return numpy.array([((i * dh % sh) * sw + j * dw % sw) * floats + (i * dh // sh) * Wq
                        + j * dw // sw for i in range(kh) for j in range(kw)], numpy.int64)


@njit(cache=True, nogil=True, error_model="numpy")
def wide_forward(x, w, bias, has_bias, y, planes, C, H, W, OH, OW, k, sh, sw, ph, pw, Wq,
                 floats, offs, unit3, work, t, parts):
    """``y`` = the depthwise correlation of ``x`` with ``w`` (+ ``bias``), planes of part
    ``t``: per output, the taps (``offs``: their places in the phases) summed row by row of
    the kernel from 0 in registers (:func:`simd.taps_rows`; ``unit3``: a 3x3 kernel of unit
    stride and dilation, :func:`simd.taps3x3_rows`, the same sums), then the bias."""
    first, end = planes * t // parts, planes * (t + 1) // parts
    if first == end:
        return
    xq = work[t]
    simd.fill(xq[0], 0, sh * sw * floats, f32(0))
    simd.fill(xq[1], 0, sh * sw * floats, f32(0))
    _phases(x, first * H * W, xq[0], H, W, ph, pw, sh, sw, Wq, floats)
    for p in range(first, end):
        # the next plane's phases go to the other buffer before this plane's taps read theirs
        if p + 1 < end:
            _phases(x, (p + 1) * H * W, xq[(p + 1 - first) % 2], H, W, ph, pw, sh, sw, Wq,
                    floats)
        c = p % C
        b = bias[c] if has_bias else f32(0)
        if unit3:
            simd.taps3x3_rows(y, p * OH * OW, OW, xq[(p - first) % 2], 0, Wq, OH, OW, w,
                              c * k, b, has_bias)
        else:
            simd.taps_rows(y, p * OH * OW, OW, xq[(p - first) % 2], 0, Wq, OH, OW, offs, 0,
                           w, c * k, k, b, has_bias)


@njit(cache=True, nogil=True, error_model="numpy")
def wide_backward_data(dy, w, dx, planes, C, H, W, OH, OW, k, sh, sw, ph, pw, Hq, Wq, floats,
                       lead, order, shifts, starts, unit3, work, t, parts):
    """``dx`` = the gradient with respect to the input (overwritten), planes of part ``t``.

    Each float of the padded input's gradient (in its phase) is the sum from 0, in the taps'
    order, of the taps of its phase (``order[starts[f]:starts[f + 1]]``) times the top diff
    ``shifts`` back (the top diff laid wide after ``lead`` zeros, zeros around it), summed in
    registers (:func:`simd.taps_rows`): the same fused multiply-adds, in the same order, as
    adding each tap's multiple of the top diff into the phases. Stride 1 writes ``dx`` at
    once (``unit3``: :func:`simd.taps3x3_rows_back`); other strides fill the phases and read
    them back unpadded."""
    dq = work[t, 0]
    dyz = work[t, 1]
    wsel = work[t, 2]
    simd.fill(dyz, 0, dyz.size, f32(0))
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        for oh in range(OH):
            simd.copy(dyz, lead + oh * Wq, dy, (p * OH + oh) * OW, OW)
        for m in range(k):
            wsel[m] = w[c * k + order[m]]
        base = p * H * W
        if unit3:
            simd.taps3x3_rows_back(dx, base, W, dyz, lead + ph * Wq + pw, Wq, H, W, wsel, 0,
                                   f32(0), False)
            continue
        if sh == 1 and sw == 1:
            simd.taps_rows(dx, base, W, dyz, lead + ph * Wq + pw, Wq, H, W, shifts, 0, wsel,
                           0, k, f32(0), False)
            continue
        for f in range(sh * sw):
            simd.taps_rows(dq, f * floats, Wq, dyz, lead, Wq, Hq, Wq, shifts, starts[f], wsel,
                           starts[f], starts[f + 1] - starts[f], f32(0), False)
        for r in range(H):
            pr = r + ph
            a, q = pr % sh, pr // sh
            if sw == 2:
                row = q * Wq + a * 2 * floats
                simd.interleave(dx, base + r * W, dq, row + (pw % 2) * floats + pw // 2,
                                dq, row + (1 - pw % 2) * floats + (pw + 1) // 2, W)
                continue
            for b in range(sw):
                c0 = (b - pw) % sw
                if c0 < W:
                    at = (a * sw + b) * floats + q * Wq + (c0 + pw) // sw
                    simd.scatter_copy(dx, base + r * W + c0, sw, dq, at,
                                      (W - 1 - c0) // sw + 1)


#: Output rows of a row-by-row weight gradient's strip (its x and top diff stay in cache
#: across the taps).
STRIP = 8


@njit(cache=True, nogil=True, error_model="numpy")
def wide_weight_grad(x, dy, dwt, N, C, H, W, OH, OW, k, sh, sw, ph, pw, Wq, floats, offs,
                     wide, work, t, parts):
    """``dwt +=`` the gradient with respect to the weights, channels of part ``t``: each
    tap's products over an image's positions summed (:func:`simd.dot_taps_rows`; ``wide``:
    over the top diff laid wide, else row by row in strips of :data:`STRIP` rows), image by
    image (Caffe's order of images)."""
    xq = work[t, 0]
    dyw = work[t, 1]
    part = work[t, 2]
    n = OH * Wq
    simd.fill(xq, 0, sh * sw * floats, f32(0))
    simd.fill(dyw, 0, dyw.size, f32(0))
    for img in range(N):                # images in order for each channel; planes in memory order
        for c in range(C * t // parts, C * (t + 1) // parts):
            p = img * C + c
            _phases(x, p * H * W, xq, H, W, ph, pw, sh, sw, Wq, floats)
            if wide:
                for oh in range(OH):
                    simd.copy(dyw, oh * Wq, dy, (p * OH + oh) * OW, OW)
                simd.dot_taps_rows(dyw, 0, n, xq, 0, n, 1, n, offs, 0, k, part, 0)
            else:
                for r0 in range(0, OH, STRIP):
                    simd.dot_taps_rows(dy, (p * OH + r0) * OW, OW, xq, r0 * Wq, Wq,
                                       min(STRIP, OH - r0), OW, offs, 0, k, part, k)
                    for m in range(k):
                        part[m] = part[k + m] if r0 == 0 else part[m] + part[k + m]
            for m in range(k):
                dwt[c * k + m] += part[m]


def backward_taps(shape, floats):
    """The data gradient's tables (see :func:`wide_backward_data`): ``(lead, order, shifts,
    starts)``: the taps grouped by phase (in the taps' order within each), each one's shift
    in its phase (negated), where each phase's taps start, and the zeros before the top diff."""
    H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw = shape
    Wq = wide_shape(shape)[1]
    taps = [(i * kw + j, ((i * dh) % sh) * sw + (j * dw) % sw,
             ((i * dh) // sh) * Wq + (j * dw) // sw) for i in range(kh) for j in range(kw)]
    taps.sort(key=lambda tap: tap[1])      # stable: the taps' order within a phase
    starts = numpy.searchsorted([tap[1] for tap in taps], numpy.arange(sh * sw + 1))
    lead = max(tap[2] for tap in taps)
    return (lead, numpy.array([tap[0] for tap in taps], numpy.int64),
            numpy.array([-tap[2] for tap in taps], numpy.int64), starts.astype(numpy.int64))


class DepthwisePlan:
    """The CPU kernels of one depthwise 2-D convolution (:func:`is_depthwise` geometry), with
    the interface of :class:`..reference.conv.ConvPlan`: ``forward`` and ``backward_data``
    overwrite, ``weight_grad`` and ``bias_grad`` accumulate.

    Whole planes (:func:`wide_forward`, ...), the weight gradient of stride-1 rows of 64 or
    more row by row (``wide_weight_grad`` False). Scratch: three buffers a thread, made here.
    Measured on MobileNet's layers at batch 32, one thread, CPU ms (forward / data gradient /
    weight gradient), best of 20 in alternating processes on a shared 2-core AVX-512 VM,
    against the kernels before (an axpy a tap, gathers and scatters for stride 2): 32x112x112
    11.1/11.1/15.0 -> 6.5/6.2/9.2, 128x56x56 10.0/10.1/21.4 -> 6.4/6.2/7.7, 256x28x28
    5.4/6.6/13.3 -> 2.7/2.4/3.3, 512x14x14 5.0/5.6/9.9 -> 1.5/1.9/2.8, 1024x7x7 3.9/4.6/10.9
    -> 1.4/1.4/2.0; stride 2: 64x112x112 30.8/27.9/34.8 -> 9.3/8.8/9.9, 128x56x56
    17.8/14.8/22.5 -> 3.7/3.3/4.0, 256x28x28 10.7/9.0/14.6 -> 4.2/3.4/4.1, 512x14x14
    6.9/7.1/13.7 -> 1.7/2.2/1.9. A training iteration's depthwise layers: forward 121 -> 43,
    backward 315 -> 100."""

    #: the data gradient reads ``dy`` while it writes ``dx``: never in one memory
    backward_data_in_place = False

    def __init__(self, geometry, team):
        g = self.geometry = geometry
        self.team = team
        self.N, self.C = g.num, g.channels
        (H, W), (OH, OW) = g.in_spatial, g.out_spatial
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.pad, g.dilation
        self.shape = (H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw)
        self.parts = None if self.N * self.C * OH * OW >= PARALLEL_MIN else 1
        self.channel_parts = min(self.C, team.threads) if self.parts is None else 1
        self.wide_weight_grad = not (sh == 1 and sw == 1 and OW >= 64)
        self.unit3 = (kh, kw, sh, sw, dh, dw) == (3, 3, 1, 1, 1, 1)
        self.Hq, self.Wq, self.floats = wide_shape(self.shape)
        self.offs = forward_taps(self.shape, self.floats)
        self.lead, self.order, self.shifts, self.starts = backward_taps(self.shape,
                                                                          self.floats)
        size = max(sh * sw * self.floats, 2 * kh * kw,
                   self.lead + (max(self.Hq, H + ph, OH) + 2) * self.Wq + 32)
        self.work = numpy.zeros((team.threads, 3, size), f32)

    def _geometry(self):
        """(k, sh, sw, ph, pw), the arguments every kernel takes after the plane sizes."""
        H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw = self.shape
        return kh * kw, sh, sw, ph, pw

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: no bias)."""
        w = w.reshape(-1)
        self.team.run(wide_forward, x.reshape(-1), w, bias if bias is not None else w,
                      bias is not None, y.reshape(-1), self.N * self.C, self.C,
                      *self.shape[:4], *self._geometry(), self.Wq, self.floats, self.offs,
                      self.unit3, self.work, parts=self.parts)

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        self.team.run(wide_backward_data, dy.reshape(-1), w.reshape(-1), dx.reshape(-1),
                      self.N * self.C, self.C, *self.shape[:4], *self._geometry(), self.Hq,
                      self.Wq, self.floats, self.lead, self.order, self.shifts, self.starts,
                      self.unit3, self.work, parts=self.parts)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights."""
        self.team.run(wide_weight_grad, x.reshape(-1), dy.reshape(-1), dw.reshape(-1),
                      self.N, self.C, *self.shape[:4], *self._geometry(), self.Wq, self.floats,
                      self.offs, self.wide_weight_grad, self.work, parts=self.channel_parts)

    def bias_grad(self, dy, db):
        """``db += dy`` summed over images and positions (the general kernel's)."""
        OH, OW = self.shape[2:4]
        self.team.run(conv.bias_grad, dy.reshape(-1), db, self.N, self.C, OH * OW)
