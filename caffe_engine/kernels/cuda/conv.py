"""2-D convolution on the device: im2col and col2im kernels around cuBLAS products.

Caffe: src/caffe/util/im2col.cu (the column matrix and its adjoint), src/caffe/layers/
base_conv_layer.cpp/.cu (one GEMM per image and group, the bias as a rank-1 GEMM) and
conv_layer.cu. The arithmetic is Caffe's; what differs is the batching, so that each cuBLAS
call is large and the launches per pass are few (small nets are launch-bound):

* **Chunks of images.** The column matrix of ``nb`` images is laid out as
  (C * kh * kw, nb * P), P = OH * OW (row ``c*kh*kw + i*kw + j``, column ``n*P + p``), so one
  GEMM per group covers the whole chunk: ``(Mg, K) x (K, nb*P)`` forward,
  ``(K, Mg) x (Mg, nb*P)`` backward-data, and ``(Mg, nb*P) x (nb*P, K)`` for the weight
  gradient, which then sums over the chunk's images inside cuBLAS. ``nb`` is the most images
  whose column matrix and one (M, nb*P) matrix fit in :data:`WORKSPACE_BYTES`; one workspace
  array per plan, allocated on first use, holds them (and one (M, K) matrix).
* **Layouts.** The GEMMs see outputs and top diffs as (M, nb, P); a small kernel swaps them
  to and from the blobs' (nb, M, P), adding the bias on the way out. A chunk of one image
  needs no swap: its GEMM reads and writes the blob directly.
* **Groups** are one strided-batched product over the group axis (``xp.matmul`` of 3-D
  arrays), never a loop; 1-group products are 2-D (cuBLAS's transpose flags, no copies).
* **1x1, stride 1, pad 0** forward and backward-data skip im2col: one batched product on the
  input itself, ``(G, Mg, Cg) x (N, G, Cg, P)``.
* **col2im** is a gather: one thread per image element sums the column entries that came
  from it, in kernel-offset order (Caffe's CPU order), so it needs no atomics and is
  deterministic.

Launches per call (``c`` chunks, ``n`` their images; "gemm" = one cuBLAS call; ``+=`` and
copies are one CuPy elementwise kernel each):

=================  ==================================================================
forward            per chunk: im2col, gemm, swap + bias -> 3c (a chunk of one image:
                   im2col, gemm straight into ``y``; the bias one kernel over all of ``y``
                   when every chunk is one image, else over that image)
backward_data      G > 1: one weight-transpose copy; per chunk: swap (``n > 1``), gemm,
                   col2im -> 3c (+1)
weight_grad        per chunk: im2col, swap (G = 1, ``n > 1``) or group pack (G > 1), gemm,
                   ``dw +=`` -> 4c (3c for G = 1, ``n = 1``)
bias_grad          one reduction, one ``+=`` -> 2
1x1 forward        gemm (+ CuPy's pointer-array kernels of a broadcast batched product,
                   3 for G = 1, 6 for G > 1, when N > 1), bias -> 2 (+3/6)
1x1 backward_data  weight transpose, gemm (+3/6 as above) -> 2 (+3/6)
=================  ==================================================================

A LeNet-sized layer (one chunk) thus takes 3 + 3 + 4 + 2 launches per iteration. Memory:
the plans of one kernel set share one :class:`.workspace.DeviceWorkspace` (grown to the
largest plan's need: at most :data:`WORKSPACE_BYTES` plus M * K floats, more only when a
single image's matrices exceed the bound).

Arrays: float32, C-contiguous; ``x`` (N, C, H, W), ``y``/``dy`` (N, M, OH, OW), ``w``
(M, C / G, kh, kw), ``bias``/``db`` (M,). Anything else (another dtype, a strided view) is
handed to the reference plan (:class:`..reference.conv.ConvPlan`), which runs on CuPy too;
so are N-D geometries (:func:`make_plan` returns None). The plan's methods raise ValueError
for an array whose shape is not the geometry's (before any kernel, or the reference's
strided views, could read past it).
"""
import math

import numpy

from ...backend import get_array_module
from ..reference import conv as reference_conv
from .device import int32
from .source import Source
from .workspace import DeviceWorkspace

