"""The cpu kernel set against the reference set on random geometry.

Convolution (2-D: odd sizes, padding up to the kernel, stride beyond the kernel, dilation,
groups, batch 1, each way of laying images out and cutting blocks; depthwise ones through their
direct kernel and through the grouped plan) within a float32 summation tolerance; pooling, LRN, the solver steps and the data transform bit for bit.
"""
import dataclasses

import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.kernels.geometry import (ConvGeometry, LRNGeometry, PoolGeometry,
                                           conv_output_shape, pooled_size)
from caffe_engine.kernels.update_rules import RULES, Hyper
from caffe_engine.proto import caffe_pb2

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels  # noqa: E402
from caffe_engine.kernels.cpu.depthwise import DepthwisePlan  # noqa: E402
from caffe_engine.kernels.cpu.team import Team  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402
from caffe_engine.kernels.cpu.workspace import Workspace  # noqa: E402

f32 = numpy.float32
REF = kernels.get("reference")
#: Tunings that reach every edge of the blocking: one thread and one-column blocks, odd thread
#: counts and slices, each images-per-chunk layout, the engine's default.
TUNINGS = [CpuTuning(threads=1, block_columns=1, kc=6),
           CpuTuning(threads=3, block_columns=7, kc=12, skew=0, images_per_chunk=3),
           CpuTuning(threads=2, block_columns=40, kc=18, skew=5, images_per_chunk=1),
           CpuTuning(threads=2, images_per_chunk=16),
           CpuTuning(threads=2)]


def random_conv(rng):
    """A random 2-D convolution geometry: odd sizes, pad up to the kernel, stride up to
    kernel + 1, dilation, groups, batch 1 sometimes."""
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.integers(1, 5))
    num_output = group * int(rng.integers(1, 6))
    kernel = tuple(int(k) for k in rng.integers(1, 6, 2))
    dilation = tuple(int(d) for d in rng.choice([1, 1, 2], 2))
    stride = tuple(int(rng.integers(1, k + 2)) for k in kernel)
    pad = tuple(int(rng.integers(0, k + 1)) for k in kernel)
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    in_spatial = tuple(max(e - 2 * p, 0) + int(rng.integers(0, 9)) for e, p in zip(extent, pad))
    in_spatial = tuple(max(1, s) for s in in_spatial)
    out = conv_output_shape(in_spatial, kernel, stride, pad, dilation)
    if min(out) < 1:
        return random_conv(rng)
    num = int(rng.choice([1, 2, 5, 17]))
    return ConvGeometry(num, channels, num_output, group, in_spatial, out, kernel, stride, pad,
                        dilation)


def conv_arrays(g, rng):
    x = rng.standard_normal((g.num, g.channels) + g.in_spatial).astype(f32)
    w = rng.standard_normal((g.num_output, g.channels // g.group) + g.kernel).astype(f32)
    b = rng.standard_normal(g.num_output).astype(f32)
    dy = rng.standard_normal((g.num, g.num_output) + g.out_spatial).astype(f32)
    return x, w, b, dy


def conv_results(plan, g, x, w, b, dy):
    y = numpy.full(dy.shape, numpy.nan, f32)
    dx = numpy.full(x.shape, numpy.nan, f32)
    dw = numpy.ones(w.shape, f32)            # the gradients accumulate onto what is there
    db = numpy.ones(b.shape, f32)
    plan.forward(x, w, b, y)
    plan.backward_data(dy, w, dx)
    plan.weight_grad(x, dy, dw)
    plan.bias_grad(dy, db)
    return {"y": y, "dx": dx, "dw": dw, "db": db}


def assert_sums_close(got, want, x, w, dy):
    """Within float32 rounding of a sum of products: 1e-5 of the largest magnitude."""
    for name in want:
        scale = max(1.0, float(numpy.abs(want[name]).max()))
        numpy.testing.assert_allclose(got[name], want[name], rtol=0, atol=2e-5 * scale,
                                      err_msg=name)


@pytest.mark.parametrize("seed", range(40))
def test_convolution_matches_reference(seed):
    rng = numpy.random.default_rng(seed)
    g = random_conv(rng)
    arrays = conv_arrays(g, rng)
    want = conv_results(REF.conv(g), g, *arrays)
    tuning = TUNINGS[seed % len(TUNINGS)]
    got = conv_results(CpuKernels(tuning).conv(g), g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])


@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: f"{t.threads}t-{t.block_columns}c")
@pytest.mark.parametrize("shape", [(100, 32, 16, 32, 5, 1, 2), (3, 3, 32, 8, 5, 1, 2),
                                   (2, 6, 9, 4, 3, 2, 1), (4, 8, 7, 12, 1, 1, 0),
                                   (3, 16, 20, 64, 1, 1, 0), (2, 24, 9, 8, 1, 1, 0),
                                   (1, 3, 23, 5, 7, 2, 3)])
