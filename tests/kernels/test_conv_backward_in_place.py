"""A convolution plan whose ``backward_data_in_place`` is set gives the same bits with ``dx``
in ``dy``'s memory as with a fresh ``dx`` (issue 27: the train net's diff sharing gives a 3x3
pad-1 convolution's bottom and top gradients one buffer): the cpu set's flipped and col2im
paths, in sub-batches or whole, and the reference set."""
import numpy
import pytest

from caffe_engine.kernels.geometry import ConvGeometry
from caffe_engine.kernels.reference import ReferenceKernels

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels, conv_plan  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32

# (N, C, H, W, kernel, pad, dilation, group): input and output of one shape
SAME_SHAPE = [(3, 8, 9, 7, 3, 1, 1, 1), (2, 16, 12, 12, 5, 2, 1, 1), (4, 6, 8, 5, 3, 2, 2, 1),
              (2, 12, 7, 9, 3, 1, 1, 3), (5, 4, 6, 6, (1, 3), (0, 1), 1, 1)]


def _geometry(N, C, H, W, kernel, pad, dilation, group):
    pair = (lambda v: v if isinstance(v, tuple) else (v, v))
    return ConvGeometry(N, C, C, group, (H, W), (H, W), pair(kernel), (1, 1), pair(pad),
                        pair(dilation))


def _in_place_matches_fresh(plan, g, seed):
    rng = numpy.random.default_rng(seed)
    dy = rng.standard_normal((g.num, g.num_output) + g.out_spatial, dtype=f32)
    w = rng.standard_normal((g.num_output, g.channels // g.group) + g.kernel, dtype=f32)
    fresh = numpy.full((g.num, g.channels) + g.in_spatial, numpy.nan, f32)
    plan.backward_data(dy.copy(), w, fresh)
    shared = dy.copy()
    plan.backward_data(shared, w, shared)
    numpy.testing.assert_array_equal(shared, fresh)


@pytest.mark.parametrize("shape", SAME_SHAPE)
@pytest.mark.parametrize("path", ["flip", "col2im"])
@pytest.mark.parametrize("limit", [None, 1])
def test_cpu_plan_data_gradient_in_place(shape, path, limit, monkeypatch):
    g = _geometry(*shape)
    if limit is not None:     # a sub-batch plan, one image (one chunk) at a time
        monkeypatch.setattr(conv_plan, "PACK_LIMIT", limit)
    plan = CpuKernels(CpuTuning(threads=2, backward_data=path)).conv(g)
    assert plan.backward_data_in_place
    if limit is not None:
        assert isinstance(plan, conv_plan.SubBatchPlan) and len(plan.slices) > 1
    _in_place_matches_fresh(plan, g, sum(shape[:4]))


@pytest.mark.parametrize("shape", SAME_SHAPE)
def test_reference_plan_data_gradient_in_place(shape):
    g = _geometry(*shape)
    plan = ReferenceKernels().conv(g)
    assert plan.backward_data_in_place
    _in_place_matches_fresh(plan, g, sum(shape[:4]))


def test_pointwise_and_depthwise_plans_do_not_claim_it():
    kernels = CpuKernels(CpuTuning(threads=2))
    pointwise = ConvGeometry(2, 8, 8, 1, (5, 5), (5, 5), (1, 1), (1, 1), (0, 0), (1, 1))
    depthwise = ConvGeometry(2, 8, 8, 8, (5, 5), (5, 5), (3, 3), (1, 1), (1, 1), (1, 1))
    assert not kernels.conv(pointwise).backward_data_in_place
    assert not kernels.conv(depthwise).backward_data_in_place
