"""Softmax and SoftmaxWithLoss on the device: 1 launch for the softmax, 2 for the loss, 1 for
its gradient.

Caffe: src/caffe/layers/softmax_layer.cu, softmax_loss_layer.cu. Arrays are viewed as
(outer, C, inner) (see :mod:`..reference.softmax`); a *position* is one (outer, inner) pair.

* ``ce_softmax_forward``: one thread per position: the max over C (NaN propagates, as NumPy's
  max), ``exp(x - max)`` summed from 0 in order of C, then each divided by the sum. ``y`` may
  be ``x``. The order of the sum is NumPy's for ``inner > 1``; for ``inner == 1`` NumPy sums
  pairwise, so the two may differ in the last bits.
* ``ce_softmax_loss_partial``: one thread per chunk of :data:`CHUNK` consecutive positions:
  each label truncated to int (NaN and values beyond int as INT_MIN, as NumPy's ``astype`` on
  x86), its validity (not ``ignore_label``), its range check, the index the gradient uses
  (the label; 0 for an out-of-range one, as the reference set indexes; -1 where ignored), and
  the chunk's sum (double) of ``log(max(p[label], FLT_MIN))``, its count of valid positions and
  its first out-of-range label.
* ``ce_softmax_loss_finish``: one thread: the chunks in order, the normalizer (VALID: the count,
  at least 1; else the value given), ``loss = -sum / normalizer`` into the loss top, the
  normalizer into a one-float buffer for the backward pass, and the label check's flag and first
  bad value into fresh device arrays handed to :func:`caffe_engine.backend.defer_check` (the
  same deferred check as :func:`caffe_engine.backend.check_values`, raised at the next
  display, test or pycaffe forward; at once off the device).
* ``ce_softmax_loss_backward``: one thread per element: ``(p - onehot) * valid * (top_diff /
  normalizer)``, the two scalars read from device memory (no host read); the reference set's
  arithmetic, operation for operation.

The loss sum runs in double, chunk by chunk, so it differs from NumPy's float32 pairwise sum in
the last bits; everything else is one float32 operation per NumPy one.
"""
import numpy

from ... import backend
from ...backend import get_array_module
from .device import float32, int32
from .source import Source

#: positions per thread of ``ce_softmax_loss_partial``
CHUNK = 256

SOURCE = Source("softmax", r"""
#define CE_FLT_MIN 1.17549435e-38f

extern "C" __global__ void ce_softmax_forward(const int n, const float* x, float* y,
                                              const int C, const int inner) {
  CE_KERNEL_LOOP(i, n) {
    const int o = i / inner;
    const int j = i - o * inner;
    const float* xi = x + (long long)o * C * inner + j;
    float* yi = y + (long long)o * C * inner + j;
    float m = xi[0];
    for (int c = 1; c < C; ++c) {
      const float v = xi[(long long)c * inner];
      if (v > m || v != v) m = (m != m) ? m : v;
    }
    float s = 0.0f;
    for (int c = 0; c < C; ++c) {
      const float e = expf(xi[(long long)c * inner] - m);
      yi[(long long)c * inner] = e;
      s += e;
    }
    for (int c = 0; c < C; ++c) {
      yi[(long long)c * inner] = yi[(long long)c * inner] / s;
    }
  }
}

extern "C" __global__ void ce_softmax_loss_partial(const int n, const int positions,
                                                   const int chunk, const float* prob,
                                                   const float* labels, const int C,
                                                   const int inner, const int has_ignore,
                                                   const int ignore_label, int* index,
                                                   double* part_loss, int* part_count,
                                                   int* part_flag, int* part_bad) {
  CE_KERNEL_LOOP(t, n) {
    const int begin = t * chunk;
    const int end = positions - begin < chunk ? positions : begin + chunk;
    double sum = 0.0;
    int count = 0, flag = 0, bad = 0;
    for (int i = begin; i < end; ++i) {
      const float lf = labels[i];
      const int label = (lf >= -2147483648.0f && lf < 2147483648.0f) ? (int)lf
                                                                      : (-2147483647 - 1);
      const int valid = !(has_ignore && label == ignore_label);
      const int in_range = label >= 0 && label < C;
      if (valid && !in_range && !flag) {
        flag = 1;
        bad = label;
      }
      if (valid) {
        const int k = in_range ? label : 0;
        index[i] = k;
        const int o = i / inner;
        const int j = i - o * inner;
        const float p = prob[((long long)o * C + k) * inner + j];
        const float q = (p > CE_FLT_MIN || p != p) ? p : CE_FLT_MIN;
        sum += (double)logf(q);
        count += 1;
      } else {
        index[i] = -1;
      }
    }
    part_loss[t] = sum;
    part_count[t] = count;
    part_flag[t] = flag;
    part_bad[t] = bad;
  }
}

extern "C" __global__ void ce_softmax_loss_finish(const int n, const int chunks,
                                                  const double* part_loss,
                                                  const int* part_count, const int* part_flag,
                                                  const int* part_bad, const int mode_valid,
                                                  const float fixed_normalizer, float* loss,
                                                  float* normalizer, bool* flag, int* payload) {
  CE_KERNEL_LOOP(i, n) {
    double sum = 0.0;
    long long count = 0;
    int f = 0, b = 0;
    for (int t = 0; t < chunks; ++t) {
      sum += part_loss[t];
      count += part_count[t];
      if (!f && part_flag[t]) {
        f = 1;
        b = part_bad[t];
      }
    }
    float norm = fixed_normalizer;
    if (mode_valid) {
      norm = (float)count;
      norm = norm > 1.0f ? norm : 1.0f;
    }
    const float total = -(float)sum;
    loss[0] = total / norm;
    normalizer[0] = norm;
    flag[0] = f != 0;
    payload[0] = b;
  }
}

extern "C" __global__ void ce_softmax_loss_backward(const int n, const float* prob,
                                                    const int* index, const int C,
                                                    const int inner, const float* top_diff,
                                                    const float* normalizer, float* dx) {
  CE_KERNEL_LOOP(i, n) {
    const int j = i % inner;
    const int c = (i / inner) % C;
    const int o = i / inner / C;
    const int k = index[o * inner + j];
    const float v = k >= 0 ? 1.0f : 0.0f;
    float d = prob[i] * v;
    if (c == k) d = d - v;
    dx[i] = d * (top_diff[0] / normalizer[0]);
  }
}
""", ("ce_softmax_forward", "ce_softmax_loss_partial", "ce_softmax_loss_finish",
      "ce_softmax_loss_backward"))


