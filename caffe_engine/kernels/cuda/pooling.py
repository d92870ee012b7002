"""MAX and AVE pooling on the device: one thread per output forward, one per input backward.

Caffe: src/caffe/layers/pooling_layer.cpp (``Forward_cpu``, ``Backward_cpu``, the rules the
fixtures hold) and pooling_layer.cu (``MaxPoolForward``, ``AvePoolForward``,
``MaxPoolBackward``, ``AvePoolBackward``, the gather form of the backward pass used here).

* MAX forward: each output scans its window, clipped to the input, row by row from
  ``-FLT_MAX`` and takes a value only when it is strictly greater, so the first maximum wins,
  NaN never wins and a window holding nothing above ``-FLT_MAX`` (all ``-FLT_MAX``/``-inf``,
  or empty) gives ``-FLT_MAX`` with argmax -1. The argmax is the input index ``h * W + w``
  within the plane, kept as int32 (Caffe's ``max_idx_``) and written as float into the
  optional mask top by the same launch.
* AVE forward: the window's sum (row by row, from 0) divided by its size clipped to the padded
  input, ``(min(hs + kh, H + ph) - hs) * (min(ws + kw, W + pw) - ws)`` with ``hs``/``ws`` not
  yet clipped: padding counts, the ceil-mode overhang does not.
* Backward: each input element gathers the terms of the outputs whose windows cover it (MAX:
  ``dy`` where the argmax is this element; AVE: ``dy / size``), outputs in increasing row-major
  order from 0. That is the order in which Caffe's CPU scatter loop adds into one element, so
  the result equals it bit for bit, with no atomics (deterministic on the GPU).

Every launch is one thread per element of what it writes: a forward call is 1 launch, a
backward call 1 launch. The float arithmetic has no products feeding sums, so there is nothing
for the device compiler to contract: the GPU gives the emulator's (and the reference set's)
bits.
"""
import numpy

from ...proto import caffe_pb2
from .device import INDEX_LIMIT, int32, operand
from .source import Source