#: Most bytes one plan's workspace holds for its chunk (the column matrix and one
#: (M, nb * P) matrix); a single image's matrices may exceed it (then chunks of one image).
WORKSPACE_BYTES = 256 << 20

#: Kernel indices are ``int``: tensors of this many elements or more go to the reference plan.
INT_LIMIT = 2 ** 31

SOURCE = Source("conv", r"""
// The column matrix of `images` images of x (images, channels, height, width): entry
// (c*kh*kw + i*kw + j, image n, position p = oh*width_col + ow) at
// col[row * row_stride + n * image_stride + p] is x[n, c, oh*stride_h - pad_h + i*dilation_h,
// ow*stride_w - pad_w + j*dilation_w], 0 in the padding. One thread per (n, c, oh, ow) writes
// its kh*kw entries; consecutive threads write consecutive positions.
extern "C" __global__ void ce_conv_im2col(
    const int n, const float* x, const int channels, const int height, const int width,
    const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
    const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
    const int height_col, const int width_col, const int row_stride, const int image_stride,
    float* col) {
  CE_KERNEL_LOOP(index, n) {
    const int ow = index % width_col;
    int rest = index / width_col;
    const int oh = rest % height_col;
    rest /= height_col;
    const int c = rest % channels;
    const int image = rest / channels;
    const int top = oh * stride_h - pad_h;
    const int left = ow * stride_w - pad_w;
    const float* plane = x + (image * channels + c) * height * width;
    float* out = col + c * kernel_h * kernel_w * row_stride + image * image_stride
                 + oh * width_col + ow;
    for (int i = 0; i < kernel_h; ++i) {
      const int h = top + i * dilation_h;
      const bool row_in = h >= 0 && h < height;
      for (int j = 0; j < kernel_w; ++j) {
        const int w = left + j * dilation_w;
        *out = (row_in && w >= 0 && w < width) ? plane[h * width + w] : 0.0f;
        out += row_stride;
      }
    }
  }
}

// The adjoint of ce_conv_im2col: x[n, c, h, w] = the sum of the column entries taken from
// it, over kernel offsets (i, j) in row-major order. One thread per image element gathers,
// so no two threads write one address.
extern "C" __global__ void ce_conv_col2im(
    const int n, const float* col, const int channels, const int height, const int width,
    const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
    const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
    const int height_col, const int width_col, const int row_stride, const int image_stride,
    float* x) {
  CE_KERNEL_LOOP(index, n) {
    const int w = index % width;
    int rest = index / width;
    const int h = rest % height;
    rest /= height;
    const int c = rest % channels;
    const int image = rest / channels;
    const int hp = h + pad_h;  // the row in the padded image
    const int wp = w + pad_w;
    // Kernel rows whose tap lands on hp from some output row 0 <= oh < height_col:
    // 0 <= hp - i*dilation_h <= (height_col - 1) * stride_h.
    // (no min(): the emulator's host compiler has no device min)
    const int i_top = hp / dilation_h;
    const int i_last = i_top < kernel_h - 1 ? i_top : kernel_h - 1;
    const int h_over = hp - (height_col - 1) * stride_h;
    const int i_first = h_over > 0 ? (h_over + dilation_h - 1) / dilation_h : 0;
    const int j_top = wp / dilation_w;
    const int j_last = j_top < kernel_w - 1 ? j_top : kernel_w - 1;
    const int w_over = wp - (width_col - 1) * stride_w;
    const int j_first = w_over > 0 ? (w_over + dilation_w - 1) / dilation_w : 0;
    const float* base = col + c * kernel_h * kernel_w * row_stride + image * image_stride;
    float sum = 0.0f;
    for (int i = i_first; i <= i_last; ++i) {
      const int hs = hp - i * dilation_h;
      if (hs % stride_h) continue;
      const int oh = hs / stride_h;
      for (int j = j_first; j <= j_last; ++j) {
        const int ws = wp - j * dilation_w;
        if (ws % stride_w) continue;
        sum += base[(i * kernel_w + j) * row_stride + oh * width_col + ws / stride_w];
      }
    }
    x[index] = sum;
  }
}

// out (inner, outer, plane) = in (outer, inner, plane) with its two leading axes swapped,
// plus bias[a] on every element of in's slice a when has_bias. One thread per output element;
// reads and writes run along `plane`.
extern "C" __global__ void ce_conv_swap(
    const int n, const float* in, const int outer, const int inner, const int plane,
    const float* bias, const int has_bias, float* out) {
  CE_KERNEL_LOOP(index, n) {
    const int p = index % plane;
    const int rest = index / plane;
    const int a = rest % outer;
    const int b = rest / outer;
    const float v = in[(a * inner + b) * plane + p];
    out[index] = has_bias ? v + bias[a] : v;
  }
}

// out (groups, images * plane, per_group) = dy (images, groups, per_group, plane) with the
// channel axis moved last: the right-hand side of a grouped weight-gradient product.
extern "C" __global__ void ce_conv_pack_groups(
    const int n, const float* dy, const int images, const int groups, const int per_group,
    const int plane, float* out) {
  CE_KERNEL_LOOP(index, n) {
    const int m = index % per_group;
    int rest = index / per_group;
    const int p = rest % plane;
    rest /= plane;
    const int image = rest % images;
    const int g = rest / images;
    out[index] = dy[((image * groups + g) * per_group + m) * plane + p];
  }
}

// y (images, channels, plane) += bias[channel].
extern "C" __global__ void ce_conv_add_bias(
    const int n, float* y, const int channels, const int plane, const float* bias) {
  CE_KERNEL_LOOP(index, n) {
    y[index] += bias[(index / plane) % channels];
  }
}
""", ("ce_conv_im2col", "ce_conv_col2im", "ce_conv_swap", "ce_conv_pack_groups",
      "ce_conv_add_bias"))


