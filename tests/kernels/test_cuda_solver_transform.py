"""The cuda set's fused solver step, param norms and data transform against the reference set.

Each test runs on the emulator (the CUDA sources compiled by g++ and run serially on NumPy
arrays, :mod:`caffe_engine.kernels.cuda.emulator`) and, where CuPy finds a device, on the GPU
(arrays copied there, results copied back). The solver step (all six rules, with and without
L2/L1 decay and ``iter_size`` normalisation, several steps in a row, the rate held on the host
or on the device) and the transform (uint8 and float32 records, crop, mirror, mean file, mean
values, no mean, scale 1 or not) must equal the reference bit for bit; the norms must equal the
reference's to float32 rounding (only the float64 summation order differs). Also: one kernel
launch per call, and no multiply-add in the solver's PTX (NVRTC, no GPU needed), the property
the bitwise equality on a GPU rests on.

The emulated device is built from this file's two sources only, so the test does not depend
on the other cuda modules compiling.
"""
import re

import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.kernels.cuda import CudaKernels
from caffe_engine.kernels.cuda import solver as cuda_solver
from caffe_engine.kernels.cuda import transform as cuda_transform
from caffe_engine.kernels.cuda.emulator import EmulatedDevice, compiler_missing
from caffe_engine.kernels.update_rules import RULES, Hyper
from caffe_engine.proto import caffe_pb2
from cuda_env import nvrtc_missing

f32 = numpy.float32
REF = kernels.get("reference")


def _gpu_missing():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # ImportError, CUDARuntimeError and the like
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    return None




_EMULATED = {}


@pytest.fixture(params=[
    pytest.param("emulated", marks=[pytest.mark.skipif(compiler_missing() is not None,
                                                       reason=str(compiler_missing()))]),
    pytest.param("gpu", marks=[pytest.mark.gpu,
                               pytest.mark.skipif(_gpu_missing() is not None,
                                                  reason=str(_gpu_missing()))])])
def cuda(request):
    """A CudaKernels on the emulator or on the GPU; ``.to`` and ``.back`` move arrays."""
    if request.param == "emulated":
        if "device" not in _EMULATED:
            _EMULATED["device"] = EmulatedDevice([cuda_solver.SOURCE, cuda_transform.SOURCE])
        ks = CudaKernels(_EMULATED["device"])
    else:
        from caffe_engine.kernels.cuda.device import CupyDevice
        ks = CudaKernels(CupyDevice())
    xp = ks.device.xp
    ks.to = lambda a: a if a is None else xp.asarray(a)
    ks.back = lambda a: a.get() if hasattr(a, "get") and not isinstance(a, numpy.ndarray) \
        else numpy.asarray(a)
    return ks


def assert_bits_equal(got, want, what=""):
    """Equal bit for bit (signed zeros included; any NaN equals any NaN)."""
    got, want = numpy.asarray(got, f32), numpy.asarray(want, f32)
    assert got.shape == want.shape, what
    nan = numpy.isnan(want)
    assert (numpy.isnan(got) == nan).all(), what
    g, w = got.view(numpy.int32)[~nan], want.view(numpy.int32)[~nan]
    bad = numpy.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} of {g.size} differ, first at {bad[0]}: "
                           f"{got[~nan][bad[0]]!r} vs {want[~nan][bad[0]]!r}"
                           if bad.size else what)


def ulps(a, b):
    """Distance in float32 units in the last place between two finite non-negative floats."""
    return abs(int(numpy.asarray(a, f32).view(numpy.int32)) -
               int(numpy.asarray(b, f32).view(numpy.int32)))


# ------------------------------------------------------------------------------------------------
# the fused solver step
# ------------------------------------------------------------------------------------------------
def solver_case(rule, count, seed):
    """Start arrays (data, diff, history...) and the Hyper of a test for ``rule``."""
    rng = numpy.random.default_rng(seed)
    momentum = 0 if rule in ("AdaGrad", "RMSProp") else 0.9
    param = caffe_pb2.SolverParameter(momentum=momentum, momentum2=0.999, delta=1e-8,
                                      rms_decay=0.98)
    sets = RULES[rule].history_sets
    start = [rng.standard_normal(count).astype(f32) for _ in range(2 + sets)]
    if rule in ("AdaGrad", "RMSProp", "AdaDelta", "Adam"):
        start[2 + sets - 1] = numpy.abs(start[2 + sets - 1])  # squared histories are >= 0
        if rule != "Adam":
            start[2:] = [numpy.abs(h) for h in start[2:]]
    grads = [rng.standard_normal(count).astype(f32) * f32(10.0 ** k) for k in (-3, 0, 1, -1)]
    return start, grads, param


