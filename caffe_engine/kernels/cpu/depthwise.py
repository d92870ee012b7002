"""Depthwise 2-D convolution on the CPU, in Numba: a direct kernel for ``group == channels ==
num_output`` (MobileNet's 3x3 convolutions, Caffe's depthwise-as-group convolution).

Caffe runs such a layer as ``group`` matrix products of one row each (src/caffe/layers/
base_conv_layer.cpp: ``conv_im2col`` then one GEMM per group), so each product multiplies a
1 x (kh kw) row by a (kh kw) x (OH OW) column matrix: an im2col copy of the input per product,
and a GEMM too thin to use a register tile. The layer is memory-bound (2 kh kw FLOPs per output
against one input read), so it is computed here directly: each output row accumulates one
shifted input row per tap, in fused multiply-adds of whole vectors for stride 1 (:mod:`.simd`'s
``axpy`` and ``mul_add_into``), element by element for other strides.

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
def forward(x, w, bias, has_bias, y, planes, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw,
            t, parts):
    """``y`` = the depthwise correlation of ``x`` with ``w`` (+ ``bias``), planes of part ``t``."""
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        xb, yb, wb = p * H * W, p * OH * OW, c * kh * kw
        for oh in range(OH):
            row = yb + oh * OW
            for ow in range(OW):
                y[row + ow] = f32(0)
            for i in range(kh):
                ih = oh * sh - ph + i * dh
                if ih < 0 or ih >= H:
                    continue
                src = xb + ih * W
                for j in range(kw):
                    off = j * dw - pw
                    first, end = _columns(off, sw, W, OW)
                    tap = w[wb + i * kw + j]
                    if sw == 1:
                        simd.axpy(y, row + first, x, src + first + off, end - first, tap)
                    else:
                        for ow in range(first, end):
                            y[row + ow] += tap * x[src + ow * sw + off]
            if has_bias:
                b = bias[c]
                for ow in range(OW):
                    y[row + ow] += b


@njit(cache=True, nogil=True, error_model="numpy")
def backward_data(dy, w, dx, planes, C, H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw, t, parts):
    """``dx`` = the gradient with respect to the input (overwritten), planes of part ``t``."""
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        c = p % C
        xb, yb, wb = p * H * W, p * OH * OW, c * kh * kw
        for k in range(H * W):
            dx[xb + k] = f32(0)
        for oh in range(OH):
            row = yb + oh * OW
            for i in range(kh):
                ih = oh * sh - ph + i * dh
                if ih < 0 or ih >= H:
                    continue
                dst = xb + ih * W
                for j in range(kw):
                    off = j * dw - pw
                    first, end = _columns(off, sw, W, OW)
                    tap = w[wb + i * kw + j]
                    if sw == 1:
                        simd.axpy(dx, dst + first + off, dy, row + first, end - first, tap)
                    else:
                        for ow in range(first, end):
                            dx[dst + ow * sw + off] += tap * dy[row + ow]


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


class DepthwisePlan:
    """The CPU kernels of one depthwise 2-D convolution (:func:`is_depthwise` geometry), with
    the interface of :class:`..reference.conv.ConvPlan`: ``forward`` and ``backward_data``
    overwrite, ``weight_grad`` and ``bias_grad`` accumulate.

    The weight gradient is always this module's. The forward and the data gradient are too
    where rows are whole vectors of unit stride (stride 1, at least one vector of output
    columns); otherwise ``general`` (the grouped :class:`.conv_plan.Conv2dPlan`) runs them, which
    measured faster on short or strided rows (MobileNet's 7x7 and 14x14 planes: equal or up to
    15 % faster; its 112x112 planes: 2x slower than the direct rows)."""

    def __init__(self, geometry, team, general=None):
        g = self.geometry = geometry
        self.team = team
        self.N, self.C = g.num, g.channels
        (H, W), (OH, OW) = g.in_spatial, g.out_spatial
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = g.kernel, g.stride, g.pad, g.dilation
        self.shape = (H, W, OH, OW, kh, kw, sh, sw, ph, pw, dh, dw)
        self.parts = None if self.N * self.C * OH * OW >= PARALLEL_MIN else 1
        self.channel_parts = min(self.C, team.threads) if self.parts is None else 1
        self.rows = sw == 1 and OW >= simd.vector_width()
        self.general = None if self.rows else general()

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: no bias)."""
        if self.general is not None:
            return self.general.forward(x, w, bias, y)
        w = w.reshape(-1)
        self.team.run(forward, x.reshape(-1), w, bias if bias is not None else w,
                      bias is not None, y.reshape(-1), self.N * self.C, self.C, *self.shape,
                      parts=self.parts)

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        if self.general is not None:
            return self.general.backward_data(dy, w, dx)
        self.team.run(backward_data, dy.reshape(-1), w.reshape(-1), dx.reshape(-1),
                      self.N * self.C, self.C, *self.shape, parts=self.parts)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights."""
        self.team.run(weight_grad, x.reshape(-1), dy.reshape(-1), dw.reshape(-1), self.N,
                      self.C, *self.shape, parts=self.channel_parts)

    def bias_grad(self, dy, db):
        """``db += dy`` summed over images and positions (the general kernel's)."""
        OH, OW = self.shape[2:4]
        self.team.run(conv.bias_grad, dy.reshape(-1), db, self.N, self.C, OH * OW)