def test_convolution_layer_shapes(tuning, shape):
    n, c, h, m, k, s, p = shape
    out = conv_output_shape((h, h), (k, k), (s, s), (p, p), (1, 1))
    g = ConvGeometry(n, c, m, 1, (h, h), out, (k, k), (s, s), (p, p), (1, 1))
    arrays = conv_arrays(g, numpy.random.default_rng(1))
    want = conv_results(REF.conv(g), g, *arrays)
    got = conv_results(CpuKernels(tuning).conv(g), g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])


@pytest.mark.parametrize("tuning", TUNINGS, ids=lambda t: f"{t.threads}t-{t.block_columns}c")
@pytest.mark.parametrize("shape", [(2, 8, (7, 7), 16, (2, 2)), (3, 5, (8, 9), 4, (3, 2)),
                                   (1, 3, (1, 6), 2, (2, 3)), (4, 64, (28, 28), 32, (2, 2)),
                                   (2, 16, (14, 13), 64, (2, 2))])
def test_strided_pointwise_convolution(tuning, shape):
    """1x1 stride > 1 (ResNet's projections) through the gathered input and an unstrided plan:
    the reference's results, the unread positions' gradient 0."""
    from caffe_engine.kernels.cpu.strided_pointwise import StridedPointwisePlan
    n, c, hw, m, stride = shape
    out = conv_output_shape(hw, (1, 1), stride, (0, 0), (1, 1))
    g = ConvGeometry(n, c, m, 1, hw, out, (1, 1), stride, (0, 0), (1, 1))
    plan = CpuKernels(tuning).conv(g)
    assert isinstance(plan, StridedPointwisePlan)
    arrays = conv_arrays(g, numpy.random.default_rng(2))
    want = conv_results(REF.conv(g), g, *arrays)
    got = conv_results(plan, g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])
    unread = numpy.ones(hw, bool)
    unread[::stride[0], ::stride[1]] = False
    assert (got["dx"][:, :, unread] == 0).all() and numpy.isfinite(got["dx"]).all()


@pytest.mark.parametrize("seed", range(12))
def test_convolution_in_sub_batches(seed):
    """A layer whose packed batch exceeds the workspace limit runs a few images at a time
    (conv_plan.SubBatchPlan, the last sub-batch shorter): the reference's results."""
    from caffe_engine.kernels.cpu import conv_plan
    rng = numpy.random.default_rng(100 + seed)
    g = random_conv(rng)
    g = ConvGeometry(int(rng.choice([5, 7, 17])), *dataclasses.astuple(g)[1:])
    tuning = TUNINGS[seed % len(TUNINGS)]
    probe = conv_plan.Conv2dPlan(g, tuning, Workspace(), Team(1))
    limit = conv_plan.packed_per_image(probe) * probe.NB * 2
    plan = conv_plan.make(g, tuning, Workspace(), Team(tuning.threads), limit=limit)
    if probe.N > 2 * probe.NB:
        assert isinstance(plan, conv_plan.SubBatchPlan) and len(plan.slices) > 1
    arrays = conv_arrays(g, rng)
    want = conv_results(REF.conv(g), g, *arrays)
    got = conv_results(plan, g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])


