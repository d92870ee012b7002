"""The cpu kernel set's pooling against the reference kernels, bit for bit (values, the int32
argmax and its float mask, and the gradients), on Caffe's tie rule's hard cases: values drawn
from a handful of integers (many ties), NaN, -inf and -FLT_MAX cells, signed zeros; planes from
1x1 to 112x112, kernels 1-7, strides 1-3, pads 0-2, ceil and floor rounding (windows clipped at
the bottom and right edges). Both of the cpu set's paths run: the flat runs over a plane
(:class:`caffe_engine.kernels.cpu.pooling.FlatTables`) and the row by row windows.
"""
import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.kernels.geometry import PoolGeometry, pooled_size

pytest.importorskip("numba")
from caffe_engine.kernels.cpu import CpuKernels  # noqa: E402
from caffe_engine.kernels.cpu.pooling import FlatTables  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32
FLT_MAX = numpy.finfo(f32).max
MAX, AVE = 0, 1
REF = kernels.get("reference")
# Caffe's ceil mode with a kernel below the stride and no pad lets the last window start past
# the input: a pool size of 0 or less, and the reference (as Caffe) divides by it
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in divide:RuntimeWarning")
CPU = {threads: CpuKernels(CpuTuning(threads=threads)) for threads in (1, 2, 3)}


def geometry(hw, kernel, stride, pad, method, ceil=True, num=1, channels=2):
    """The pooling geometry, or None where Caffe refuses it (pad >= kernel, or a window that
    starts past the padded input)."""
    if any(p >= k for p, k in zip(pad, kernel)):
        return None
    if any(k > s + 2 * p for k, s, p in zip(kernel, hw, pad)):
        return None
    out = tuple(pooled_size(*a, ceil) for a in zip(hw, kernel, stride, pad))
    if min(out) <= 0:
        return None
    return PoolGeometry(num, channels, hw, out, kernel, stride, pad, method)


