"""The cuda set's convolution (caffe_engine/kernels/cuda/conv.py) against the reference set.

The CUDA sources run on the CPU through the emulator (g++, serially); the cuBLAS products are
NumPy's matmul there. Checked: the plan's four methods on fixed and random 2-D geometries
(groups, dilation, stride beyond the kernel, padding, 1x1 with and without im2col, non-square
everything, batch 1) with the workspace bound patched so that a chunk holds every image, one
image, or a few (the last chunk shorter); Deconvolution's use of the plan (the layer's calls,
then the layer itself on both sets); im2col/col2im bit for bit; the reference fallbacks (N-D,
other dtypes, strided views); the kernel launches per call; one workspace per plan; and the
NVRTC compile of the source for sm_90. What the emulator cannot show (races, FMA contraction,
CuPy's matmul on the device) needs the GPU.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import kernels
from caffe_engine.blob import Blob
from caffe_engine.kernels.cuda import CudaKernels, conv
from caffe_engine.kernels.cuda.emulator import EmulatedDevice, compiler_missing
from caffe_engine.kernels.geometry import (ConvGeometry, conv_output_shape,
                                           deconv_output_shape)
from caffe_engine.kernels.reference import conv as reference_conv
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from cuda_env import nvrtc_missing

pytestmark = pytest.mark.skipif(compiler_missing() is not None,
                                reason=str(compiler_missing()))

f32 = numpy.float32


@pytest.fixture(scope="module")
def device():
    """An emulated device with this module's source only (the other sources may be in flux)."""
    return EmulatedDevice([conv.SOURCE])


def conv_geometry(num, channels, num_output, group, in_spatial, kernel, stride=(1, 1),
                  pad=(0, 0), dilation=(1, 1)):
    out = conv_output_shape(in_spatial, kernel, stride, pad, dilation)
    return ConvGeometry(num, channels, num_output, group, tuple(in_spatial), out, tuple(kernel),
                        tuple(stride), tuple(pad), tuple(dilation))


def deconv_geometry(num, channels, num_output, group, in_spatial, kernel, stride=(1, 1),
                    pad=(0, 0), dilation=(1, 1)):
    """Deconvolution's plan: the image side is the layer's top, the column side its bottom,
    channels and num_output swapped (convolution.py, ``reshape``)."""
    out = deconv_output_shape(in_spatial, kernel, stride, pad, dilation)
    return ConvGeometry(num, num_output, channels, group, out, tuple(in_spatial),
                        tuple(kernel), tuple(stride), tuple(pad), tuple(dilation))


GEOMETRIES = {
    "k3_pad1": conv_geometry(5, 3, 4, 1, (6, 6), (3, 3), pad=(1, 1)),
    "groups2_stride_pad": conv_geometry(5, 4, 6, 2, (7, 9), (3, 2), (2, 1), (1, 2)),
    "groups3_dilation": conv_geometry(5, 6, 9, 3, (9, 8), (3, 3), (1, 2), (2, 0), (2, 3)),
    "stride_beyond_kernel": conv_geometry(5, 2, 3, 1, (11, 10), (2, 3), (4, 5), (1, 0)),
    "rect_all": conv_geometry(5, 3, 5, 1, (5, 12), (2, 5), (1, 3), (0, 2), (2, 1)),
    "pad_up_to_kernel": conv_geometry(5, 2, 2, 2, (3, 4), (3, 4), (2, 1), (3, 4)),
    "pointwise": conv_geometry(5, 6, 4, 1, (4, 7), (1, 1)),
    "pointwise_groups": conv_geometry(5, 6, 8, 2, (5, 3), (1, 1)),
    "pointwise_dilation": conv_geometry(5, 3, 2, 1, (4, 4), (1, 1), dilation=(3, 2)),
    "k1_stride2": conv_geometry(5, 4, 3, 1, (7, 6), (1, 1), (2, 2)),
    "k1_pad1": conv_geometry(5, 2, 3, 1, (3, 4), (1, 1), pad=(1, 1)),
    "batch1": conv_geometry(1, 3, 4, 1, (6, 5), (3, 3), pad=(1, 1)),
    "batch1_groups": conv_geometry(1, 4, 4, 2, (6, 5), (3, 3), (2, 2), (1, 1)),
    "batch1_pointwise_groups": conv_geometry(1, 4, 6, 2, (3, 5), (1, 1)),
    "depthwise": conv_geometry(5, 4, 4, 4, (6, 6), (3, 3), pad=(1, 1)),
    "output_1x1": conv_geometry(5, 3, 2, 1, (4, 5), (4, 5)),
    "deconv_k4_s2_p1": deconv_geometry(5, 3, 4, 1, (4, 5), (4, 4), (2, 2), (1, 1)),
    "deconv_groups_dilation": deconv_geometry(5, 4, 6, 2, (3, 4), (3, 2), (1, 2), (1, 0),
                                              (2, 1)),
}


