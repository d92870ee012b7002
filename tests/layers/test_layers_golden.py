"""Golden tests: the engine's layers against BVLC Caffe's outputs (../shared/caffe_reference).

Every ``kind: layer`` case of the manifest is replayed by ``golden.check_case``; a case whose
net has a layer on the kernels (``golden.KERNEL_LAYERS``) is replayed once per kernel set (the
``kernel_set`` fixture; ``cpu-blocks`` cuts Convolution into the smallest chunks and blocks).
A case whose net uses a layer type the engine does not register yet is a strict expected
failure, so it turns into an error the moment the type lands without passing. Every
configuration Caffe aborts on (manifest ``failures``) must raise CaffeError. A few behaviours the
fixtures do not stress (MAX pooling ties, NaN and -inf, on every kernel set; Accuracy ties) are
checked against straight loops written from Caffe's code.

GPU mode: the ``kernel_set`` fixture's ``cuda`` parameter replays the kernel cases with blobs on
CuPy, and ``test_every_case_in_gpu_mode`` replays every case and every failure there (the
``gpu_mode`` fixture; skipped with the reason where CuPy or a device is missing).
"""
import numpy
import pytest
from google.protobuf import text_format

import golden
from caffe_engine import backend, rng
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.layers import create_layer, layer_type_list
from caffe_engine.proto import caffe_pb2
from gradient_check import blobs_of, put

ALL_CASES = [c for c in golden.manifest()["cases"] if c["kind"] == "layer"]
LAYER_TYPES = {"Convolution", "Pooling", "InnerProduct", "Input", "ReLU", "Softmax",
               "SoftmaxWithLoss", "Accuracy"}
CASES = golden.cases(LAYER_TYPES)
FAILURES = golden.failures(LAYER_TYPES)


def _net_types(case):
    _, net = golden.load(case)
    return {lp.type for lp in net.layer}


NET_TYPES = {case["id"]: _net_types(case) for case in ALL_CASES}


def _on_kernels(case):
    return bool(NET_TYPES[case["id"]] & golden.KERNEL_LAYERS)


def _case_param(case):
    missing = sorted(NET_TYPES[case["id"]] - set(layer_type_list()))
    marks = [pytest.mark.xfail(strict=True, reason=f"layer type(s) {', '.join(missing)} "
                               "not implemented yet")] if missing else []
    return pytest.param(case, id=case["id"], marks=marks)


def test_every_lenet_type_has_cases():
    assert {c["layer_type"] for c in CASES} == LAYER_TYPES


@pytest.mark.parametrize("case", [_case_param(c) for c in ALL_CASES if not _on_kernels(c)])
def test_layer_matches_caffe(case):
    golden.check_case(case)


@pytest.mark.parametrize("case", [_case_param(c) for c in ALL_CASES if _on_kernels(c)])
def test_kernel_layer_matches_caffe(case, kernel_set):
    golden.check_case(case)


def test_cases_split_by_kernels():
    on_kernels = [c for c in ALL_CASES if _on_kernels(c)]
    assert {c["layer_type"] for c in on_kernels} == golden.KERNEL_LAYERS
    assert 0 < len(on_kernels) < len(ALL_CASES)


@pytest.mark.parametrize("failure", FAILURES, ids=[f["id"] for f in FAILURES])
def test_caffe_failure_raises(failure):
    with pytest.raises(CaffeError):
        golden.run_failure(failure)


@pytest.mark.gpu
def test_every_case_in_gpu_mode(gpu_mode, request):
    """Every manifest case whose layer types exist, and every failure, with blobs on CuPy (the
    layers' own xp path and the cuda kernel set); the failures' errors may be deferred device
    checks, raised by ``backend.raise_deferred``. All cases run; the failures are listed.
    Dropout's TRAIN cases hold Caffe's host mt19937 masks, so the exact mode draws them on the
    host here (on the device by default: docs/reproducibility.md)."""
    previous = rng.set_exact_rng(True)
    request.addfinalizer(lambda: rng.set_exact_rng(previous))
    ran, problems = golden.check_every_case()
    assert ran and not problems, f"{len(problems)} of {len(ALL_CASES)} cases:\n" + \
        "\n".join(problems)


