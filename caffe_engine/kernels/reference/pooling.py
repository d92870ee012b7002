"""MAX and AVE pooling as Caffe computes them, in readable array code (one array operation per
kernel offset).

Caffe: src/caffe/layers/pooling_layer.cpp (``Forward_cpu``, ``Backward_cpu``).

* MAX scans each window row-major from ``-FLT_MAX`` and keeps a value only when it is strictly
  greater: the first maximum wins, NaN never wins, and a window with nothing above ``-FLT_MAX``
  gives ``-FLT_MAX`` with argmax -1. The argmax is the input index ``h * W + w``.
* AVE sums each window row-major and divides by its size clipped to the padded input
  (``min(start + k, size + pad) - start``: padding counts, the ceil-mode overhang does not).
* Backward adds ``dy`` (MAX: at the argmax; AVE: ``dy / size`` over the window) in the order of
  the outputs, as Caffe's loop does: an input position receives its terms from the outputs in
  increasing order.

Windows that hang off the input (padding, ceil mode) read a padded copy: ``-inf`` for MAX
(it never beats ``-FLT_MAX``), 0 for AVE (adding 0 leaves a float32 sum unchanged).
"""
import numpy

from ...backend import get_array_module
from ...proto import caffe_pb2

f32 = numpy.float32
FLT_MAX = numpy.finfo(f32).max
MAX = caffe_pb2.PoolingParameter.MAX


def ave_divisors(in_hw, out_hw, kernel, stride, pad):
    """Caffe's AVE pool sizes: float32 (OH, OW) of ``(hend - hstart) (wend - wstart)`` with
    ``hend = min(hstart + kh, H + ph)`` before ``hstart`` is clipped to 0."""
    sizes = []
    for size, out, k, s, p in zip(in_hw, out_hw, kernel, stride, pad):
        start = numpy.arange(out) * s - p
        sizes.append(numpy.minimum(start + k, size + p) - start)
    return numpy.outer(sizes[0], sizes[1]).astype(f32)


class PoolPlan:
    """One pooling geometry (:class:`..geometry.PoolGeometry`), NumPy or CuPy arrays.

    ``x``/``dx`` (N, C, H, W), ``y``/``dy``/``mask`` (N, C, OH, OW), float32. MAX keeps the
    argmax (int32, like Caffe's ``max_idx_``) from ``forward`` for ``backward``; ``forward``
    writes it as float into ``mask`` (Caffe's second top) unless ``mask`` is None.
    """

    def __init__(self, geometry):
        g = self.geometry = geometry
        (kh, kw), (sh, sw), (ph, pw) = g.kernel, g.stride, g.pad
        (h, w), (oh, ow) = g.in_hw, g.out_hw
        # the padded extent every window fits in
        self.extent = ((oh - 1) * sh + kh, (ow - 1) * sw + kw)
        self.offsets = [(i, j) for i in range(kh) for j in range(kw)]
        self.argmax = None
        # input index of each window's origin, (OH, OW)
        self._origin = ((numpy.arange(oh) * sh - ph)[:, None] * w
                        + (numpy.arange(ow) * sw - pw)[None, :]).astype(numpy.int32)
        self._divisor = ave_divisors(g.in_hw, g.out_hw, g.kernel, g.stride, g.pad)

    def _padded(self, xp, x, fill):
        g = self.geometry
        (ph, pw), (h, w) = g.pad, g.in_hw
        eh, ew = self.extent
        out = xp.full(x.shape[:2] + (max(eh, ph + h), max(ew, pw + w)), fill, f32)
        out[:, :, ph:ph + h, pw:pw + w] = x
        return out

    def _window(self, a, i, j):
        g = self.geometry
        (sh, sw), (oh, ow) = g.stride, g.out_hw
        return a[:, :, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw]

    #: The reference makes a new argmax each forward: nothing to place elsewhere.
    saved_bytes = 0

    def keep_saved_in(self, buffer):
        """Nothing to keep (:attr:`saved_bytes` is 0)."""

    def forward(self, x, y, mask=None):
        """``y`` = the pooled ``x``; MAX also records the argmax (and ``mask``)."""
        xp = get_array_module(x)
        g = self.geometry
        w = g.in_hw[1]
        if g.method == MAX:
            xpad = self._padded(xp, x, -numpy.inf)
            best = xp.full(y.shape, -FLT_MAX, f32)
            arg = xp.full(y.shape, -1, numpy.int32)
            origin = xp.asarray(self._origin)
            for i, j in self.offsets:
                window = self._window(xpad, i, j)
                better = window > best
                best = xp.where(better, window, best)
                arg = xp.where(better, origin + (i * w + j), arg)
            y[...] = best
            self.argmax = arg
            if mask is not None:
                mask[...] = arg
            return
        xpad = self._padded(xp, x, 0)
        total = xp.zeros(y.shape, f32)
        for i, j in self.offsets:
            total += self._window(xpad, i, j)
        y[...] = total / xp.asarray(self._divisor)

    def backward(self, dy, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        xp = get_array_module(dy)
        g = self.geometry
        (ph, pw), (h, w) = g.pad, g.in_hw
        grad = self._padded(xp, xp.zeros(dx.shape, f32), 0)
        if g.method == MAX:
            origin = xp.asarray(self._origin)
            for i, j in reversed(self.offsets):
                hit = self.argmax == origin + (i * w + j)
                self._window(grad, i, j)[...] += xp.where(hit, dy, f32(0))
        else:
            share = dy / xp.asarray(self._divisor)
            for i, j in reversed(self.offsets):
                self._window(grad, i, j)[...] += share
        dx[...] = grad[:, :, ph:ph + h, pw:pw + w]
