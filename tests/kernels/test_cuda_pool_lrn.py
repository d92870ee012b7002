"""The cuda kernel set's pooling and ACROSS_CHANNELS LRN plans against the reference set.

The plans (``caffe_engine/kernels/cuda/pooling.py``, ``lrn.py``) run on an
:class:`~caffe_engine.kernels.cuda.emulator.EmulatedDevice` built from these two sources only
(the CUDA text compiled by g++ and run serially on NumPy arrays), so the tests do not depend on
the other cuda modules. Pooling must equal the reference bit for bit (outputs, argmax, mask,
gradients, signs of zeros) on random and hand-picked geometries: padding, strides beyond the
kernel (empty windows), ceil-mode overhang, global and non-square windows, ties, NaN, -inf and
-FLT_MAX. LRN's scale equals the reference's bit for bit; so do its output and gradient when
``beta`` is -1 (``scale ** 1`` is exact on both sides), which pins every other operation's
order; for other ``beta`` the host's ``powf`` and NumPy's float32 power may differ by an ulp,
so those compare within a few ulps. What the emulator cannot show (races, the device's
``powf``, launch limits) needs a GPU: the ``cuda`` parameter of the layer tests.
"""
import dataclasses

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import kernels
from caffe_engine.blob import Blob
from caffe_engine.kernels.cuda.emulator import compiler_missing
from caffe_engine.kernels.geometry import LRNGeometry, PoolGeometry, pooled_size
from caffe_engine.kernels.reference.lrn import LRNPlan as ReferenceLRNPlan
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

pytestmark = pytest.mark.skipif(compiler_missing() is not None, reason=str(compiler_missing()))

f32 = numpy.float32
FLT_MAX = numpy.finfo(f32).max
MAX = caffe_pb2.PoolingParameter.MAX
AVE = caffe_pb2.PoolingParameter.AVE
STOCHASTIC = caffe_pb2.PoolingParameter.STOCHASTIC
REF = kernels.get("reference")


@pytest.fixture(scope="module")
def device():
    from caffe_engine.kernels.cuda import lrn, pooling
    from caffe_engine.kernels.cuda.emulator import EmulatedDevice
    return EmulatedDevice([pooling.SOURCE, lrn.SOURCE])


@pytest.fixture(scope="module")
def cuda_set(device):
    from caffe_engine.kernels.cuda import CudaKernels
    return CudaKernels(device)


def assert_identical(got, want, name):
    """Equal bit for bit up to NaN payloads and signs: values, NaN positions, signs of
    zeros."""
    numpy.testing.assert_array_equal(got, want, err_msg=name)
    number = ~numpy.isnan(want)
    numpy.testing.assert_array_equal(numpy.signbit(got[number]), numpy.signbit(want[number]),
                                     err_msg=name)


# -- pooling -----------------------------------------------------------------------------------

def pool_geometry(n, c, hw, kernel, stride, pad, method, ceil=True):
    out = tuple(pooled_size(s, k, st, p, ceil) for s, k, st, p in zip(hw, kernel, stride, pad))
    return PoolGeometry(n, c, tuple(hw), out, tuple(kernel), tuple(stride), tuple(pad), method)


def random_pool(rng, method):
    """Kernels 1-5, pad below the kernel, stride up to kernel + 2 (empty windows in ceil mode),
    inputs from smaller than the kernel (padding fills the rest) to 10 beyond it."""
    while True:
        kernel = tuple(int(k) for k in rng.integers(1, 6, 2))
        pad = tuple(int(rng.integers(0, k)) for k in kernel)
        stride = tuple(int(rng.integers(1, k + 3)) for k in kernel)
        hw = tuple(max(1, k - 2 * p + int(rng.integers(0, 11))) for k, p in zip(kernel, pad))
        g = pool_geometry(int(rng.integers(1, 4)), int(rng.integers(1, 5)), hw, kernel, stride,
                          pad, method, bool(rng.integers(0, 2)))
        if min(g.out_hw) >= 1:
            return g