SOURCE = Source("pooling", r"""
// The window of output (oh, ow) along one axis, before clipping: [o * s - p, o * s - p + k).
// (Own int min/max: the emulator compiles this text as plain C++, without CUDA's.)
__device__ int ce_pool_min(const int a, const int b) { return a < b ? a : b; }
__device__ int ce_pool_max(const int a, const int b) { return a > b ? a : b; }

extern "C" __global__ void ce_max_pool_forward(const int n, const float* x, const int H,
                                               const int W, const int OH, const int OW,
                                               const int kh, const int kw, const int sh,
                                               const int sw, const int ph, const int pw,
                                               float* y, int* argmax, float* mask,
                                               const int with_mask) {
  CE_KERNEL_LOOP(i, n) {
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int plane = i / (OW * OH);
    int hs = oh * sh - ph;
    int ws = ow * sw - pw;
    const int he = ce_pool_min(hs + kh, H);
    const int we = ce_pool_min(ws + kw, W);
    hs = ce_pool_max(hs, 0);
    ws = ce_pool_max(ws, 0);
    const float* xp = x + plane * H * W;
    float best = -CE_FLT_MAX;
    int arg = -1;
    for (int h = hs; h < he; ++h) {
      for (int w = ws; w < we; ++w) {
        const float v = xp[h * W + w];
        if (v > best) {  // strict: the first maximum stays; NaN compares false
          best = v;
          arg = h * W + w;
        }
      }
    }
    y[i] = best;
    argmax[i] = arg;
    if (with_mask) {
      mask[i] = (float)arg;
    }
  }
}

extern "C" __global__ void ce_ave_pool_forward(const int n, const float* x, const int H,
                                               const int W, const int OH, const int OW,
                                               const int kh, const int kw, const int sh,
                                               const int sw, const int ph, const int pw,
                                               float* y) {
  CE_KERNEL_LOOP(i, n) {
    const int ow = i % OW;
    const int oh = (i / OW) % OH;
    const int plane = i / (OW * OH);
    int hs = oh * sh - ph;
    int ws = ow * sw - pw;
    int he = ce_pool_min(hs + kh, H + ph);
    int we = ce_pool_min(ws + kw, W + pw);
    const int size = (he - hs) * (we - ws);  // padding counted, the overhang not
    hs = ce_pool_max(hs, 0);
    ws = ce_pool_max(ws, 0);
    he = ce_pool_min(he, H);
    we = ce_pool_min(we, W);
    const float* xp = x + plane * H * W;
    float total = 0.0f;
    for (int h = hs; h < he; ++h) {
      for (int w = ws; w < we; ++w) {
        total += xp[h * W + w];
      }
    }
    y[i] = total / (float)size;
  }
}

extern "C" __global__ void ce_max_pool_backward(const int n, const float* dy,
                                                const int* argmax, const int H, const int W,
                                                const int OH, const int OW, const int kh,
                                                const int kw, const int sh, const int sw,
                                                const int ph, const int pw, float* dx) {
  CE_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int h = (i / W) % H;
    const int plane = i / (W * H);
    // the outputs whose windows cover (h, w): o * s <= h + p < o * s + k
    const int oh0 = (h + ph < kh) ? 0 : (h + ph - kh) / sh + 1;
    const int oh1 = ce_pool_min((h + ph) / sh + 1, OH);
    const int ow0 = (w + pw < kw) ? 0 : (w + pw - kw) / sw + 1;
    const int ow1 = ce_pool_min((w + pw) / sw + 1, OW);
    const int here = h * W + w;
    const int base = plane * OH * OW;
    float grad = 0.0f;
    for (int oh = oh0; oh < oh1; ++oh) {
      for (int ow = ow0; ow < ow1; ++ow) {
        const int o = base + oh * OW + ow;
        if (argmax[o] == here) {
          grad += dy[o];
        }
      }
    }
    dx[i] = grad;
  }
}

extern "C" __global__ void ce_ave_pool_backward(const int n, const float* dy, const int H,
                                                const int W, const int OH, const int OW,
                                                const int kh, const int kw, const int sh,
                                                const int sw, const int ph, const int pw,
                                                float* dx) {
  CE_KERNEL_LOOP(i, n) {
    const int w = i % W;
    const int h = (i / W) % H;
    const int plane = i / (W * H);
    const int oh0 = (h + ph < kh) ? 0 : (h + ph - kh) / sh + 1;
    const int oh1 = ce_pool_min((h + ph) / sh + 1, OH);
    const int ow0 = (w + pw < kw) ? 0 : (w + pw - kw) / sw + 1;
    const int ow1 = ce_pool_min((w + pw) / sw + 1, OW);
    const int base = plane * OH * OW;
    float grad = 0.0f;
    for (int oh = oh0; oh < oh1; ++oh) {
      const int hs = oh * sh - ph;
      const int rows = ce_pool_min(hs + kh, H + ph) - hs;
      for (int ow = ow0; ow < ow1; ++ow) {
        const int ws = ow * sw - pw;
        const int size = rows * (ce_pool_min(ws + kw, W + pw) - ws);
        grad += dy[base + oh * OW + ow] / (float)size;
      }
    }
    dx[i] = grad;
  }
}
""", ("ce_max_pool_forward", "ce_ave_pool_forward", "ce_max_pool_backward",
      "ce_ave_pool_backward"))

MAX = caffe_pb2.PoolingParameter.MAX
AVE = caffe_pb2.PoolingParameter.AVE


def make_plan(device, geometry):
    """A :class:`PoolPlan` for ``geometry`` (:class:`...geometry.PoolGeometry`) on ``device``,
    or None for a method other than MAX and AVE (STOCHASTIC; the layer refuses it first) or a
    geometry whose element indices overflow a C int (the caller falls back to the reference
    plan)."""
    g = geometry
    if g.method not in (MAX, AVE):
        return None
    planes = g.num * g.channels
    if planes * max(g.in_hw[0] * g.in_hw[1], g.out_hw[0] * g.out_hw[1]) >= INDEX_LIMIT:
        return None
    return PoolPlan(device, geometry)