def run_steps(ks, rule, start, grads, param, decay, l1, iter_scale, rate, to=None, back=None):
    """Four steps in a row on kernel set ``ks``; returns [data, diff, history...] on the host
    and the kernel launches counted (None for the reference)."""
    to = to or (lambda a: a)
    back = back or (lambda a: a)
    data, diff, *history = [to(a.copy()) for a in start]
    hyper = Hyper(param)
    step = ks.update(rule)
    device = getattr(ks, "device", None)
    before = device.launches if device else None
    for t, gr in enumerate(grads):
        hyper.t = t + 1
        diff[...] = to(gr)
        step(data, diff, history, rate(t), hyper, decay, l1, iter_scale)
    launches = device.launches - before if device else None
    return [back(a) for a in [data, diff] + history], launches


REGULARISATION = [(0.0, False, 1.0), (f32(0.01), False, 1.0), (f32(0.02), True, 1.0),
                  (f32(0.005), False, f32(0.25)), (f32(0.005), True, f32(1) / f32(3)),
                  (0.0, False, f32(0.5))]


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("decay,l1,iter_scale", REGULARISATION)
@pytest.mark.parametrize("count", [1, 7, 1027])
def test_step_equals_reference_bitwise(cuda, rule, decay, l1, iter_scale, count):
    start, grads, param = solver_case(rule, count, seed=count)
    rates = [f32(0.01), f32(0.5), f32(0.003), f32(1.7)]
    want, _ = run_steps(REF, rule, start, grads, param, decay, l1, iter_scale,
                        lambda t: rates[t])
    got, launches = run_steps(cuda, rule, start, grads, param, decay, l1, iter_scale,
                              lambda t: rates[t], cuda.to, cuda.back)
    assert launches == len(grads)  # one fused kernel per step
    for name, g, w in zip(["data", "diff", "history0", "history1"], got, want):
        assert_bits_equal(g, w, f"{rule} {name}")


@pytest.mark.parametrize("rule", list(RULES))
def test_step_with_the_rate_on_the_device(cuda, rule):
    # LARC's rate may stay on the device: a 0-d float32 array the kernel reads
    start, grads, param = solver_case(rule, 300, seed=5)
    rates = [f32(0.02), f32(0.7), f32(0.001), f32(3.0)]
    want, _ = run_steps(REF, rule, start, grads, param, f32(0.01), False, f32(0.5),
                        lambda t: rates[t])
    xp = cuda.device.xp
    got, launches = run_steps(cuda, rule, start, grads, param, f32(0.01), False, f32(0.5),
                              lambda t: xp.asarray(rates[t], dtype=f32), cuda.to, cuda.back)
    assert launches == len(grads)
    for g, w in zip(got, want):
        assert_bits_equal(g, w, rule)


@pytest.mark.parametrize("rule", list(RULES))
def test_step_on_special_values(cuda, rule):
    # signed zeros under L1 (numpy's sign: +0 for both), huge and tiny (subnormal) values,
    # a zero gradient, an infinite and a NaN weight (numpy's sign keeps the NaN; Caffe's
    # caffe_sign would give 0)
    start, grads, param = solver_case(rule, 12, seed=9)
    start[0][:9] = [0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1.0, numpy.inf, numpy.nan]
    for gr in grads:
        gr[:4] = [0.0, -0.0, 1e-39, -0.0]
    for decay, l1 in [(f32(0.1), True), (f32(0.1), False), (0.0, False)]:
        with numpy.errstate(all="ignore"):
            want, _ = run_steps(REF, rule, start, grads, param, decay, l1, f32(0.5),
                                lambda t: f32(0.1))
        got, _ = run_steps(cuda, rule, start, grads, param, decay, l1, f32(0.5),
                           lambda t: f32(0.1), cuda.to, cuda.back)
        for g, w in zip(got, want):
            assert_bits_equal(g, w, f"{rule} decay {decay} l1 {l1}")


