"""ReLU and Dropout on the device: one thread per element.

Caffe: src/caffe/layers/relu_layer.cu (``ReLUForward``: ``x > 0 ? x : x * slope``, so NaN
gives ``NaN * slope``; ``ReLUBackward``: ``dy * ((x > 0) + (x <= 0) * slope)``) and
dropout_layer.cu (``y = x * (mask > threshold) * scale`` with a uint32 mask drawn on the
device).
"""
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