def _usable(*arrays):
    """Whether every array (None skipped) is float32 and C-contiguous (the kernels' layout)."""
    return all(a is None or (a.dtype == numpy.float32 and a.flags.c_contiguous)
               for a in arrays)


def _window_args(channels, in_hw, kernel, stride, pad, dilation, out_hw):
    return [int32(v) for v in (channels, *in_hw, *kernel, *pad, *stride, *dilation, *out_hw)]


def _launch_im2col(device, x, channels, in_hw, kernel, stride, pad, dilation, out_hw,
                   row_stride, image_stride, col):
    images = x.size // (channels * in_hw[0] * in_hw[1])
    n = images * channels * out_hw[0] * out_hw[1]
    device.launch(SOURCE, "ce_conv_im2col", n, int32(n), x,
                  *_window_args(channels, in_hw, kernel, stride, pad, dilation, out_hw),
                  int32(row_stride), int32(image_stride), col)


def _launch_col2im(device, col, channels, in_hw, kernel, stride, pad, dilation, out_hw,
                   row_stride, image_stride, x):
    n = x.size
    device.launch(SOURCE, "ce_conv_col2im", n, int32(n), col,
                  *_window_args(channels, in_hw, kernel, stride, pad, dilation, out_hw),
                  int32(row_stride), int32(image_stride), x)


def im2col(device, x, kernel, stride, pad, dilation, out_shape):
    """Caffe's column matrix of every image of ``x`` (n, C, H, W), float32: a new
    C-contiguous array (n, C, kh, kw, OH, OW) (the Im2col layer's layout, see
    :func:`..reference.conv.im2col`). Returns None (the caller falls back to the reference
    set) when the convolution is not 2-D, ``x`` is not float32 and C-contiguous, or the
    result has 2**31 elements or more.

    Caffe: src/caffe/util/im2col.cu, ``im2col_gpu_kernel``.
    """
    if len(kernel) != 2 or x.ndim != 4 or not _usable(x):
        return None
    n, channels = x.shape[:2]
    kernel, stride, pad, dilation, out_shape = (tuple(int(v) for v in t) for t in
                                                (kernel, stride, pad, dilation, out_shape))
    positions = out_shape[0] * out_shape[1]
    rows = channels * kernel[0] * kernel[1]
    if n * rows * positions >= INT_LIMIT or x.size >= INT_LIMIT:
        return None
    xp = get_array_module(x)
    col = xp.empty((n, channels) + kernel + out_shape, numpy.float32)
    _launch_im2col(device, x, channels, x.shape[2:], kernel, stride, pad, dilation, out_shape,
                   positions, rows * positions, col)
    return col