def test_step_leaves_odd_arrays_to_the_reference(cuda):
    # a float64 param or a strided view is not the kernel's: the reference step runs instead
    start, grads, param = solver_case("SGD", 10, seed=2)
    want, _ = run_steps(REF, "SGD", [a.astype(numpy.float64) for a in start], grads, param,
                        0.01, False, 1.0, lambda t: 0.1)
    got, launches = run_steps(cuda, "SGD", [a.astype(numpy.float64) for a in start], grads,
                              param, 0.01, False, 1.0, lambda t: 0.1, cuda.to, cuda.back)
    assert launches == 0
    for g, w in zip(got, want):
        numpy.testing.assert_array_equal(g, w)


def test_step_refuses_what_it_cannot_run(cuda):
    with pytest.raises(ValueError, match="unknown update rule 'Lion'"):
        cuda.update("Lion")
    step = cuda.update("Adam")
    a = cuda.to(numpy.zeros(4, f32))
    hyper = Hyper(caffe_pb2.SolverParameter())
    with pytest.raises(ValueError, match="Adam keeps 2 history"):
        step(a, a.copy(), [a.copy()], f32(0.1), hyper, 0.0, False, 1.0)
    with pytest.raises(ValueError, match="one element"):
        step(a, a.copy(), [a.copy(), a.copy()], cuda.to(numpy.ones(2, f32)), hyper, 0.0,
             False, 1.0)


@pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
def test_solver_ptx_has_no_multiply_add():
    # the bitwise equality on a GPU needs every product rounded before its sum: the PTX of
    # the solver source must hold only rounded mul/add (ptxas does not fuse .rn operations)
    from cupy.cuda import nvrtc
    source = cuda_solver.SOURCE
    program = nvrtc.createProgram(source.text(), "solver.cu", [], [])
    nvrtc.compileProgram(program, ["-arch=compute_90", "--std=c++14"])
    ptx = nvrtc.getPTX(program)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert not re.search(r"\bfma\.", ptx)
    assert not re.search(r"\b(mul|add|sub)\.f32\b", ptx)  # unrounded: contractible by ptxas
    for kernel in source.kernels:
        assert f".entry {kernel}(" in ptx


# ------------------------------------------------------------------------------------------------
# LARC's norms
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("count", [0, 1, 7, 1000, cuda_solver.NORM_PARTS + 5,
                                   3 * cuda_solver.NORM_PARTS + 1])
def test_param_norms_match_reference(cuda, count):
    rng = numpy.random.default_rng(count)
    data = (rng.standard_normal(count) * 0.05).astype(f32)
    diff = (rng.standard_normal(count) * 1e-4).astype(f32)
    want = REF.param_norms(data, diff)
    exact = [f32(numpy.sqrt(numpy.sum(a.astype(numpy.float64) ** 2))) for a in (data, diff)]
    before = cuda.device.launches
    got = cuda.param_norms(cuda.to(data), cuda.to(diff))
    assert cuda.device.launches - before == (1 if count else 0)
    for g, w, e in zip(got, want, exact):
        if cuda.device.xp is numpy:
            assert type(g) is f32  # a NumPy scalar on the emulator
        else:
            assert g.shape == () and g.dtype == f32  # a device scalar on the GPU
        value = f32(cuda.back(g))
        assert ulps(value, w) <= 1 and ulps(value, e) <= 1, (value, w, e)


def test_param_norms_of_zeros_and_of_a_matrix(cuda):
    zeros = numpy.zeros((3, 5), f32)
    w = numpy.arange(-6, 6, dtype=f32).reshape(3, 4)
    got = cuda.param_norms(cuda.to(zeros), cuda.to(zeros))
    assert [f32(cuda.back(v)) for v in got] == [0.0, 0.0]
    got = cuda.param_norms(cuda.to(w), cuda.to(w * 2))
    assert [f32(cuda.back(v)) for v in got] == [f32(numpy.sqrt(146.0)),
                                                f32(numpy.sqrt(4 * 146.0))]
    with pytest.raises(ValueError, match="data has 15 elements, diff 12"):
        cuda.param_norms(cuda.to(zeros), cuda.to(w))