def pool_input(rng, g, special=True):
    """Small integers (ties everywhere), a few NaN, -inf and -FLT_MAX; AVE gets finite
    non-integers (its sums then round)."""
    x = rng.integers(-3, 4, (g.num, g.channels) + g.in_hw).astype(f32)
    if special:
        flat = x.reshape(-1)
        flat[rng.integers(0, x.size, 2)] = numpy.nan
        flat[rng.integers(0, x.size, 1)] = -numpy.inf
        flat[rng.integers(0, x.size, 1)] = -FLT_MAX
    if g.method == AVE:
        x = numpy.nan_to_num(x, nan=1.5, neginf=-5.0, posinf=5.0) * f32(0.37)
        x += rng.standard_normal(x.shape).astype(f32) * f32(1e-3)
    return x


def pool_run(plan, g, x, dy, with_mask=True):
    """forward (into NaN-filled y and mask) then backward (into a NaN-filled dx)."""
    y = numpy.full(dy.shape, numpy.nan, f32)
    mask = numpy.full(dy.shape, f32(-7)) if (with_mask and g.method == MAX) else None
    dx = numpy.full(x.shape, numpy.nan, f32)
    with numpy.errstate(all="ignore"):   # empty AVE windows divide 0 by 0, as Caffe
        plan.forward(x, y, mask)
        plan.backward(dy, dx)
    argmax = None if g.method != MAX else numpy.asarray(plan.argmax).reshape(dy.shape).copy()
    return {"y": y, "mask": mask, "dx": dx, "argmax": argmax}


def assert_pool_equal(g, x, dy, plan, with_mask=True):
    want = pool_run(REF.pooling(g), g, x, dy, with_mask)
    got = pool_run(plan, g, x, dy, with_mask)
    for name in want:
        if want[name] is None:
            assert got[name] is None, name
        else:
            assert_identical(got[name], want[name], f"{name} of {g}")
    return got


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
@pytest.mark.parametrize("seed", range(60))
def test_pooling_matches_reference_exactly(device, method, seed):
    from caffe_engine.kernels.cuda import pooling
    rng = numpy.random.default_rng(seed)
    g = random_pool(rng, method)
    x = pool_input(rng, g)
    dy = rng.standard_normal((g.num, g.channels) + g.out_hw).astype(f32)
    assert_pool_equal(g, x, dy, pooling.make_plan(device, g), with_mask=seed % 3 != 0)


# (in_hw, kernel, stride, pad, ceil): Caffe's 3x3/2 with and without the ceil overhang,
# non-square everything, global windows, 1x1, kernel = input with padding, wide rows, stride
# beyond the kernel, input smaller than the kernel (windows only reach it through padding)
NAMED_POOLS = [((7, 7), (3, 3), (2, 2), (0, 0), True), ((6, 6), (3, 3), (2, 2), (0, 0), True),
               ((6, 6), (3, 3), (2, 2), (1, 1), True), ((6, 6), (3, 3), (2, 2), (1, 1), False),
               ((5, 9), (2, 4), (3, 1), (1, 2), True), ((13, 5), (13, 5), (1, 1), (0, 0), True),
               ((1, 1), (1, 1), (1, 1), (0, 0), True), ((8, 3), (1, 1), (2, 2), (0, 0), True),
               ((4, 4), (4, 4), (1, 1), (3, 2), True), ((5, 37), (3, 3), (2, 2), (1, 1), True),
               ((11, 2), (2, 2), (5, 4), (0, 0), True), ((2, 3), (4, 5), (1, 2), (3, 2), False),
               ((16, 16), (2, 2), (2, 2), (0, 0), False)]


@pytest.mark.parametrize("method", [MAX, AVE], ids=["MAX", "AVE"])
@pytest.mark.parametrize("shape", NAMED_POOLS, ids=lambda s: "x".join(map(str, s[0]))
                         + f"-k{s[1][0]}x{s[1][1]}-s{s[2][0]}x{s[2][1]}-p{s[3][0]}x{s[3][1]}"
                         + ("-ceil" if s[4] else "-floor"))
