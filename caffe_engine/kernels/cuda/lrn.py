"""ACROSS_CHANNELS local response normalisation on the device: one thread per image position,
walking the channels with Caffe's running window.

Caffe: src/caffe/layers/lrn_layer.cpp (``CrossChannelForward_cpu``,
``CrossChannelBackward_cpu``: the arithmetic kept here, which the fixtures hold) and
lrn_layer.cu (``LRNFillScale``, ``LRNComputeDiff``: the one-thread-per-(n, h, w) layout).

The arithmetic is the reference set's (:mod:`..reference.lrn`), step for step, per float32
operation:

* forward: ``scale = k``, then ``scale += a * x_j^2`` for the ``size`` window channels of
  channel 0 (``a = alpha / size``, float32; a channel beyond the edges adds ``a * 0``); each
  next channel starts from the previous scale, adds the head's ``a * x^2`` and then the tail's
  ``-a * x^2``; ``y = scale ** -beta * x``. Caffe's GPU kernel sums the squares first and
  scales once, which rounds differently; the CPU order is the one the fixtures hold.
* backward: ``dx = scale ** -beta * dy - cache_ratio * x * accum`` with ``cache_ratio =
  2 alpha beta / size`` and ``accum`` the running window sum of ``dy * y / scale`` (head added
  before the channel's use, tail subtracted after).

A forward call is 1 launch (the scale, kept for backward, and the output together); a backward
call is 1 launch. The products that feed sums go through ``__fmul_rn`` on the device so that
the device compiler cannot contract them into FMAs: the GPU then differs from the emulator (and
the reference set) only where its ``powf`` rounds differently from the host's.

WITHIN_CHANNEL is not covered (:func:`make_plan` returns None; the cuda set runs the reference
plan's array code, which works on CuPy arrays).
"""
import numpy

from .device import INDEX_LIMIT, float32, int32, operand
from .source import Source

SOURCE = Source("lrn", r"""
// A product that feeds a sum, rounded on its own: the device compiler must not fuse it into an
// FMA (the host compiler of the emulator does not contract at all).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CE_LRN_MUL(a, b) __fmul_rn((a), (b))
#else
#define CE_LRN_MUL(a, b) ((a) * (b))
#endif

// x[c]^2 of the position at base (channel stride P), 0 beyond the channels.
__device__ float ce_lrn_square(const float* x, const int base, const int c, const int C,
                               const int P) {
  if (c < 0 || c >= C) return 0.0f;
  const float v = x[base + c * P];
  return v * v;
}

// dy[c] * y[c] / scale[c] of the position at base, 0 beyond the channels.
__device__ float ce_lrn_ratio(const float* dy, const float* y, const float* scale,
                              const int base, const int c, const int C, const int P) {
  if (c < 0 || c >= C) return 0.0f;
  const int at = base + c * P;
  return (dy[at] * y[at]) / scale[at];
}

extern "C" __global__ void ce_lrn_across_forward(const int n, const float* x, const int C,
                                                 const int P, const int size, const float a,
                                                 const float k, const float neg_beta,
                                                 float* scale, float* y) {
  CE_KERNEL_LOOP(i, n) {
    const int base = (i / P) * C * P + i % P;
    const int pre = (size - 1) / 2;
    const float neg_a = -a;
    float s = k;
    for (int j = 0; j < size; ++j) {
      s += CE_LRN_MUL(a, ce_lrn_square(x, base, j - pre, C, P));
    }
    for (int c = 0; c < C; ++c) {
      if (c > 0) {
        s += CE_LRN_MUL(a, ce_lrn_square(x, base, c + size - 1 - pre, C, P));
        s += CE_LRN_MUL(neg_a, ce_lrn_square(x, base, c - 1 - pre, C, P));
      }
      const int at = base + c * P;
      scale[at] = s;
      y[at] = powf(s, neg_beta) * x[at];
    }
  }
}

extern "C" __global__ void ce_lrn_across_backward(const int n, const float* x, const float* y,
                                                  const float* dy, const float* scale,
                                                  const int C, const int P, const int size,
                                                  const float neg_beta,
                                                  const float cache_ratio, float* dx) {
  CE_KERNEL_LOOP(i, n) {
    const int base = (i / P) * C * P + i % P;
    const int pre = size - (size + 1) / 2;  // Caffe's inverse_pre_pad
    const float neg_ratio = -cache_ratio;
    float accum = 0.0f;
    for (int j = 0; j < size - 1; ++j) {
      accum += ce_lrn_ratio(dy, y, scale, base, j - pre, C, P);
    }
    for (int c = 0; c < C; ++c) {
      accum += ce_lrn_ratio(dy, y, scale, base, c + size - 1 - pre, C, P);
      const int at = base + c * P;
      const float d = CE_LRN_MUL(powf(scale[at], neg_beta), dy[at]);
      dx[at] = d + CE_LRN_MUL(neg_ratio, x[at] * accum);
      accum -= ce_lrn_ratio(dy, y, scale, base, c - pre, C, P);
    }
  }
}
""", ("ce_lrn_across_forward", "ce_lrn_across_backward"))