class PoolPlan:
    """One pooling geometry (:class:`...geometry.PoolGeometry`, MAX or AVE) on ``device``'s
    arrays; the contract of :class:`..reference.pooling.PoolPlan`.

    ``forward(x, y, mask=None)``: ``x`` (N, C, H, W) float32 -> ``y`` (N, C, OH, OW) float32;
    MAX also keeps ``argmax`` (N, C, OH, OW) int32 (-1 where nothing beat ``-FLT_MAX``) for
    ``backward`` and writes it as float into ``mask`` (N, C, OH, OW) unless ``mask`` is None.
    ``backward(dy, dx)``: ``dy`` (N, C, OH, OW) -> ``dx`` (N, C, H, W), overwritten.
    One launch per call. Arrays that are not C-contiguous go through contiguous copies.

    Raises:
        ValueError: an array whose shape is not the geometry's.
        TypeError: an array that is not float32.
        RuntimeError: MAX ``backward`` before any ``forward``.
    """

    def __init__(self, device, geometry):
        g = self.geometry = geometry
        self.device = device
        self.is_max = g.method == MAX
        self.in_shape = (g.num, g.channels) + tuple(g.in_hw)
        self.out_shape = (g.num, g.channels) + tuple(g.out_hw)
        # H, W, OH, OW, kh, kw, sh, sw, ph, pw as the kernels take them
        self.dims = tuple(int32(v) for v in (tuple(g.in_hw) + tuple(g.out_hw) + tuple(g.kernel)
                                              + tuple(g.stride) + tuple(g.pad)))
        self.argmax = None
        #: bytes of the argmax ``forward`` keeps for ``backward`` (0: AVE keeps nothing)
        self.saved_bytes = 4 * int(numpy.prod(self.out_shape)) if self.is_max else 0

    def keep_saved_in(self, buffer):
        """Keep the argmax in ``buffer`` (a flat device array of at least :attr:`saved_bytes`
        bytes) from the next ``forward`` on, instead of memory of the plan's own."""
        self.argmax = (buffer.view(numpy.uint8)[:self.saved_bytes].view(numpy.int32)
                       .reshape(self.out_shape))

    def forward(self, x, y, mask=None):
        """``y`` = the pooled ``x``; MAX also records the argmax (and fills ``mask``)."""
        xp = self.device.xp
        xc = operand(xp, x, self.in_shape, "pooling", "x")
        yc = operand(xp, y, self.out_shape, "pooling", "y")
        n = yc.size
        if self.is_max:
            if self.argmax is None:
                self.argmax = xp.empty(self.out_shape, numpy.int32)
            mc = None if mask is None else operand(xp, mask, self.out_shape, "pooling", "mask")
            self.device.launch(SOURCE, "ce_max_pool_forward", n, int32(n), xc, *self.dims[:4],
                               *self.dims[4:], yc, self.argmax, yc if mc is None else mc,
                               int32(mc is not None))
            if mc is not None and mc is not mask:
                mask[...] = mc
        else:
            self.device.launch(SOURCE, "ce_ave_pool_forward", n, int32(n), xc, *self.dims, yc)
        if yc is not y:
            y[...] = yc

    def backward(self, dy, dx):
        """``dx`` = the gradient with respect to the pooled input (overwritten)."""
        xp = self.device.xp
        dyc = operand(xp, dy, self.out_shape, "pooling", "dy")
        dxc = operand(xp, dx, self.in_shape, "pooling", "dx")
        n = dxc.size
        if self.is_max:
            if self.argmax is None:
                raise RuntimeError("pooling: MAX backward needs the argmax of a forward call")
            self.device.launch(SOURCE, "ce_max_pool_backward", n, int32(n), dyc, self.argmax,
                               *self.dims, dxc)
        else:
            self.device.launch(SOURCE, "ce_ave_pool_backward", n, int32(n), dyc, *self.dims,
                               dxc)
        if dxc is not dx:
            dx[...] = dxc