def test_pooling_named_geometries(device, method, shape):
    from caffe_engine.kernels.cuda import pooling
    hw, kernel, stride, pad, ceil = shape
    g = pool_geometry(2, 3, hw, kernel, stride, pad, method, ceil)
    assert min(g.out_hw) >= 1
    rng = numpy.random.default_rng(sum(hw))
    x = pool_input(rng, g)
    dy = rng.standard_normal((g.num, g.channels) + g.out_hw).astype(f32)
    assert_pool_equal(g, x, dy, pooling.make_plan(device, g))


def test_max_pooling_first_maximum_nan_and_nothing_above_minus_flt_max(device):
    """Caffe's rule by hand: strict '>', from -FLT_MAX; -1 where nothing beats it."""
    from caffe_engine.kernels.cuda import pooling
    g = pool_geometry(1, 4, (2, 4), (2, 2), (2, 2), (0, 0), MAX)
    x = numpy.zeros((1, 4, 2, 4), f32)
    x[0, 0] = [[1, 5, 2, 2], [5, 3, 2, 2]]                       # ties: the first one wins
    x[0, 1] = [[numpy.nan, 1, numpy.nan, numpy.nan], [0, 1, numpy.nan, numpy.nan]]
    x[0, 2] = [[-numpy.inf, -FLT_MAX, -FLT_MAX, -FLT_MAX], [-numpy.inf] * 4]
    x[0, 3] = [[-FLT_MAX, -numpy.inf, 7, numpy.inf], [numpy.inf, 1, 7, 7]]
    plan = pooling.make_plan(device, g)
    y = numpy.empty((1, 4, 1, 2), f32)
    mask = numpy.empty_like(y)
    plan.forward(x, y, mask)
    numpy.testing.assert_array_equal(y[0, :, 0], [[5, 2], [1, -FLT_MAX], [-FLT_MAX, -FLT_MAX],
                                                  [numpy.inf, numpy.inf]])
    want_arg = [[1, 2], [1, -1], [-1, -1], [4, 3]]
    numpy.testing.assert_array_equal(plan.argmax.reshape(4, 2), want_arg)
    numpy.testing.assert_array_equal(mask[0, :, 0], numpy.array(want_arg, f32))
    assert plan.argmax.dtype == numpy.int32
    dy = numpy.arange(1, 9, dtype=f32).reshape(y.shape)
    dx = numpy.full(x.shape, numpy.nan, f32)
    plan.backward(dy, dx)
    want = numpy.zeros(x.shape, f32)
    for c in range(4):
        for o in range(2):
            if want_arg[c][o] >= 0:
                want[0, c].reshape(-1)[want_arg[c][o]] += dy[0, c, 0, o]
    assert_identical(dx, want, "dx")


def test_pooling_gradients_add_in_output_order(device):
    """Overlapping windows (kernel 3, stride 1): an input position takes many terms, summed
    from 0 in increasing output order, as Caffe's loop; values chosen so that order shows."""
    from caffe_engine.kernels.cuda import pooling
    for method in (MAX, AVE):
        g = pool_geometry(1, 2, (5, 6), (3, 3), (1, 1), (1, 1), method)
        x = numpy.zeros((1, 2) + g.in_hw, f32)               # all ties: argmax = first cell
        rng = numpy.random.default_rng(5)
        dy = (rng.standard_normal((1, 2) + g.out_hw) * 10.0 ** rng.integers(-7, 8, (1, 2)
                                                                              + g.out_hw))
        dy = dy.astype(f32)
        got = assert_pool_equal(g, x, dy, pooling.make_plan(device, g))
        if method == MAX:  # and against a plain scatter loop in Caffe's order
            want = numpy.zeros(x.shape, f32)
            for idx in numpy.ndindex(dy.shape):
                a = got["argmax"][idx]
                if a >= 0:
                    want[idx[:2]].reshape(-1)[a] += dy[idx]
            assert_identical(got["dx"], want, "scatter")