def conv_arrays(g, rng):
    x = rng.standard_normal((g.num, g.channels) + g.in_spatial).astype(f32)
    w = rng.standard_normal((g.num_output, g.channels // g.group) + g.kernel).astype(f32)
    b = rng.standard_normal(g.num_output).astype(f32)
    dy = rng.standard_normal((g.num, g.num_output) + g.out_spatial).astype(f32)
    return x, w, b, dy


def conv_results(plan, x, w, b, dy, bias=True):
    y = numpy.full(dy.shape, numpy.nan, f32)     # forward and backward_data overwrite
    dx = numpy.full(x.shape, numpy.nan, f32)
    dw = numpy.ones(w.shape, f32)                # the gradients accumulate onto what is there
    db = numpy.ones(b.shape, f32)
    plan.forward(x, w, b if bias else None, y)
    plan.backward_data(dy, w, dx)
    plan.weight_grad(x, dy, dw)
    plan.bias_grad(dy, db)
    return {"y": y, "dx": dx, "dw": dw, "db": db}


def assert_sums_close(got, want):
    """Within float32 rounding of a sum of products: 2e-5 of the largest magnitude."""
    for name in want:
        assert got[name].shape == want[name].shape, name
        scale = max(1.0, float(numpy.abs(want[name]).max()))
        numpy.testing.assert_allclose(got[name], want[name], rtol=0, atol=2e-5 * scale,
                                      err_msg=name)


def images_bound(g, images):
    """A workspace bound that gives chunks of ``images`` images for ``g``."""
    per_image = (g.channels * g.kernel[0] * g.kernel[1] + g.num_output) * \
        g.out_spatial[0] * g.out_spatial[1]
    return 4 * per_image * images


def plan_with_chunk(device, g, images, monkeypatch):
    """The cuda plan of ``g`` with ``images`` images per chunk (None: the module's bound)."""
    if images is not None:
        monkeypatch.setattr(conv, "WORKSPACE_BYTES", images_bound(g, images))
    plan = conv.make_plan(device, g)
    monkeypatch.undo()
    assert isinstance(plan, conv.ConvPlan)
    return plan


# -- the plan against the reference ------------------------------------------------------------
@pytest.mark.parametrize("images", [None, 1, 2], ids=["one_chunk", "chunk1", "chunk2"])
@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_plan_matches_reference(name, images, device, monkeypatch):
    g = GEOMETRIES[name]
    plan = plan_with_chunk(device, g, images, monkeypatch)
    assert plan.chunk == min(g.num, images or g.num)
    rng = numpy.random.default_rng(sum(map(ord, name)))
    arrays = conv_arrays(g, rng)
    reference = reference_conv.ConvPlan(g)
    for bias in (True, False):
        assert_sums_close(conv_results(plan, *arrays, bias=bias),
                          conv_results(reference, *arrays, bias=bias))


def random_geometry(rng):
    """A random 2-D geometry: odd sizes, pad up to the kernel, stride up to kernel + 1,
    dilation, groups, 1x1 kernels often, batch 1 sometimes."""
    group = int(rng.choice([1, 1, 2, 3]))
    channels = group * int(rng.integers(1, 4))
    num_output = group * int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.choice([1, 1, 2, 3, 5], 2))
    dilation = tuple(int(d) for d in rng.choice([1, 1, 2], 2))
    stride = tuple(int(rng.integers(1, k + 2)) for k in kernel)
    pad = tuple(int(rng.integers(0, k + 1)) for k in kernel)
    if rng.random() < 0.3:
        stride, pad = (1, 1), (0, 0)
    extent = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    in_spatial = tuple(max(1, max(e - 2 * p, 0) + int(rng.integers(0, 7)))
                       for e, p in zip(extent, pad))
    if min(conv_output_shape(in_spatial, kernel, stride, pad, dilation)) < 1:
        return random_geometry(rng)
    num = int(rng.choice([1, 2, 3, 7]))
    return conv_geometry(num, channels, num_output, group, in_spatial, kernel, stride, pad,
                         dilation)


@pytest.mark.parametrize("seed", range(30))
def test_plan_matches_reference_on_random_geometry(seed, device, monkeypatch):
    rng = numpy.random.default_rng(1000 + seed)
    g = random_geometry(rng)
    images = [None, 1, 2, 3][seed % 4]
    plan = plan_with_chunk(device, g, images, monkeypatch)
    arrays = conv_arrays(g, rng)
    assert_sums_close(conv_results(plan, *arrays, bias=seed % 3 != 0),
                      conv_results(reference_conv.ConvPlan(g), *arrays, bias=seed % 3 != 0))


def test_the_default_bound_is_256_mib_and_chunks_hold_it(device):
    assert conv.WORKSPACE_BYTES == 256 << 20
    big = conv_geometry(64, 64, 64, 1, (56, 56), (3, 3), pad=(1, 1))
    plan = conv.make_plan(device, big)
    per_image = (64 * 9 + 64) * 56 * 56
    assert plan.chunk == conv.WORKSPACE_BYTES // 4 // per_image
    assert 1 < plan.chunk < 64
    huge = conv_geometry(2, 512, 8, 1, (300, 300), (3, 3), pad=(1, 1))
    assert conv.make_plan(device, huge).chunk == 1   # one image exceeds the bound alone


# -- Deconvolution ----------------------------------------------------------------------------
@pytest.mark.parametrize("images", [None, 1, 2], ids=["one_chunk", "chunk1", "chunk2"])
def test_deconvolution_calls_match_reference(images, device, monkeypatch):
    """DeconvolutionLayer's calls: forward = backward_data then the bias; backward =
    weight_grad(top diff, bottom) and forward(top diff, w, None) for the bottom diff."""
    g = GEOMETRIES["deconv_k4_s2_p1"]
    plan = plan_with_chunk(device, g, images, monkeypatch)
    reference = reference_conv.ConvPlan(g)
    rng = numpy.random.default_rng(5)
    bottom = rng.standard_normal((g.num, g.num_output) + g.out_spatial).astype(f32)
    top_diff = rng.standard_normal((g.num, g.channels) + g.in_spatial).astype(f32)
    w = rng.standard_normal((g.num_output, g.channels // g.group) + g.kernel).astype(f32)
    results = []
    for p in (plan, reference):
        top = numpy.full(top_diff.shape, numpy.nan, f32)
        p.backward_data(bottom, w, top)
        dw = numpy.full(w.shape, 0.5, f32)
        p.weight_grad(top_diff, bottom, dw)
        bottom_diff = numpy.full(bottom.shape, numpy.nan, f32)
        p.forward(top_diff, w, None, bottom_diff)
        results.append({"top": top, "dw": dw, "bottom_diff": bottom_diff})
    assert_sums_close(*results)


def _run_layer(text, x, top_diff, params):
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottom = Blob(x.shape)
    bottom.data[...] = x
    top = Blob()
    layer.setup([bottom], [top])
    for blob, value in zip(layer.blobs, params):
        blob.data[...] = value
    layer.forward([bottom], [top])
    top.diff[...] = top_diff
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward([top], [True], [bottom])
    return [top.data.copy(), bottom.diff.copy()] + [b.diff.copy() for b in layer.blobs]


@pytest.mark.parametrize("layer_type", ["Convolution", "Deconvolution"])
def test_layers_on_the_cuda_set_match_the_reference_set(layer_type, device):
    text = (f'name: "c" type: "{layer_type}" bottom: "x" top: "y" convolution_param {{ '
            'num_output: 6 group: 2 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 '
            'pad_h: 1 pad_w: 0 dilation: 1 dilation: 2 }')
    rng = numpy.random.default_rng(11)
    x = rng.standard_normal((3, 4, 7, 6)).astype(f32)
    cuda_set = CudaKernels(device)
    results = {}
    for name, chosen in (("cuda", cuda_set), ("reference", "reference")):
        previous = kernels.use(chosen)
        try:
            lp = text_format.Parse(text, caffe_pb2.LayerParameter())
            probe = create_layer(lp, caffe_pb2.TRAIN)
            b, t = Blob(x.shape), Blob()
            b.data[...] = x
            probe.setup([b], [t])
            params = [numpy.random.default_rng(12 + i).standard_normal(p.shape).astype(f32)
                      for i, p in enumerate(probe.blobs)]
            top_diff = numpy.random.default_rng(13).standard_normal(t.shape).astype(f32)
            results[name] = _run_layer(text, x, top_diff, params)
            if name == "cuda":
                assert isinstance(probe.plan, conv.ConvPlan)
        finally:
            kernels.use(previous)
    for got, want in zip(results["cuda"], results["reference"]):
        scale = max(1.0, float(numpy.abs(want).max()))
        numpy.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale)


# -- im2col / col2im ----------------------------------------------------------------------------
WINDOWS = [  # (n, C, in_hw, kernel, stride, pad, dilation)
    (2, 3, (6, 5), (3, 2), (2, 1), (1, 0), (1, 2)),
    (1, 2, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 1, (5, 9), (1, 1), (1, 1), (0, 0), (1, 1)),
    (2, 2, (4, 6), (2, 4), (3, 2), (2, 3), (2, 1)),
    (1, 4, (9, 4), (5, 1), (4, 1), (0, 0), (1, 1)),
    (2, 1, (3, 3), (3, 3), (1, 1), (2, 2), (2, 2)),
]


@pytest.mark.parametrize("window", WINDOWS, ids=[str(i) for i in range(len(WINDOWS))])
def test_im2col_and_col2im_match_reference_bit_for_bit(window, device):
    n, channels, in_hw, kernel, stride, pad, dilation = window
    out = conv_output_shape(in_hw, kernel, stride, pad, dilation)
    rng = numpy.random.default_rng(7)
    x = rng.standard_normal((n, channels) + in_hw).astype(f32)
    col = conv.im2col(device, x, kernel, stride, pad, dilation, out)
    want = reference_conv.im2col(x, kernel, stride, pad, dilation, out)
    assert col.shape == want.shape == (n, channels) + kernel + out
    numpy.testing.assert_array_equal(col, want)
    dcol = rng.standard_normal(col.shape).astype(f32)
    dx = conv.col2im(device, dcol, in_hw, kernel, stride, pad, dilation)
    want_dx = reference_conv.col2im(dcol, in_hw, kernel, stride, pad, dilation)
    assert dx.shape == (n, channels) + in_hw and dx.flags.c_contiguous
    numpy.testing.assert_array_equal(dx, want_dx)   # one summation order: kernel offsets


def test_col2im_is_the_adjoint_of_im2col(device):
    n, channels, in_hw, kernel, stride, pad, dilation = WINDOWS[3]
    out = conv_output_shape(in_hw, kernel, stride, pad, dilation)
    rng = numpy.random.default_rng(8)
    x = rng.standard_normal((n, channels) + in_hw)
    c = rng.standard_normal((n, channels) + kernel + out)
    left = float((conv.im2col(device, x.astype(f32), kernel, stride, pad, dilation, out)
                  .astype(numpy.float64) * c).sum())
    right = float((x * conv.col2im(device, c.astype(f32), in_hw, kernel, stride, pad,
                                   dilation).astype(numpy.float64)).sum())
    assert left == pytest.approx(right, rel=1e-5)


# -- what falls back to the reference set -------------------------------------------------------
def test_not_2d_falls_back_to_the_reference_set(device):
    g3 = ConvGeometry(2, 2, 3, 1, (4, 4, 4), (2, 2, 2), (3, 3, 3), (1, 1, 1), (0, 0, 0),
                      (1, 1, 1))
    assert conv.make_plan(device, g3) is None
    assert isinstance(CudaKernels(device).conv(g3), reference_conv.ConvPlan)
    x = numpy.ones((1, 2, 4, 4, 4), f32)
    assert conv.im2col(device, x, (3, 3, 3), (1, 1, 1), (0, 0, 0), (1, 1, 1), (2, 2, 2)) is None
    col = numpy.ones((1, 2, 3, 3, 3, 2, 2, 2), f32)
    assert conv.col2im(device, col, (4, 4, 4), (3, 3, 3), (1, 1, 1), (0, 0, 0),
                       (1, 1, 1)) is None


def test_strided_views_and_float64_use_the_reference_plan(device):
    g = GEOMETRIES["groups2_stride_pad"]
    plan = conv.make_plan(device, g)
    rng = numpy.random.default_rng(3)
    x, w, b, dy = conv_arrays(g, rng)
    wide = numpy.zeros(x.shape[:-1] + (x.shape[-1] * 2,), f32)
    wide[..., ::2] = x
    strided = wide[..., ::2]
    assert not strided.flags.c_contiguous
    before = plan.device.launches
    y = numpy.empty(dy.shape, f32)
    plan.forward(strided, w, b, y)
    assert plan.device.launches == before             # no kernel saw the strided view
    want = numpy.empty(dy.shape, f32)
    reference_conv.ConvPlan(g).forward(x, w, b, want)
    numpy.testing.assert_array_equal(y, want)
    y64 = numpy.empty(dy.shape)
    plan.forward(x.astype(numpy.float64), w.astype(numpy.float64), b.astype(numpy.float64), y64)
    numpy.testing.assert_allclose(y64, want, rtol=0, atol=1e-4)
    assert conv.im2col(device, strided, g.kernel, g.stride, g.pad, g.dilation,
                       g.out_spatial) is None


def test_arrays_of_another_shape_raise_before_any_launch(device):
    """Shapes are checked before a kernel (or the reference's strided views) reads past an
    array."""
    g = GEOMETRIES["k3_pad1"]
    plan = conv.make_plan(device, g)
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(2))
    before = device.launches
    with pytest.raises(ValueError, match="x-shaped array has shape"):
        plan.forward(numpy.ascontiguousarray(x[:, :, :-1]), w, b, numpy.empty(dy.shape, f32))
    with pytest.raises(ValueError, match="x-shaped array has shape"):   # before the fallback
        plan.forward(x[:, :, :-1], w, b, numpy.empty(dy.shape, f32))
    with pytest.raises(ValueError, match="y-shaped array has shape"):
        plan.backward_data(dy[:-1], w, numpy.empty(x.shape, f32))
    with pytest.raises(ValueError, match="w-shaped array has shape"):
        plan.weight_grad(x, dy, numpy.zeros((g.num_output, 1) + g.kernel, f32))
    with pytest.raises(ValueError, match="bias-shaped array has shape"):
        plan.bias_grad(dy, numpy.zeros(g.num_output + 1, f32))
    assert device.launches == before


# -- launches and the workspace -------------------------------------------------------------------
def _launches(plan, method, *args):
    before = plan.device.launches
    getattr(plan, method)(*args)
    return plan.device.launches - before


@pytest.mark.parametrize("name, images, expected", [
    # (forward, backward_data, weight_grad, bias_grad) kernels of this module per call
    ("k3_pad1", None, (2, 2, 2, 0)),          # one chunk: im2col + swap, swap + col2im, ...
    ("k3_pad1", 1, (5 + 1, 5, 5, 0)),         # per image: im2col / col2im; one bias kernel
    ("k3_pad1", 2, (2 + 2 + 2, 5, 5, 0)),     # 2 + 2 + 1 images: the last one's bias kernel
    ("groups2_stride_pad", None, (2, 2, 2, 0)),
    ("pointwise", None, (1, 0, 2, 0)),        # 1x1: bias only; backward_data none
    ("pointwise_groups", None, (1, 0, 2, 0)),
])
def test_kernel_launches_per_call(name, images, expected, device, monkeypatch):
    g = GEOMETRIES[name]
    plan = plan_with_chunk(device, g, images, monkeypatch)
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(0))
    y, dx = numpy.empty(dy.shape, f32), numpy.empty(x.shape, f32)
    dw, db = numpy.zeros(w.shape, f32), numpy.zeros(b.shape, f32)
    got = (_launches(plan, "forward", x, w, b, y), _launches(plan, "backward_data", dy, w, dx),
           _launches(plan, "weight_grad", x, dy, dw), _launches(plan, "bias_grad", dy, db))
    assert got == expected


