"""Gradient checks (``gradient_check.check_gradient``, Caffe's GradientChecker) and a few
identities for Deconvolution, Im2col, SPP, RNN, LSTM and LSTMUnit.

The identities use independent references: Deconvolution is the adjoint of Convolution with
the same weights; Im2col against a straight loop and against Convolution's GEMM; a recurrent
layer run over a sequence in one pass equals the same sequence cut in two passes with the
state carried over (internally, or through ``expose_hidden``). Deconvolution, Im2col and SPP
run on the kernels: their checks and identities run on every kernel set (``kernel_set``).
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from gradient_check import (blobs_of, check_gradient, distinct, gaussian, gpu_twins,
                            make_layer, put)


def _layer(text, values, ntop):
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    lp.bottom.extend(f"b{i}" for i in range(len(values)))
    lp.top.extend(f"t{i}" for i in range(ntop))
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottoms, tops = blobs_of(values), [Blob() for _ in range(ntop)]
    layer.setup(bottoms, tops)
    return layer, bottoms, tops


# -- Deconvolution -----------------------------------------------------------------------------
DECONV_CASES = {
    "basic": ("num_output: 3 kernel_size: 3", (2, 2, 3, 3)),
    "stride_pad": ("num_output: 2 kernel_size: 4 stride: 2 pad: 1", (1, 3, 3, 3)),
    "group_rect": ("num_output: 4 group: 2 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1",
                   (2, 4, 2, 3)),
    "dilation_no_bias": ("num_output: 2 kernel_size: 2 dilation: 2 pad: 1 bias_term: false",
                         (1, 2, 3, 4)),
    "nd_3d": ("num_output: 2 kernel_size: 2 stride: 2", (1, 2, 2, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(DECONV_CASES))
def test_deconvolution(name, kernel_set):
    conv, shape = DECONV_CASES[name]
    layer, bottoms, tops = make_layer(
        f'name: "deconv" type: "Deconvolution" bottom: "x" top: "y" '
        f'convolution_param {{ {conv} }}', [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


def test_deconvolution_two_bottoms_share_weights(kernel_set):
    layer, bottoms, tops = make_layer(
        'name: "deconv" type: "Deconvolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
        'convolution_param { num_output: 2 kernel_size: 3 stride: 2 pad: 1 }',
        [gaussian((1, 2, 2, 3), 4), gaussian((1, 2, 2, 3), 5)])
    check_gradient(layer, bottoms, tops, [0, 1])


@pytest.mark.parametrize("conv, shape", [
    ("kernel_size: 3 stride: 2 pad: 1 group: 2", (2, 4, 7, 7)),
    ("kernel_h: 2 kernel_w: 3 dilation: 2 stride_h: 1 stride_w: 3", (2, 4, 6, 8)),
], ids=["group_stride_pad", "rect_dilation"])
def test_deconvolution_is_the_adjoint_of_convolution(conv, shape, kernel_set):
    # <conv(x), y> == <x, deconv(y)> with the very same weight blob and no bias (for input
    # sizes the convolution covers exactly, so that deconv gives back x's shape).
    x = gaussian(shape, 6)
    c, cb, ct = _layer(f'name: "c" type: "Convolution" convolution_param {{ num_output: 6 '
                       f'bias_term: false {conv} }}', [x], 1)
    put(c.blobs[0].data, gaussian(c.blobs[0].shape, 7))
    c.forward(cb, ct)
    y_shape = ct[0].shape
    y = gaussian(y_shape, 8)
    d, db, dt = _layer(f'name: "d" type: "Deconvolution" convolution_param {{ num_output: 4 '
                       f'bias_term: false {conv} }}', [y], 1)
    assert d.blobs[0].shape == c.blobs[0].shape
    d.blobs[0].data[...] = c.blobs[0].data
    d.forward(db, dt)
    assert dt[0].shape == x.shape
    lhs = float(numpy.sum(backend.to_numpy(ct[0].data).astype(numpy.float64) * y))
    rhs = float(numpy.sum(x.astype(numpy.float64) * backend.to_numpy(dt[0].data)))
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs))


# -- Im2col ------------------------------------------------------------------------------------
IM2COL_CASES = {
    "k3_pad1_stride2": ("kernel_size: 3 pad: 1 stride: 2", (2, 2, 5, 5)),
    "rect_dilation": ("kernel_h: 2 kernel_w: 3 dilation: 2", (1, 2, 5, 6)),
    "nd_3d": ("kernel_size: 2 pad: 1 stride: 2", (1, 2, 3, 3, 2)),
}


@pytest.mark.parametrize("name", sorted(IM2COL_CASES))
def test_im2col(name, kernel_set):
    conv, shape = IM2COL_CASES[name]
    layer, bottoms, tops = make_layer(
        f'name: "im2col" type: "Im2col" bottom: "x" top: "y" convolution_param {{ {conv} }}',
        [gaussian(shape)])
    check_gradient(layer, bottoms, tops, [0])


def test_im2col_layout_matches_a_loop_and_convolution(kernel_set):
    x = gaussian((2, 3, 6, 5), 9)
    kh, kw, sh, sw, ph, pw, dh, dw = 3, 2, 2, 1, 1, 0, 1, 2
    conv = (f"kernel_h: {kh} kernel_w: {kw} stride_h: {sh} stride_w: {sw} pad_h: {ph} "
            f"pad_w: {pw} dilation: {dh} dilation: {dw}")
    layer, bottoms, tops = _layer(f'name: "i" type: "Im2col" convolution_param {{ {conv} }}',
                                  [x], 1)
    layer.forward(bottoms, tops)
    col = backend.to_numpy(tops[0].data)
    n, c, h, w = x.shape
    oh, ow = col.shape[2:]
    expected = numpy.zeros_like(col)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                for y in range(oh):
                    for z in range(ow):
                        r, s = y * sh - ph + i * dh, z * sw - pw + j * dw
                        if 0 <= r < h and 0 <= s < w:
                            expected[:, (ci * kh + i) * kw + j, y, z] = x[:, ci, r, s]
    numpy.testing.assert_array_equal(col, expected)
    # Convolution = weights (M, C*kh*kw) times these columns.
    cv, cb, ct = _layer(f'name: "c" type: "Convolution" convolution_param {{ num_output: 4 '
                        f'bias_term: false {conv} }}', [x], 1)
    put(cv.blobs[0].data, gaussian(cv.blobs[0].shape, 10))
    cv.forward(cb, ct)
    via_columns = numpy.einsum("mk,nkp->nmp", backend.to_numpy(cv.blobs[0].data).reshape(4, -1),
                               col.reshape(n, col.shape[1], -1))
    numpy.testing.assert_allclose(backend.to_numpy(ct[0].data).reshape(via_columns.shape), via_columns,
                                  rtol=1e-5, atol=1e-5)


# -- SPP ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("spp, shape", [
    ("pyramid_height: 1", (2, 2, 3, 4)),
    ("pyramid_height: 2", (1, 2, 5, 7)),
    ("pyramid_height: 3", (1, 2, 6, 6)),
    ("pyramid_height: 2 pool: AVE", (2, 2, 5, 7)),
    ("pyramid_height: 3 pool: AVE", (1, 2, 6, 7)),
], ids=["max_h1", "max_h2", "max_h3", "ave_h2", "ave_h3"])
def test_spp(spp, shape, kernel_set):
    layer, bottoms, tops = make_layer(
        f'name: "spp" type: "SPP" bottom: "x" top: "y" spp_param {{ {spp} }}',
        [distinct(shape)])     # values 0.05 apart: no MAX ties survive the +-0.01 nudge
    check_gradient(layer, bottoms, tops, [0])


def test_spp_shapes_and_levels(kernel_set):
    x = gaussian((2, 3, 7, 6), 11)
    layer, bottoms, tops = _layer('name: "s" type: "SPP" spp_param { pyramid_height: 3 }',
                                  [x], 1)
    layer.forward(bottoms, tops)
    assert tops[0].shape == (2, 3 * (1 + 4 + 16))
    numpy.testing.assert_array_equal(backend.to_numpy(tops[0].data)[:, :3], x.max(axis=(2, 3)))
    one, b1, t1 = _layer('name: "s" type: "SPP" spp_param { pyramid_height: 1 pool: AVE }',
                         [x], 1)
    one.forward(b1, t1)
    assert t1[0].shape == (2, 3, 1, 1)
    numpy.testing.assert_allclose(backend.to_numpy(t1[0].data)[:, :, 0, 0], x.mean(axis=(2, 3)),
                                  rtol=1e-6)
    # A new input size rebuilds the levels.
    bottoms[0].reshape((1, 3, 8, 8))
    layer.reshape(bottoms, tops)
    assert tops[0].shape == (1, 63)


def test_spp_refuses_a_pyramid_too_deep_for_the_input():
    # 3 rows in 4 bins: kernel 1, pad 1 -- Caffe's Pooling refuses pad >= kernel.
    with pytest.raises(CaffeError):
        _layer('name: "s" type: "SPP" spp_param { pyramid_height: 3 }',
               [gaussian((1, 1, 3, 3))], 1)


# -- LSTMUnit ----------------------------------------------------------------------------------
def test_lstm_unit():
    # Binary cont only: for fractional cont Caffe's forget-gate diff is not the derivative.
    cont = numpy.float32([[1, 0, 1]])
    layer, bottoms, tops = make_layer(
        'name: "u" type: "LSTMUnit" bottom: "c_prev" bottom: "gates" bottom: "cont" '
        'top: "c" top: "h"',
        [gaussian((1, 3, 4), 12), gaussian((1, 3, 16), 13), cont])
    check_gradient(layer, bottoms, tops, [0, 1])


def test_lstm_unit_refuses_gradient_to_cont():
    layer, bottoms, tops = _layer('name: "u" type: "LSTMUnit"',
                                  [gaussian((1, 2, 3)), gaussian((1, 2, 12)),
                                   numpy.ones((1, 2), numpy.float32)], 2)
    layer.forward(bottoms, tops)
    assert not layer.allow_force_backward(2)
    with pytest.raises(CaffeError, match="sequence indicators"):
        layer.backward(tops, [True, True, True], bottoms)


# -- RNN and LSTM ------------------------------------------------------------------------------
def _cont(t, n, restart=()):
    """Sequence indicators: 0 at t = 0 (so the carried-over state never matters), 1 after,
    0 again at each (t, n) in ``restart``."""
    cont = numpy.ones((t, n), numpy.float32)
    cont[0] = 0
    for ti, ni in restart:
        cont[ti, ni] = 0
    return cont


def _recurrent(kind, values, extra="", ntop=1, scale=0.5, seed=14):
    text = (f'name: "r" type: "{kind}" recurrent_param {{ num_output: 3 {extra} }}')
    layer, bottoms, tops = _layer(text, values, ntop)
    rng = numpy.random.RandomState(seed)
    for blob in layer.blobs:
        put(blob.data, scale * rng.standard_normal(blob.shape))
    return layer, bottoms, tops


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
@pytest.mark.parametrize("static", [False, True], ids=["plain", "static"])
def test_recurrent_gradient(kind, static):
    values = [gaussian((3, 2, 2), 15), _cont(3, 2, restart=[(2, 1)])]
    if static:
        values.append(gaussian((2, 3), 16))
    layer, bottoms, tops = _recurrent(kind, values)
    shapes = [b.shape for b in layer.blobs]
    g = 4 * 3 if kind == "LSTM" else 3
    expected = [(g, 2), (g,)] + ([(g, 3)] if static else [])
    expected += [(g, 3)] if kind == "LSTM" else [(3, 3), (3, 3), (3,)]
    assert shapes == expected
    check_gradient(layer, bottoms, tops, [0, 2] if static else [0])


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_recurrent_gradient_exposed_hidden(kind):
    # Caffe gives the exposed initial states no gradient; x and the params still get theirs.
    states = 2 if kind == "LSTM" else 1
    values = [gaussian((3, 2, 2), 17), numpy.ones((3, 2), numpy.float32)]
    values += [gaussian((1, 2, 3), 18 + i) for i in range(states)]
    layer, bottoms, tops = _recurrent(kind, values, "expose_hidden: true", ntop=1 + states)
    # Only the output top is the objective: exposed final states carry no gradient in Caffe.
    check_gradient(layer, bottoms, tops, [0], top_id=0)
    layer.backward(tops, [True, False] + [True] * states, bottoms)
    for b in bottoms[2:]:
        assert not b.diff.any()


@pytest.mark.parametrize("kind", ["RNN", "LSTM"])
def test_recurrent_state_carries_over_between_passes(kind):
    states = 2 if kind == "LSTM" else 1
    x = gaussian((4, 2, 2), 20)
    cont = _cont(4, 2, restart=[(3, 0)])
    whole, wb, wt = _recurrent(kind, [x, cont])
    whole.forward(wb, wt)
    # Two passes of two steps: the state goes on from the first pass to the second.
    half, hb, ht = _recurrent(kind, [x[:2], cont[:2]])
    half.forward(hb, ht)
    first = ht[0].data.copy()
    carried = [s.copy() for s in half.state]
    hb[0].data[...], hb[1].data[...] = x[2:], cont[2:]
    half.forward(hb, ht)
    numpy.testing.assert_allclose(numpy.concatenate([first, ht[0].data]), wt[0].data,
                                  rtol=1e-6, atol=1e-7)
    # The same through expose_hidden: zero initial states in, final states fed back in.
    zeros = [numpy.zeros((1, 2, 3), numpy.float32)] * states
    ex, eb, et = _recurrent(kind, [x[:2], cont[:2]] + zeros, "expose_hidden: true",
                            ntop=1 + states)
    ex.forward(eb, et)
    numpy.testing.assert_array_equal(et[0].data, first)
    for t, s in zip(et[1:], carried):
        numpy.testing.assert_array_equal(t.data, s)
    eb[0].data[...], eb[1].data[...] = x[2:], cont[2:]
    for b, t in zip(eb[2:], et[1:]):
        b.data[...] = t.data
    ex.forward(eb, et)
    numpy.testing.assert_allclose(et[0].data, wt[0].data[2:], rtol=1e-6, atol=1e-7)


def test_recurrent_refuses_gradient_to_cont_and_a_changed_length():
    layer, bottoms, tops = _recurrent("LSTM", [gaussian((2, 2, 2)), _cont(2, 2)])
    assert not layer.allow_force_backward(1)
    layer.forward(bottoms, tops)
    with pytest.raises(CaffeError, match="sequence indicators"):
        layer.backward(tops, [True, True], bottoms)
    bottoms[0].reshape((3, 2, 2))
    bottoms[1].reshape((3, 2))
    with pytest.raises(CaffeError, match="timesteps"):
        layer.reshape(bottoms, tops)


# GPU mode: each gradient check above once more with the blobs on CuPy (skipped without a device)
globals().update(gpu_twins(globals()))