def test_pooling_plan_state_and_launches(device, cuda_set):
    """One launch per call; the argmax is the last forward's; dx is overwritten; the cuda set
    hands out these plans for MAX and AVE and falls back for STOCHASTIC."""
    from caffe_engine.kernels.cuda import pooling
    g = pool_geometry(2, 3, (9, 8), (3, 2), (2, 2), (1, 0), MAX)
    plan = cuda_set.pooling(g)
    assert isinstance(plan, pooling.PoolPlan)
    assert isinstance(cuda_set.pooling(dataclasses.replace(g, method=AVE)), pooling.PoolPlan)
    stochastic = dataclasses.replace(g, method=STOCHASTIC)
    assert pooling.make_plan(device, stochastic) is None
    assert not isinstance(cuda_set.pooling(stochastic), pooling.PoolPlan)
    rng = numpy.random.default_rng(2)
    shape_out = (g.num, g.channels) + g.out_hw
    x1, x2 = (rng.standard_normal((g.num, g.channels) + g.in_hw).astype(f32) for _ in range(2))
    dy = rng.standard_normal(shape_out).astype(f32)
    y = numpy.empty(shape_out, f32)
    dx = numpy.full(x1.shape, numpy.nan, f32)
    ref = REF.pooling(g)
    ref.forward(x2, numpy.empty_like(y))
    want = numpy.empty_like(dx)
    ref.backward(dy, want)
    before = device.launches
    plan.forward(x1, y)
    plan.forward(x2, y)                      # backward uses this forward's argmax
    assert device.launches - before == 2
    plan.backward(dy, dx)
    plan.backward(dy, dx)                    # overwrites, does not accumulate
    assert device.launches - before == 4
    assert_identical(dx, want, "dx")


def test_pooling_non_contiguous_arrays(device):
    from caffe_engine.kernels.cuda import pooling
    for method in (MAX, AVE):
        g = pool_geometry(2, 3, (7, 6), (3, 3), (2, 2), (1, 1), method)
        rng = numpy.random.default_rng(3)
        x = pool_input(rng, g, special=False)
        dy = rng.standard_normal((g.num, g.channels) + g.out_hw).astype(f32)
        want = pool_run(REF.pooling(g), g, x, dy)
        # the same values behind strided views
        xt = numpy.ascontiguousarray(x.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3)
        out = (g.num, g.channels) + g.out_hw
        y = numpy.full(out + (2,), numpy.nan, f32)[..., 0]
        mask = numpy.full(out + (2,), numpy.nan, f32)[..., 1] if method == MAX else None
        dx = numpy.full(x.shape + (2,), numpy.nan, f32)[..., 0]
        plan = pooling.make_plan(device, g)
        plan.forward(xt, y, mask)
        dy_view = numpy.full(dy.shape + (3,), numpy.nan, f32)[..., 2]
        dy_view[...] = dy
        assert not (xt.flags.c_contiguous or y.flags.c_contiguous or dx.flags.c_contiguous
                    or dy_view.flags.c_contiguous)
        plan.backward(dy_view, dx)
        assert_identical(y, want["y"], "y")
        assert_identical(dx, want["dx"], "dx")
        if method == MAX:
            assert_identical(mask, want["mask"], "mask")


def test_pooling_rejects_wrong_arrays(device):
    from caffe_engine.kernels.cuda import pooling
    g = pool_geometry(1, 2, (4, 4), (2, 2), (2, 2), (0, 0), MAX)
    plan = pooling.make_plan(device, g)
    x = numpy.zeros((1, 2, 4, 4), f32)
    with pytest.raises(RuntimeError, match="argmax"):
        plan.backward(numpy.zeros((1, 2, 2, 2), f32), numpy.zeros_like(x))
    with pytest.raises(ValueError, match="shape"):
        plan.forward(numpy.zeros((1, 2, 4, 5), f32), numpy.zeros((1, 2, 2, 2), f32))
    with pytest.raises(ValueError, match="shape"):
        plan.forward(x, numpy.zeros((1, 2, 3, 2), f32))
    with pytest.raises(TypeError, match="float32"):
        plan.forward(x.astype(numpy.float64), numpy.zeros((1, 2, 2, 2), f32))