def test_one_workspace_per_plan_within_the_bound(device, monkeypatch):
    g = GEOMETRIES["groups3_dilation"]
    plan = plan_with_chunk(device, g, 2, monkeypatch)
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(1))
    conv_results(plan, x, w, b, dy)
    buffer = plan._workspace._buffer
    conv_results(plan, x, w, b, dy)
    assert plan._workspace._buffer is buffer
    weights = g.num_output * g.kernel_dim
    assert buffer.size - weights <= images_bound(g, 2) // 4


def test_the_plans_of_one_kernel_set_share_one_workspace(device, monkeypatch):
    from caffe_engine.kernels.cuda import CudaKernels
    kernels = CudaKernels(device)
    small, large = GEOMETRIES["groups3_dilation"], GEOMETRIES["rect_all"]
    plans = [kernels.conv(small), kernels.conv(large)]
    for plan, g in zip(plans, (small, large)):
        x, w, b, dy = conv_arrays(g, numpy.random.default_rng(2))
        conv_results(plan, x, w, b, dy)
    assert plans[0]._workspace is plans[1]._workspace is kernels.workspace
    # the shared buffer is the larger need, not the sum
    needs = [p._col_size + p._mid_size + p._mat_size for p in plans]
    assert kernels.workspace.nbytes == 4 * max(needs)


# -- NVRTC ----------------------------------------------------------------------------------------


@pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
def test_the_conv_source_compiles_for_sm_90():
    from caffe_engine.kernels.cuda.device import compile_check
    [(name, size)] = compile_check("sm_90", [conv.SOURCE])
    assert name == "conv" and size > 1000