f32 = numpy.float32


def make_plan(device, geometry):
    """An :class:`LRNPlan` for an ACROSS_CHANNELS ``geometry`` (:class:`...geometry.LRNGeometry`)
    on ``device``; None for WITHIN_CHANNEL, for a shape that is not (N, C, ...) with at least two
    axes, and for one whose element indices overflow a C int (the caller then uses the
    reference plan)."""
    g = geometry
    if g.within or len(g.shape) < 2:
        return None
    count = 1
    for d in g.shape:
        count *= int(d)
    if count >= INDEX_LIMIT:
        return None
    return LRNPlan(device, geometry)


class LRNPlan:
    """ACROSS_CHANNELS LRN of one geometry (:class:`...geometry.LRNGeometry`) on ``device``'s
    arrays; the contract of :class:`..reference.lrn.LRNPlan`.

    ``forward(x, y)``: ``x`` (N, C, H, W) float32 -> ``y`` of the same shape; keeps ``scale``
    (N, C, H, W) float32 for ``backward(x, y, dy, dx)``, which overwrites ``dx`` with the
    gradient given the forward's ``x`` and ``y`` and the top's ``dy``. One launch per call.
    Arrays that are not C-contiguous go through contiguous copies.

    Raises:
        ValueError: an array whose shape is not the geometry's.
        TypeError: an array that is not float32.
        RuntimeError: ``backward`` before any ``forward``.
    """

    #: The scale stays a device array of the plan's own: nothing to place elsewhere.
    saved_bytes = 0

    def keep_saved_in(self, buffer):
        """Nothing to keep (:attr:`saved_bytes` is 0)."""

    def __init__(self, device, geometry):
        g = self.geometry = geometry
        self.device = device
        self.shape = tuple(int(d) for d in g.shape)
        self.size = int(g.size)
        alpha, beta = f32(g.alpha), f32(g.beta)
        self.channels = self.shape[1]
        positions = 1
        for d in self.shape[2:]:
            positions *= d
        self.positions = positions
        self.threads = self.shape[0] * positions
        # the reference set's float32 constants
        self.a = float32(alpha / f32(self.size))
        self.k = float32(g.k)
        self.neg_beta = float32(-beta)
        self.cache_ratio = float32(2.0 * float(alpha) * float(beta) / self.size)
        self.scale = None

    def forward(self, x, y):
        """``y`` = ``x * scale ** -beta``; keeps the scale."""
        xp = self.device.xp
        xc = operand(xp, x, self.shape, "LRN", "x")
        yc = operand(xp, y, self.shape, "LRN", "y")
        if self.scale is None:
            self.scale = xp.empty(self.shape, f32)
        n = self.threads
        self.device.launch(SOURCE, "ce_lrn_across_forward", n, int32(n), xc,
                           int32(self.channels), int32(self.positions), int32(self.size),
                           self.a, self.k, self.neg_beta, self.scale, yc)
        if yc is not y:
            y[...] = yc

    def backward(self, x, y, dy, dx):
        """``dx`` = the gradient with respect to ``x`` (overwritten)."""
        if self.scale is None:
            raise RuntimeError("LRN: backward needs the scale of a forward call")
        xp = self.device.xp
        xc = operand(xp, x, self.shape, "LRN", "x")
        yc = operand(xp, y, self.shape, "LRN", "y")
        dyc = operand(xp, dy, self.shape, "LRN", "dy")
        dxc = operand(xp, dx, self.shape, "LRN", "dx")
        n = self.threads
        self.device.launch(SOURCE, "ce_lrn_across_backward", n, int32(n), xc, yc, dyc,
                           self.scale, int32(self.channels), int32(self.positions),
                           int32(self.size), self.neg_beta, self.cache_ratio, dxc)
        if dxc is not dx:
            dx[...] = dxc
