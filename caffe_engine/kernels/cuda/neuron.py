"""ReLU and Dropout on the device: one thread per element.

Caffe: src/caffe/layers/relu_layer.cu (``ReLUForward``: ``x > 0 ? x : x * slope``, so NaN
gives ``NaN * slope``; ``ReLUBackward``: ``dy * ((x > 0) + (x <= 0) * slope)``) and
dropout_layer.cu (``y = x * (mask > threshold) * scale`` with a uint32 mask, and the gradient
``dy * scale * (mask > threshold)``). The mask and threshold come from the kernel set's
``dropout_mask`` (:func:`..reference.neuron.dropout_mask`): device words (uint32, Caffe's GPU
threshold) in normal GPU runs; a host bernoulli mask (uint8 0/1, threshold 0) in the exact mode,
which these kernels do not take (:func:`dropout_launchable`), so it runs the reference array
code on the device. The gradient's order (``dy * scale`` first, as Caffe's .cu) differs from the
reference's (``dy * mask * scale``, Caffe's .cpp) only where ``dy * scale`` overflows (NaN here,
0 there, for a dropped element).
"""
import numpy

from .device import float32, int32
from .source import Source

SOURCE = Source("neuron", r"""
extern "C" __global__ void ce_relu_forward(const int n, const float* x, float* y,
                                           const float slope) {
  CE_KERNEL_LOOP(i, n) {
    const float v = x[i];
    y[i] = v > 0 ? v : (slope == 0 ? (v != v ? v : 0.0f) : v * slope);
  }
}

extern "C" __global__ void ce_relu_backward(const int n, const float* x, const float* dy,
                                            float* dx, const float slope) {
  CE_KERNEL_LOOP(i, n) {
    dx[i] = x[i] > 0 ? dy[i] : dy[i] * slope;
  }
}

extern "C" __global__ void ce_dropout_forward(const int n, const float* x,
                                              const unsigned int* mask,
                                              const unsigned int threshold, const float scale,
                                              float* y) {
  CE_KERNEL_LOOP(i, n) {
    y[i] = x[i] * (mask[i] > threshold) * scale;
  }
}

extern "C" __global__ void ce_dropout_backward(const int n, const float* dy,
                                               const unsigned int* mask,
                                               const unsigned int threshold, const float scale,
                                               float* dx) {
  CE_KERNEL_LOOP(i, n) {
    dx[i] = dy[i] * scale * (mask[i] > threshold);
  }
}
""", ("ce_relu_forward", "ce_relu_backward", "ce_dropout_forward", "ce_dropout_backward"))


def relu_forward(device, x, y, negative_slope):
    """``y`` = ReLU(``x``), contiguous float32 of one size (``y`` may be ``x``)."""
    device.launch(SOURCE, "ce_relu_forward", x.size, int32(x.size), x, y,
                  float32(negative_slope))


def relu_backward(device, x, dy, dx, negative_slope):
    """``dx`` = ``dy`` where ``x > 0``, else ``negative_slope * dy`` (``0 * dy`` for ReLU)."""
    device.launch(SOURCE, "ce_relu_backward", dy.size, int32(dy.size), x, dy, dx,
                  float32(negative_slope))


def dropout_launchable(x, mask, y):
    """Whether the dropout kernels take these arrays: a uint32 ``mask`` of ``x``'s size, all
    three C-contiguous (``y`` may be ``x``)."""
    return (mask.dtype == numpy.uint32 and mask.size == x.size == y.size
            and x.flags.c_contiguous and mask.flags.c_contiguous and y.flags.c_contiguous)


def dropout_forward(device, x, mask, threshold, scale, y):
    """``y = x * (mask > threshold) * scale``: float32 ``x``, ``y``, uint32 ``mask`` (see
    :func:`dropout_launchable`), ``threshold`` in [0, 2**32), ``scale`` float32."""
    device.launch(SOURCE, "ce_dropout_forward", x.size, int32(x.size), x, mask,
                  numpy.uint32(threshold), float32(scale), y)


def dropout_backward(device, dy, mask, threshold, scale, dx):
    """``dx = dy * scale * (mask > threshold)`` (Caffe's DropoutBackward; ``dx`` may be
    ``dy``)."""
    device.launch(SOURCE, "ce_dropout_backward", dy.size, int32(dy.size), dy, mask,
                  numpy.uint32(threshold), float32(scale), dx)
