"""Gradient checks and targeted tests for LRN, BatchNorm, MVN and the loss layers.

Finite differences by ``gradient_check.check_gradient`` (Caffe's GradientChecker), with the
step size and threshold Caffe's own tests use for each layer (src/caffe/test/test_*_layer.cpp):
LRN 1e-2 / 1e-2, BatchNorm 1e-2 / 1e-4, MVN 1e-2 / 1e-3, Euclidean, SigmoidCrossEntropy,
Contrastive and Hinge L2 1e-2 / 1e-2, Hinge L1 1e-2 / 2e-3, MultinomialLogistic 1e-2 / 2e-2,
Infogain 1e-4 / 2e-2. Elements near a kink are skipped (the checker's ``kink``, ``kink_range``).

LRN runs on the kernels: its gradient checks and hand-computed values run on every kernel set
(the ``kernel_set`` fixture).

Targeted tests: hand-computed LRN values, BatchNorm running statistics over two TRAIN passes then
used in TEST, BatchNorm's lr_mult 0 bookkeeping in a Net, the stored BatchNorm statistics after
forward in the fixtures (``param_after``), InfogainLoss's H from a binaryproto, loss
normalisation defaults, and labels never receiving a gradient.
"""
import numpy
import pytest
from google.protobuf import text_format

import golden
from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.io.blobproto import write_blobproto
from caffe_engine.layers import create_layer
from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2
from gradient_check import blobs_of, check_gradient, gaussian, gpu_twins, make_layer, put

f32 = numpy.float32


def labels(shape, classes, seed=7):
    return numpy.random.RandomState(seed).randint(0, classes, shape).astype(f32)


def layer_from(text, values, phase=caffe_pb2.TRAIN):
    """Layer (name "layer", bottoms b0.., tops t0..) set up on ``values`` in ``phase``."""
    lp = text_format.Parse(f'name: "layer" {text}', caffe_pb2.LayerParameter())
    lp.bottom.extend(f"b{i}" for i in range(len(values)))
    if not lp.top:
        lp.top.append("t0")
    layer = create_layer(lp, phase)
    bottoms = blobs_of(values)
    tops = [Blob() for _ in lp.top]
    layer.setup(bottoms, tops)
    return layer, bottoms, tops


# -- LRN -------------------------------------------------------------------------------------
@pytest.mark.parametrize("lrn, shape", [
    ("", (2, 7, 3, 3)),
    ("local_size: 15 alpha: 0.3 k: 2", (1, 9, 2, 2)),
    ("local_size: 3 alpha: 0.5 beta: 0.6 norm_region: WITHIN_CHANNEL", (2, 2, 4, 3)),
    ("local_size: 5 beta: 0.9 norm_region: WITHIN_CHANNEL", (1, 2, 5, 4)),
], ids=["across", "across_large_region", "within_ls3", "within_ls5"])
def test_lrn_gradient(lrn, shape, kernel_set):
    layer, bottoms, tops = make_layer(
        f'name: "lrn" type: "LRN" bottom: "x" top: "y" lrn_param {{ {lrn} }}', [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0], 1e-2, 1e-2)


def test_lrn_within_channel_by_hand(kernel_set):
    # alpha 9 over a 3x3 window of ones, beta 1: top = 1 / (1 + number of in-image neighbours).
    # Padded cells count in the window's 3x3 divisor; k is not used WITHIN_CHANNEL.
    layer, bottoms, tops = layer_from(
        'type: "LRN" lrn_param { local_size: 3 alpha: 9 beta: 1 k: 5 '
        'norm_region: WITHIN_CHANNEL }', [numpy.ones((1, 1, 3, 3), f32)])
    layer.forward(bottoms, tops)
    expected = 1 / (1 + numpy.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]], numpy.float64))
    numpy.testing.assert_allclose(backend.to_numpy(tops[0].data)[0, 0], expected, rtol=1e-6)
    # Twice the input: squares are 4 each, top = 2 / (1 + 4 n).
    bottoms[0].data[...] = 2
    layer.forward(bottoms, tops)
    expected = 2 / (1 + 4 * numpy.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]], numpy.float64))
    numpy.testing.assert_allclose(backend.to_numpy(tops[0].data)[0, 0], expected, rtol=1e-6)


