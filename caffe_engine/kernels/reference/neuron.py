"""Elementwise activations as the ReLU and Dropout layers compute them, in readable array code.

Caffe: src/caffe/layers/relu_layer.cpp. ``y = max(x, 0)`` (NaN stays NaN), leaky:
``y = x`` where ``x > 0`` else ``negative_slope * x``; the gradient ``dy * (x > 0)``, leaky
``dy`` where ``x > 0`` else ``negative_slope * dy``.

Caffe: src/caffe/layers/dropout_layer.cpp and dropout_layer.cu. Dropout keeps an element where
its mask word is above a threshold and scales it by ``1 / (1 - ratio)``; the mask is drawn from
the host stream (bernoulli 0/1, threshold 0) or the device stream (uint32 words, Caffe's GPU
threshold :func:`dropout_threshold`): the streams' choice, :func:`caffe_engine.rng.dropout_mask`.
"""
import numpy

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


# ------------------------------------------------------------------------------------------------
# Dropout
# ------------------------------------------------------------------------------------------------
#: Caffe's ``UINT_MAX``.
UINT_MAX = 4294967295


def dropout_threshold(ratio):
    """Caffe's ``uint_thres_ = static_cast<unsigned int>(UINT_MAX * threshold_)`` for a float32
    ``dropout_ratio`` (src/caffe/layers/dropout_layer.cpp): the product is taken in float
    (``UINT_MAX`` rounds to 2**32), then truncated. An element whose uint32 word is above it is
    kept: ratio 0 gives 0 (only a word 0 is dropped, probability 2**-32), 0.5 gives 2**31.

    Raises:
        ValueError: ``ratio`` outside [0, 1).
    """
    ratio = numpy.float32(ratio)
    if not 0 <= ratio < 1:
        raise ValueError(f"dropout ratio must be in [0, 1), got {ratio}")
    return int(numpy.float32(UINT_MAX) * ratio)


def _kept(mask, threshold):
    return mask > numpy.dtype(mask.dtype).type(threshold)


def dropout_forward(x, mask, threshold, scale, y):
    """``y = x * (mask > threshold) * scale`` (float32, two roundings: ``x * 1`` is exact, so
    it is ``x * scale`` where kept and ``x * 0`` elsewhere; ``y`` may be ``x``). ``mask`` has
    ``x``'s shape (or broadcasts to it), any unsigned dtype. Caffe: dropout_layer.cpp/.cu."""
    xp = get_array_module(x)
    xp.multiply(x, _kept(mask, threshold), out=y)
    y *= scale


def dropout_backward(dy, mask, threshold, scale, dx):
    """``dx = dy * (mask > threshold) * scale`` in that order (dropout_layer.cpp's
    ``top_diff * mask * scale``; ``dx`` may be ``dy``)."""
    xp = get_array_module(dy)
    xp.multiply(dy, _kept(mask, threshold), out=dx)
    dx *= scale