# ------------------------------------------------------------------------------------------------
# the data transform
# ------------------------------------------------------------------------------------------------
def transform_case(dtype, mean, crop, mirror, seed=3, shape=(4, 3, 6, 5)):
    rng = numpy.random.default_rng(seed)
    n, c, h, w = shape
    if dtype == numpy.uint8:
        batch = rng.integers(0, 256, shape).astype(numpy.uint8)
    else:
        batch = (rng.standard_normal(shape) * 60 + 100).astype(f32)
    oh, ow = (crop, crop) if crop else (h, w)
    mirrors = rng.integers(0, 2, n) if mirror == "random" else numpy.full(n, int(mirror))
    params = numpy.stack([mirrors, rng.integers(0, h - oh + 1, n),
                          rng.integers(0, w - ow + 1, n)], axis=1).astype(numpy.int64)
    means = {None: None,
             "values": (rng.random((c, 1, 1)) * 100).astype(f32),
             "one value": numpy.full((1, 1, 1), 104.5, f32),
             "file": (rng.random((c, h, w)) * 100).astype(f32)}
    return batch, params, means[mean], (n, c, oh, ow)


@pytest.mark.parametrize("dtype", [numpy.uint8, f32])
@pytest.mark.parametrize("mean", [None, "values", "one value", "file"])
@pytest.mark.parametrize("crop", [0, 3, 5])
@pytest.mark.parametrize("mirror", [False, True, "random"])
@pytest.mark.parametrize("scale", [f32(1), f32(0.00390625), f32(0.017)])
def test_transform_equals_reference_bitwise(cuda, dtype, mean, crop, mirror, scale):
    batch, params, mean_array, out_shape = transform_case(dtype, mean, crop, mirror)
    want = numpy.full(out_shape, numpy.nan, f32)
    REF.transform(batch, want, params, mean_array, scale)
    out = cuda.to(numpy.full(out_shape, numpy.nan, f32))
    before = cuda.device.launches
    cuda.transform(cuda.to(batch), out, params, cuda.to(mean_array), scale)
    assert cuda.device.launches - before == 1
    assert_bits_equal(cuda.back(out), want)


def test_transform_from_host_records_and_into_a_strided_out(cuda):
    # records and mean may come from the host (copied over); a non-contiguous out is filled
    batch, params, mean_array, out_shape = transform_case(numpy.uint8, "file", 4, "random",
                                                          seed=11, shape=(3, 2, 7, 9))
    want = numpy.empty(out_shape, f32)
    REF.transform(batch, want, params, mean_array, f32(0.5))
    wide = cuda.to(numpy.zeros(out_shape[:3] + (2 * out_shape[3],), f32))
    out = wide[..., ::2]
    cuda.transform(batch, out, params, mean_array, f32(0.5))
    assert_bits_equal(cuda.back(out), want)
    assert not cuda.back(wide[..., 1::2]).any()


def test_transform_of_other_record_types_and_device_params(cuda):
    # int16 and float64 records are converted to float32 first, as the reference's subtract
    rng = numpy.random.default_rng(4)
    for dtype in (numpy.int16, numpy.float64):
        batch = (rng.standard_normal((2, 3, 5, 5)) * 300).astype(dtype)
        params = numpy.array([[1, 0, 2], [0, 2, 1]], numpy.int64)
        mean = rng.random((3, 1, 1)).astype(f32)
        want = numpy.empty((2, 3, 3, 3), f32)
        REF.transform(batch, want, params, mean, f32(0.1))
        out = cuda.to(numpy.empty((2, 3, 3, 3), f32))
        cuda.transform(cuda.to(batch), out, cuda.to(params), cuda.to(mean), f32(0.1))
        assert_bits_equal(cuda.back(out), want, str(dtype))


def test_transform_refuses_a_window_outside_the_records(cuda):
    batch = cuda.to(numpy.zeros((2, 1, 4, 4), numpy.uint8))
    out = cuda.to(numpy.zeros((2, 1, 3, 3), f32))
    with pytest.raises(ValueError, match="leaves the 4x4 records"):
        cuda.transform(batch, out, numpy.array([[0, 0, 0], [0, 2, 0]]), None, 1)
    with pytest.raises(ValueError, match=r"params must have shape \(2, 3\)"):
        cuda.transform(batch, out, numpy.zeros((3, 3), numpy.int64), None, 1)
    with pytest.raises(ValueError, match="does not fit records"):
        cuda.transform(batch, cuda.to(numpy.zeros((2, 1, 5, 3), f32)),
                       numpy.zeros((2, 3), numpy.int64), None, 1)