def test_lrn_across_channels_by_hand(kernel_set):
    # Channels 1, 2, 3; alpha / local_size = 1, beta 1, k 1: scale = 1 + sum of the squares of
    # the channel and its neighbours (zero beyond the edges).
    x = numpy.array([1, 2, 3], f32).reshape(1, 3, 1, 1)
    layer, bottoms, tops = layer_from(
        'type: "LRN" lrn_param { local_size: 3 alpha: 3 beta: 1 k: 1 }', [x])
    layer.forward(bottoms, tops)
    numpy.testing.assert_allclose(backend.to_numpy(tops[0].data).ravel(), [1 / 6, 2 / 15, 3 / 14],
                                  rtol=1e-6)


def test_lrn_rejects_even_size_and_in_place():
    with pytest.raises(CaffeError, match="odd"):
        layer_from('type: "LRN" lrn_param { local_size: 4 }', [gaussian((1, 4, 2, 2))])
    lp = text_format.Parse('name: "l" type: "LRN"', caffe_pb2.LayerParameter())
    blob = Blob((1, 3, 2, 2))
    with pytest.raises(CaffeError, match="in-place"):
        create_layer(lp, caffe_pb2.TEST).setup([blob], [blob])


# -- BatchNorm -------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 3)], ids=["nchw", "2d"])
def test_batch_norm_gradient_batch_stats(shape):
    layer, bottoms, tops = make_layer(
        'name: "bn" type: "BatchNorm" bottom: "x" top: "y" '
        'batch_norm_param { use_global_stats: false }', [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0], 1e-2, 1e-4)


def test_batch_norm_gradient_global_stats():
    layer, bottoms, tops = make_layer(
        'name: "bn" type: "BatchNorm" bottom: "x" top: "y" '
        'batch_norm_param { use_global_stats: true }', [gaussian((2, 3, 2, 2))])
    put(layer.blobs[0].data, [0.5, -1.0, 2.0])
    put(layer.blobs[1].data, [1.5, 0.2, 3.0])
    put(layer.blobs[2].data, 2.0)
    # The statistics are not learned: Caffe computes no gradient for them.
    check_gradient(layer, bottoms, tops, [0], 1e-2, 1e-4, params=False)