def random_depthwise(rng):
    """A random depthwise geometry (group = channels = num_output): stride 1 half the time,
    else strided; odd sizes, dilation, padding up to the kernel."""
    channels = int(rng.integers(2, 9))
    kernel = tuple(int(k) for k in rng.integers(1, 6, 2))
    dilation = tuple(int(d) for d in rng.choice([1, 1, 2], 2))
    stride = (1, 1) if rng.random() < 0.5 else tuple(int(rng.integers(1, k + 2)) for k in kernel)
    pad = tuple(int(rng.integers(0, k + 1)) for k in kernel)
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    in_spatial = tuple(max(1, max(e - 2 * p, 0) + int(rng.integers(0, 40)))
                       for e, p in zip(extent, pad))
    out = conv_output_shape(in_spatial, kernel, stride, pad, dilation)
    if min(out) < 1:
        return random_depthwise(rng)
    num = int(rng.choice([1, 2, 5]))
    return ConvGeometry(num, channels, channels, channels, in_spatial, out, kernel, stride, pad,
                        dilation)


@pytest.mark.parametrize("seed", range(30))
def test_depthwise_convolution_matches_reference(seed):
    rng = numpy.random.default_rng(100 + seed)
    g = random_depthwise(rng)
    arrays = conv_arrays(g, rng)
    want = conv_results(REF.conv(g), g, *arrays)
    plan = CpuKernels(TUNINGS[seed % len(TUNINGS)]).conv(g)
    assert isinstance(plan, DepthwisePlan)
    got = conv_results(plan, g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])


@pytest.mark.parametrize("shape", [(2, 16, 40, 1), (3, 8, 33, 2), (1, 32, 7, 1), (2, 24, 56, 1),
                                   (2, 8, 70, 1), (2, 8, 14, 2), (1, 4, 100, 2), (3, 5, 9, 3)])
def test_depthwise_mobilenet_shapes(shape):
    n, c, h, s = shape
    out = conv_output_shape((h, h), (3, 3), (s, s), (1, 1), (1, 1))
    g = ConvGeometry(n, c, c, c, (h, h), out, (3, 3), (s, s), (1, 1), (1, 1))
    arrays = conv_arrays(g, numpy.random.default_rng(2))
    want = conv_results(REF.conv(g), g, *arrays)
    plan = CpuKernels(CpuTuning(threads=2)).conv(g)
    # whole planes, but long stride-1 rows' weight gradient row by row
    assert plan.wide_weight_grad == (not (s == 1 and out[1] >= 64))
    got = conv_results(plan, g, *arrays)
    assert_sums_close(got, want, arrays[0], arrays[1], arrays[3])


def random_pool(rng, method):
    kernel = tuple(int(k) for k in rng.integers(1, 5, 2))
    pad = tuple(int(rng.integers(0, k)) for k in kernel)
    stride = tuple(int(rng.integers(1, k + 2)) for k in kernel)
    hw = tuple(int(k + rng.integers(0, 9)) for k in kernel)
    ceil = bool(rng.integers(0, 2))
    out = tuple(pooled_size(s, k, st, p, ceil) for s, k, st, p in zip(hw, kernel, stride, pad))
    n, c = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    return PoolGeometry(n, c, hw, out, kernel, stride, pad, method)


