"""Gradient checks (``gradient_check.check_gradient``, Caffe's GradientChecker with its default
step 1e-2 and threshold 1e-3) for Convolution, Pooling, InnerProduct, ReLU, Softmax,
SoftmaxWithLoss and Split. The layers on the kernels (Convolution, Pooling, InnerProduct, ReLU)
are checked on every kernel set (the ``kernel_set`` fixture).
"""
import numpy
import pytest

from gradient_check import check_gradient, distinct, gaussian, gpu_twins, make_layer


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
def test_convolution(name, kernel_set):
    conv, shape = CONV_CASES[name]
    layer, bottoms, tops = make_layer(
        f'name: "conv" type: "Convolution" bottom: "x" top: "y" '
        f'convolution_param {{ {conv} }}', [gaussian(shape)])
    assert check_gradient(layer, bottoms, tops, [0])


def test_convolution_two_bottoms_share_weights(kernel_set):
    layer, bottoms, tops = make_layer(
        'name: "conv" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        'convolution_param { num_output: 2 kernel_size: 3 pad: 1 }',
        [gaussian((1, 2, 4, 4), 4), gaussian((1, 2, 4, 4), 5)])
    assert check_gradient(layer, bottoms, tops, [0, 1])


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
def test_pooling(name, kernel_set):
    pool, shape = POOL_CASES[name]
    tops = 'top: "y" top: "mask"' if "MAX" in pool and "global" not in pool else 'top: "y"'
    layer, bottoms, tops = make_layer(
        f'name: "pool" type: "Pooling" bottom: "x" {tops} pooling_param {{ {pool} }}',
        [distinct(shape)])
    # The mask top is an index, not a function to differentiate: only top 0 is the objective.
    assert check_gradient(layer, bottoms, tops, [0], top_id=0 if len(tops) > 1 else None)


# -- InnerProduct ----------------------------------------------------------------------------
@pytest.mark.parametrize("ip, shape", [
    ("num_output: 4", (2, 3, 2, 2)),
    ("num_output: 3 transpose: true", (3, 5)),
    ("num_output: 2 axis: 2 bias_term: false", (2, 3, 4)),
], ids=["basic", "transpose", "axis2_no_bias"])
def test_inner_product(ip, shape, kernel_set):
    layer, bottoms, tops = make_layer(
        f'name: "ip" type: "InnerProduct" bottom: "x" top: "y" inner_product_param {{ {ip} }}',
        [gaussian(shape)])
    assert check_gradient(layer, bottoms, tops, [0])


# -- ReLU ------------------------------------------------------------------------------------
@pytest.mark.parametrize("slope", [0.0, 0.1])
def test_relu(slope, kernel_set):
    x = gaussian((2, 3, 4, 4))
    x += numpy.sign(x) * 0.05  # away from the kink at 0
    layer, bottoms, tops = make_layer(
        f'name: "relu" type: "ReLU" bottom: "x" top: "y" relu_param {{ negative_slope: {slope} }}',
        [x])
    assert check_gradient(layer, bottoms, tops, [0], kink=0.0, kink_range=0.01)


# -- Softmax and SoftmaxWithLoss -------------------------------------------------------------
@pytest.mark.parametrize("axis, shape", [(1, (2, 4, 2, 3)), (-1, (3, 5)), (2, (2, 3, 4))])
def test_softmax(axis, shape):
    layer, bottoms, tops = make_layer(
        f'name: "sm" type: "Softmax" bottom: "x" top: "y" softmax_param {{ axis: {axis} }}',
        [gaussian(shape)])
    assert check_gradient(layer, bottoms, tops, [0])


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
    assert check_gradient(layer, bottoms, tops, [0])


def test_split_sums_top_gradients():
    layer, bottoms, tops = make_layer('name: "s" type: "Split" bottom: "x" top: "a" top: "b" top: "c"',
                                      [gaussian((2, 3, 4))])
    assert check_gradient(layer, bottoms, tops, [0])


# GPU mode: each gradient check above once more with the blobs on CuPy (skipped without a device)
globals().update(gpu_twins(globals()))
