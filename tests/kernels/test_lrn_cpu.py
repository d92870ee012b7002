"""The cpu kernel set's ACROSS_CHANNELS LRN plan (``caffe_engine/kernels/cpu/lrn.py``) against
the reference plan, bit for bit: odd shapes (batch 1 and 3, fewer channels than the window,
odd positions), windows of 1 to 7 channels, one to three parts, channel blocks of one or two
channels and the default; two calls in a row (the scale's memory reused), a shape change
between calls, and the scale kept in a buffer placed from outside (``keep_saved_in``, the train
net's gradient arena). The layer's ``saved_bytes`` on every kernel set.
"""
import numpy
import pytest

from caffe_engine import backend, kernels
from caffe_engine.kernels.geometry import LRNGeometry
from gradient_check import gaussian, make_layer

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import lrn  # noqa: E402
from caffe_engine.kernels.cpu.team import Team  # noqa: E402

f32 = numpy.float32
REF = kernels.get("reference")
#: (shape, local_size): batch 1 and 3, channels fewer than the window, odd H * W
CASES = [((1, 3, 5, 7), 5), ((3, 2, 3, 5), 7), ((3, 4, 1, 1), 1), ((1, 6, 3, 3), 3),
         ((3, 9, 5, 3), 5), ((3, 13, 7, 1), 7), ((1, 1, 3, 3), 3), ((3, 5, 1, 3), 3)]


def geometry(shape, size, alpha=0.7, beta=0.75, k=1.5):
    return LRNGeometry(shape, size, alpha, beta, k, False)


def cpu_plan(g, threads, block_channels):
    """A cpu plan on ``threads`` parts cutting its images into ``block_channels`` (0: the
    default block)."""
    positions = int(numpy.prod(g.shape[2:]))
    block_bytes = 4 * positions * block_channels if block_channels else lrn.BLOCK_BYTES
    return lrn.LRNPlan(g, Team(threads), block_bytes=block_bytes)


def run(plan, x, dy):
    """(y, dx) of one forward and backward; the outputs start as NaN."""
    y = numpy.full(x.shape, numpy.nan, f32)
    dx = numpy.full(x.shape, numpy.nan, f32)
    plan.forward(x, y)
    plan.backward(x, y, dy, dx)
    return y, dx


def arrays(shape, seed):
    rng = numpy.random.default_rng(seed)
    return rng.standard_normal(shape).astype(f32), rng.standard_normal(shape).astype(f32)


def assert_bits_equal(got, want):
    for a, b in zip(got, want):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("block_channels", [1, 2, 0])
@pytest.mark.parametrize("shape, size", CASES)
def test_twice_in_a_row_equals_the_reference(shape, size, threads, block_channels):
    g = geometry(shape, size)
    plan = cpu_plan(g, threads, block_channels)
    scales = []
    for seed in (1, 2):
        x, dy = arrays(shape, seed)
        assert_bits_equal(run(plan, x, dy), run(REF.lrn(g), x, dy))
        scales.append(plan.scale)
    assert scales[0] is scales[1]          # one scale array, reused


@pytest.mark.parametrize("threads", [1, 2])
def test_a_shape_change_between_calls(threads):
    plan = cpu_plan(geometry((3, 9, 5, 3), 5), threads, 2)
    for seed, shape in enumerate([(3, 9, 5, 3), (1, 4, 3, 3), (3, 9, 5, 3), (2, 9, 5, 3)]):
        x, dy = arrays(shape, seed)
        assert_bits_equal(run(plan, x, dy), run(REF.lrn(geometry(shape, 5)), x, dy))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape, size", CASES[:4])
def test_the_scale_in_a_placed_buffer(shape, size, threads):
    g = geometry(shape, size, alpha=2.0, beta=0.6, k=0.5)
    plan = cpu_plan(g, threads, 1)
    count = int(numpy.prod(shape))
    assert plan.saved_bytes == 4 * count
    arena = numpy.full(count + 37, numpy.nan, f32)
    buffer = arena[21:21 + count]
    plan.keep_saved_in(buffer)
    for seed in (3, 4):
        x, dy = arrays(shape, seed)
        assert_bits_equal(run(plan, x, dy), run(REF.lrn(g), x, dy))
        assert numpy.shares_memory(plan.scale, buffer)
        assert plan._own is None           # no memory of its own
    assert numpy.isnan(arena[:21]).all() and numpy.isnan(arena[21 + count:]).all()


def test_keep_saved_in_after_a_call_of_its_own():
    g = geometry((3, 9, 5, 3), 5)
    plan = cpu_plan(g, 2, 0)
    x, dy = arrays(g.shape, 5)
    want = run(REF.lrn(g), x, dy)
    assert_bits_equal(run(plan, x, dy), want)
    buffer = numpy.zeros(plan.saved_bytes // 4, f32)
    plan.keep_saved_in(buffer)
    assert_bits_equal(run(plan, x, dy), want)
    assert numpy.shares_memory(plan.scale, buffer)


def test_within_channel_keeps_nothing_placeable():
    g = LRNGeometry((2, 3, 5, 5), 3, 0.7, 0.75, 1.5, True)
    plan = cpu_plan(g, 2, 0)
    assert plan.saved_bytes == 0
    plan.keep_saved_in(numpy.zeros(100, f32))
    x, dy = arrays(g.shape, 6)
    assert_bits_equal(run(plan, x, dy), run(REF.lrn(g), x, dy))


def test_backward_before_forward_raises():
    g = geometry((2, 3, 3, 3), 3)
    plan = cpu_plan(g, 2, 0)
    x, dy = arrays(g.shape, 7)
    with pytest.raises(RuntimeError, match="scale of a forward"):
        plan.backward(x, x, dy, numpy.empty_like(x))


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_layer_saved_bytes_on_every_kernel_set(region, kernel_set):
    """The cpu plans let the net place ACROSS_CHANNELS's scale; the reference and cuda plans
    keep their own (saved_bytes 0), and the layer never hands them a buffer."""
    shape = (2, 5, 3, 3)
    layer, bottoms, tops = make_layer(
        f'name: "lrn" type: "LRN" bottom: "x" top: "y" '
        f'lrn_param {{ local_size: 3 norm_region: {region} }}', [gaussian(shape)])
    placeable = isinstance(layer.plan, lrn.LRNPlan) and region == "ACROSS_CHANNELS"
    assert layer.saved_bytes() == (4 * int(numpy.prod(shape)) if placeable else 0)
    xp = backend.get_array_module(bottoms[0].data)
    buffer = xp.zeros(int(numpy.prod(shape)), f32)
    layer.keep_saved_in(buffer)
    layer.forward(bottoms, tops)
    tops[0].diff[...] = 1
    layer.backward(tops, [True], bottoms)
    if placeable:
        assert numpy.shares_memory(layer.plan.scale, buffer)
    else:
        assert not bool((buffer != 0).any())       # never written
