"""The convolution plan's data-movement paths (issue 27) give the bits of the paths they
replace: the pointwise data gradient reading the top diff in place against packing it, the
packed layout against NumPy's, the pointwise weight gradient's images in one hand-off against
one product per image; and the results stay within a float32 sum of the reference kernels."""
import numpy
import pytest

from caffe_engine.kernels.geometry import ConvGeometry

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels, conv  # noqa: E402
from caffe_engine.kernels.cpu.team import Team  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402
from test_cpu_vs_reference import (REF, assert_sums_close, conv_arrays,  # noqa: E402
                                   conv_results)

f32 = numpy.float32


def held_with_slack(a, slack):
    """``a`` copied into an allocation with ``slack`` NaN floats past it."""
    held = numpy.full(a.size + slack, numpy.nan, f32)
    held[:a.size] = a.reshape(-1)
    return held[:a.size].reshape(a.shape)


@pytest.mark.parametrize("shape", [(3, 5, 7, 6, 5, 1), (2, 12, 8, 7, 7, 2), (4, 16, 9, 1, 9, 1),
                                   (5, 3, 40, 14, 14, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_data_gradient_reads_the_top_diff_in_place(shape, threads):
    N, C, M, H, W, G = shape
    g = ConvGeometry(N, C, M, G, (H, W), (H, W), (1, 1), (1, 1), (0, 0), (1, 1))
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(sum(shape)))
    plan = CpuKernels(CpuTuning(threads=threads, images_per_chunk=1)).conv(g)
    assert plan.flip and plan.fNB == 1 and plan.pointwise
    for slack in (0, 64):
        held = held_with_slack(dy, slack)
        assert numpy.shares_memory(plan._flip_input(held), held) == (slack > 0)
    got = {}
    for slack in (0, 64):     # packed, then in place
        dx = numpy.full(x.shape, numpy.nan, f32)
        plan.backward_data(held_with_slack(dy, slack), w, dx)
        got[slack] = dx
    numpy.testing.assert_array_equal(got[0], got[64])
    want = conv_results(REF.conv(g), g, x, w, b, dy)
    results = conv_results(plan, g, x, w, b, held_with_slack(dy, 64))
    assert_sums_close(results, want, x, w, dy)


def numpy_packed(x, ph, pw, sh, sw, Hs, Ws, NB):
    """:func:`conv.pack`'s layout (chunks, C, sh, sw, Hs, Ws, NB) built by NumPy."""
    N, C, H, W = x.shape
    chunks = -(-N // NB)
    xpad = numpy.zeros((chunks * NB, C, Hs * sh, Ws * sw), f32)
    rows, cols = min(H, Hs * sh - ph), min(W, Ws * sw - pw)
    xpad[:N, :, ph:ph + rows, pw:pw + cols] = x[:, :, :rows, :cols]
    phased = xpad.reshape(chunks, NB, C, Hs, sh, Ws, sw)
    return phased.transpose(0, 2, 4, 6, 3, 5, 1).reshape(-1)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("NB", [1, 2, 3, 8])
@pytest.mark.parametrize("shape", [(5, 3, 7, 7, 0, 0, 1, 1), (4, 2, 14, 14, 1, 1, 1, 1),
                                   (3, 2, 5, 40, 2, 1, 1, 1), (2, 3, 9, 8, 1, 2, 2, 2),
                                   (3, 1, 6, 33, 0, 3, 1, 1), (1, 2, 4, 3, 2, 2, 1, 1)])
def test_pack_lays_the_input_out_as_numpy_does(shape, NB, threads):
    N, C, H, W, ph, pw, sh, sw = shape
    x = numpy.random.default_rng(sum(shape)).standard_normal((N, C, H, W)).astype(f32)
    Hs, Ws = -(-(H + 2 * ph) // sh), -(-(W + 2 * pw) // sw)
    want = numpy_packed(x, ph, pw, sh, sw, Hs, Ws, NB)
    xt = numpy.full(want.size + 4, numpy.nan, f32)
    Team(threads).run(conv.pack, x.reshape(-1), xt, N, C, H, W, ph, pw, sh, sw, Hs, Ws, NB)
    numpy.testing.assert_array_equal(xt[:want.size], want)
    assert numpy.isnan(xt[want.size:]).all()
    # a wider layout than the rows need (col2im's top diff in the input's phase width), and
    # one cutting the last row and column off
    for Hs2, Ws2 in ((Hs, Ws + 3), (Hs - 1, Ws - 1)):
        want = numpy_packed(x, ph, pw, sh, sw, Hs2, Ws2, NB)
        xt = numpy.full(want.size, numpy.nan, f32)
        Team(threads).run(conv.pack, x.reshape(-1), xt, N, C, H, W, ph, pw, sh, sw, Hs2, Ws2,
                          NB)
        numpy.testing.assert_array_equal(xt, want)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("shape", [(3, 5, 40, 7), (4, 16, 784, 192), (2, 64, 300, 64),
                                   (5, 130, 33, 9), (1, 3, 2, 50), (3, 20, 70, 21)])
@pytest.mark.parametrize("kc", [16, 1024])
def test_summed_products_give_the_bits_of_one_product_per_image(shape, threads, kc):
    from caffe_engine.kernels.cpu import gemm
    from caffe_engine.kernels.cpu.workspace import Workspace
    images, M, K, N = shape
    rng = numpy.random.default_rng(sum(shape))
    a = rng.standard_normal((images, M, K)).astype(f32)
    b = rng.standard_normal((images, N, K)).astype(f32)
    c0 = rng.standard_normal((M, N)).astype(f32)
    tuning = CpuTuning(threads=threads, gemm_kc=kc, gemm_pack_bytes=1 << 14)
    team, workspace = Team(threads), Workspace()
    want = c0.copy()
    for i in range(images):
        gemm.product(a[i], b[i], want, True, tuning, workspace, team, trans_b=True)
    got = c0.copy()
    gemm.sum_products_bt(a, b, got, tuning, workspace, team)
    numpy.testing.assert_array_equal(got, want)
    numpy.testing.assert_allclose(got, c0 + numpy.einsum("imk,ink->mn", a, b), rtol=1e-4,
                                  atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3, 5, 50, 7, 2, 3), (2, 4, 6, 20, 3, 1, 1),
                                   (3, 2, 3, 6, 1, 1, 0)])
def test_forward_blocks_of_whole_rows_give_the_bits_of_row_parts(shape, threads):
    from caffe_engine.kernels.cpu import conv
    N, C, M, H, k, s, p = shape
    W = 112 * s          # rows of 112 valid positions: 2 of them in a run of 256 columns
    out = ((H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1)
    g = ConvGeometry(N, C, M, 1, (H, W), out, (k, k), (s, s), (p, p), (1, 1))
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(sum(shape)))
    plan = CpuKernels(CpuTuning(threads=threads, images_per_chunk=1)).conv(g)
    got = {}
    for blocks in ("runs", "parts"):
        if blocks == "parts":
            plan.forward_blocks = plan.blocks
            if plan.flip:
                plan.flip_blocks = conv.plan_blocks(N, H, W, plan.fWs, plan.fNB, 256)
        else:
            assert len(plan.forward_blocks[0]) < len(plan.blocks[0])
        got[blocks] = conv_results(plan, g, x, w, b, dy)
        if blocks == "runs":
            assert_sums_close(got[blocks], conv_results(REF.conv(g), g, x, w, b, dy), x, w, dy)
    for name in got["runs"]:
        numpy.testing.assert_array_equal(got["runs"][name], got["parts"][name], err_msg=name)


@pytest.mark.parametrize("shape,products", [((2, 16, 512, 5, 5), True),
                                            ((2, 600, 512, 3, 4), False),
                                            ((2, 16, 64, 5, 5), False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_weight_gradient_by_products_or_blocks(shape, products, threads):
    # per-image products from 512 outputs up (as many as the inputs or more), else the blocked
    # kernel; either way within a float32 sum of the reference
    N, C, M, H, W = shape
    g = ConvGeometry(N, C, M, 1, (H, W), (H, W), (1, 1), (1, 1), (0, 0), (1, 1))
    x, w, b, dy = conv_arrays(g, numpy.random.default_rng(sum(shape)))
    plan = CpuKernels(CpuTuning(threads=threads)).conv(g)
    assert plan.gemm_weight_grad == products
    want = conv_results(REF.conv(g), g, x, w, b, dy)
    assert_sums_close(conv_results(plan, g, x, w, b, dy), want, x, w, dy)