# -- Behaviours the fixtures do not stress, against straight loops written from Caffe's code ----
def _caffe_max_pool(x, kernel, stride, pad, out_hw):
    """Caffe's MAX pooling loop: running max from -FLT_MAX, strict '>', row-major scan."""
    n, c, h, w = x.shape
    top = numpy.full((n, c) + out_hw, -numpy.finfo(numpy.float32).max, numpy.float32)
    mask = numpy.full((n, c) + out_hw, -1.0, numpy.float32)
    for ph in range(out_hw[0]):
        for pw in range(out_hw[1]):
            hs, ws = ph * stride[0] - pad[0], pw * stride[1] - pad[1]
            he, we = min(hs + kernel[0], h), min(ws + kernel[1], w)
            for hh in range(max(hs, 0), he):
                for ww in range(max(ws, 0), we):
                    better = x[:, :, hh, ww] > top[:, :, ph, pw]
                    top[:, :, ph, pw][better] = x[:, :, hh, ww][better]
                    mask[:, :, ph, pw][better] = hh * w + ww
    return top, mask


@pytest.mark.parametrize("pool", ["kernel_size: 3 stride: 2 pad: 1", "kernel_size: 2 stride: 2",
                                  "kernel_h: 3 kernel_w: 2 stride_h: 1 stride_w: 2",
                                  "global_pooling: true"])
def test_max_pooling_ties_nan_and_mask(pool, kernel_set):
    rng = numpy.random.RandomState(11)
    x = rng.randint(-2, 3, (2, 3, 7, 6)).astype(numpy.float32)   # many ties
    x[0, 0, 1, 1] = numpy.nan
    x[0, 1, :3, :3] = -numpy.inf
    x[1, 2, :, :] = -numpy.finfo(numpy.float32).max              # nothing beats -FLT_MAX
    layer, bottoms, tops = _make(f'type: "Pooling" pooling_param {{ pool: MAX {pool} }}',
                                 [x], ntop=2)
    layer.forward(bottoms, tops)
    p = layer
    ref_top, ref_mask = _caffe_max_pool(x, p.kernel, p.stride, p.pad, p.out_hw)
    numpy.testing.assert_array_equal(backend.to_numpy(tops[0].data), ref_top)
    numpy.testing.assert_array_equal(backend.to_numpy(tops[1].data), ref_mask)
    # Backward sends each top diff to the recorded index (none where the mask is -1).
    top_diff = rng.standard_normal(tops[0].shape).astype(numpy.float32)
    put(tops[0].diff, top_diff)
    layer.backward(tops, [True], bottoms)
    expected = numpy.zeros(x.shape, numpy.float64)
    n_, c_ = numpy.indices(ref_mask.shape[:2])
    for idx in numpy.ndindex(ref_mask.shape[2:]):
        m = ref_mask[(Ellipsis,) + idx].astype(int)
        ok = m >= 0
        numpy.add.at(expected.reshape(x.shape[0], x.shape[1], -1),
                     (n_[ok], c_[ok], m[ok]), top_diff[(Ellipsis,) + idx][ok])
    numpy.testing.assert_allclose(backend.to_numpy(bottoms[0].diff), expected, rtol=1e-6,
                                  atol=1e-6)


def test_accuracy_ties_count_against_the_prediction():
    scores = numpy.array([[1, 1, 0], [2, 2, 2], [0, 3, 3], [5, 1, 1]], numpy.float32)
    labels = numpy.array([0, 2, 1, 1], numpy.float32)
    # Caffe: correct iff #{k != label : s_k >= s_label} < top_k.
    for top_k, expected in [(1, 0.0), (2, 0.5), (3, 1.0)]:
        layer, bottoms, tops = _make(
            f'type: "Accuracy" accuracy_param {{ top_k: {top_k} }}', [scores, labels], ntop=2)
        layer.forward(bottoms, tops)
        assert tops[0].data == numpy.float32(expected)
    # top_k 2: rows 0 (tie with class 1) and 2 (tie with class 2) hit; per class: 0 -> 1/1,
    # 1 -> 1/2, 2 -> 0/1.
    layer, bottoms, tops = _make('type: "Accuracy" accuracy_param { top_k: 2 }',
                                 [scores, labels], ntop=2)
    layer.forward(bottoms, tops)
    numpy.testing.assert_array_equal(tops[1].data, numpy.float32([1, 0.5, 0]))


def test_softmax_with_loss_rejects_labels_out_of_range():
    layer, bottoms, tops = _make('type: "SoftmaxWithLoss"',
                                 [numpy.zeros((2, 3), numpy.float32),
                                  numpy.float32([0, 3])], ntop=1)
    with pytest.raises(CaffeError, match="label value 3"):
        layer.forward(bottoms, tops)


def _make(text, values, ntop):
    lp = text_format.Parse(f'name: "layer" {text}', caffe_pb2.LayerParameter())
    lp.bottom.extend(f"b{i}" for i in range(len(values)))
    lp.top.extend(f"t{i}" for i in range(ntop))
    layer = create_layer(lp, caffe_pb2.TEST)
    bottoms = blobs_of(values)
    tops = [Blob() for _ in range(ntop)]
    layer.setup(bottoms, tops)
    return layer, bottoms, tops
