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


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_batch_norm_passes_equal_the_reference(shape, in_place, threads):
    cpu = CpuKernels(CpuTuning(threads=threads))
    x, dy, mean, std, dot, total = arrays(shape, sum(shape))
    results = []
    for ks in (REF, cpu):
        xx, gg = x.copy(), dy.copy()
        y = xx if in_place else numpy.full(shape, numpy.nan, f32)
        square, copy = numpy.empty(shape, f32), numpy.empty(shape, f32)
        ks.center(xx, mean, y, square)
        ks.normalize(y, std.reshape(1, -1, 1), copy)
        dx = gg.reshape(shape) if in_place else numpy.full(shape, numpy.nan, f32)  # a new view
        ks.batch_norm_grad(y, gg, dot.reshape(1, -1, 1), total, f32(-1 / 7), std, dx)
        plain = numpy.empty(shape, f32)
        ks.center(x, mean, plain)
        results.append((y, square, copy, dx, plain))
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