def col2im(device, col, in_shape, kernel, stride, pad, dilation):
    """The adjoint of :func:`im2col`: ``col`` (n, C, kh, kw, OH, OW) float32 summed back onto
    a new C-contiguous (n, C, *in_shape) array (each element gathers its entries in
    kernel-offset order). Returns None (reference fallback) when not 2-D, ``col`` is not
    float32 and C-contiguous or its kernel axes are not ``kernel``, or a size reaches 2**31.

    Caffe: src/caffe/util/im2col.cu, ``col2im_gpu_kernel`` (a gather there too).
    """
    if len(kernel) != 2 or col.ndim != 6 or not _usable(col):
        return None
    n, channels = col.shape[:2]
    kernel, stride, pad, dilation, in_shape = (tuple(int(v) for v in t) for t in
                                               (kernel, stride, pad, dilation, in_shape))
    if tuple(col.shape[2:4]) != kernel:
        return None
    out_shape = tuple(col.shape[4:])
    positions = out_shape[0] * out_shape[1]
    rows = channels * kernel[0] * kernel[1]
    if col.size >= INT_LIMIT or n * channels * in_shape[0] * in_shape[1] >= INT_LIMIT:
        return None
    xp = get_array_module(col)
    x = xp.empty((n, channels) + in_shape, numpy.float32)
    _launch_col2im(device, col, channels, in_shape, kernel, stride, pad, dilation, out_shape,
                   positions, rows * positions, x)
    return x


def make_plan(device, geometry, workspace=None):
    """A :class:`ConvPlan` for a 2-D ``geometry`` (a :class:`..geometry.ConvGeometry`), or
    None (the kernel set then uses the reference plan): not 2-D, or a tensor (the input, the
    output, one image's column matrix) of 2**31 elements or more."""
    g = geometry
    if len(g.kernel) != 2:
        return None
    rows = g.channels * g.kernel[0] * g.kernel[1]
    if max(g.num * g.channels * math.prod(g.in_spatial),
           g.num * g.num_output * math.prod(g.out_spatial),
           rows * math.prod(g.out_spatial)) >= INT_LIMIT:
        return None
    return ConvPlan(device, geometry, workspace)


