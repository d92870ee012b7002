"""Finite-difference gradient checks, in the manner of Caffe's GradientChecker.

Caffe: include/caffe/test/test_gradient_check_util.hpp. For every element of every checked
bottom and parameter blob, the central difference ``(f(x + h) - f(x - h)) / 2h`` with
``h = 1e-2`` is compared with the analytic gradient from ``backward``; they must agree within
``1e-3 * max(|analytic|, |estimate|, 1)`` (Caffe's scale rule). The layer runs in float32 as
always; the objective is ``sum_i top_i * r_i`` with fixed random weights ``r`` (the top diffs),
summed in float64 so that unperturbed outputs cancel exactly. Parameter diffs start at zero,
as the checker requires.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine.blob import Blob
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

STEPSIZE = 1e-2
THRESHOLD = 1e-3


def blobs_of(values):
    """One float32 Blob per array, holding its values (data only)."""
    blobs = []
    for value in values:
        blob = Blob(value.shape)
        blob.data[...] = value
        blobs.append(blob)
    return blobs


def make_layer(text, bottom_values, seed=0):
    """Create and set up a layer from prototxt text; params get random values."""
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottoms = blobs_of(bottom_values)
    tops = [Blob() for _ in lp.top]
    layer.setup(bottoms, tops)
    rng = numpy.random.RandomState(seed)
    for blob in layer.blobs:
        blob.data[...] = rng.standard_normal(blob.shape)
    return layer, bottoms, tops


def check_gradient(layer, bottoms, tops, check_bottoms, seed=1, kink=None, kink_range=-1.0):
    """Assert analytic == numeric gradients for ``check_bottoms`` and every param blob."""
    rng = numpy.random.RandomState(seed)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    weights = [rng.standard_normal(t.shape).astype(numpy.float32) for t in tops]

    def objective():
        layer.reshape(bottoms, tops)
        layer.forward(bottoms, tops)
        return sum(float(numpy.sum(t.data.astype(numpy.float64) * w))
                   for t, w in zip(tops, weights))

    for t, w in zip(tops, weights):
        t.diff[...] = w
    for blob in layer.blobs:
        blob.diff[...] = 0
    propagate = [i in check_bottoms for i in range(len(bottoms))]
    layer.backward(tops, propagate, bottoms)
    checked = [(f"bottom {i}", bottoms[i], bottoms[i].diff.copy()) for i in check_bottoms]
    checked += [(f"param {k}", b, b.diff.copy()) for k, b in enumerate(layer.blobs)]

    count = 0
    for what, blob, analytic in checked:
        flat = blob.data.reshape(-1)
        for j in range(flat.size):
            value = flat[j]
            if kink is not None and abs(float(value) - kink) < kink_range:
                continue
            flat[j] = value + numpy.float32(STEPSIZE)
            plus = objective()
            flat[j] = value - numpy.float32(STEPSIZE)
            minus = objective()
            flat[j] = value
            estimate = (plus - minus) / (2 * STEPSIZE)
            computed = float(analytic.reshape(-1)[j])
            scale = max(abs(computed), abs(estimate), 1.0)
            assert abs(computed - estimate) <= THRESHOLD * scale, (
                f"{what}[{numpy.unravel_index(j, blob.shape)}]: analytic {computed}, "
                f"numeric {estimate}")
            count += 1
    assert count > 0
    return count


def gaussian(shape, seed=2):
    return numpy.random.RandomState(seed).standard_normal(shape).astype(numpy.float32)


def distinct(shape, seed=3, spacing=0.05):
    """Values pairwise at least ``spacing`` apart (no ties survive a +-stepsize nudge)."""
    n = int(numpy.prod(shape))
    values = numpy.random.RandomState(seed).permutation(n) * spacing - n * spacing / 2
    return values.reshape(shape).astype(numpy.float32)


# -- Convolution -----------------------------------------------------------------------------
CONV_CASES = {
    "basic": ("num_output: 3 kernel_size: 3", (2, 2, 5, 5)),
    "group_pad": ("num_output: 4 kernel_size: 3 pad: 1 group: 2", (2, 4, 4, 4)),
    "stride_dilation": ("num_output: 2 kernel_size: 2 stride: 2 dilation: 2 pad: 1",
                        (2, 3, 7, 6)),
    "rect_hw": ("num_output: 2 kernel_h: 3 kernel_w: 1 stride_h: 2 stride_w: 1 pad_w: 1 pad_h: 0",
                (1, 2, 6, 4)),
    "no_bias_1x1": ("num_output: 3 kernel_size: 1 bias_term: false", (2, 4, 3, 3)),
    "nd_3d": ("num_output: 2 kernel_size: 2 pad: 1 stride: 2", (1, 2, 3, 4, 3)),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_convolution(name):
    conv, shape = CONV_CASES[name]
    layer, bottoms, tops = make_layer(
        f'name: "conv" type: "Convolution" bottom: "x" top: "y" '
        f'convolution_param {{ {conv} }}', [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


def test_convolution_two_bottoms_share_weights():
    layer, bottoms, tops = make_layer(
        'name: "conv" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        'convolution_param { num_output: 2 kernel_size: 3 pad: 1 }',
        [gaussian((1, 2, 4, 4), 4), gaussian((1, 2, 4, 4), 5)])
    check_gradient(layer, bottoms, tops, [0, 1])


# -- Pooling -------------------------------------------------------------------------------
POOL_CASES = {
    "max_k3_s2_pad1": ("pool: MAX kernel_size: 3 stride: 2 pad: 1", (2, 2, 7, 7)),
    "max_k2_s2_ceil": ("pool: MAX kernel_size: 2 stride: 2", (1, 2, 5, 5)),
    "max_rect_floor": ("pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 "
                       "round_mode: FLOOR", (1, 2, 6, 5)),
    "max_global": ("pool: MAX global_pooling: true", (2, 2, 3, 4)),
    "ave_k3_s2_pad1": ("pool: AVE kernel_size: 3 stride: 2 pad: 1", (2, 2, 6, 6)),
    "ave_k3_s2_ceil": ("pool: AVE kernel_size: 3 stride: 2", (1, 2, 6, 6)),
    "ave_rect_pad": ("pool: AVE kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 "
                     "pad_w: 1", (1, 2, 5, 4)),
    "ave_global": ("pool: AVE global_pooling: true", (2, 2, 3, 4)),
}


@pytest.mark.parametrize("name", sorted(POOL_CASES))
def test_pooling(name):
    pool, shape = POOL_CASES[name]
    tops = 'top: "y" top: "mask"' if "MAX" in pool and "global" not in pool else 'top: "y"'
    layer, bottoms, tops = make_layer(
        f'name: "pool" type: "Pooling" bottom: "x" {tops} pooling_param {{ {pool} }}',
        [distinct(shape)])
    if len(tops) > 1:
        # The mask top is an index, not a function to differentiate: give it no weight.
        check_gradient_ignoring_mask(layer, bottoms, tops)
    else:
        check_gradient(layer, bottoms, tops, [0])


def check_gradient_ignoring_mask(layer, bottoms, tops):
    """Check a MAX pooling layer with a mask top, treating only top 0 as the objective."""

    class OneTop:
        def __init__(self, inner):
            self.inner, self.blobs = inner, inner.blobs

        def reshape(self, b, t):
            self.inner.reshape(b, tops)

        def forward(self, b, t):
            self.inner.forward(b, tops)

        def backward(self, t, pd, b):
            self.inner.backward(tops, pd, b)

    check_gradient(OneTop(layer), bottoms, tops[:1], [0])


# -- InnerProduct ----------------------------------------------------------------------------
@pytest.mark.parametrize("ip, shape", [
    ("num_output: 4", (2, 3, 2, 2)),
    ("num_output: 3 transpose: true", (3, 5)),
    ("num_output: 2 axis: 2 bias_term: false", (2, 3, 4)),
], ids=["basic", "transpose", "axis2_no_bias"])
def test_inner_product(ip, shape):
    layer, bottoms, tops = make_layer(
        f'name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param {{ {ip} }}',
        [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


# -- ReLU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("slope", [0.0, 0.1])
def test_relu(slope):
    x = gaussian((2, 3, 4, 4))
    x += numpy.sign(x) * 0.05  # away from the kink at 0
    layer, bottoms, tops = make_layer(
        f'name: "relu" type: "ReLU" bottom: "x" top: "y" relu_param {{ negative_slope: {slope} }}',
        [x])
    check_gradient(layer, bottoms, tops, [0], kink=0.0, kink_range=0.01)


# -- Softmax and SoftmaxWithLoss -------------------------------------------------------------
@pytest.mark.parametrize("axis, shape", [(1, (2, 4, 2, 3)), (-1, (3, 5)), (2, (2, 3, 4))])
def test_softmax(axis, shape):
    layer, bottoms, tops = make_layer(
        f'name: "sm" type: "Softmax" bottom: "x" top: "y" softmax_param {{ axis: {axis} }}',
        [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


@pytest.mark.parametrize("extra, shape, label_shape", [
    ("", (4, 5), (4,)),
    ("loss_param { ignore_label: 1 }", (2, 3, 2, 2), (2, 1, 2, 2)),
    ("loss_param { normalization: FULL ignore_label: 0 }", (2, 3, 3), (2, 3)),
    ("loss_param { normalization: BATCH_SIZE } loss_weight: 2", (2, 4, 3), (2, 3)),
    ("loss_param { normalize: false } softmax_param { axis: 2 }", (2, 3, 4), (2, 3)),
], ids=["valid", "ignore", "full_ignore", "batch_size_lw2", "legacy_axis2"])
def test_softmax_with_loss(extra, shape, label_shape):
    classes = shape[2] if "axis: 2" in extra else shape[1]
    labels = numpy.random.RandomState(7).randint(0, classes, label_shape).astype(numpy.float32)
    layer, bottoms, tops = make_layer(
        f'name: "loss" type: "SoftmaxWithLoss" bottom: "x" bottom: "label" top: "loss" {extra}',
        [gaussian(shape), labels])
    check_gradient(layer, bottoms, tops, [0])


def test_split_sums_top_gradients():
    layer, bottoms, tops = make_layer('name: "s" type: "Split" bottom: "x" top: "a" top: "b" top: "c"',
                                      [gaussian((2, 3, 4))])
    check_gradient(layer, bottoms, tops, [0])