# rows wider than a vector (several chunks per row) and Caffe's common 3x3/2 and global windows
WIDE_POOLS = [((5, 37), (3, 3), (2, 2), (1, 1)), ((7, 40), (2, 5), (1, 3), (0, 2)),
              ((16, 16), (3, 3), (2, 2), (0, 0)), ((6, 33), (6, 33), (1, 1), (0, 0)),
              # rows of several whole vectors inside (the plain-load chunks) and edges
              ((5, 150), (3, 3), (2, 2), (0, 0)), ((4, 101), (2, 2), (2, 2), (0, 0)),
              ((3, 111), (3, 3), (2, 2), (1, 1)), ((3, 70), (3, 3), (1, 1), (1, 1)),
              ((2, 224), (2, 2), (2, 2), (0, 0))]


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("seed", range(25 + len(WIDE_POOLS)))
def test_pooling_matches_reference_exactly(method, seed):
    rng = numpy.random.default_rng(seed)
    value = caffe_pb2.PoolingParameter.PoolMethod.Value(method)
    if seed < 25:
        g = random_pool(rng, value)
    else:
        hw, kernel, stride, pad = WIDE_POOLS[seed - 25]
        out = tuple(pooled_size(*a, True) for a in zip(hw, kernel, stride, pad))
        g = PoolGeometry(2, 3, hw, out, kernel, stride, pad, value)
    # ties, NaN and -inf are where the first-max rule shows
    x = rng.integers(-3, 4, (g.num, g.channels) + g.in_hw).astype(f32)
    x.reshape(-1)[rng.integers(0, x.size, 2)] = numpy.nan
    x.reshape(-1)[rng.integers(0, x.size, 1)] = -numpy.inf
    if method == "AVE":
        x = numpy.nan_to_num(x, neginf=-5.0) * f32(0.37)
    dy = rng.standard_normal((g.num, g.channels) + g.out_hw).astype(f32)
    results = []
    for ks in (REF, CpuKernels(CpuTuning(threads=2))):
        plan = ks.pooling(g)
        y = numpy.empty(dy.shape, f32)
        mask = numpy.full(dy.shape, f32(-7)) if method == "MAX" else None
        dx = numpy.full(x.shape, numpy.nan, f32)
        plan.forward(x, y, mask)
        plan.backward(dy, dx)
        results.append((y, mask, dx))
    for a, b in zip(*results):
        if a is not None:
            numpy.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("within", [False, True])
@pytest.mark.parametrize("size,shape", [(5, (2, 7, 3, 4)), (3, (1, 2, 5, 5)), (1, (2, 3, 2, 2)),
                                        (7, (3, 4, 6, 1))])
def test_lrn_matches_reference_exactly(within, size, shape):
    rng = numpy.random.default_rng(size)
    g = LRNGeometry(shape, size, 0.7, 0.75, 1.5, within)
    x = rng.standard_normal(shape).astype(f32)
    dy = rng.standard_normal(shape).astype(f32)
    results = []
    for ks in (REF, CpuKernels(CpuTuning(threads=2))):
        plan = ks.lrn(g)
        y = numpy.empty(shape, f32)
        dx = numpy.empty(shape, f32)
        plan.forward(x, y)
        plan.backward(x, y, dy, dx)
        results.append((y, dx))
    for a, b in zip(*results):
        numpy.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("decay,l1,iter_scale", [(0.0, False, 1.0), (0.01, False, 0.5),
                                                 (0.02, True, 1.0)])
@pytest.mark.parametrize("count", [5, (1 << 16) + 3])
def test_solver_step_matches_reference_exactly(rule, decay, l1, iter_scale, count):
    rng = numpy.random.default_rng(count)
    param = caffe_pb2.SolverParameter(momentum=0.9 if rule not in ("AdaGrad", "RMSProp") else 0,
                                      momentum2=0.999, delta=1e-8, rms_decay=0.98)
    hyper = Hyper(param)
    hyper.t = 7
    sets = RULES[rule].history_sets
    start = [rng.standard_normal(count).astype(f32) for _ in range(2 + sets)]
    if rule in ("AdaGrad", "RMSProp", "AdaDelta", "Adam"):
        start[2:] = [numpy.abs(h) for h in start[2:]]
    results = []
    for ks in (REF, CpuKernels(CpuTuning(threads=2))):
        data, diff, *history = [a.copy() for a in start]
        step = ks.update(rule)
        for _ in range(3):
            diff[...] = start[1]
            step(data, diff, history, f32(0.01), hyper, f32(decay), l1, f32(iter_scale))
        results.append([data, diff] + history)
    for a, b in zip(*results):
        numpy.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [numpy.uint8, f32])
