"""Local response normalisation as Caffe computes it, in readable array code.

Caffe: src/caffe/layers/lrn_layer.cpp (and, for WITHIN_CHANNEL, the power, pooling, eltwise
and split layers it is built from).

* ACROSS_CHANNELS: ``scale = k + alpha / size * sum(x_j ** 2)`` over the ``size`` channels
  centred on each channel (zero beyond the edges), kept as Caffe keeps it: a running window over
  the channels (add the head, subtract the tail); ``top = x * scale ** -beta``; the gradient is
  ``scale ** -beta * dy - 2 alpha beta / size * x * sum_window(dy * top / scale)``, with the
  same running window.
* WITHIN_CHANNEL: Caffe's chain of layers, their arithmetic repeated: square (Power 2), AVE
  pooling of ``size x size`` windows with pad ``(size - 1) / 2`` and stride 1 (every window,
  padded cells included, divides by ``size ** 2``), ``(1 + alpha * pooled) ** -beta`` (Power),
  times x (Eltwise PROD). ``k`` is not used there.
"""
import numpy

from ...backend import get_array_module

f32 = numpy.float32


def power_forward(xp, x, power, scale, shift):
    """``(shift + scale * x) ** power`` in Caffe's PowerLayer order: scale, shift, powx."""
    if power * scale == 0:
        value = f32(1) if power == 0 else f32(numpy.power(shift, power))
        return xp.full(x.shape, value, f32)
    y = x.copy()
    if scale != 1:
        y *= scale
    if shift != 0:
        y += shift
    if power != 1:
        xp.power(y, power, out=y)
    return y


def power_backward(xp, x, y, dy, power, scale, shift):
    """The gradient of :func:`power_forward` as Caffe's PowerLayer::Backward_cpu computes it."""
    diff_scale = f32(power * scale)
    if diff_scale == 0 or power == 1:
        dx = xp.full(x.shape, diff_scale, f32)
    elif power == 2:
        dx = x * f32(diff_scale * scale)
        if shift != 0:
            dx += f32(diff_scale * shift)
    elif shift == 0:
        dx = y / x
        dx *= power
    else:
        dx = x.copy()
        if scale != 1:
            dx *= scale
        dx += shift
        xp.divide(y, dx, out=dx)
        if diff_scale != 1:
            dx *= diff_scale
    if diff_scale != 0:
        xp.multiply(dy, dx, out=dx)
    return dx


class LRNPlan:
    """One LRN geometry (:class:`..geometry.LRNGeometry`) on (N, C, H, W) float32 arrays.

    ``forward(x, y)`` keeps what ``backward(x, y, dy, dx)`` needs (the scale, or the pooled
    squares and the power output).
    """

    def __init__(self, geometry):
        self.geometry = geometry
        self.size = geometry.size
        self.pre_pad = (geometry.size - 1) // 2
        self.alpha, self.beta, self.k = f32(geometry.alpha), f32(geometry.beta), f32(geometry.k)
        self.scale = None

    #: The reference makes a new scale each forward: nothing to place elsewhere.
    saved_bytes = 0

    def keep_saved_in(self, buffer):
        """Nothing to keep (:attr:`saved_bytes` is 0)."""

    def forward(self, x, y):
        if self.geometry.within:
            self._within_forward(x, y)
        else:
            self._across_forward(x, y)

    def backward(self, x, y, dy, dx):
        if self.geometry.within:
            self._within_backward(x, dy, dx)
        else:
            self._across_backward(x, y, dy, dx)

    # -- ACROSS_CHANNELS ---------------------------------------------------------------------
    def _across_forward(self, x, y):
        xp = get_array_module(x)
        n, c, h, w = x.shape
        size, pad = self.size, self.pre_pad
        a = self.alpha / f32(size)
        sq = xp.zeros((n, c + size - 1, h, w), f32)
        xp.multiply(x, x, out=sq[:, pad:pad + c])
        scale = self.scale = xp.empty(x.shape, f32)
        s = scale[:, 0]
        s[...] = self.k
        for j in range(size):
            s += a * sq[:, j]
        for j in range(1, c):
            s = scale[:, j]
            s[...] = scale[:, j - 1]
            s += a * sq[:, j + size - 1]
            s += -a * sq[:, j - 1]
        xp.power(scale, -self.beta, out=y)
        y *= x

    def _across_backward(self, x, y, dy, dx):
        xp = get_array_module(x)
        n, c, h, w = x.shape
        size = self.size
        cache_ratio = f32(2.0 * float(self.alpha) * float(self.beta) / size)
        xp.power(self.scale, -self.beta, out=dx)
        dx *= dy
        inverse_pre_pad = size - (size + 1) // 2
        ratio = xp.zeros((n, c + size - 1, h, w), f32)
        inner = ratio[:, inverse_pre_pad:inverse_pre_pad + c]
        xp.multiply(dy, y, out=inner)
        inner /= self.scale
        accum = xp.zeros((n, h, w), f32)
        for j in range(size - 1):
            accum += ratio[:, j]
        for j in range(c):
            accum += ratio[:, j + size - 1]
            dx[:, j] += -cache_ratio * (x[:, j] * accum)
            accum -= ratio[:, j]

    # -- WITHIN_CHANNEL ----------------------------------------------------------------------
    def _within_forward(self, x, y):
        xp = get_array_module(x)
        h, w = x.shape[2:]
        size, pad = self.size, self.pre_pad
        padded = xp.zeros(x.shape[:2] + (h + 2 * pad, w + 2 * pad), f32)
        xp.multiply(x, x, out=padded[:, :, pad:pad + h, pad:pad + w])         # Power 2
        pooled = xp.zeros(x.shape, f32)                                        # AVE pooling
        for i in range(size):
            for j in range(size):
                pooled += padded[:, :, i:i + h, j:j + w]
        pooled /= f32(size * size)
        self.pooled = pooled
        self.power_out = power_forward(xp, pooled, -self.beta, self.alpha, f32(1))
        xp.multiply(x, self.power_out, out=y)                                  # Eltwise PROD

    def _within_backward(self, x, dy, dx):
        xp = get_array_module(x)
        h, w = x.shape[2:]
        size, pad = self.size, self.pre_pad
        d_product = self.power_out * dy                       # PROD -> the split's first top
        d_power = x * dy                                      # PROD -> the power output
        d_pooled = power_backward(xp, self.pooled, self.power_out, d_power,
                                  -self.beta, self.alpha, f32(1))
        # AVE pooling backward: Caffe adds top_diff / size^2 into each window, windows in
        # row-major order, so an input cell receives its terms last kernel offset first.
        spread = xp.zeros(x.shape[:2] + (h + 2 * pad, w + 2 * pad), f32)
        spread[:, :, pad:pad + h, pad:pad + w] = d_pooled / f32(size * size)
        d_square = xp.zeros_like(x)
        for i in reversed(range(size)):
            for j in reversed(range(size)):
                d_square += spread[:, :, 2 * pad - i:2 * pad - i + h, 2 * pad - j:2 * pad - j + w]
        d_square *= x * f32(2)                                # Power 2 backward
        xp.add(d_product, d_square, out=dx)                   # Split backward
