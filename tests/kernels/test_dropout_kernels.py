"""Dropout's kernel-set methods: the mask's threshold (Caffe's ``uint(UINT_MAX * ratio)``), the
forward/backward kernels of the cuda set (run by the emulator) against the reference array
code for given uint32 masks, which stream a mask comes from (host mt19937 on NumPy and in the
exact mode, the device stream otherwise), and the Dropout layer on the device path."""
import shutil
import subprocess

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import kernels
from caffe_engine.backend import get_array_module
from caffe_engine import rng as caffe_rng
from caffe_engine.blob import Blob
from caffe_engine.kernels.reference import neuron as ref_neuron
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

from conftest import kernel_set_object

F32 = numpy.float32
RATIOS = (0.0, 0.5, 0.9)


@pytest.fixture(autouse=True)
def _exact_mode_restored(monkeypatch):
    monkeypatch.delenv(caffe_rng.EXACT_RNG_ENV, raising=False)
    previous = caffe_rng.set_exact_rng(None)
    yield
    caffe_rng.set_exact_rng(previous)


def emulated():
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    if compiler_missing():
        pytest.skip(compiler_missing())
    return kernel_set_object("cuda-emulated")


# -- the threshold -------------------------------------------------------------------------------
def test_threshold_is_caffes_float_product_truncated():
    assert ref_neuron.dropout_threshold(0) == 0
    assert ref_neuron.dropout_threshold(0.5) == 2 ** 31
    # UINT_MAX rounds to 2**32 in float, so the product is exact: 2**32 * float(0.9).
    assert ref_neuron.dropout_threshold(0.9) == int(2 ** 32 * float(F32(0.9))) == 3865470464
    for bad in (1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="ratio"):
            ref_neuron.dropout_threshold(bad)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on the PATH")
def test_threshold_matches_the_cpp_expression(tmp_path):
    ratios = [0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 0.9, 0.99, float(numpy.nextafter(F32(1), F32(0)))]
    src = tmp_path / "t.cpp"
    src.write_text("#include <climits>\n#include <cstdio>\n#include <cstdlib>\n"
                   "int main(int argc, char** argv) { for (int i = 1; i < argc; ++i) {"
                   " float threshold_ = strtof(argv[i], 0);"
                   " printf(\"%u\\n\", static_cast<unsigned int>(UINT_MAX * threshold_)); } }\n")
    subprocess.run(["g++", "-O0", "-o", str(tmp_path / "t"), str(src)], check=True)
    out = subprocess.run([str(tmp_path / "t")] + [repr(float(F32(r))) for r in ratios],
                         check=True, capture_output=True, text=True).stdout.split()
    assert [ref_neuron.dropout_threshold(r) for r in ratios] == [int(v) for v in out]


# -- forward / backward for a given mask ----------------------------------------------------------
def words_around(threshold, shape, seed=0):
    """uint32 words: random ones plus the edges (0, threshold, threshold + 1, UINT_MAX)."""
    words = numpy.random.RandomState(seed).randint(0, 2 ** 32, size=shape, dtype=numpy.uint32)
    flat = words.reshape(-1)
    edges = [0, threshold, min(threshold + 1, 2 ** 32 - 1), 2 ** 32 - 1]
    flat[:len(edges)] = numpy.array(edges, numpy.uint64).astype(numpy.uint32)
    return words


@pytest.mark.parametrize("ratio", RATIOS)
def test_emulated_kernels_equal_the_reference_for_a_given_mask(ratio):
    cuda = emulated()
    ref = kernels.get("reference")
    shape = (3, 5, 7, 11)
    x = numpy.random.RandomState(1).standard_normal(shape).astype(F32)
    dy = numpy.random.RandomState(2).standard_normal(shape).astype(F32)
    threshold = ref_neuron.dropout_threshold(ratio)
    scale = F32(1.0 / (1.0 - float(F32(ratio))))
    mask = words_around(threshold, shape)
    kept = mask > numpy.uint32(threshold)
    want_y = (x * kept) * scale
    want_dx = (dy * kept) * scale
    y_ref, dx_ref = numpy.empty_like(x), numpy.empty_like(dy)
    ref.dropout_forward(x, mask, threshold, scale, y_ref)
    ref.dropout_backward(dy, mask, threshold, scale, dx_ref)
    numpy.testing.assert_array_equal(y_ref, want_y)
    numpy.testing.assert_array_equal(dx_ref, want_dx)
    launches = cuda.device.launches
    y, dx = numpy.full_like(x, numpy.nan), numpy.full_like(dy, numpy.nan)
    cuda.dropout_forward(x, mask, threshold, scale, y)
    cuda.dropout_backward(dy, mask, threshold, scale, dx)
    assert cuda.device.launches == launches + 2          # the CUDA kernels ran, not a fallback
    assert y.tobytes() == y_ref.tobytes() and dx.tobytes() == dx_ref.tobytes()
    # The edges: a word equal to the threshold is dropped, one above it kept.
    flat = y.reshape(-1)
    assert flat[0] == 0 and flat[1] == 0 and flat[3] == x.reshape(-1)[3] * scale
    if threshold < 2 ** 32 - 1:
        assert flat[2] == x.reshape(-1)[2] * scale
    # In place, as the layer runs it with top == bottom.
    inplace = x.copy()
    cuda.dropout_forward(inplace, mask, threshold, scale, inplace)
    assert inplace.tobytes() == y_ref.tobytes()