@pytest.mark.parametrize("mean", [None, "values", "file"])
@pytest.mark.parametrize("crop", [0, 3])
def test_transform_matches_reference_exactly(dtype, mean, crop):
    rng = numpy.random.default_rng(3)
    n, c, h, w = 4, 3, 6, 5
    batch = rng.integers(0, 256, (n, c, h, w)).astype(dtype)
    oh, ow = (crop, crop) if crop else (h, w)
    params = numpy.stack([rng.integers(0, 2, n), rng.integers(0, h - oh + 1, n),
                          rng.integers(0, w - ow + 1, n)], axis=1).astype(numpy.int64)
    means = {None: None, "values": rng.random((c, 1, 1)).astype(f32) * 100,
             "file": rng.random((c, h, w)).astype(f32) * 100}
    results = []
    for ks in (REF, CpuKernels(CpuTuning(threads=1))):
        out = numpy.full((n, c, oh, ow), numpy.nan, f32)
        ks.transform(batch, out, params, means[mean], f32(0.00390625))
        results.append(out)
    numpy.testing.assert_array_equal(*results)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 5), (9, 17, 50), (64, 300, 70),
                                   (130, 64, 20)])
def test_matmul_matches_reference(trans_a, trans_b, shape):
    m, k, n = shape
    rng = numpy.random.default_rng(m + k + n)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(f32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(f32)
    for accumulate in (False, True):
        want = numpy.full((m, n), 0.5, f32)
        REF.matmul(a, b, want, accumulate, trans_a, trans_b)
        for tuning in (CpuTuning(threads=1, kc=5), CpuTuning(threads=3, kc=256)):
            got = numpy.full((m, n), 0.5, f32)
            CpuKernels(tuning).matmul(a, b, got, accumulate, trans_a, trans_b)
            scale = max(1.0, float(numpy.abs(want).max()))
            numpy.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale * k ** 0.5)


@pytest.mark.parametrize("slack", [0, 64])
def test_pointwise_convolution_reads_its_input_in_place_only_with_slack(slack):
    from caffe_engine.kernels.cpu import conv_plan
    g = ConvGeometry(3, 5, 7, 1, (6, 5), (6, 5), (1, 1), (1, 1), (0, 0), (1, 1))
    rng = numpy.random.default_rng(7)
    x, w, b, dy = conv_arrays(g, rng)
    held = numpy.full(x.size + slack, numpy.nan, f32)
    held[:x.size] = x.reshape(-1)
    x_held = held[:x.size].reshape(x.shape)          # NaN past the end: never used in a sum
    plan = CpuKernels(CpuTuning(threads=2, images_per_chunk=1)).conv(g)
    assert plan.NB == 1 and plan.pointwise
    in_place = plan._input(x_held)
    assert (in_place.base is not None and numpy.shares_memory(in_place, held)) == (slack > 0)
    want = conv_results(REF.conv(g), g, x, w, b, dy)
    got = conv_results(plan, g, x_held, w, b, dy)
    assert_sums_close(got, want, x, w, dy)
    assert conv_plan.slack_after(x_held) == slack


@pytest.mark.parametrize("slope", [0.0, 0.1])
@pytest.mark.parametrize("count", [7, (1 << 15) + 5])
def test_relu_matches_reference_exactly(slope, count):
    rng = numpy.random.default_rng(count)
    x = rng.standard_normal(count).astype(f32)
    x[:4] = [numpy.nan, -0.0, 0.0, numpy.inf]
    dy = rng.standard_normal(count).astype(f32)
    dy[4] = numpy.inf
    results = []
    for ks in (REF, CpuKernels(CpuTuning(threads=2))):
        y = numpy.empty_like(x)
        dx = numpy.empty_like(x)
        ks.relu_forward(x, y, f32(slope))
        ks.relu_backward(x, dy, dx, f32(slope))
        results.append((y, dx))
    for a, b in zip(*results):
        assert a.tobytes() == b.tobytes()