class LossCache:
    """What ``ce_softmax_loss_backward`` needs from the forward pass: the per-position class
    index (-1 where ignored) and the normalizer, both on the device."""

    def __init__(self, index, normalizer):
        self.index = index
        self.normalizer = normalizer


def _fits(*arrays):
    return all(a.flags.c_contiguous and a.dtype == numpy.float32 and a.size < 2 ** 31
               for a in arrays)


def softmax_launchable(x, y):
    """Whether ``ce_softmax_forward`` takes these (outer, C, inner) arrays: float32,
    C-contiguous, C >= 1."""
    return _fits(x, y) and x.shape == y.shape and x.shape[1] >= 1


def softmax_forward(device, x, y):
    """``y`` = softmax of ``x`` over axis 1, one launch (see the module docstring)."""
    outer, c, inner = x.shape
    n = outer * inner
    device.launch(SOURCE, "ce_softmax_forward", n, int32(n), x, y, int32(c), int32(inner))


def loss_launchable(prob, labels, loss):
    """Whether the loss kernels take these arrays (float32, C-contiguous, C >= 1)."""
    return _fits(prob, labels, loss) and prob.shape[1] >= 1 and loss.size == 1


def softmax_loss_forward(device, prob, labels, ignore_label, normalizer, loss, key, make_error):
    """The loss (2 launches) and the label check; returns a :class:`LossCache`. Arguments as
    :func:`..reference.softmax.softmax_loss_forward`'s."""
    xp = get_array_module(prob)
    outer, c, inner = prob.shape
    positions = outer * inner
    chunks = max(1, (positions + CHUNK - 1) // CHUNK)
    index = xp.empty(positions, numpy.int32)
    part_loss = xp.empty(chunks, numpy.float64)
    part_ints = xp.empty(3 * chunks, numpy.int32)
    norm = xp.empty(1, numpy.float32)
    flag = xp.empty((), numpy.bool_)  # fresh each call: a pending deferred check keeps them
    payload = xp.empty((), numpy.int32)
    part_count, part_flag, part_bad = (part_ints[k * chunks:(k + 1) * chunks] for k in range(3))
    device.launch(SOURCE, "ce_softmax_loss_partial", chunks, int32(chunks), int32(positions),
                  int32(CHUNK), prob, labels, int32(c), int32(inner),
                  int32(ignore_label is not None),
                  int32(0 if ignore_label is None else ignore_label), index, part_loss,
                  part_count, part_flag, part_bad)
    device.launch(SOURCE, "ce_softmax_loss_finish", 1, int32(1), int32(chunks), part_loss,
                  part_count, part_flag, part_bad, int32(normalizer is None),
                  float32(1 if normalizer is None else normalizer), loss, norm, flag, payload)
    if positions:
        backend.check_flag(key, flag, payload, make_error)
    return LossCache(index, norm)


def softmax_loss_backward(device, prob, cache, top_diff, dx):
    """``dx`` = the loss's gradient, one launch reading ``top_diff`` (0-d) and the normalizer
    on the device."""
    outer, c, inner = dx.shape
    device.launch(SOURCE, "ce_softmax_loss_backward", dx.size, int32(dx.size), prob,
                  cache.index, int32(c), int32(inner), top_diff, cache.normalizer, dx)