def test_batch_norm_running_stats_two_train_passes_then_test():
    maf, eps = 0.9, 1e-3
    text = (f'type: "BatchNorm" batch_norm_param {{ moving_average_fraction: {maf} '
            f'eps: {eps} }}')
    x1, x2 = gaussian((4, 3, 2, 2), 11), 2 + 3 * gaussian((4, 3, 2, 2), 12)
    layer, bottoms, tops = layer_from(text, [x1])
    assert layer.use_global_stats is False
    for x in (x1, x2):
        bottoms[0].data[...] = x
        layer.reshape(bottoms, tops)
        layer.forward(bottoms, tops)
        ref = x.astype(numpy.float64)
        mean, var = ref.mean(axis=(0, 2, 3)), ref.var(axis=(0, 2, 3))
        numpy.testing.assert_allclose(
            tops[0].data, (ref - mean[:, None, None]) / numpy.sqrt(var + eps)[:, None, None],
            rtol=1e-4, atol=1e-5)
    m = x1.size // 3
    means = [x.astype(numpy.float64).mean(axis=(0, 2, 3)) for x in (x1, x2)]
    variances = [x.astype(numpy.float64).var(axis=(0, 2, 3)) * m / (m - 1) for x in (x1, x2)]
    factor = maf * 1 + 1
    mean_sum = maf * means[0] + means[1]
    var_sum = maf * variances[0] + variances[1]
    numpy.testing.assert_allclose(layer.blobs[2].data, [factor], rtol=1e-6)
    numpy.testing.assert_allclose(layer.blobs[0].data, mean_sum, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(layer.blobs[1].data, var_sum, rtol=1e-5)

    # TEST uses the stored sums divided by the factor, and leaves them alone.
    x3 = gaussian((2, 3, 2, 2), 13)
    test_layer, tb, tt = layer_from(text, [x3], phase=caffe_pb2.TEST)
    assert test_layer.use_global_stats is True
    for src, dst in zip(layer.blobs, test_layer.blobs):
        dst.data[...] = src.data
    test_layer.forward(tb, tt)
    mean, var = mean_sum / factor, var_sum / factor
    expected = (x3 - mean[:, None, None]) / numpy.sqrt(var + eps)[:, None, None]
    numpy.testing.assert_allclose(tt[0].data, expected, rtol=1e-5, atol=1e-6)
    for src, dst in zip(layer.blobs, test_layer.blobs):
        numpy.testing.assert_array_equal(src.data, dst.data)


def test_batch_norm_zero_scale_factor_means_zero_statistics():
    layer, bottoms, tops = layer_from('type: "BatchNorm" batch_norm_param { eps: 0.25 }',
                                      [gaussian((2, 2, 3))], phase=caffe_pb2.TEST)
    layer.blobs[0].data[...] = 5
    layer.blobs[1].data[...] = 7
    layer.forward(bottoms, tops)
    numpy.testing.assert_allclose(tops[0].data, bottoms[0].data / 0.5, rtol=1e-6)


def test_batch_norm_in_place_matches_separate_top():
    x = gaussian((3, 2, 2, 2), 5)
    dy = gaussian((3, 2, 2, 2), 6)
    results = []
    for in_place in (False, True):
        lp = text_format.Parse('name: "bn" type: "BatchNorm"', caffe_pb2.LayerParameter())
        layer = create_layer(lp, caffe_pb2.TRAIN)
        bottom = Blob(x.shape)
        bottom.data[...] = x
        top = bottom if in_place else Blob()
        layer.setup([bottom], [top])
        layer.forward([bottom], [top])
        y = top.data.copy()
        top.diff[...] = dy
        layer.backward([top], [True], [bottom])
        results.append((y, bottom.diff.copy()))
    numpy.testing.assert_array_equal(results[0][0], results[1][0])
    numpy.testing.assert_array_equal(results[0][1], results[1][1])


BN_NET = """
name: "bn" force_backward: true
layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "data" top: "out" %s }
"""


def test_batch_norm_statistics_get_lr_mult_zero_in_the_net():
    net = Net(text_format.Parse(BN_NET % "", caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    bn = net.layers[net.layer_names.index("bn")]
    assert [spec.lr_mult for spec in bn.param.param] == [0, 0, 0]
    assert net.params_lr == [0, 0, 0]
    assert net.learnable_params == bn.blobs
    # Explicit lr_mult 0 specs are accepted; a non-zero one is refused, as Caffe does.
    Net(text_format.Parse(BN_NET % "param { lr_mult: 0 } param { lr_mult: 0 }",
                          caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    with pytest.raises(CaffeError, match="batch normalization statistics"):
        Net(text_format.Parse(BN_NET % "param { lr_mult: 1 }", caffe_pb2.NetParameter()),
            caffe_pb2.TRAIN)


BN_CASES = golden.cases({"BatchNorm"})


@pytest.mark.parametrize("case", BN_CASES, ids=[c["id"] for c in BN_CASES])
def test_batch_norm_stored_statistics_match_caffe(case):
    # golden.check_case compares tops and diffs; the statistics after forward are checked here.
    arrays, net = golden.load(case)
    replay = golden.Replay(case, arrays, net)
    replay.forward()
    after = sorted(k for k in arrays if k.startswith("param_after/"))
    assert len(after) == 3
    for key in after:
        _, layer_name, index = key.split("/")
        layer = next(layer for lp, layer, _, _ in replay.layers if lp.name == layer_name)
        golden.compare(f"{case['id']} {key}", layer.blobs[int(index)].data, arrays[key])


# -- MVN -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mvn, shape", [
    ("", (2, 3, 3, 2)),
    ("normalize_variance: false", (2, 3, 2, 2)),
    ("across_channels: true", (2, 2, 3, 2)),
    ("across_channels: true normalize_variance: false", (2, 2, 2, 2)),
], ids=["default", "mean_only", "across_channels", "across_mean_only"])
def test_mvn_gradient(mvn, shape):
    layer, bottoms, tops = make_layer(
        f'name: "mvn" type: "MVN" bottom: "x" top: "y" mvn_param {{ {mvn} }}',
        [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0], 1e-2, 1e-3)


def test_mvn_adds_eps_to_the_standard_deviation():
    x = numpy.array([1, 3, 5, 7], f32).reshape(1, 1, 2, 2)
    layer, bottoms, tops = layer_from('type: "MVN" mvn_param { eps: 0.5 }', [x])
    layer.forward(bottoms, tops)
    std = numpy.sqrt(5.0)
    numpy.testing.assert_allclose(tops[0].data.ravel(), (x.ravel() - 4) / (std + 0.5),
                                  rtol=1e-6)


# -- Loss layers ---------------------------------------------------------------------------
def test_euclidean_loss_gradient():
    layer, bottoms, tops = make_layer(
        'name: "loss" type: "EuclideanLoss" bottom: "a" bottom: "b" top: "loss"',
        [gaussian((6, 5, 1, 1), 2), gaussian((6, 5, 1, 1), 3)])
    check_gradient(layer, bottoms, tops, [0, 1], 1e-2, 1e-2)


@pytest.mark.parametrize("norm, threshold", [("L1", 2e-3), ("L2", 1e-2)])
def test_hinge_loss_gradient(norm, threshold):
    x = 3 * gaussian((6, 5))
    x[numpy.abs(numpy.abs(x) - 1) < 0.05] += 0.2          # keep off the hinge at |x| = 1
    layer, bottoms, tops = make_layer(
        f'name: "loss" type: "HingeLoss" bottom: "x" bottom: "label" top: "loss" '
        f'hinge_loss_param {{ norm: {norm} }}', [x, labels((6,), 5)])
    check_gradient(layer, bottoms, tops, [0], 1e-2, threshold, kink=1.0, kink_range=0.02)


@pytest.mark.parametrize("extra, shape, label_shape", [
    ("", (4, 3), (4,)),
    ("loss_param { ignore_label: 1 normalization: FULL }", (2, 3, 2, 2), (2, 1, 2, 2)),
    ("infogain_loss_param { axis: 2 } loss_param { normalization: BATCH_SIZE }",
     (2, 2, 3), (2, 2)),
], ids=["basic", "spatial_ignore_full", "axis2_batch_size"])
def test_infogain_loss_gradient(extra, shape, label_shape):
    classes = 3
    h = numpy.abs(gaussian((classes, classes), 9))
    layer, bottoms, tops = make_layer(
        f'name: "loss" type: "InfogainLoss" bottom: "x" bottom: "label" bottom: "H" '
        f'top: "loss" {extra}', [gaussian(shape), labels(label_shape, classes), h])
    check_gradient(layer, bottoms, tops, [0], 1e-4, 2e-2)


def test_infogain_h_from_binaryproto_matches_h_bottom(tmp_path):
    h = numpy.abs(gaussian((4, 4), 9))
    path = tmp_path / "H.binaryproto"
    write_blobproto(path, h.reshape(1, 1, 4, 4))
    x, y = gaussian((3, 4), 4), labels((3,), 4)
    from_file, fb, ft = layer_from(
        f'type: "InfogainLoss" infogain_loss_param {{ source: "{path}" }}', [x, y])
    with_bottom, bb, bt = layer_from('type: "InfogainLoss"', [x, y, h])
    for layer, bottoms, tops in ((from_file, fb, ft), (with_bottom, bb, bt)):
        layer.forward(bottoms, tops)
        layer.backward(tops, [True, False, False][:len(bottoms)], bottoms)
    numpy.testing.assert_array_equal(ft[0].data, bt[0].data)
    numpy.testing.assert_array_equal(fb[0].diff, bb[0].diff)
    # The reference: -sum_l H[label, l] log softmax(x)_l / N.
    p = numpy.exp(x - x.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    ref = -sum(h[int(y[i])] @ numpy.log(p[i]) for i in range(3)) / 3
    numpy.testing.assert_allclose(ft[0].data, ref, rtol=1e-5)


def test_infogain_errors():
    x, y = gaussian((3, 4)), labels((3,), 4)
    with pytest.raises(CaffeError, match="source"):
        layer_from('type: "InfogainLoss"', [x, y])
    with pytest.raises(CaffeError, match="deprecated"):
        layer_from('type: "InfogainLoss" loss_param { normalize: true }',
                   [x, y, numpy.eye(4, dtype=f32)])
    with pytest.raises(CaffeError, match="4x4"):
        layer_from('type: "InfogainLoss"', [x, y, numpy.eye(3, dtype=f32)])
    layer, bottoms, tops = layer_from('type: "InfogainLoss"', [x, y, numpy.eye(4, dtype=f32)])
    layer.forward(bottoms, tops)
    # force_backward may reach H (as in Caffe), and backward then refuses it, as Caffe aborts.
    assert layer.allow_force_backward(2) and not layer.allow_force_backward(1)
    with pytest.raises(CaffeError, match="infogain"):
        layer.backward(tops, [True, False, True], bottoms)


def test_multinomial_logistic_loss_gradient():
    rng = numpy.random.RandomState(4)
    p = rng.uniform(0.2, 1.0, (5, 4)).astype(f32)
    layer, bottoms, tops = make_layer(
        'name: "loss" type: "MultinomialLogisticLoss" bottom: "p" bottom: "label" top: "loss"',
        [p, labels((5,), 4)])
    check_gradient(layer, bottoms, tops, [0], 1e-2, 2e-2, kink=0.0, kink_range=0.05)


@pytest.mark.parametrize("extra, binary", [
    ("", False),
    ("loss_param { ignore_label: -1 normalization: VALID }", True),
    ("loss_param { normalization: FULL }", False),
], ids=["default", "valid_ignore", "full"])
def test_sigmoid_cross_entropy_loss_gradient(extra, binary):
    rng = numpy.random.RandomState(5)
    if binary:
        target = rng.randint(-1, 2, (4, 5)).astype(f32)
    else:
        target = rng.uniform(0, 1, (4, 5)).astype(f32)
    layer, bottoms, tops = make_layer(
        f'name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "x" bottom: "t" top: "loss" '
        f'{extra}', [gaussian((4, 5)), target])
    check_gradient(layer, bottoms, tops, [0], 1e-2, 1e-2)


@pytest.mark.parametrize("loss_param, divisor", [
    ("", 2),                                                  # BATCH_SIZE by default
    ("loss_param { normalize: false }", 2),                   # deprecated false: BATCH_SIZE
    ("loss_param { normalize: true ignore_label: 2 }", 4),    # deprecated true: VALID
    ("loss_param { normalization: FULL ignore_label: 2 }", 6),
    ("loss_param { normalization: NONE }", 1),
])
def test_sigmoid_cross_entropy_normalization(loss_param, divisor):
    x = gaussian((2, 3), 8)
    t = numpy.array([[0, 1, 2], [1, 2, 0]], f32)
    layer, bottoms, tops = layer_from(f'type: "SigmoidCrossEntropyLoss" {loss_param}', [x, t])
    layer.forward(bottoms, tops)
    xd = x.astype(numpy.float64)
    terms = numpy.log1p(numpy.exp(-numpy.abs(xd))) + numpy.maximum(xd, 0) - xd * t
    if "ignore_label" in loss_param:
        terms = terms[t != 2]
    numpy.testing.assert_allclose(tops[0].data, terms.sum() / divisor, rtol=2e-6)


@pytest.mark.parametrize("extra", ["", "contrastive_loss_param { margin: 2 legacy_version: true }"],
                         ids=["default", "legacy"])
def test_contrastive_loss_gradient(extra):
    rng = numpy.random.RandomState(6)
    sim = rng.randint(0, 2, (8, 1, 1, 1)).astype(f32)
    layer, bottoms, tops = make_layer(
        f'name: "loss" type: "ContrastiveLoss" bottom: "a" bottom: "b" bottom: "sim" '
        f'top: "loss" {extra}',
        [0.5 * gaussian((8, 4, 1, 1), 2), 0.5 * gaussian((8, 4, 1, 1), 3), sim])
    check_gradient(layer, bottoms, tops, [0, 1], 1e-2, 1e-2)


LABELLED = [
    ('type: "HingeLoss"', [gaussian((3, 4)), labels((3,), 4)], 1),
    ('type: "MultinomialLogisticLoss"', [numpy.full((3, 4), 0.25, f32), labels((3,), 4)], 1),
    ('type: "SigmoidCrossEntropyLoss"', [gaussian((3, 4)), labels((3, 4), 2)], 1),
    ('type: "InfogainLoss"', [gaussian((3, 4)), labels((3,), 4), numpy.eye(4, dtype=f32)], 1),
    ('type: "ContrastiveLoss"', [gaussian((3, 2)), gaussian((3, 2)), labels((3,), 2)], 2),
]


@pytest.mark.parametrize("text, values, label_index", LABELLED,
                         ids=[t.split('"')[1] for t, _, _ in LABELLED])
def test_labels_never_get_a_gradient(text, values, label_index):
    layer, bottoms, tops = layer_from(text, values)
    assert not layer.allow_force_backward(label_index)
    assert layer.loss_weights == [1.0]
    layer.forward(bottoms, tops)
    propagate = [False] * len(bottoms)
    propagate[label_index] = True
    with pytest.raises(CaffeError, match="cannot backpropagate"):
        layer.backward(tops, propagate, bottoms)


def test_euclidean_loss_force_backward_reaches_both_inputs():
    layer, _, _ = layer_from('type: "EuclideanLoss"', [gaussian((2, 3)), gaussian((2, 3))])
    assert layer.allow_force_backward(0) and layer.allow_force_backward(1)


def test_loss_layers_check_the_first_dimension():
    with pytest.raises(CaffeError, match="first dimension"):
        layer_from('type: "EuclideanLoss"', [gaussian((2, 3)), gaussian((3, 2))])
    with pytest.raises(CaffeError, match="label value 4"):
        layer, bottoms, tops = layer_from('type: "HingeLoss"',
                                          [gaussian((2, 4)), numpy.float32([0, 4])])
        layer.forward(bottoms, tops)


# GPU mode: each gradient check above once more with the blobs on CuPy (skipped without a device)
globals().update(gpu_twins(globals()))
