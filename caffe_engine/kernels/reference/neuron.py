"""Elementwise activations as the ReLU layer computes them, in readable array code.

Caffe: src/caffe/layers/relu_layer.cpp. ``y = max(x, 0)`` (NaN stays NaN), leaky:
``y = x`` where ``x > 0`` else ``negative_slope * x``; the gradient ``dy * (x > 0)``, leaky
``dy`` where ``x > 0`` else ``negative_slope * dy``.
"""
from ...backend import get_array_module


def relu_forward(x, y, negative_slope):
    """``y`` = ReLU(``x``) (any shape, float32; ``y`` may be ``x``)."""
    xp = get_array_module(x)
    if negative_slope == 0:
        xp.maximum(x, 0, out=y)
    else:
        xp.copyto(y, xp.where(x > 0, x, x * negative_slope))


def relu_backward(x, dy, dx, negative_slope):
    """``dx`` = the gradient of ReLU at ``x`` (the bottom data, or the top data in place)."""
    xp = get_array_module(dy)
    if negative_slope == 0:
        xp.multiply(dy, x > 0, out=dx)
    else:
        xp.copyto(dx, xp.where(x > 0, dy, dy * negative_slope))