class ConvPlan:
    """One 2-D convolution geometry on ``device`` (a :class:`.device.CupyDevice` or an
    :class:`.emulator.EmulatedDevice`), with the contract of
    :class:`..reference.conv.ConvPlan`: ``forward(x, w, bias, y)`` and
    ``backward_data(dy, w, dx)`` overwrite, ``weight_grad(x, dy, dw)`` and
    ``bias_grad(dy, db)`` accumulate. Shapes as the module docstring; Convolution runs it
    forward and Deconvolution backward (base_conv_layer.cpp's two directions).

    Attributes: ``chunk``, the images per chunk (from :data:`WORKSPACE_BYTES`, read when the
    plan is made); ``pointwise``, whether forward/backward-data skip im2col (1x1 kernel,
    stride 1, no pad); ``backward_data_in_place`` False (``dx`` is never given in ``dy``'s
    memory: see :class:`..reference.conv.ConvPlan`).
    """

    backward_data_in_place = False

    def __init__(self, device, geometry, workspace=None):
        g = self.geometry = geometry
        self.device = device
        self.N, self.C, self.M, self.G = g.num, g.channels, g.num_output, g.group
        self.Cg, self.Mg = self.C // self.G, self.M // self.G
        self.K = g.kernel_dim                        # rows of one group's column matrix
        self.rows = self.G * self.K                  # C * kh * kw
        self.in_hw, self.out_hw = tuple(g.in_spatial), tuple(g.out_spatial)
        self.P = self.out_hw[0] * self.out_hw[1]
        self.pointwise = (tuple(g.kernel) == (1, 1) and tuple(g.stride) == (1, 1)
                          and tuple(g.pad) == (0, 0))
        per_image = (self.rows + self.M) * self.P
        self.chunk = max(1, min(self.N, WORKSPACE_BYTES // 4 // max(1, per_image)))
        self._col_size = self.rows * self.chunk * self.P
        self._mid_size = self.M * self.chunk * self.P
        self._mat_size = self.M * self.K
        self._workspace = workspace if workspace is not None else DeviceWorkspace()
        self._reference = reference_conv.ConvPlan(geometry)
        kh, kw = g.kernel
        self._shapes = {"x": (self.N, self.C) + self.in_hw, "y": (self.N, self.M) + self.out_hw,
                        "w": (self.M, self.Cg, kh, kw), "bias": (self.M,)}

    def _check(self, **arrays):
        """Raise ValueError unless each array (None skipped) has the shape of its role: ``x``
        the image side (N, C, H, W), ``y`` the column side (N, M, OH, OW), ``w``, ``bias``."""
        for role, a in arrays.items():
            if a is not None and tuple(a.shape) != self._shapes[role]:
                raise ValueError(f"convolution plan for {self.geometry}: the {role}-shaped "
                                 f"array has shape {tuple(a.shape)}, expected "
                                 f"{self._shapes[role]}")

    # -- buffers and launches ----------------------------------------------------------------
    def _buffers(self, xp, nb):
        """Views of the workspace for a chunk of ``nb`` images: the column matrix
        (rows, nb * P), the (M, nb * P) matrix, the (M, K) matrix."""
        total = self._col_size + self._mid_size + self._mat_size
        ws = self._workspace.get(xp, total)
        cols = nb * self.P
        col = ws[:self.rows * cols].reshape(self.rows, cols)
        mid = ws[self._col_size:self._col_size + self.M * cols]
        mat = ws[self._col_size + self._mid_size:total]
        return col, mid, mat

    def _chunks(self):
        for n0 in range(0, self.N, self.chunk):
            yield n0, min(self.N, n0 + self.chunk)

    def _im2col(self, x, col):
        g = self.geometry
        _launch_im2col(self.device, x, self.C, self.in_hw, g.kernel, g.stride, g.pad,
                       g.dilation, self.out_hw, col.shape[1], self.P, col)

    def _col2im(self, col, x):
        g = self.geometry
        _launch_col2im(self.device, col, self.C, self.in_hw, g.kernel, g.stride, g.pad,
                       g.dilation, self.out_hw, col.shape[1], self.P, x)

    def _swap(self, src, outer, inner, out, bias=None):
        n = out.size
        self.device.launch(SOURCE, "ce_conv_swap", n, int32(n), src, int32(outer),
                           int32(inner), int32(self.P), bias if bias is not None else out,
                           int32(bias is not None), out)

    def _add_bias(self, y, bias):
        n = y.size
        self.device.launch(SOURCE, "ce_conv_add_bias", n, int32(n), y, int32(self.M),
                           int32(self.P), bias)

    def _product_shape(self, *shape):
        """(G, *shape), or ``shape`` alone for one group (cuBLAS's 2-D products)."""
        return shape if self.G == 1 else (self.G,) + shape

    @staticmethod
    def _t(a):
        """``a`` with its last two axes swapped (a view)."""
        return a.T if a.ndim == 2 else a.transpose(0, 2, 1)

    # -- the kernel interface ------------------------------------------------------------------
    def forward(self, x, w, bias, y):
        """``y`` (N, M, OH, OW) = conv(``x``, ``w``) + ``bias`` (None: no bias)."""
        self._check(x=x, w=w, bias=bias, y=y)
        if not _usable(x, w, bias, y):
            return self._reference.forward(x, w, bias, y)
        xp = get_array_module(x)
        Mg, Cg, K, P = self.Mg, self.Cg, self.K, self.P
        if self.pointwise:
            if self.N == 1:
                xp.matmul(w.reshape(self._product_shape(Mg, Cg)),
                          x.reshape(self._product_shape(Cg, P)),
                          out=y.reshape(self._product_shape(Mg, P)))
            else:
                xp.matmul(w.reshape(self._product_shape(Mg, Cg)),
                          x.reshape((self.N,) + self._product_shape(Cg, P)),
                          out=y.reshape((self.N,) + self._product_shape(Mg, P)))
            if bias is not None:
                self._add_bias(y, bias)
            return
        weights = w.reshape(self._product_shape(Mg, K))
        for n0, n1 in self._chunks():
            nb = n1 - n0
            col, mid, _ = self._buffers(xp, nb)
            self._im2col(x[n0:n1], col)
            cols = col.reshape(self._product_shape(K, nb * P))
            if nb == 1:
                xp.matmul(weights, cols, out=y[n0].reshape(self._product_shape(Mg, P)))
                if bias is not None and self.chunk > 1:    # a last chunk of one image
                    self._add_bias(y[n0:n1], bias)
            else:
                out = mid.reshape(self._product_shape(Mg, nb * P))
                xp.matmul(weights, cols, out=out)
                self._swap(out, self.M, nb, y[n0:n1], bias)
        if bias is not None and self.chunk == 1:
            self._add_bias(y, bias)

    def backward_data(self, dy, w, dx):
        """``dx`` (N, C, H, W) = the gradient with respect to the input: col2im(W^T dy)."""
        self._check(y=dy, w=w, x=dx)
        if not _usable(dy, w, dx):
            return self._reference.backward_data(dy, w, dx)
        xp = get_array_module(dy)
        G, Mg, Cg, K, P = self.G, self.Mg, self.Cg, self.K, self.P
        if self.pointwise:
            _, _, mat = self._buffers(xp, 0)
            if self.G == 1 and self.N == 1:
                weights_t = w.reshape(Mg, Cg).T        # cuBLAS's transpose flag
            else:
                weights_t = mat.reshape(self._product_shape(Cg, Mg))
                weights_t[...] = self._t(w.reshape(self._product_shape(Mg, Cg)))
            lead = () if self.N == 1 else (self.N,)
            xp.matmul(weights_t, dy.reshape(lead + self._product_shape(Mg, P)),
                      out=dx.reshape(lead + self._product_shape(Cg, P)))
            return
        weights = w.reshape(self._product_shape(Mg, K))
        weights_t = None
        for n0, n1 in self._chunks():
            nb = n1 - n0
            col, mid, mat = self._buffers(xp, nb)
            if weights_t is None:
                if G == 1:
                    weights_t = weights.T              # cuBLAS's transpose flag
                else:
                    weights_t = mat.reshape(G, K, Mg)  # one copy, for every chunk
                    weights_t[...] = self._t(weights)
            if nb == 1:
                top = dy[n0].reshape(self._product_shape(Mg, P))
            else:
                top = mid.reshape(self._product_shape(Mg, nb * P))
                self._swap(dy[n0:n1], nb, self.M, top)
            xp.matmul(weights_t, top, out=col.reshape(self._product_shape(K, nb * P)))
            self._col2im(col, dx[n0:n1])

    def weight_grad(self, x, dy, dw):
        """``dw`` (M, C / G, kh, kw) += the gradient with respect to the weights."""
        self._check(x=x, y=dy, w=dw)
        if not _usable(x, dy, dw):
            return self._reference.weight_grad(x, dy, dw)
        xp = get_array_module(x)
        G, Mg, K, P = self.G, self.Mg, self.K, self.P
        acc = dw.reshape(self._product_shape(Mg, K))
        for n0, n1 in self._chunks():
            nb = n1 - n0
            col, mid, mat = self._buffers(xp, nb)
            self._im2col(x[n0:n1], col)
            if G == 1:
                if nb == 1:
                    top = dy[n0].reshape(Mg, P)
                else:
                    top = mid.reshape(Mg, nb * P)
                    self._swap(dy[n0:n1], nb, self.M, top)
                prod = mat.reshape(Mg, K)
                xp.matmul(top, col.T, out=prod)        # (M, nbP) x (nbP, K)
                acc += prod
            else:
                top = mid.reshape(G, nb * P, Mg)
                n = top.size
                self.device.launch(SOURCE, "ce_conv_pack_groups", n, int32(n), dy[n0:n1],
                                   int32(nb), int32(G), int32(Mg), int32(P), top)
                prod = mat.reshape(G, K, Mg)           # (K, nbP) x (nbP, Mg) per group
                xp.matmul(col.reshape(G, K, nb * P), top, out=prod)
                acc += prod.transpose(0, 2, 1)

    def bias_grad(self, dy, db):
        """``db`` (M,) += ``dy`` summed over images and positions."""
        self._check(y=dy, bias=db)
        if not _usable(dy, db):
            return self._reference.bias_grad(dy, db)
        db += dy.reshape(self.N, self.M, self.P).sum(axis=(0, 2))
