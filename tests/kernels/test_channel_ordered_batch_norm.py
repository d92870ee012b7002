"""BatchNorm's channel-ordered passes on the cpu set (``batch_norm_stats_forward`` and
``batch_norm_backward``: a thread's channels a group at a time, all passes of a group back to
back) against the reference set's composition (``batch_norm_stats``, ``sqrt(var + eps)``,
``batch_norm_forward``; ``batch_norm_backward``), bit for bit: the per-channel sums over items
must be added as NumPy adds the item axis of an (outer, C) array -- in turn for C >= 2,
pairwise for C == 1 (caffe_engine/kernels/cpu/channelwise.py,
caffe_engine/kernels/reference/channelwise.py)."""
import itertools

import numpy
import pytest
from numpy.testing import assert_array_equal

from caffe_engine import kernels

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels, channelwise  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32
REF = kernels.get("reference")
EPS = f32(1e-5)
OUTERS = [1, 2, 7, 8, 9, 32, 129]
CHANNELS = [1, 2, 3, 64]
INNERS = [1, 5, 49, 784, 3136]
#: The grid's largest arrays are left out (the test's time, not the kernels', limits them).
MAX_FLOATS = 1 << 21


def _cpu(threads):
    return CpuKernels(CpuTuning(threads=threads))


def _run(ks, x, dy, scale, bias, slope, factor, in_place):
    """Forward then backward through one kernel set; every result, as a list of arrays."""
    outer, C, inner = x.shape
    inv = f32(1.0 / (outer * inner))
    xx = x.copy()
    y = xx if in_place else numpy.full(x.shape, numpy.nan, f32)
    x_norm = numpy.full(x.shape, numpy.nan, f32)
    std = numpy.full(C, numpy.nan, f32)
    mean, var = ks.batch_norm_stats_forward(xx, inv, EPS, x_norm, y, std, scale, bias, slope)
    g = dy.copy()
    dx = g if in_place else numpy.full(x.shape, numpy.nan, f32)
    sums = ks.batch_norm_backward(g, x_norm, std, dx, factor, scale,
                                  y if slope is not None else None, slope)
    assert (sums[1] is None) == (scale is None)
    return [mean, var, std, x_norm, y, dx, sums[0]] + ([sums[1]] if scale is not None else [])


def _data(shape, seed):
    r = numpy.random.default_rng(seed)
    C = shape[1]
    x = (r.standard_normal(shape) * 3 + r.standard_normal((1, C, 1)) * 10).astype(f32)
    x[..., ::4] = 0.0                     # ties at the ReLU
    dy = r.standard_normal(shape).astype(f32)
    return x, dy, r.standard_normal(C).astype(f32), r.standard_normal(C).astype(f32)


def _assert_same(ours, theirs):
    for a, b in zip(ours, theirs):
        assert_array_equal(a, b)
        finite = ~numpy.isnan(a)
        assert a[finite].tobytes() == b[finite].tobytes()   # -0.0 against 0.0 too
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_grid_equals_the_reference(threads):
    """Every (outer, C, inner) of the grid (up to :data:`MAX_FLOATS` floats), with a Scale
    with bias and a ReLU, batch statistics, not in place."""
    cpu = _cpu(threads)
    for outer, C, inner in itertools.product(OUTERS, CHANNELS, INNERS):
        if outer * C * inner > MAX_FLOATS:
            continue
        x, dy, scale, bias = _data((outer, C, inner), outer * 7919 + C * 31 + inner)
        args = (x, dy, scale, bias, f32(0), f32(-1.0 / (outer * inner)), False)
        _assert_same(_run(cpu, *args), _run(REF, *args))


EPILOGUES = [(False, False, None), (True, False, None), (True, True, f32(0)),
             (False, False, f32(0)), (True, True, f32(0.25))]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(9, 1, 49), (8, 1, 5), (32, 3, 784), (7, 64, 5)])
@pytest.mark.parametrize("epilogue", EPILOGUES)
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("batch", [True, False])
def test_epilogues_in_place_and_global_statistics(threads, shape, epilogue, in_place, batch):
    """Without the Scale, its bias or the ReLU, leaky, in place, and the backward with global
    statistics (``factor`` None)."""
    has_scale, has_bias, slope = epilogue
    x, dy, scale, bias = _data(shape, sum(shape))
    factor = f32(-1.0 / (shape[0] * shape[2])) if batch else None
    args = (x, dy, scale if has_scale else None, bias if has_bias else None, slope, factor,
            in_place)
    _assert_same(_run(_cpu(threads), *args), _run(REF, *args))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(8, 2, 5), (9, 3, 49), (129, 1, 5), (7, 64, 49)])
def test_nan_inf_and_negative_zero(threads, shape):
    """A NaN, an infinity, planes of -0.0 and a channel all -0.0 (its sums -0.0 or 0.0 as
    NumPy makes them), in the data and the gradient."""
    x, dy, scale, bias = _data(shape, 5)
    outer, C, _ = shape
    x[0, 0, 0] = numpy.nan
    x[-1, C - 1, -1] = numpy.inf if C > 1 else x[-1, C - 1, -1]
    x[outer // 2, C // 2] = -0.0
    dy[:, C - 1] = -0.0
    dy[0, 0, -1] = -numpy.inf
    if C > 2:
        x[:, 1] = -0.0
        dy[1 % outer, 2, 0] = numpy.nan
    args = (x, dy, scale, bias, f32(0), f32(-1.0 / (shape[0] * shape[2])), False)
    _assert_same(_run(_cpu(threads), *args), _run(REF, *args))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("group_floats", [1, 16, 100])
def test_channel_groups_and_ragged_splits(monkeypatch, threads, group_floats):
    """Groups of several channels, the last one short, and thread shares that are not a
    multiple of the group (large enough arrays to be split between the threads)."""
    monkeypatch.setattr(channelwise, "GROUP_FLOATS", group_floats)
    for shape in [(11, 67, 49), (4, 13, 784)]:
        assert numpy.prod(shape) >= channelwise.PARALLEL_MIN
        x, dy, scale, bias = _data(shape, group_floats + threads)
        args = (x, dy, scale, bias, f32(0), f32(-1.0 / (shape[0] * shape[2])), True)
        _assert_same(_run(_cpu(threads), *args), _run(REF, *args))


def test_reference_composition_is_the_layers_former_sequence():
    """The reference's ``batch_norm_stats_forward`` is ``batch_norm_stats``, ``std =
    sqrt(var + eps)`` in float32 and ``batch_norm_forward``: what BatchNormLayer ran before."""
    x, _, scale, bias = _data((4, 3, 10), 1)
    mean, var = REF.batch_norm_stats(x, f32(1 / 40))
    std = numpy.sqrt((var + EPS).astype(f32))
    x_norm, y = numpy.empty_like(x), numpy.empty_like(x)
    REF.batch_norm_forward(x, mean, std, x_norm, y, scale, bias, f32(0))
    got = [numpy.empty_like(x), numpy.empty_like(x), numpy.empty(3, f32)]
    m2, v2 = REF.batch_norm_stats_forward(x, f32(1 / 40), EPS, got[0], got[1], got[2], scale,
                                          bias, f32(0))
    _assert_same([m2, v2, got[2], got[0], got[1]], [mean, var, std, x_norm, y])