# -- the layers on this set ----------------------------------------------------------------

def _layer_run(kernel_set, text, x, ntop=1):
    previous = kernels.use(kernel_set)
    try:
        lp = text_format.Parse(f'name: "l" bottom: "b" {text}', caffe_pb2.LayerParameter())
        lp.top.extend(f"t{i}" for i in range(ntop))
        layer = create_layer(lp, caffe_pb2.TRAIN)
        bottom = Blob()
        bottom.reshape(x.shape)
        bottom.data[...] = x
        tops = [Blob() for _ in range(ntop)]
        layer.setup([bottom], tops)
        layer.forward([bottom], tops)
        tops[0].diff[...] = numpy.random.default_rng(1).standard_normal(tops[0].shape)
        bottom.diff[...] = numpy.nan
        layer.backward(tops, [True], [bottom])
        return [t.data.copy() for t in tops] + [bottom.diff.copy()], layer
    finally:
        kernels.use(previous)


@pytest.mark.parametrize("text", [
    'type: "Pooling" pooling_param { pool: MAX global_pooling: true }',
    'type: "Pooling" pooling_param { pool: AVE global_pooling: true }',
    'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }',
    'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }',
    'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 round_mode: FLOOR }',
    'type: "SPP" spp_param { pyramid_height: 3 pool: MAX }',
    'type: "SPP" spp_param { pyramid_height: 2 pool: AVE }',
    'type: "LRN" lrn_param { local_size: 5 alpha: 0.001 beta: 0.75 }',
    'type: "LRN" lrn_param { local_size: 3 alpha: 2 beta: -1 k: 0.5 }',
])
def test_layers_on_the_cuda_set_match_the_reference_set(cuda_set, text):
    from caffe_engine.kernels.cuda import lrn, pooling
    x = numpy.random.default_rng(4).integers(-4, 5, (2, 6, 7, 6)).astype(f32)
    if "LRN" not in text:
        x = x * f32(0.3)
    ntop = 2 if ("MAX" in text and "Pooling" in text) else 1
    want, _ = _layer_run(REF, text, x, ntop)
    got, layer = _layer_run(cuda_set, text, x, ntop)
    plans = [lvl[0].plan for lvl in layer.levels] if "SPP" in text else [layer.plan]
    assert all(isinstance(p, (pooling.PoolPlan, lrn.LRNPlan)) for p in plans)
    for a, b in zip(got, want):
        if "beta: 0.75" in text:   # powf against NumPy's float32 power
            numpy.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-6 * numpy.abs(b).max())
        else:
            assert_identical(a, b, text)


# -- LRN ---------------------------------------------------------------------------------------

def lrn_run(plan, x, dy):
    y = numpy.full(x.shape, numpy.nan, f32)
    dx = numpy.full(x.shape, numpy.nan, f32)
    plan.forward(x, y)
    plan.backward(x, y, dy, dx)
    return {"y": y, "dx": dx, "scale": numpy.asarray(plan.scale).copy()}


LRN_SHAPES = [(2, 7, 3, 4), (1, 3, 5, 5), (2, 3, 2, 2), (3, 4, 6, 1), (1, 1, 2, 3),
              (2, 12, 1, 1), (1, 16, 3, 5)]


def lrn_case(shape, seed):
    """x (spread so that the squares matter) and dy, float32 of ``shape``."""
    rng = numpy.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3).astype(f32)
    dy = rng.standard_normal(shape).astype(f32)
    return x, dy


