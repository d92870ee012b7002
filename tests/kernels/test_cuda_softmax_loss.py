"""The cuda kernel set's Softmax and SoftmaxWithLoss kernels against the reference set.

The kernels (``caffe_engine/kernels/cuda/softmax.py``) run on an
:class:`~caffe_engine.kernels.cuda.emulator.EmulatedDevice` built from that source only. The
softmax and the loss compare within float32 tolerance (the host's ``expf``/``logf`` against
NumPy's, NumPy's pairwise sums against the kernels' ordered ones); the gradient is the same
operations in the same order as the reference's, so it compares bit for bit. The label check
keeps the reference's semantics: immediate on the CPU, deferred on the device path
(``backend.count_host_reads``), the first bad label in C order, Caffe's message naming the
layer. What the emulator cannot show (races, the device's ``expf``/``logf``, launch limits)
needs a GPU.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend, kernels
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.kernels.cuda.emulator import compiler_missing
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))

f32 = numpy.float32
REF = kernels.get("reference")
NORM = caffe_pb2.LossParameter


@pytest.fixture(scope="module")
def device():
    from caffe_engine.kernels.cuda import softmax
    from caffe_engine.kernels.cuda.emulator import EmulatedDevice
    return EmulatedDevice([softmax.SOURCE])


@pytest.fixture(scope="module")
def cuda_set(device):
    from caffe_engine.kernels.cuda import CudaKernels
    return CudaKernels(device)


class Bad(Exception):
    pass


def make_error(value):
    return Bad(f"label value {int(value)}")


def softmax_ref(x):
    y = numpy.empty_like(x)
    REF.softmax_forward(x, y, numpy.empty((x.shape[0], 1, x.shape[2]), f32))
    return y


SHAPES = [(4, 10, 1), (2, 3, 5), (3, 1, 4), (1, 7, 300), (600, 2, 1)]


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_forward_matches_reference(cuda_set, device, shape):
    rng = numpy.random.default_rng(1)
    x = (rng.standard_normal(shape) * 5).astype(f32)
    want = softmax_ref(x)
    y = numpy.empty_like(x)
    before = device.launches
    cuda_set.softmax_forward(x, y, numpy.empty((shape[0], 1, shape[2]), f32))
    assert device.launches - before == 1
    numpy.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7)
    cuda_set.softmax_forward(x, x, None)          # in place
    numpy.testing.assert_array_equal(x, y)


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")
def test_softmax_forward_nan_and_inf(cuda_set):
    x = f32([[[0], [1], [2]], [[numpy.nan], [1], [0]], [[1], [numpy.nan], [0]],
             [[numpy.inf], [0], [1]], [[-numpy.inf], [0], [1]]])
    want = softmax_ref(x)
    y = numpy.empty_like(x)
    cuda_set.softmax_forward(x, y, None)
    numpy.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-7)  # NaN where NumPy's is


def labels_for(rng, outer, c, inner, ignore=None, bad=()):
    labels = rng.integers(0, c, (outer, inner)).astype(f32)
    if ignore is not None:
        labels[rng.random((outer, inner)) < 0.3] = ignore
    for (o, i), value in bad:
        labels[o, i] = value
    return labels


def run_both(cuda_set, prob, labels, ignore, normalizer, top_diff=f32(0.75)):
    out = {}
    for name, kset in (("ref", REF), ("cuda", cuda_set)):
        loss = numpy.full((), numpy.nan, f32)
        cache = kset.softmax_loss_forward(prob, labels, ignore, normalizer, loss, "key",
                                          make_error)
        dx = numpy.full(prob.shape, numpy.nan, f32)
        kset.softmax_loss_backward(prob, cache, numpy.asarray(top_diff, f32).reshape(()), dx)
        out[name] = loss, dx
    return out


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ignore", [None, 1, -1])
@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_loss_and_gradient_match_reference(cuda_set, shape, ignore, mode):
    rng = numpy.random.default_rng(2)
    outer, c, inner = shape
    prob = softmax_ref((rng.standard_normal(shape) * 3).astype(f32))
    prob[0, 0, 0] = 0.0                           # log(FLT_MIN) where the label is 0
    labels = labels_for(rng, outer, c, inner, ignore)
    normalizer = {"VALID": None, "FULL": f32(max(1, outer * inner)),
                  "BATCH_SIZE": f32(max(1, outer)), "NONE": f32(1)}[mode]
    out = run_both(cuda_set, prob, labels, ignore, normalizer)
    (ref_loss, ref_dx), (loss, dx) = out["ref"], out["cuda"]
    numpy.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    numpy.testing.assert_array_equal(dx, ref_dx)


def test_all_ignored_gives_zero_loss_and_gradient(cuda_set):
    prob = softmax_ref(numpy.ones((2, 3, 2), f32))
    labels = numpy.full((2, 2), 5, f32)
    out = run_both(cuda_set, prob, labels, 5, None)
    assert out["cuda"][0] == out["ref"][0] == 0
    numpy.testing.assert_array_equal(out["cuda"][1], out["ref"][1])


def test_launch_counts(cuda_set, device):
    prob = softmax_ref(numpy.ones((3, 4, 700), f32))   # several chunks
    labels = numpy.zeros((3, 700), f32)
    loss = numpy.empty((), f32)
    before = device.launches
    cache = cuda_set.softmax_loss_forward(prob, labels, None, None, loss, "key", make_error)
    assert device.launches - before == 2
    cuda_set.softmax_loss_backward(prob, cache, numpy.ones((), f32), numpy.empty_like(prob))
    assert device.launches - before == 3


# -- the label check ---------------------------------------------------------------------------

BAD_CASES = {
    # (shape, ignore, bad positions and values, the value the error names)
    "high": ((4, 3, 1), None, [((2, 0), 3)], 3),
    "negative": ((4, 3, 1), None, [((1, 0), -2)], -2),
    "ignored_bad_skipped": ((4, 3, 1), 7, [((0, 0), 7), ((3, 0), 9)], 9),
    "first_in_c_order": ((2, 3, 4), None, [((1, 3), 5), ((0, 2), 4), ((1, 0), -1)], 4),
    "later_chunk": ((3, 2, 300), None, [((2, 299), 8), ((1, 10), 6)], 6),
    "fraction_truncates": ((4, 3, 1), None, [((1, 0), 3.7)], 3),
    "nan": ((4, 3, 1), None, [((3, 0), numpy.nan)], -2 ** 31),  # NumPy's cast on x86
}


def _skip_unless_nan_casts_to_int_min(name):
    if name == "nan":
        with numpy.errstate(invalid="ignore"):
            if numpy.array([numpy.nan], f32).astype(numpy.int32)[0] != -2 ** 31:
                pytest.skip("NumPy casts NaN to another int here; the kernel gives INT_MIN")


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_labels_raise_at_once_on_the_cpu(cuda_set, name):
    _skip_unless_nan_casts_to_int_min(name)
    shape, ignore, bad, value = BAD_CASES[name]
    labels = _labels(shape, bad)
    prob = softmax_ref(numpy.ones(shape, f32))
    for kset in (REF, cuda_set):
        backend.discard_deferred()
        with pytest.raises(Bad, match=f"label value {value}$"):
            kset.softmax_loss_forward(prob, labels, ignore, None, numpy.empty((), f32), "key",
                                      make_error)
        assert backend.pending_checks() == 0


def _labels(shape, bad):
    labels = numpy.zeros((shape[0], shape[2]), f32)
    for (o, i), value in bad:
        labels[o, i] = value
    return labels


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast")
@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_labels_deferred_on_the_device_path(cuda_set, name):
    _skip_unless_nan_casts_to_int_min(name)
    shape, ignore, bad, value = BAD_CASES[name]
    labels = _labels(shape, bad)
    prob = softmax_ref(numpy.ones(shape, f32))
    results = {}
    for kset in (REF, cuda_set):
        backend.discard_deferred()
        with backend.count_host_reads() as reads:
            loss = numpy.empty((), f32)
            cache = kset.softmax_loss_forward(prob, labels, ignore, None, loss, "key",
                                              make_error)
            dx = numpy.empty_like(prob)
            kset.softmax_loss_backward(prob, cache, numpy.ones((), f32), dx)
            assert reads.count == 0
            assert backend.pending_checks() == 1
            with pytest.raises(Bad, match=f"label value {value}$"):
                backend.raise_deferred()
            assert reads.count == 2
        results[kset.name] = loss, dx
    # meanwhile the out-of-range labels index class 0 on both
    numpy.testing.assert_allclose(results["cuda"][0], results["reference"][0], rtol=1e-6)
    numpy.testing.assert_array_equal(results["cuda"][1], results["reference"][1])


def test_a_pending_failure_survives_later_good_forwards(cuda_set):
    prob = softmax_ref(numpy.ones((4, 3, 1), f32))
    backend.discard_deferred()
    with backend.count_host_reads():
        cuda_set.softmax_loss_forward(prob, f32([[0], [4], [1], [5]]), None, None,
                                      numpy.empty((), f32), "key", make_error)
        cuda_set.softmax_loss_forward(prob, f32([[0], [1], [1], [6]]), None, None,
                                      numpy.empty((), f32), "key", make_error)
        cuda_set.softmax_loss_forward(prob, f32([[0], [1], [2], [0]]), None, None,
                                      numpy.empty((), f32), "key", make_error)
        with pytest.raises(Bad, match="label value 4$"):
            backend.raise_deferred()
    assert backend.pending_checks() == 0


# -- the layer on the cuda set -------------------------------------------------------------------

def _layer(text, values):
    lp = text_format.Parse(f'name: "checked" type: "SoftmaxWithLoss" {text}',
                           caffe_pb2.LayerParameter())
    lp.bottom.extend(["data", "label"])
    lp.top.append("loss")
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottoms = []
    for value in values:
        blob = Blob(value.shape)
        blob.data[...] = value
        bottoms.append(blob)
    tops = [Blob()]
    layer.setup(bottoms, tops)
    layer.reshape(bottoms, tops)
    return layer, bottoms, tops


def _run_layer(kset, text, values):
    previous = kernels.use(kset)
    try:
        layer, bottoms, tops = _layer(text, values)
        layer.forward(bottoms, tops)
        tops[0].diff[...] = f32(2.5)
        layer.backward(tops, [True, False], bottoms)
        return tops[0].data.copy(), bottoms[0].diff.copy(), layer.prob.data.copy()
    finally:
        kernels.use(previous)


@pytest.mark.parametrize("text", [
    "",
    "loss_param { ignore_label: 2 }",
    "loss_param { ignore_label: 0 normalization: FULL }",
    "loss_param { normalization: BATCH_SIZE }",
    "loss_param { ignore_label: 1 normalization: NONE }",
    "loss_param { normalize: false }",
])
def test_layer_on_the_cuda_set_matches_reference(cuda_set, device, text):
    rng = numpy.random.default_rng(4)
    x = rng.standard_normal((2, 4, 3, 5)).astype(f32)
    labels = rng.integers(0, 4, (2, 1, 3, 5)).astype(f32)
    want = _run_layer(REF, text, [x, labels])
    before = device.launches
    got = _run_layer(cuda_set, text, [x, labels])
    assert device.launches - before == 4          # softmax, loss (2); gradient (1)
    numpy.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    numpy.testing.assert_allclose(got[2], want[2], rtol=2e-6, atol=1e-7)
    numpy.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-7)


def test_layer_on_the_cuda_set_defers_caffes_message(cuda_set):
    x = numpy.random.default_rng(5).standard_normal((4, 3)).astype(f32)
    previous = kernels.use(cuda_set)
    try:
        backend.discard_deferred()
        layer, bottoms, tops = _layer("", [x, f32([0, 1, 3, 2])])
        with pytest.raises(CaffeError, match=r"checked.*label value 3 outside \[0, 3\)"):
            layer.forward(bottoms, tops)
        with backend.count_host_reads() as reads:
            layer.forward(bottoms, tops)
            layer.forward(bottoms, tops)
            assert reads.count == 0 and backend.pending_checks() == 1
            with pytest.raises(CaffeError, match=r"checked.*label value 3 outside \[0, 3\)"):
                backend.raise_deferred()
            assert reads.count == 2
    finally:
        kernels.use(previous)
        backend.discard_deferred()
