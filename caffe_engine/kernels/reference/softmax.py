"""Softmax and SoftmaxWithLoss in array code (Caffe's float32 arithmetic order).

Caffe: src/caffe/layers/softmax_layer.cpp, softmax_loss_layer.cpp.

Arrays are viewed as (outer, C, inner): the softmax runs over the middle axis at every
(outer, inner) position; the labels are the label blob's float values viewed as (outer, inner).
"""
import numpy

from ... import backend
from ...backend import get_array_module

f32 = numpy.float32
FLT_MIN = numpy.finfo(f32).tiny


def softmax_forward(x, y, scale):
    """``y`` = softmax of ``x`` over axis 1: subtract the max, exp, sum, divide. ``scale`` is an
    (outer, 1, inner) float32 buffer; ``y`` may be ``x``."""
    xp = get_array_module(x)
    xp.max(x, axis=1, keepdims=True, out=scale)
    xp.subtract(x, scale, out=y)
    xp.exp(y, out=y)
    xp.sum(y, axis=1, keepdims=True, out=scale)
    y /= scale


def label_check(key, labels, valid, num_classes, make_error):
    """Raise (or defer, on the device) ``make_error(v)`` for the first non-ignored label ``v``
    outside [0, num_classes) (:func:`caffe_engine.backend.check_values` under ``key``);
    return the labels to index with: ignored (``valid`` False) and out-of-range ones set to 0.

    Args:
        labels: int32 array; valid: bool array of its shape, or None (all valid).
    """
    xp = get_array_module(labels)
    in_range = (labels >= 0) & (labels < num_classes)
    bad = ~in_range if valid is None else valid & ~in_range
    backend.check_values(key, bad, labels, make_error)
    return xp.where(in_range if valid is None else valid & in_range, labels, 0)


def softmax_loss_forward(prob, labels, ignore_label, normalizer, loss, key, make_error):
    """``loss[...] = -sum(log(max(p[label], FLT_MIN))) / normalizer`` over the non-ignored
    positions.

    Args:
        prob: (outer, C, inner) float32 probabilities; labels: (outer, inner) label values
            (float, truncated to int); ignore_label: int or None; normalizer: float32, or None
            for VALID (the number of non-ignored labels, at least 1); loss: 0-d float32 output;
            key, make_error: the label check's (:func:`label_check`).

    Returns:
        the cache :func:`softmax_loss_backward` takes.
    """
    xp = get_array_module(prob)
    labels = labels.astype(numpy.int32)
    if ignore_label is None:
        valid = xp.ones(labels.shape, bool)
    else:
        valid = labels != ignore_label
    labels = label_check(key, labels, valid, prob.shape[1], make_error)
    if normalizer is None:
        normalizer = xp.maximum(valid.sum(dtype=numpy.int64).astype(f32), f32(1))
    p = xp.take_along_axis(prob, labels[:, None, :], axis=1)[:, 0, :]
    logp = xp.log(xp.maximum(p, FLT_MIN))
    value = -xp.where(valid, logp, f32(0)).sum(dtype=f32)
    loss[...] = value / normalizer
    return labels, valid, normalizer


def softmax_loss_backward(prob, cache, top_diff, dx):
    """``dx = (prob - onehot(label)) * valid * (top_diff / normalizer)``, all (outer, C, inner)
    but ``top_diff`` (the loss top's 0-d diff); ``cache`` from :func:`softmax_loss_forward`."""
    xp = get_array_module(dx)
    labels, valid, normalizer = cache
    outer, c, inner = dx.shape
    xp.multiply(prob.reshape(dx.shape), valid[:, None, :], out=dx)
    flat = dx.reshape(-1)
    rows = xp.arange(outer, dtype=numpy.int64)[:, None] * (c * inner)
    cols = xp.arange(inner, dtype=numpy.int64)[None, :]
    at = (rows + labels.astype(numpy.int64) * inner + cols).ravel()
    flat[at] -= valid.ravel().astype(f32)
    scale = (top_diff.reshape(()) / normalizer).astype(f32)
    dx *= scale