def test_emulated_set_takes_a_host_bernoulli_mask_through_the_reference():
    cuda = emulated()
    x = numpy.random.RandomState(3).standard_normal((4, 50)).astype(F32)
    mask = caffe_rng.CaffeRNG(9).bernoulli(x.size, 0.7).reshape(x.shape)     # uint8 0/1
    launches = cuda.device.launches
    y, y_ref = numpy.empty_like(x), numpy.empty_like(x)
    cuda.dropout_forward(x, mask, 0, F32(2.0), y)
    kernels.get("reference").dropout_forward(x, mask, 0, F32(2.0), y_ref)
    assert cuda.device.launches == launches
    assert y.tobytes() == y_ref.tobytes()
    assert y.tobytes() == ((x * mask) * F32(2.0)).tobytes()      # the layer's former arithmetic


# -- which stream ---------------------------------------------------------------------------------
class _FakeCupy:
    __name__ = "cupy"


def test_numpy_always_takes_the_host_stream_and_cupy_only_in_exact_mode(monkeypatch):
    assert caffe_rng.host_stream_for(numpy)
    assert not caffe_rng.host_stream_for(_FakeCupy)
    monkeypatch.setenv(caffe_rng.EXACT_RNG_ENV, "1")
    assert caffe_rng.exact_rng() and caffe_rng.host_stream_for(_FakeCupy)
    monkeypatch.setenv(caffe_rng.EXACT_RNG_ENV, "0")
    assert not caffe_rng.exact_rng()
    caffe_rng.set_exact_rng(True)                   # the switch wins over the environment
    assert caffe_rng.host_stream_for(_FakeCupy) and caffe_rng.host_stream_for(numpy)
    caffe_rng.set_exact_rng(False)
    monkeypatch.setenv(caffe_rng.EXACT_RNG_ENV, "1")
    assert not caffe_rng.host_stream_for(_FakeCupy) and caffe_rng.host_stream_for(numpy)


def test_numpy_mask_is_the_host_bernoulli_whatever_the_mode():
    x = numpy.zeros(1000, F32)
    for exact in (False, True):
        caffe_rng.set_exact_rng(exact)
        caffe_rng.set_random_seed(11)
        mask, threshold = caffe_rng.dropout_mask(x.size, F32(0.3), x)
        caffe_rng.set_random_seed(11)
        want = caffe_rng.get_rng().bernoulli(x.size, 1.0 - float(F32(0.3)))
        assert threshold == 0 and mask.dtype == numpy.uint8
        numpy.testing.assert_array_equal(mask, want)


@pytest.fixture
def numpy_as_device(monkeypatch):
    """NumPy arrays take the device-stream path (as CuPy arrays do) unless in exact mode."""
    monkeypatch.setattr(caffe_rng, "host_stream_for", lambda xp: caffe_rng.exact_rng())


@pytest.mark.parametrize("ratio", RATIOS)
def test_device_path_words_threshold_and_keep_rate(numpy_as_device, ratio):
    caffe_rng.set_random_seed(5)
    n = 200000
    like = numpy.zeros(1, F32)
    mask, threshold = caffe_rng.dropout_mask(n, F32(ratio), like)
    assert mask.dtype == numpy.uint32 and mask.shape == (n,)
    assert threshold == ref_neuron.dropout_threshold(ratio)
    keep = float(numpy.mean(mask > numpy.uint32(threshold)))
    assert abs(keep - (1 - ratio)) < 0.005
    # Seeded from the host stream's seed: the same words after the same seed, a fresh draw
    # otherwise; the host stream is not advanced.
    again, _ = caffe_rng.dropout_mask(n, F32(ratio), like)
    assert not numpy.array_equal(mask, again)
    caffe_rng.set_random_seed(5)
    assert caffe_rng.device_stream(numpy).seed == 5
    first_word = caffe_rng.get_rng().word()
    caffe_rng.set_random_seed(5)
    repeat, _ = caffe_rng.dropout_mask(n, F32(ratio), like)
    numpy.testing.assert_array_equal(mask, repeat)
    assert caffe_rng.get_rng().word() == first_word
    caffe_rng.set_random_seed(6)
    other, _ = caffe_rng.dropout_mask(n, F32(ratio), like)
    assert not numpy.array_equal(mask, other)


