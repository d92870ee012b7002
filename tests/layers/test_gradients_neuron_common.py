"""Gradient checks and targeted tests for the neuron layers and the common data-moving layers.

Finite differences in Caffe's manner (``gradient_check.check_gradient``) for every type with a
backward; direct checks for what the fixtures in ../shared/caffe_reference/layers leave open:
in-place use, Reshape's 0 / -1 inference and its errors, ArgMax ties, Eltwise MAX ties,
Dropout masks, the layers that share their top with a bottom or a param.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from caffe_engine.rng import set_random_seed
from gradient_check import (blobs_of, check_gradient, distinct, gaussian, gpu_twins,
                            make_layer, put)

f32 = numpy.float32


def away_from(values, kinks, margin=0.05):
    """Nudge every value at least ``margin`` away from each kink (keeps finite differences
    on one side of it)."""
    values = values.copy()
    for kink in kinks:
        near = numpy.abs(values - kink) < margin
        values[near] = kink + numpy.where(values[near] >= kink, margin, -margin)
    return values.astype(f32)


def build(text, values, phase=caffe_pb2.TEST, in_place=False):
    """A set-up layer from prototxt text, without touching its params (unlike make_layer).

    ``in_place``: the single top is the bottom blob itself.
    """
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(lp, phase)
    bottoms = blobs_of(values)
    tops = [bottoms[0]] if in_place else [Blob() for _ in lp.top]
    layer.setup(bottoms, tops)
    return layer, bottoms, tops


def run(layer, bottoms, tops, top_diffs, propagate=None):
    """reshape + forward, set the top diffs, backward; returns (top data, bottom diffs)."""
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    outs = [backend.to_numpy(t.data).copy() for t in tops]
    for t, d in zip(tops, top_diffs):
        put(t.diff, d)
    layer.backward(tops, propagate or [True] * len(bottoms), bottoms)
    return outs, [backend.to_numpy(b.diff).copy() for b in bottoms]


# ------------------------------------------------------------------------------------------------
# Neuron layers
# ------------------------------------------------------------------------------------------------
SHAPE = (2, 3, 3, 2)

NEURON_CASES = {
    "absval": ('type: "AbsVal"', away_from(gaussian(SHAPE), [0.0])),
    "bnll": ('type: "BNLL"', gaussian(SHAPE) * 3),
    "clip": ('type: "Clip" clip_param { min: -0.5 max: 0.7 }',
             away_from(gaussian(SHAPE), [-0.5, 0.7])),
    "elu": ('type: "ELU"', away_from(gaussian(SHAPE), [0.0])),
    "elu_alpha": ('type: "ELU" elu_param { alpha: 0.5 }', away_from(gaussian(SHAPE), [0.0])),
    "exp": ('type: "Exp"', gaussian(SHAPE)),
    "exp_base_scale_shift": ('type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }',
                             gaussian(SHAPE)),
    "exp_natural_shift": ('type: "Exp" exp_param { scale: 0.7 shift: 0.5 }', gaussian(SHAPE)),
    "log": ('type: "Log"', numpy.abs(gaussian(SHAPE)) + f32(0.5)),
    "log_base_scale_shift": ('type: "Log" log_param { base: 10 scale: 2 shift: 1 }',
                             numpy.abs(gaussian(SHAPE)) + f32(0.2)),
    "power_square": ('type: "Power" power_param { power: 2 scale: 0.5 shift: 1 }',
                     gaussian(SHAPE)),
    "power_sqrt": ('type: "Power" power_param { power: 0.5 }',
                   numpy.abs(gaussian(SHAPE)) + f32(0.5)),
    "power_cube": ('type: "Power" power_param { power: 3 scale: -1.5 }', gaussian(SHAPE)),
    "power_general": ('type: "Power" power_param { power: 1.7 scale: 0.7 shift: 2 }',
                      gaussian(SHAPE)),
    "power_linear": ('type: "Power" power_param { power: 1 scale: 2 shift: -1 }', gaussian(SHAPE)),
    "power_zero": ('type: "Power" power_param { power: 0 scale: 3 shift: 1 }', gaussian(SHAPE)),
    "sigmoid": ('type: "Sigmoid"', gaussian(SHAPE) * 2),
    "swish": ('type: "Swish"', gaussian(SHAPE) * 2),
    "swish_beta": ('type: "Swish" swish_param { beta: 1.5 }', gaussian(SHAPE) * 2),
    "tanh": ('type: "TanH"', gaussian(SHAPE)),
    "prelu": ('type: "PReLU"', away_from(gaussian(SHAPE), [0.0])),
    "prelu_shared": ('type: "PReLU" prelu_param { channel_shared: true }',
                     away_from(gaussian(SHAPE), [0.0])),
    "prelu_2d": ('type: "PReLU"', away_from(gaussian((4, 5)), [0.0])),
}


@pytest.mark.parametrize("name", sorted(NEURON_CASES))
def test_neuron_gradient(name):
    text, x = NEURON_CASES[name]
    layer, bottoms, tops = make_layer(f'name: "n" {text} bottom: "x" top: "y"', [x])
    check_gradient(layer, bottoms, tops, [0])


def test_dropout_gradient_test_phase_is_identity():
    x = gaussian(SHAPE)
    layer, bottoms, tops = build('name: "d" type: "Dropout" bottom: "x" top: "y"', [x])
    check_gradient(layer, bottoms, tops, [0])
    dy = gaussian(SHAPE, seed=9)
    (y,), (dx,) = run(layer, bottoms, tops, [dy])
    numpy.testing.assert_array_equal(y, x)
    numpy.testing.assert_array_equal(dx, dy)


def test_dropout_gradient_train_with_a_fixed_mask():
    layer, bottoms, tops = build('name: "d" type: "Dropout" bottom: "x" top: "y" '
                                 'dropout_param { dropout_ratio: 0.3 }', [gaussian(SHAPE)],
                                 phase=caffe_pb2.TRAIN)
    forward = layer.forward

    def seeded_forward(b, t):  # the same mask on every pass of the checker
        set_random_seed(123)
        forward(b, t)

    layer.forward = seeded_forward
    check_gradient(layer, bottoms, tops, [0])


def test_dropout_train_mask_scale_and_fresh_draws():
    x = numpy.ones((4, 50), f32)
    layer, bottoms, tops = build('name: "d" type: "Dropout" bottom: "x" top: "y" '
                                 'dropout_param { dropout_ratio: 0.3 }', [x],
                                 phase=caffe_pb2.TRAIN)
    set_random_seed(7)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    first = tops[0].data.copy()
    scale = f32(1.0 / (1.0 - float(f32(0.3))))
    assert set(numpy.unique(first).tolist()) <= {0.0, float(scale)}
    # The mask is drawn from Caffe's stream: bernoulli(1 - ratio), one word per element.
    set_random_seed(7)
    from caffe_engine.rng import get_rng
    expected = get_rng().bernoulli(x.size, 1.0 - float(f32(0.3))).reshape(x.shape)
    numpy.testing.assert_array_equal(first != 0, expected.astype(bool))
    assert layer.mask.dtype in (numpy.uint8, numpy.bool_)
    layer.forward(bottoms, tops)  # a fresh draw on every TRAIN forward
    assert not numpy.array_equal(first, tops[0].data)
    tops[0].diff[...] = 1
    layer.backward(tops, [True], bottoms)
    numpy.testing.assert_array_equal(bottoms[0].diff, tops[0].data)


def test_dropout_rejects_ratio_one():
    with pytest.raises(CaffeError, match="dropout_ratio"):
        build('name: "d" type: "Dropout" bottom: "x" top: "y" dropout_param { dropout_ratio: 1 }',
              [gaussian(SHAPE)])


def test_prelu_default_filler_and_shapes():
    layer, _, _ = build('name: "p" type: "PReLU" bottom: "x" top: "y"', [gaussian(SHAPE)])
    assert layer.blobs[0].shape == (3,)
    numpy.testing.assert_array_equal(layer.blobs[0].data, f32(0.25))
    layer, _, _ = build('name: "p" type: "PReLU" bottom: "x" top: "y" '
                        'prelu_param { channel_shared: true '
                        'filler { type: "constant" value: 0.1 } }',
                        [gaussian(SHAPE)])
    assert layer.blobs[0].shape == ()
    assert layer.blobs[0].data == f32(0.1)
    with pytest.raises(CaffeError, match="axes"):
        build('name: "p" type: "PReLU" bottom: "x" top: "y"', [gaussian((5,))])


INPLACE_SAFE = {
    "ReLU": 'type: "ReLU" relu_param { negative_slope: 0.1 }',
    "PReLU": 'type: "PReLU" prelu_param { filler { type: "constant" value: 0.3 } }',
    "ELU": 'type: "ELU" elu_param { alpha: 0.7 }',
    "Sigmoid": 'type: "Sigmoid"',
    "TanH": 'type: "TanH"',
    "Swish": 'type: "Swish" swish_param { beta: 1.3 }',
    "Exp": 'type: "Exp" exp_param { base: 3 scale: 0.5 }',
    "DropoutTest": 'type: "Dropout"',
    "DropoutTrain": 'type: "Dropout" dropout_param { dropout_ratio: 0.4 }',
    "Scale": 'type: "Scale" scale_param { bias_term: true filler { type: "constant" value: 1.5 } '
             'bias_filler { type: "constant" value: -0.2 } }',
    "Bias": 'type: "Bias" bias_param { filler { type: "constant" value: 0.4 } }',
}


@pytest.mark.parametrize("name", sorted(INPLACE_SAFE))
def test_in_place_matches_separate_top(name):
    """In place gives the same top, bottom diff and param diff as a separate top."""
    text = f'name: "l" {INPLACE_SAFE[name]} bottom: "x" top: "y"'
    phase = caffe_pb2.TRAIN if name == "DropoutTrain" else caffe_pb2.TEST
    x = away_from(gaussian(SHAPE), [0.0])
    dy = gaussian(SHAPE, seed=5)
    results = []
    for in_place in (False, True):
        layer, bottoms, tops = build(text, [x], phase=phase, in_place=in_place)
        set_random_seed(11)
        (y,), (dx,) = run(layer, bottoms, tops, [dy])
        results.append((y, dx, [b.diff.copy() for b in layer.blobs]))
    (y0, dx0, p0), (y1, dx1, p1) = results
    numpy.testing.assert_array_equal(y1, y0)
    numpy.testing.assert_array_equal(dx1, dx0)
    for a, b in zip(p1, p0):
        numpy.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("layer_type", ["AbsVal", "Flatten", "Reshape"])
def test_in_place_refused(layer_type):
    extra = ' reshape_param { shape { dim: -1 } }' if layer_type == "Reshape" else ""
    with pytest.raises(CaffeError, match="in-place"):
        build(f'name: "l" type: "{layer_type}" bottom: "x" top: "x"{extra}', [gaussian(SHAPE)],
              in_place=True)


def test_threshold_forward_and_no_backward():
    x = numpy.array([[-1, 0.2, 0.2001, 3]], f32)
    layer, bottoms, tops = build('name: "t" type: "Threshold" bottom: "x" top: "y" '
                                 'threshold_param { threshold: 0.2 }', [x])
    layer.forward(bottoms, tops)
    numpy.testing.assert_array_equal(tops[0].data, [[0, 0, 1, 1]])
    layer.backward(tops, [False], bottoms)
    with pytest.raises(CaffeError, match="no backward"):
        layer.backward(tops, [True], bottoms)


def test_clip_gradient_passes_at_the_bounds():
    x = numpy.array([-0.6, -0.5, 0.0, 0.7, 0.8], f32)
    layer, bottoms, tops = build('name: "c" type: "Clip" bottom: "x" top: "y" '
                                 'clip_param { min: -0.5 max: 0.7 }', [x])
    (y,), (dx,) = run(layer, bottoms, tops, [numpy.ones(5, f32)])
    numpy.testing.assert_array_equal(y, f32([-0.5, -0.5, 0.0, 0.7, 0.7]))
    numpy.testing.assert_array_equal(dx, [0, 1, 1, 1, 0])


# ------------------------------------------------------------------------------------------------
# Common layers: gradients
# ------------------------------------------------------------------------------------------------
COMMON_CASES = {
    "concat_axis1": ('type: "Concat"', [(2, 2, 3), (2, 3, 3), (2, 1, 3)], [0, 1, 2]),
    "concat_axis0": ('type: "Concat" concat_param { axis: 0 }', [(1, 3, 2), (2, 3, 2)], [0, 1]),
    "concat_legacy_dim": ('type: "Concat" concat_param { concat_dim: 2 }', [(2, 2, 1), (2, 2, 3)],
                          [0, 1]),
    "eltwise_sum_coeff": ('type: "Eltwise" eltwise_param { operation: SUM coeff: 1 coeff: -0.5 '
                          'coeff: 2 }', [SHAPE] * 3, [0, 1, 2]),
    "eltwise_prod_stable": ('type: "Eltwise" eltwise_param { operation: PROD }', [SHAPE] * 3,
                            [0, 1, 2]),
    "eltwise_prod_unstable": ('type: "Eltwise" eltwise_param { operation: PROD '
                              'stable_prod_grad: false }', [SHAPE] * 2, [0, 1]),
    "tile_axis1": ('type: "Tile" tile_param { axis: 1 tiles: 3 }', [(2, 2, 3)], [0]),
    "tile_axis_neg1": ('type: "Tile" tile_param { axis: -1 tiles: 2 }', [(2, 3)], [0]),
    "reduction_sum": ('type: "Reduction"', [(2, 3, 4)], [0]),
    "reduction_sumsq": ('type: "Reduction" '
                        'reduction_param { operation: SUMSQ axis: -1 coeff: 0.5 }',
                        [(2, 3, 4)], [0]),
    "reduction_mean": ('type: "Reduction" reduction_param { operation: MEAN axis: 1 coeff: -2 }',
                       [(3, 2, 5)], [0]),
    "bias_param": ('type: "Bias"', [SHAPE], [0]),
    "bias_param_axes2": ('type: "Bias" bias_param { axis: 1 num_axes: 2 }', [SHAPE], [0]),
    "bias_scalar": ('type: "Bias" bias_param { num_axes: 0 }', [(3, 4)], [0]),
    "bias_two_bottoms": ('type: "Bias"', [(2, 3, 4, 2), (3, 4)], [0, 1]),
    "bias_two_bottoms_scalar": ('type: "Bias"', [(2, 3), ()], [0, 1]),
    "scale_param": ('type: "Scale"', [SHAPE], [0]),
    "scale_bias": ('type: "Scale" scale_param { bias_term: true }', [SHAPE], [0]),
    "scale_axes_to_end": ('type: "Scale" scale_param { num_axes: -1 }', [SHAPE], [0]),
    "scale_scalar_bias": ('type: "Scale" scale_param { num_axes: 0 bias_term: true }', [(2, 3, 2)],
                          [0]),
    "scale_two_bottoms": ('type: "Scale"', [(2, 3, 4, 2), (3, 4)], [0, 1]),
    "scale_two_bottoms_axis0_bias": ('type: "Scale" scale_param { axis: 0 bias_term: true }',
                                     [(2, 3, 2, 2), (2, 3)], [0, 1]),
    "scale_outer1": ('type: "Scale" scale_param { axis: 0 }', [(3, 4)], [0]),
}


@pytest.mark.parametrize("name", sorted(COMMON_CASES))
def test_common_gradient(name):
    text, shapes, checked = COMMON_CASES[name]
    tops = 'top: "y"'
    bottoms = " ".join(f'bottom: "b{i}"' for i in range(len(shapes)))
    values = [gaussian(s, seed=10 + i) for i, s in enumerate(shapes)]
    layer, bottoms, tops = make_layer(f'name: "l" {text} {bottoms} {tops}', values)
    check_gradient(layer, bottoms, tops, checked)


def test_slice_gradient():
    layer, bottoms, tops = make_layer('name: "s" type: "Slice" bottom: "x" top: "a" top: "b" '
                                      'top: "c" slice_param { slice_point: 1 slice_point: 3 }',
                                      [gaussian((2, 5, 2))])
    assert [t.shape for t in tops] == [(2, 1, 2), (2, 2, 2), (2, 2, 2)]
    check_gradient(layer, bottoms, tops, [0])
    layer, bottoms, tops = make_layer('name: "s" type: "Slice" bottom: "x" top: "a" top: "b" '
                                      'slice_param { slice_dim: 0 }', [gaussian((4, 3))])
    assert [t.shape for t in tops] == [(2, 3), (2, 3)]
    check_gradient(layer, bottoms, tops, [0])


@pytest.mark.parametrize("text, shape", [
    ('type: "Flatten"', (2, 3, 2, 2)),
    ('type: "Flatten" flatten_param { axis: 1 end_axis: 2 }', (2, 3, 4, 2)),
    ('type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }', (2, 3, 2, 2)),
    ('type: "Reshape" reshape_param { shape { dim: 2 dim: -1 } axis: 1 num_axes: 1 }', (2, 6, 3)),
])
def test_views_gradient(text, shape):
    layer, bottoms, tops = make_layer(f'name: "v" {text} bottom: "x" top: "y"', [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


def test_crop_gradient():
    layer, bottoms, tops = make_layer(
        'name: "c" type: "Crop" bottom: "x" bottom: "ref" top: "y" '
        'crop_param { axis: 2 offset: 1 offset: 2 }',
        [gaussian((2, 3, 7, 8)), numpy.zeros((1, 1, 4, 5), f32)])
    assert tops[0].shape == (2, 3, 4, 5)
    check_gradient(layer, bottoms, tops, [0])


def test_eltwise_max_gradient():
    values = distinct((3,) + SHAPE)
    layer, bottoms, tops = make_layer(
        'name: "e" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" top: "y" '
        'eltwise_param { operation: MAX }', list(values))
    check_gradient(layer, bottoms, tops, [0, 1, 2])


def test_reduction_asum_gradient():
    layer, bottoms, tops = make_layer(
        'name: "r" type: "Reduction" bottom: "x" top: "y" '
        'reduction_param { operation: ASUM axis: 1 }', [away_from(gaussian((3, 4, 2)), [0.0])])
    check_gradient(layer, bottoms, tops, [0])


def test_batch_reindex_gradient():
    idx = numpy.array([2, 0, 2, 3, 1, 2], f32)
    layer, bottoms, tops = make_layer(
        'name: "r" type: "BatchReindex" bottom: "x" bottom: "idx" top: "y"',
        [gaussian((4, 2, 3)), idx])
    check_gradient(layer, bottoms, tops, [0])


def test_filter_gradient():
    sel = numpy.array([[1], [0], [2], [0]], f32)
    layer, bottoms, tops = make_layer(
        'name: "f" type: "Filter" bottom: "a" bottom: "b" bottom: "sel" top: "fa" top: "fb"',
        [gaussian((4, 3)), gaussian((4, 2, 2), seed=4), sel])
    check_gradient(layer, bottoms, tops, [0, 1])
    assert [t.shape for t in tops] == [(2, 3), (2, 2, 2)]


@pytest.mark.parametrize("bias", ["true", "false"])
def test_embed_gradient(bias):
    idx = numpy.array([[0, 3, 1], [3, 3, 2]], f32)
    layer, bottoms, tops = make_layer(
        f'name: "e" type: "Embed" bottom: "idx" top: "y" '
        f'embed_param {{ num_output: 3 input_dim: 5 bias_term: {bias} }}', [idx])
    assert tops[0].shape == (2, 3, 3)
    check_gradient(layer, bottoms, tops, [])


def test_silence_zeroes_bottom_diffs():
    layer, bottoms, tops = build('name: "s" type: "Silence" bottom: "a" bottom: "b"',
                                 [gaussian((2, 3)), gaussian((4,))])
    assert tops == []
    for b in bottoms:
        b.diff[...] = 5
    layer.forward(bottoms, tops)
    layer.backward(tops, [True, False], bottoms)
    numpy.testing.assert_array_equal(bottoms[0].diff, 0)
    numpy.testing.assert_array_equal(bottoms[1].diff, 5)


# ------------------------------------------------------------------------------------------------
# Common layers: targeted behaviour
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reshape, in_shape, out_shape", [
    ("shape { dim: 0 dim: -1 }", (2, 3, 2, 2), (2, 12)),
    ("shape { dim: -1 dim: 0 }", (6, 3), (6, 3)),
    ("shape { dim: 0 dim: 2 dim: -1 dim: 0 }", (3, 4, 5, 2), (3, 2, 10, 2)),
    ("shape { dim: -1 }", (2, 3, 4), (24,)),
    ("shape { dim: 2 dim: -1 } axis: 1 num_axes: 1", (2, 6, 3), (2, 2, 3, 3)),
    ("shape { dim: 1 } axis: -1 num_axes: 0", (2, 3), (2, 3, 1)),
    ("shape { dim: 1 dim: 1 } axis: 0 num_axes: 0", (2, 3), (1, 1, 2, 3)),
    ("shape { } axis: 1 num_axes: 1", (4, 1, 5), (4, 5)),
])
def test_reshape_infers_shape_and_shares(reshape, in_shape, out_shape):
    x = gaussian(in_shape)
    layer, bottoms, tops = build(
        f'name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param {{ {reshape} }}', [x])
    assert tops[0].shape == out_shape
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    numpy.testing.assert_array_equal(tops[0].data.reshape(-1), x.reshape(-1))
    # Data and diff are shared with the bottom, not copied.
    bottoms[0].data[...] = 7
    assert (tops[0].data == 7).all()
    tops[0].diff[...] = 3
    assert (bottoms[0].diff == 3).all()


@pytest.mark.parametrize("reshape, message", [
    ("shape { dim: 5 dim: -1 }", "divisible"),
    ("shape { dim: 5 dim: 3 }", "count must match"),
    ("shape { dim: -1 dim: -1 }", "multiple -1"),
    ("shape { dim: 0 dim: 0 dim: 0 dim: 0 dim: 0 }", "no corresponding bottom axis"),
    ("shape { dim: 2 } axis: 5", "out of range"),
    ("shape { dim: 2 } axis: 1 num_axes: 4", "out of range"),
])
def test_reshape_impossible_shapes_raise(reshape, message):
    with pytest.raises(CaffeError, match=message):
        build(f'name: "r" type: "Reshape" bottom: "x" top: "y" reshape_param {{ {reshape} }}',
              [gaussian((2, 3, 2))])


def test_reshape_follows_a_new_bottom_shape():
    layer, bottoms, tops = build('name: "r" type: "Reshape" bottom: "x" top: "y" '
                                 'reshape_param { shape { dim: 0 dim: -1 } }',
                                 [gaussian((2, 3, 2))])
    bottoms[0].reshape((4, 3, 5))
    bottoms[0].data[...] = 1
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    assert tops[0].shape == (4, 15) and (tops[0].data == 1).all()


def test_single_bottom_concat_and_single_top_slice_share():
    x = gaussian((2, 3))
    layer, bottoms, tops = build('name: "c" type: "Concat" bottom: "x" top: "y"', [x])
    layer.forward(bottoms, tops)
    assert tops[0].data is bottoms[0].data and tops[0].diff is bottoms[0].diff
    layer, bottoms, tops = build('name: "s" type: "Slice" bottom: "x" top: "y"', [x])
    layer.forward(bottoms, tops)
    assert tops[0].data is bottoms[0].data and tops[0].diff is bottoms[0].diff


@pytest.mark.parametrize("text, message", [
    ('type: "Concat" concat_param { axis: 1 concat_dim: 1 } bottom: "a" bottom: "b"', "not both"),
    ('type: "Concat" concat_param { axis: 2 } bottom: "a" bottom: "c"', "same shape"),
    ('type: "Slice" slice_param { slice_point: 1 slice_point: 2 } bottom: "a"', "slice points"),
    ('type: "Slice" slice_param { axis: 2 slice_point: 3 } bottom: "a"', "beyond"),
    ('type: "Slice" slice_param { axis: 1 } bottom: "a"', "evenly divide"),
    ('type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 } bottom: "a" bottom: "b"',
     "only takes coefficients"),
    ('type: "Eltwise" eltwise_param { coeff: 1 } bottom: "a" bottom: "b"', "one coefficient"),
    ('type: "Eltwise" bottom: "a" bottom: "c"', "differs"),
    ('type: "Tile" bottom: "a"', "tiles must be specified"),
    ('type: "ArgMax" argmax_param { top_k: 5 axis: 1 } bottom: "a"', "top_k"),
    ('type: "Crop" crop_param { axis: 1 offset: 0 offset: 1 offset: 2 } bottom: "a" bottom: "c"',
     "number of offset"),
])
def test_bad_parameters_raise(text, message):
    values = {"a": gaussian((2, 3, 2)), "b": gaussian((2, 3, 2), 4), "c": gaussian((2, 2, 2), 5)}
    lp = text_format.Parse(f'name: "l" {text}', caffe_pb2.LayerParameter())
    slice_tops = 'top: "y" top: "z"' if lp.type == "Slice" else 'top: "y"'
    with pytest.raises(CaffeError, match=message):
        build(f'name: "l" {text} {slice_tops}', [values[b] for b in lp.bottom])


def _caffe_argmax(x, top_k, out_max_val, axis):
    """Straight loop from Caffe's ArgMaxLayer::Forward_cpu: sort (value, index) pairs
    descending, taking the first top_k."""
    if axis is None:
        rows = x.reshape(x.shape[0], -1)
        out = []
        for row in rows:
            pairs = sorted(((float(v), j) for j, v in enumerate(row)), reverse=True)[:top_k]
            out.append([j for _, j in pairs] + ([v for v, _ in pairs] if out_max_val else []))
        return numpy.array(out, f32)
    moved = numpy.moveaxis(x, axis, -1)
    out = numpy.empty(moved.shape[:-1] + (top_k,), f32)
    for idx in numpy.ndindex(moved.shape[:-1]):
        pairs = sorted(((float(v), j) for j, v in enumerate(moved[idx])), reverse=True)[:top_k]
        out[idx] = [v for v, _ in pairs] if out_max_val else [j for _, j in pairs]
    return numpy.moveaxis(out, -1, axis)


@pytest.mark.parametrize("args", ["top_k: 3", "top_k: 2 out_max_val: true", "axis: 1 top_k: 2",
                                  "axis: -1 top_k: 3 out_max_val: true", "axis: 0"])
def test_argmax_ties_prefer_the_larger_index(args):
    x = numpy.random.RandomState(3).randint(-2, 3, (3, 4, 5)).astype(f32)  # many ties
    layer, bottoms, tops = build(f'name: "a" type: "ArgMax" bottom: "x" top: "y" '
                                 f'argmax_param {{ {args} }}', [x])
    layer.forward(bottoms, tops)
    p = layer.param.argmax_param
    expected = _caffe_argmax(x, p.top_k, p.out_max_val, p.axis if p.HasField("axis") else None)
    if p.HasField("axis"):
        numpy.testing.assert_array_equal(tops[0].data, expected)
    else:
        assert tops[0].shape == (3, 2 if p.out_max_val else 1, p.top_k)
        numpy.testing.assert_array_equal(tops[0].data.reshape(3, -1), expected)
    with pytest.raises(CaffeError):
        layer.backward(tops, [True], bottoms)


def test_eltwise_max_ties_follow_caffe():
    # Between bottoms 0 and 1 a tie goes to 1 (strict '>' for 0); later bottoms need '>' to win.
    a = numpy.array([1, 2, 3, 0], f32)
    b = numpy.array([1, 1, 3, 0], f32)
    c = numpy.array([1, 2, 3, 5], f32)
    layer, bottoms, tops = build('name: "e" type: "Eltwise" bottom: "a" bottom: "b" bottom: "c" '
                                 'top: "y" eltwise_param { operation: MAX }', [a, b, c])
    (y,), diffs = run(layer, bottoms, tops, [numpy.ones(4, f32)])
    numpy.testing.assert_array_equal(y, [1, 2, 3, 5])
    numpy.testing.assert_array_equal(diffs[0], [0, 1, 0, 0])
    numpy.testing.assert_array_equal(diffs[1], [1, 0, 1, 0])
    numpy.testing.assert_array_equal(diffs[2], [0, 0, 0, 1])


def test_filter_keeps_nonzero_selector_items_and_zero_items():
    x = gaussian((4, 3))
    layer, bottoms, tops = build('name: "f" type: "Filter" bottom: "x" bottom: "s" top: "y"',
                                 [x, numpy.array([0, 2, 0, -1], f32)])
    assert tops[0].shape == (4, 3)  # Caffe: the first reshape, before any selector, keeps N
    (y,), (dx, _) = run(layer, bottoms, tops, [numpy.ones((2, 3), f32)], [True, False])
    numpy.testing.assert_array_equal(y, x[[1, 3]])
    numpy.testing.assert_array_equal(dx, [[0] * 3, [1] * 3, [0] * 3, [1] * 3])
    with pytest.raises(CaffeError, match="filter index"):
        layer.backward(tops, [True, True], bottoms)
    bottoms[1].data[...] = 0
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    assert tops[0].shape == (0, 3)


def test_index_layers_check_their_indices():
    layer, bottoms, tops = build('name: "r" type: "BatchReindex" bottom: "x" bottom: "i" top: "y"',
                                 [gaussian((3, 2)), numpy.array([0, 3], f32)])
    with pytest.raises(CaffeError, match="outside"):
        layer.forward(bottoms, tops)
    with pytest.raises(CaffeError, match="index"):
        layer.backward(tops, [True, True], bottoms)
    layer, bottoms, tops = build('name: "e" type: "Embed" bottom: "i" top: "y" '
                                 'embed_param { num_output: 2 input_dim: 3 }',
                                 [numpy.array([0, 1.5], f32)])
    with pytest.raises(CaffeError, match="non-integer"):
        layer.forward(bottoms, tops)
    with pytest.raises(CaffeError, match="EmbedLayer input"):
        layer.backward(tops, [True], bottoms)


def test_parameter_top_is_the_param():
    layer, bottoms, tops = build('name: "p" type: "Parameter" top: "w" '
                                 'parameter_param { shape { dim: 2 dim: 3 } }', [])
    assert tops[0].shape == (2, 3) and layer.blobs[0].shape == (2, 3)
    numpy.testing.assert_array_equal(layer.blobs[0].data, 0)  # no filler
    layer.blobs[0].data[...] = gaussian((2, 3))
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    numpy.testing.assert_array_equal(tops[0].data, layer.blobs[0].data)
    tops[0].diff[...] = 4
    layer.backward(tops, [], bottoms)
    numpy.testing.assert_array_equal(layer.blobs[0].diff, 4)
    # A param array replaced from outside (weight sharing) is picked up at the next pass.
    layer.blobs[0].data = numpy.ones((2, 3), f32)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    numpy.testing.assert_array_equal(tops[0].data, 1)


def test_scale_and_bias_fillers_and_param_layout():
    layer, _, _ = build('name: "s" type: "Scale" bottom: "x" top: "y" '
                        'scale_param { bias_term: true }', [gaussian(SHAPE)])
    assert [b.shape for b in layer.blobs] == [(3,), (3,)]
    numpy.testing.assert_array_equal(layer.blobs[0].data, 1)
    numpy.testing.assert_array_equal(layer.blobs[1].data, 0)
    layer, _, _ = build('name: "s" type: "Scale" bottom: "x" bottom: "s" top: "y" '
                        'scale_param { bias_term: true }', [gaussian(SHAPE), gaussian((3, 3))])
    assert [b.shape for b in layer.blobs] == [(3, 3)]
    layer, _, _ = build('name: "b" type: "Bias" bottom: "x" top: "y" '
                        'bias_param { axis: -2 num_axes: -1 }', [gaussian(SHAPE)])
    assert layer.blobs[0].shape == (3, 2)


def test_scale_param_gradient_accumulates_like_caffe():
    x = gaussian(SHAPE)
    dy = gaussian(SHAPE, seed=6)
    layer, bottoms, tops = build('name: "s" type: "Scale" bottom: "x" top: "y" '
                                 'scale_param { bias_term: true }', [x])
    run(layer, bottoms, tops, [dy])
    once = [b.diff.copy() for b in layer.blobs]
    layer.backward(tops, [True], bottoms)
    for blob, first in zip(layer.blobs, once):
        numpy.testing.assert_allclose(blob.diff, 2 * first, rtol=1e-6)
    # Caffe's quirk: with nothing before the axis (outer 1), several scales and something after
    # them, the scale diff is overwritten (gemv with beta 0), not accumulated.
    layer, bottoms, tops = build('name: "s" type: "Scale" bottom: "x" top: "y" '
                                 'scale_param { axis: 0 }', [x])
    run(layer, bottoms, tops, [dy])
    first = layer.blobs[0].diff.copy()
    layer.backward(tops, [True], bottoms)
    numpy.testing.assert_array_equal(layer.blobs[0].diff, first)


# GPU mode: each gradient check above once more with the blobs on CuPy (skipped without a device)
globals().update(gpu_twins(globals()))
