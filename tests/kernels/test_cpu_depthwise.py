"""The cpu kernel set's depthwise convolution (kernels/cpu/depthwise.py) against the reference
kernels on odd shapes: every kernel (forward with and without bias, data gradient, weight and
bias gradients accumulated onto what is there) for batches of 1 and 3, planes 1x1 to 15x15,
strides 1-3 (2: the phases split and merged by shuffles), padding 0-2, dilation 1-2, kernels
1, 3 and 5, one thread and two.
"""
import itertools

import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.kernels.geometry import ConvGeometry, conv_output_shape

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels  # noqa: E402
from caffe_engine.kernels.cpu.depthwise import DepthwisePlan  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32
REF = kernels.get("reference")
PLANES = [(1, 1), (5, 7), (7, 7), (14, 14), (15, 15)]


def depthwise_cases():
    """(num, plane, kernel, stride, pad, dilation) with an output of at least 1x1."""
    cases = []
    for num, plane, k, s, p, d in itertools.product((1, 3), PLANES, (1, 3, 5), (1, 2, 3),
                                                    (0, 1, 2), (1, 2)):
        out = conv_output_shape(plane, (k, k), (s, s), (p, p), (d, d))
        if min(out) >= 1 and p < d * (k - 1) + 1:
            cases.append((num, plane, k, s, p, d))
    return cases


CASES = depthwise_cases()


def results(plan, x, w, b, dy, dw0, db0):
    y = numpy.full(dy.shape, numpy.nan, f32)
    y_plain = numpy.full(dy.shape, numpy.nan, f32)
    dx = numpy.full(x.shape, numpy.nan, f32)
    dw, db = dw0.copy(), db0.copy()
    plan.forward(x, w, b, y)
    plan.forward(x, w, None, y_plain)
    plan.backward_data(dy, w, dx)
    plan.weight_grad(x, dy, dw)
    plan.bias_grad(dy, db)
    return {"y": y, "y_plain": y_plain, "dx": dx, "dw": dw, "db": db}


@pytest.mark.parametrize("case", CASES,
                         ids=lambda c: "n{}-{}x{}-k{}-s{}-p{}-d{}".format(c[0], *c[1], *c[2:]))
def test_depthwise_odd_shapes_match_reference(case):
    num, plane, k, s, p, d = case
    channels = 3
    out = conv_output_shape(plane, (k, k), (s, s), (p, p), (d, d))
    g = ConvGeometry(num, channels, channels, channels, plane, out, (k, k), (s, s), (p, p),
                     (d, d))
    rng = numpy.random.default_rng(hash(case) % 2**32)
    x = rng.standard_normal((num, channels) + plane).astype(f32)
    w = rng.standard_normal((channels, 1, k, k)).astype(f32)
    b = rng.standard_normal(channels).astype(f32)
    dy = rng.standard_normal((num, channels) + out).astype(f32)
    dw0 = rng.standard_normal(w.shape).astype(f32)      # accumulated onto
    db0 = rng.standard_normal(b.shape).astype(f32)
    want = results(REF.conv(g), x, w, b, dy, dw0, db0)
    for threads in (1, 2):
        plan = CpuKernels(CpuTuning(threads=threads)).conv(g)
        assert isinstance(plan, DepthwisePlan)
        got = results(plan, x, w, b, dy, dw0, db0)
        for name in want:
            scale = max(1.0, float(numpy.abs(want[name]).max()))
            numpy.testing.assert_allclose(got[name], want[name], rtol=0, atol=2e-5 * scale,
                                          err_msg=f"{name}, {threads} threads")


@pytest.mark.parametrize("shape", [(3, 16, 15, 2), (2, 8, 14, 2), (1, 5, 9, 2), (2, 4, 64, 1),
                                   (2, 70, 7, 1)])
def test_depthwise_threads_agree_bit_for_bit(shape):
    """The split between threads (planes, or channels for the weight gradient) changes no
    bit: each plane's and each weight's sums are the same whichever thread does them."""
    n, c, h, s = shape
    out = conv_output_shape((h, h), (3, 3), (s, s), (1, 1), (1, 1))
    g = ConvGeometry(n, c, c, c, (h, h), out, (3, 3), (s, s), (1, 1), (1, 1))
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((n, c, h, h)).astype(f32)
    w = rng.standard_normal((c, 1, 3, 3)).astype(f32)
    b = rng.standard_normal(c).astype(f32)
    dy = rng.standard_normal((n, c) + out).astype(f32)
    zero_w, zero_b = numpy.zeros_like(w), numpy.zeros_like(b)
    runs = [results(CpuKernels(CpuTuning(threads=t)).conv(g), x, w, b, dy, zero_w, zero_b)
            for t in (1, 2, 3)]
    for other in runs[1:]:
        for name in runs[0]:
            assert runs[0][name].tobytes() == other[name].tobytes(), name