def test_exact_mode_takes_the_host_stream_on_the_device_path(numpy_as_device):
    like = numpy.zeros(1, F32)
    caffe_rng.set_exact_rng(True)
    caffe_rng.set_random_seed(8)
    mask, threshold = caffe_rng.dropout_mask(500, F32(0.5), like)
    caffe_rng.set_random_seed(8)
    numpy.testing.assert_array_equal(mask, caffe_rng.get_rng().bernoulli(500, 0.5))
    assert threshold == 0 and mask.dtype == numpy.uint8
    caffe_rng.set_exact_rng(False)
    mask, threshold = caffe_rng.dropout_mask(500, F32(0.5), like)
    assert mask.dtype == numpy.uint32 and threshold == 2 ** 31


# -- the layer ------------------------------------------------------------------------------------
def dropout_layer(ratio, shape=(4, 6, 5), in_place=False):
    text = (f'name: "d" type: "Dropout" bottom: "x" top: "{"x" if in_place else "y"}" '
            f'dropout_param {{ dropout_ratio: {ratio} }}')
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
    bottom = Blob(shape)
    # through xp: CuPy refuses a NumPy array as the value of a device slice assignment
    xp = get_array_module(bottom.data)
    bottom.data[...] = xp.asarray(numpy.random.RandomState(4).standard_normal(shape).astype(F32))
    top = bottom if in_place else Blob(shape)
    layer.setup([bottom], [top])
    return layer, [bottom], [top]


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("in_place", [False, True])
def test_layer_on_the_device_path_runs_the_kernels(numpy_as_device, ratio, in_place):
    cuda = emulated()
    previous = kernels.use(cuda)
    try:
        layer, bottom, top = dropout_layer(ratio, in_place=in_place)
        x = bottom[0].data.copy()
        caffe_rng.set_random_seed(21)
        launches = cuda.device.launches
        layer.forward(bottom, top)
        assert layer.mask.dtype == numpy.uint32 and layer.mask.shape == x.shape
        assert layer.threshold == ref_neuron.dropout_threshold(ratio)
        caffe_rng.set_random_seed(21)
        words = caffe_rng.device_stream(numpy).words(x.size).reshape(x.shape)
        numpy.testing.assert_array_equal(layer.mask, words)
        kept = words > numpy.uint32(layer.threshold)
        assert top[0].data.tobytes() == ((x * kept) * layer.scale).tobytes()
        dy = numpy.random.RandomState(5).standard_normal(x.shape).astype(F32)
        top[0].diff[...] = dy
        layer.backward(top, [True], bottom)
        assert bottom[0].diff.tobytes() == ((dy * kept) * layer.scale).tobytes()
        assert cuda.device.launches == launches + 2
    finally:
        kernels.use(previous)


def test_layer_on_numpy_keeps_the_host_stream_with_any_kernel_set(kernel_set):
    layer, bottom, top = dropout_layer(0.4)
    x = bottom[0].data.copy()
    if kernel_set.name == "cuda" and not isinstance(x, numpy.ndarray):
        pytest.skip("NumPy only")
    caffe_rng.set_random_seed(3)
    layer.forward(bottom, top)
    caffe_rng.set_random_seed(3)
    want = caffe_rng.get_rng().bernoulli(x.size, 1.0 - float(F32(0.4))).reshape(x.shape)
    numpy.testing.assert_array_equal(numpy.asarray(layer.mask), want)
    assert layer.threshold == 0
    scale = F32(1.0 / (1.0 - float(F32(0.4))))
    assert numpy.asarray(top[0].data).tobytes() == ((x * want) * scale).tobytes()


# -- on a GPU (skipped without one) ---------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("exact", [False, True])
def test_layer_on_the_gpu(gpu_mode, exact):
    import cupy
    caffe_rng.set_exact_rng(exact)
    layer, bottom, top = dropout_layer(0.3)
    assert isinstance(bottom[0].data, cupy.ndarray)
    x = bottom[0].data.get()
    caffe_rng.set_random_seed(13)
    layer.forward(bottom, top)
    mask = layer.mask.get()
    if exact:
        caffe_rng.set_random_seed(13)
        want = caffe_rng.get_rng().bernoulli(x.size, 1.0 - float(F32(0.3))).reshape(x.shape)
        assert layer.threshold == 0 and numpy.array_equal(mask, want)
    else:
        assert mask.dtype == numpy.uint32 and layer.threshold == ref_neuron.dropout_threshold(0.3)
        caffe_rng.set_random_seed(13)
        layer.forward(bottom, top)
        assert numpy.array_equal(layer.mask.get(), mask)          # repeatable from the seed
    kept = mask > mask.dtype.type(layer.threshold)
    assert top[0].data.get().tobytes() == ((x * kept) * layer.scale).tobytes()
    dy = numpy.random.RandomState(5).standard_normal(x.shape).astype(F32)
    top[0].diff[...] = cupy.asarray(dy)
    layer.backward(top, [True], bottom)
    assert bottom[0].diff.get().tobytes() == ((dy * kept) * layer.scale).tobytes()
