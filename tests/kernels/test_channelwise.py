"""BatchNorm's and Scale's per-channel passes: the cpu set's fused kernels against the reference
set's array code, bit for bit, in place and not, on small and multi-threaded sizes
(caffe_engine/kernels/cpu/channelwise.py, caffe_engine/kernels/reference/channelwise.py)."""
import numpy
import pytest

from caffe_engine import kernels

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32
REF = kernels.get("reference")
SHAPES = [(1, 1, 1), (2, 3, 5), (3, 7, 33), (4, 64, 196), (2, 16, 3137)]


def arrays(shape, seed):
    r = numpy.random.default_rng(seed)
    a = lambda *s: (r.standard_normal(s) * 3).astype(f32)  # noqa: E731
    c = shape[1]
    return a(*shape), a(*shape), a(c), numpy.abs(a(c)) + f32(0.1), a(c), a(c)


def same(a, b):
    assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_channel_sums_have_numpys_bits(threads):
    """The cpu set sums each plane in NumPy's pairwise order: every plane length up to 300 and
    some long ones, of large and tiny magnitudes, zeros and negative zeros."""
    cpu = CpuKernels(CpuTuning(threads=threads))
    r = numpy.random.default_rng(3)
    for inner in list(range(0, 301)) + [1000, 3136, 4097, 12544]:
        for magnitude in (1.0, 1e4):
            a = (r.standard_normal((3, 2, inner)) * magnitude).astype(f32)
            a[0, 0] = -0.0
            a[1, 1, ::2] = 0.0
            for alpha in (None, f32(1 / 7)):
                same(cpu.channel_sum(a, alpha), REF.channel_sum(a, alpha))
    big = (r.standard_normal((4, 64, 3136)) + 5).astype(f32)
    same(cpu.channel_sum(big, f32(1 / 12544)), REF.channel_sum(big, f32(1 / 12544)))


EPILOGUES = [(False, False, None), (True, False, None), (True, True, None), (True, True, 0.0),
             (False, False, 0.0), (True, True, 0.25)]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", SHAPES + [(3, 5, 129), (2, 4, 8)])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_batch_norm_passes_equal_the_reference(shape, in_place, threads, epilogue):
    """Statistics, the forward with an optional Scale (with or without bias) and ReLU (slope 0
    or leaky), the backward with batch and with global statistics: the same bits."""
    has_scale, has_bias, slope = epilogue
    slope = None if slope is None else f32(slope)
    cpu = CpuKernels(CpuTuning(threads=threads))
    x, dy, scale, std, bias, _ = arrays(shape, sum(shape))
    x[..., ::3] = 0.0          # ties at the ReLU
    scale = scale if has_scale else None
    bias = bias if has_bias else None
    inv = f32(1.0 / (shape[0] * shape[2]))
    results = []
    for ks in (REF, cpu):
        mean, var = ks.batch_norm_stats(x, inv)
        xx = x.copy()
        y = xx if in_place else numpy.full(shape, numpy.nan, f32)
        x_norm = numpy.full(shape, numpy.nan, f32)
        ks.batch_norm_forward(xx, mean, std, x_norm, y, scale, bias, slope)
        out = [mean, var, y, x_norm]
        for factor in (f32(-1 / 7), None):
            gg = dy.copy()
            dx = gg.reshape(shape) if in_place else numpy.full(shape, numpy.nan, f32)
            sums = ks.batch_norm_backward(gg, x_norm, std, dx, factor, scale,
                                          y if slope is not None else None, slope)
            out += [dx, sums[0]] + ([sums[1]] if has_scale else [])
            assert (sums[1] is None) == (not has_scale)
        results.append(out)
    for a, b in zip(*results):
        same(a, b)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_scale_passes_equal_the_reference(shape, in_place, threads):
    cpu = CpuKernels(CpuTuning(threads=threads))
    x, dy, scale, _, bias, _ = arrays(shape, 7 + sum(shape))
    results = []
    for ks in (REF, cpu):
        xx, gg = x.copy(), dy.copy()
        y = xx if in_place else numpy.empty(shape, f32)
        ks.scale_shift(xx, scale, bias, y)
        y2 = numpy.empty(shape, f32)
        ks.scale_shift(x, scale, None, y2)
        saved = x.copy()
        product = saved if in_place else numpy.empty(shape, f32)   # Caffe's temp_ in place
        dx = gg.reshape(shape) if in_place else numpy.empty(shape, f32)
        ks.scale_grad(gg, saved, scale, product, dx)
        dx2 = numpy.empty(shape, f32)
        ks.scale_grad(dy, None, scale, None, dx2)
        results.append((y, y2, product, dx, dx2))
    for a, b in zip(*results):
        same(a, b)
    numpy.testing.assert_array_equal(results[0][2], dy * x)
