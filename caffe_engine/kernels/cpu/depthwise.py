"""Depthwise 2-D convolution on the CPU, in Numba: a direct kernel for ``group == channels ==
num_output`` (MobileNet's 3x3 convolutions, Caffe's depthwise-as-group convolution).

Caffe runs such a layer as ``group`` matrix products of one row each (src/caffe/layers/
base_conv_layer.cpp: ``conv_im2col`` then one GEMM per group), so each product multiplies a
1 x (kh kw) row by a (kh kw) x (OH OW) column matrix: an im2col copy of the input per product,
and a GEMM too thin to use a register tile. The layer is memory-bound (2 kh kw FLOPs per output
against one input read), so it is computed here directly, a plane at a time: the padded plane
split into its stride phases, and each tap one fused multiply-add of the whole plane's outputs
in "wide" order (:mod:`.simd`'s ``axpy`` and ``mul_add_into`` over ``OH x Wq`` floats); the
weight gradient of long rows row by row.

Every kernel is split between the team's threads by planes (image, channel); the weight
gradient by channels, so no two threads write the same weight. Summation order: the forward sums
the taps (row by row of the kernel) and then adds the bias, as the reference's product then bias;
the weight gradient sums each image's positions (in per-column partial sums, then across them)
and adds image by image, Caffe's order of images. The results equal the reference kernels' within
float32 rounding of the sums (``tests/kernels/test_cpu_vs_reference.py``).

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


@njit(cache=True, nogil=True, inline="always")
def _columns(off, stride, width, count):
    """The output columns ``ow`` in [0, count) whose input column ``ow stride + off`` lies in
    [0, width): (first, end)."""
    first = 0 if off >= 0 else (-off + stride - 1) // stride
    end = (width - 1 - off) // stride + 1 if width - 1 - off >= 0 else 0
    return first, min(max(end, first), count)


@njit(cache=True, nogil=True, error_model="numpy")
def weight_grad(x, dy, dwt, N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, t, parts):
    """``dwt +=`` the gradient with respect to the weights, channels of part ``t``."""
    partial = numpy.empty(OW, f32)
    for c in range(C * t // parts, C * (t + 1) // parts):
        wb = c * kh * kw
        for n in range(N):
            p = n * C + c
            xb, yb = p * H * W, p * OH * OW
            for i in range(kh):
                for j in range(kw):
                    off = j * dw - pw
                    first, end = _columns(off, sw, W, OW)
                    for ow in range(OW):
                        partial[ow] = f32(0)
                    for oh in range(OH):
                        ih = oh * sh - ph + i * dh
                        if ih < 0 or ih >= H:
                            continue
                        src, row = xb + ih * W, yb + oh * OW
                        if sw == 1:
                            simd.mul_add_into(partial, first, dy, row + first, x,
                                              src + first + off, end - first)
                        else:
                            for ow in range(first, end):
                                partial[ow] += dy[row + ow] * x[src + ow * sw + off]
                    dwt[wb + i * kw + j] += simd.total(partial, first, end - first)


# ------------------------------------------------------------------------------------------------
# Whole planes at a time ("wide" layout): any stride, short rows
# ------------------------------------------------------------------------------------------------
# A plane's zero-padded input is split into its stride phases, each phase a plane of Hq x Wq
# floats (phase (a, b) holds padded rows a, a + sh, ... and columns b, b + sw, ...). Tap (i, j)
# then reads phase (i dh % sh, j dw % sw) shifted by (i dh // sh, j dw // sw), and the outputs in
# "wide" order (row stride Wq, columns past OW unused) are one fused multiply-add of OH Wq floats
# per tap: a few long vector loops a plane instead of a short one per output row and tap.


def wide_shape(shape):
    """(Hq, Wq, plane floats with slack) of a geometry's ``shape`` tuple (see DepthwisePlan)."""
    H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw = shape
    Hq = -(-(H + 2 * ph) // sh)
    Wq = -(-(W + 2 * pw) // sw)
    rows = max(Hq, OH + (dh * (kh - 1)) // sh)
    return Hq, Wq, (rows + 1) * Wq + (dw * (kw - 1)) // sw + 16


@njit(cache=True, nogil=True, error_model="numpy")
def _phases(src, s0, dst, H, W, ph, pw, sh, sw, Hq, Wq, phase):
    """Plane ``src[s0:]`` (H, W) zero-padded and split into its sh x sw phases in ``dst``
    (each ``phase`` floats apart; everything else in ``dst`` zero)."""
    dst[:] = f32(0)
    if sh == 1 and sw == 1:
        for r in range(H):
            simd.copy(dst, (r + ph) * Wq + pw, src, s0 + r * W, W)
        return
    for r in range(H):
        pr = r + ph
        a, q = pr % sh, pr // sh
        for b in range(sw):
            c0 = (b - pw) % sw          # the first column of phase b
            if c0 < W:
                at = (a * sw + b) * phase + q * Wq + (c0 + pw) // sw
                # + -0.0 keeps every value's bits
                simd.gather_plus(dst, at, src, s0 + r * W + c0, sw, (W - 1 - c0) // sw + 1,
                                 f32(-0.0))


@njit(cache=True, nogil=True, inline="always")
def _tap(i, j, dh, dw, sh, sw, phase, Wq):
    """Where tap (i, j) starts reading in the phases: phase (i dh % sh, j dw % sw), shifted by
    (i dh // sh, j dw // sw)."""
    ri, cj = i * dh, j * dw
    return ((ri % sh) * sw + cj % sw) * phase + (ri // sh) * Wq + cj // sw


@njit(cache=True, nogil=True, error_model="numpy")
def wide_forward(x, w, bias, has_bias, y, planes, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh,
                 dw, Hq, Wq, floats, work, t, parts):
    """``y`` = the depthwise correlation of ``x`` with ``w`` (+ ``bias``), planes of part
    ``t``: per output, the taps summed row by row of the kernel from 0, then the bias."""
    phase = floats
    xq = work[t, 0]
    yw = work[t, 1]
    n = OH * Wq
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        _phases(x, p * H * W, xq, H, W, ph, pw, sh, sw, Hq, Wq, phase)
        simd.fill(yw, 0, n, f32(0))
        for i in range(kh):
            for j in range(kw):
                at = _tap(i, j, dh, dw, sh, sw, phase, Wq)
                simd.axpy(yw, 0, xq, at, n, w[(c * kh + i) * kw + j])
        b = bias[c] if has_bias else f32(0)
        for oh in range(OH):
            if has_bias:
                simd.copy_plus(y, (p * OH + oh) * OW, yw, oh * Wq, OW, b)
            else:
                simd.copy(y, (p * OH + oh) * OW, yw, oh * Wq, OW)


@njit(cache=True, nogil=True, error_model="numpy")
def wide_backward_data(dy, w, dx, planes, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, Hq,
                       Wq, floats, work, t, parts):
    """``dx`` = the gradient with respect to the input (overwritten), planes of part ``t``:
    each tap adds its multiple of the wide top diff into the phases of the padded input's
    gradient, which are then read back unpadded."""
    phase = floats
    dq = work[t, 0]
    dyw = work[t, 1]
    n = OH * Wq
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        simd.fill(dyw, 0, n, f32(0))
        for oh in range(OH):
            simd.copy(dyw, oh * Wq, dy, (p * OH + oh) * OW, OW)
        dq[:] = f32(0)
        for i in range(kh):
            for j in range(kw):
                at = _tap(i, j, dh, dw, sh, sw, phase, Wq)
                simd.axpy(dq, at, dyw, 0, n, w[(c * kh + i) * kw + j])
        base = p * H * W
        for r in range(H):
            pr = r + ph
            a, q = pr % sh, pr // sh
            if sh == 1 and sw == 1:
                simd.copy(dx, base + r * W, dq, pr * Wq + pw, W)
                continue
            for b in range(sw):
                c0 = (b - pw) % sw
                if c0 < W:
                    at = (a * sw + b) * phase + q * Wq + (c0 + pw) // sw
                    simd.scatter_copy(dx, base + r * W + c0, sw, dq, at,
                                      (W - 1 - c0) // sw + 1)


@njit(cache=True, nogil=True, error_model="numpy")
def wide_weight_grad(x, dy, dwt, N, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, Hq, Wq,
                     floats, work, t, parts):
    """``dwt +=`` the gradient with respect to the weights, channels of part ``t``: each
    tap's products over an image's positions summed (:func:`simd.total`), image by image
    (Caffe's order of images)."""
    phase = floats
    xq = work[t, 0]
    dyw = work[t, 1]
    partial = work[t, 2]
    n = OH * Wq
    for c in range(C * t // parts, C * (t + 1) // parts):
        for img in range(N):
            p = img * C + c
            _phases(x, p * H * W, xq, H, W, ph, pw, sh, sw, Hq, Wq, phase)
            simd.fill(dyw, 0, n, f32(0))
            for oh in range(OH):
                simd.copy(dyw, oh * Wq, dy, (p * OH + oh) * OW, OW)
            for i in range(kh):
                for j in range(kw):
                    at = _tap(i, j, dh, dw, sh, sw, phase, Wq)
                    simd.fill(partial, 0, n, f32(0))
                    simd.mul_add_into(partial, 0, dyw, 0, xq, at, n)
                    dwt[(c * kh + i) * kw + j] += simd.total(partial, 0, n)


class DepthwisePlan:
    """The CPU kernels of one depthwise 2-D convolution (:func:`is_depthwise` geometry), with
    the interface of :class:`..reference.conv.ConvPlan`: ``forward`` and ``backward_data``
    overwrite, ``weight_grad`` and ``bias_grad`` accumulate.

    Whole planes in the wide layout (:func:`wide_forward`, ...), except the weight gradient of
    stride-1 rows of 64 or more, row by row (:func:`weight_grad`). Measured on MobileNet's
    layers at batch 32 (forward / data gradient / weight gradient, ms), against the kernels
    before (row kernels for stride-1 rows of a vector or more, else the grouped GEMM plan):
    32x112x112 10.8/12.7/9.3 -> 6.7/6.0/9.3, 128x56x56 14.3/14.1/12.9 -> 5.7/5.7/11.4,
    256x28x28 11.3/10.6/7.7 -> 3.0/3.6/6.9, 512x14x14 6.9/6.9/9.8 -> 2.9/2.7/5.3, 1024x7x7
    14.6/14.1/11.4 -> 2.1/2.2/6.1; stride 2: 64x112x112 20.2/19.9/27.8 -> 16.0/14.6/18.2,
    128x56x56 11.6/12.9/16.8 -> 10.7/8.4/12.6."""

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
        self.Hq, self.Wq, self.floats = wide_shape(self.shape)
        self.work = numpy.zeros((team.threads, 3, sh * sw * self.floats), f32)

    def _wide(self):
        return self.Hq, self.Wq, self.floats, self.work

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: no bias)."""
        w = w.reshape(-1)
        self.team.run(wide_forward, x.reshape(-1), w, bias if bias is not None else w,
                      bias is not None, y.reshape(-1), self.N * self.C, self.C, *self.shape,
                      *self._wide(), parts=self.parts)

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        self.team.run(wide_backward_data, dy.reshape(-1), w.reshape(-1), dx.reshape(-1),
                      self.N * self.C, self.C, *self.shape, *self._wide(), parts=self.parts)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights."""
        if self.wide_weight_grad:
            self.team.run(wide_weight_grad, x.reshape(-1), dy.reshape(-1), dw.reshape(-1),
                          self.N, self.C, *self.shape, *self._wide(), parts=self.channel_parts)
            return
        self.team.run(weight_grad, x.reshape(-1), dy.reshape(-1), dw.reshape(-1), self.N,
                      self.C, *self.shape, parts=self.channel_parts)

    def bias_grad(self, dy, db):
        """``db += dy`` summed over images and positions (the general kernel's)."""
        OH, OW = self.shape[2:4]
        self.team.run(conv.bias_grad, dy.reshape(-1), db, self.N, self.C, OH * OW)