def hard_input(rng, shape, method):
    """Values from {-2..2} (ties everywhere), with NaN, -inf, -FLT_MAX and -0.0 cells for MAX;
    small multiples of 0.37 with signed zeros for AVE (finite: a sum's order shows)."""
    x = rng.integers(-2, 3, shape).astype(f32)
    flat = x.reshape(-1)
    for value, share in ((numpy.nan, 23), (-numpy.inf, 19), (-FLT_MAX, 17), (-0.0, 7)):
        flat[rng.integers(0, flat.size, max(1, flat.size // share))] = value
    if method == AVE:
        x = numpy.nan_to_num(x, nan=1.0, neginf=-3.0, posinf=3.0)
        x[numpy.abs(x) > 10] = -2.5
        x = x * f32(0.37)
    return x


def run(kernels, g, x, dy):
    plan = kernels.pooling(g)
    y = numpy.full(dy.shape, f32(7), f32)
    mask = numpy.full(dy.shape, f32(-7)) if g.method == MAX else None
    dx = numpy.full(x.shape, numpy.nan, f32)
    plan.forward(x, y, mask)
    plan.backward(dy, dx)
    return y, mask, dx


def assert_same(g, x, dy, threads=2):
    want = run(REF, g, x, dy)
    got = run(CPU[threads], g, x, dy)
    for name, a, b in zip(("y", "mask", "dx"), want, got):
        if a is not None:
            assert a.tobytes() == b.tobytes(), (name, g)


def check_all(hw, method, seed, kernels=(1, 2, 3, 5, 7), strides=(1, 2, 3), pads=(0, 1, 2),
              ceils=(True, False), num=1, channels=2):
    rng = numpy.random.default_rng(seed)
    checked = 0
    for k in kernels:
        for s in strides:
            for p in pads:
                for ceil in ceils:
                    g = geometry(hw, (k, k), (s, s), (p, p), method, ceil, num, channels)
                    if g is None:
                        continue
                    x = hard_input(rng, (num, channels) + hw, method)
                    dy = rng.integers(-3, 4, (num, channels) + g.out_hw).astype(f32) * f32(0.3)
                    dy.reshape(-1)[::5] = -0.0
                    assert_same(g, x, dy)
                    checked += 1
    assert checked


@pytest.mark.parametrize("method", [MAX, AVE])
@pytest.mark.parametrize("hw", [(1, 1), (2, 3), (7, 7), (13, 13), (14, 14), (28, 28)])
def test_small_planes_every_window(hw, method):
    check_all(hw, method, seed=hw[0] * 10 + method, num=2, channels=3)


@pytest.mark.parametrize("method", [MAX, AVE])
@pytest.mark.parametrize("hw", [(56, 56), (112, 112)])
def test_large_planes(hw, method):
    check_all(hw, method, seed=hw[0] + method, kernels=(1, 2, 3, 5, 7), strides=(1, 2, 3),
              pads=(0, 1, 2), ceils=(True,), channels=1)


# GoogLeNet's pools (inception 3x3/1 pad 1, pool1-pool4 3x3/2 ceil, AVE 5x5/3 and 7x7/1),
# ResNet/AlexNet's 3x3/2 on odd planes, rectangular windows and strides
NET_POOLS = [((28, 28), (3, 3), (1, 1), (1, 1)), ((14, 14), (3, 3), (1, 1), (1, 1)),
             ((7, 7), (3, 3), (1, 1), (1, 1)), ((112, 112), (3, 3), (2, 2), (0, 0)),
             ((56, 56), (3, 3), (2, 2), (0, 0)), ((28, 28), (3, 3), (2, 2), (0, 0)),
             ((14, 14), (3, 3), (2, 2), (0, 0)), ((14, 14), (5, 5), (3, 3), (0, 0)),
             ((7, 7), (7, 7), (1, 1), (0, 0)), ((55, 55), (3, 3), (2, 2), (0, 0)),
             ((27, 27), (3, 3), (2, 2), (1, 1)), ((13, 13), (3, 3), (2, 2), (0, 0)),
             ((9, 17), (2, 3), (1, 2), (1, 1)), ((17, 9), (3, 2), (2, 1), (0, 1)),
             ((20, 31), (3, 5), (3, 2), (2, 2)), ((10, 30), (1, 3), (1, 3), (0, 1))]


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("method", [MAX, AVE])
@pytest.mark.parametrize("hw,kernel,stride,pad", NET_POOLS)
def test_net_pools(hw, kernel, stride, pad, method, threads):
    g = geometry(hw, kernel, stride, pad, method, num=2, channels=5)
    rng = numpy.random.default_rng(hash((hw, kernel, stride, pad, method)) % 2**32)
    x = hard_input(rng, (2, 5) + hw, method)
    dy = rng.standard_normal((2, 5) + g.out_hw).astype(f32)
    assert_same(g, x, dy, threads)


@pytest.mark.parametrize("hw,kernel,stride,pad", NET_POOLS[:3] + NET_POOLS[5:7])
def test_net_pools_take_the_flat_runs(hw, kernel, stride, pad):
    """GoogLeNet's inception pools and pool3/pool4 run as flat runs (with 8 or 16 lanes a
    vector): the tests above cover that path."""
    assert FlatTables.fits(geometry(hw, kernel, stride, pad, MAX))


def test_all_ties_first_cell_wins():
    """A plane of equal values (and of +0/-0 mixed): every argmax is its window's first cell
    inside the input, the value that cell's (the sign of zero kept)."""
    for value in (f32(1.5), f32(0.0)):
        g = geometry((14, 14), (3, 3), (1, 1), (1, 1), MAX, num=1, channels=3)
        x = numpy.full((1, 3, 14, 14), value, f32)
        if value == 0:
            x.reshape(-1)[::2] = -0.0
        dy = numpy.ones((1, 3, 14, 14), f32)
        assert_same(g, x, dy)


def test_nothing_beats_minus_flt_max():
    """Windows of NaN, -inf and -FLT_MAX only: -FLT_MAX out, argmax -1, no gradient."""
    for hw, k, s, p in (((14, 14), 3, 1, 1), ((28, 28), 3, 2, 0), ((7, 7), 2, 1, 1)):
        g = geometry(hw, (k, k), (s, s), (p, p), MAX)
        x = numpy.resize(numpy.array([numpy.nan, -numpy.inf, -FLT_MAX], f32), (1, 2) + hw)
        dy = numpy.ones((1, 2) + g.out_hw, f32)
        y, mask, dx = run(CPU[2], g, x, dy)
        assert (y == -FLT_MAX).all() and (mask == -1).all() and (dx == 0).all()
        assert_same(g, x, dy)