@pytest.mark.parametrize("shape", LRN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("size", [1, 3, 5, 7, 9, 4])
@pytest.mark.parametrize("alpha,k", [(0.7, 1.5), (1e-4, 1.0), (3.0, 0.25)])
def test_lrn_matches_reference_exactly_with_an_exact_power(device, size, shape, alpha, k):
    """beta = -1: ``scale ** 1`` is exact on both sides, so every other operation (the running
    windows, the ratios, the products) must be the reference's, bit for bit."""
    from caffe_engine.kernels.cuda import lrn
    g = LRNGeometry(shape, size, alpha, -1.0, k)
    x, dy = lrn_case(shape, size * 100 + sum(shape))
    want = lrn_run(REF.lrn(g), x, dy)
    got = lrn_run(lrn.make_plan(device, g), x, dy)
    for name in want:
        assert_identical(got[name], want[name], name)


@pytest.mark.parametrize("shape", LRN_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("size", [1, 3, 5, 7, 9])
@pytest.mark.parametrize("alpha,beta,k", [(0.7, 0.75, 1.5), (1e-4, 0.75, 1.0), (2.0, 0.5, 2.0),
                                          (0.3, 2.3, 0.8), (1.0, 0.0, 1.0)])
def test_lrn_matches_reference(device, size, shape, alpha, beta, k):
    """The scale bit for bit; y and dx within a few float32 ulps (the host's powf against
    NumPy's float32 power), dx relative to its largest magnitude (it cancels)."""
    from caffe_engine.kernels.cuda import lrn
    g = LRNGeometry(shape, size, alpha, beta, k)
    x, dy = lrn_case(shape, size * 7 + sum(shape))
    want = lrn_run(REF.lrn(g), x, dy)
    got = lrn_run(lrn.make_plan(device, g), x, dy)
    assert_identical(got["scale"], want["scale"], "scale")
    numpy.testing.assert_allclose(got["y"], want["y"], rtol=1e-6, atol=0)
    numpy.testing.assert_allclose(got["dx"], want["dx"], rtol=1e-6,
                                  atol=1e-6 * float(numpy.abs(want["dx"]).max()))


def test_lrn_nan_and_inf_propagate_as_in_the_reference(device):
    from caffe_engine.kernels.cuda import lrn
    shape = (2, 9, 2, 3)
    g = LRNGeometry(shape, 5, 0.5, -1.0, 1.0)
    x, dy = lrn_case(shape, 9)
    x[0, 4, 1, 1] = numpy.nan
    x[1, 0, 0, 2] = numpy.inf
    dy[1, 7, 1, 0] = numpy.nan
    with numpy.errstate(all="ignore"):
        want = lrn_run(REF.lrn(g), x, dy)
        got = lrn_run(lrn.make_plan(device, g), x, dy)
    for name in want:
        assert_identical(got[name], want[name], name)


def test_lrn_plan_launches_state_and_fallback(device, cuda_set):
    from caffe_engine.kernels.cuda import lrn
    shape = (2, 6, 3, 3)
    g = LRNGeometry(shape, 5, 0.7, -1.0, 1.5)
    plan = cuda_set.lrn(g)
    assert isinstance(plan, lrn.LRNPlan)
    within = LRNGeometry(shape, 5, 0.7, 0.75, 1.5, True)
    assert lrn.make_plan(device, within) is None
    assert isinstance(cuda_set.lrn(within), ReferenceLRNPlan)
    x, dy = lrn_case(shape, 1)
    with pytest.raises(RuntimeError, match="forward"):
        plan.backward(x, x, dy, numpy.empty_like(x))
    want = lrn_run(REF.lrn(g), x, dy)
    before = device.launches
    got = lrn_run(plan, x, dy)
    assert device.launches - before == 2
    for name in want:
        assert_identical(got[name], want[name], name)
    # non-contiguous views give the same
    y = numpy.full(shape + (2,), numpy.nan, f32)[..., 1]
    dx = numpy.full(shape + (2,), numpy.nan, f32)[..., 0]
    xt = numpy.ascontiguousarray(x.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    plan.forward(xt, y)
    plan.backward(xt, y, dy, dx)
    assert_identical(y, want["y"], "y")
    assert_identical(dx, want["dx"], "dx")
    with pytest.raises(ValueError, match="shape"):
        plan.forward(x[:, :5], numpy.empty((2, 5, 3, 3), f32))
    with pytest.raises(TypeError, match="float32"):
        plan.forward(x.astype(numpy.float64), numpy.empty_like(x))
