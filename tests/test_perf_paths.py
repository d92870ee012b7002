"""Correctness of the fast paths: every convolution path against a float64 reference, the
phase-layout pooling against Caffe's loops, the batch-last im2col/col2im adjoint pair, and the
Data layer's prefetch thread against loading on the caller's thread.

The convolution paths (see ``caffe_engine/layers/vision.py``) are chosen per layer by shape; the
tests force each one through the module's constants (monkeypatched): ``CHUNK_IMAGES`` (chunk
boundaries), ``POINTWISE_BATCHED_MIN`` (1x1 per-image GEMMs or stacked columns) and
``COL2IM_COST`` (backward-data through col2im or as a convolution of the top diff) and
``ROWS_MIN_CHANNELS``/``ROWS_MAX_CHANNELS`` (the pixel-major im2row layout or the batch-last one).
"""
import gc
import logging
import subprocess
import sys
import threading
import time
import weakref

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.blob import Blob
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.layers import create_layer, vision
from caffe_engine.layers import data as data_module
from caffe_engine.proto import caffe_pb2

F32 = numpy.float32
FLT_MAX = numpy.finfo(F32).max


# -- helpers -----------------------------------------------------------------------------------
def layer_with(text, shapes, seed=0):
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    r = numpy.random.RandomState(seed)
    bottoms = []
    for shape in shapes:
        b = Blob(shape)
        b.data[...] = r.standard_normal(shape)
        bottoms.append(b)
    tops = [Blob() for _ in lp.top]
    layer.setup(bottoms, tops)
    for blob in layer.blobs:
        blob.data[...] = r.standard_normal(blob.shape)
    return layer, bottoms, tops


def run_layer(layer, bottoms, tops, seed=1):
    """Forward, then backward with random top diffs; returns (tops, bottom diffs, param diffs)."""
    r = numpy.random.RandomState(seed)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    for t in tops:
        t.diff[...] = r.standard_normal(t.shape)
    for b in layer.blobs:
        b.diff[...] = 0
    layer.backward(tops, [True] * len(bottoms), bottoms)
    return ([t.data.copy() for t in tops], [b.diff.copy() for b in bottoms],
            [b.diff.copy() for b in layer.blobs])


def reference_conv(x, w, b, stride, pad, dilation, group, dy):
    """2-D convolution, its data, weight and bias gradients, in float64 (one einsum per offset)."""
    x, w, dy = (a.astype(numpy.float64) for a in (x, w, dy))
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    xp = numpy.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    y = numpy.zeros((n, m, oh, ow))
    dxp = numpy.zeros_like(xp)
    dw_ = numpy.zeros_like(w)
    mg = m // group
    for i in range(kh):
        for j in range(kw):
            win = (slice(None), slice(None), slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                   slice(j * dw, j * dw + sw * (ow - 1) + 1, sw))
            patch = xp[win]
            for g in range(group):
                cs, ms = slice(g * cg, (g + 1) * cg), slice(g * mg, (g + 1) * mg)
                y[:, ms] += numpy.einsum("nchw,mc->nmhw", patch[:, cs], w[ms, :, i, j])
                dw_[ms, :, i, j] += numpy.einsum("nmhw,nchw->mc", dy[:, ms], patch[:, cs])
                dxp[(slice(None), cs) + win[2:]] += numpy.einsum("nmhw,mc->nchw", dy[:, ms],
                                                                  w[ms, :, i, j])
    if b is not None:
        y += b.reshape(1, m, 1, 1)
    return y, dxp[:, :, ph:ph + h, pw:pw + wd], dw_, dy.sum(axis=(0, 2, 3))


def conv_text(num_output, kernel, stride=1, pad=0, dilation=1, group=1, bias=True, name="c"):
    return (f'name: "{name}" type: "Convolution" bottom: "x" top: "y" convolution_param {{ '
            f'num_output: {num_output} kernel_size: {kernel} stride: {stride} pad: {pad} '
            f'dilation: {dilation} group: {group} bias_term: {"true" if bias else "false"} }}')


CONV_CASES = {
    # name: (bottom shape, num_output, kernel, stride, pad, dilation, group)
    "5x5_same": ((5, 4, 9, 9), 6, 5, 1, 2, 1, 1),
    "5x5_valid": ((3, 3, 10, 8), 5, 5, 1, 0, 1, 1),
    "3x3_wide": ((2, 3, 5, 17), 4, 3, 1, 1, 1, 1),
    "3x3_stride2_pad1": ((4, 3, 9, 11), 4, 3, 2, 1, 1, 1),
    "7x7_stride2_pad3": ((2, 3, 15, 15), 4, 7, 2, 3, 1, 1),
    "3x3_dilated": ((3, 2, 11, 11), 3, 3, 1, 2, 2, 1),
    "grouped": ((3, 6, 8, 8), 4, 3, 1, 1, 1, 2),
    "pointwise": ((5, 6, 7, 7), 4, 1, 1, 0, 1, 1),
    "pointwise_grouped": ((3, 6, 5, 5), 9, 1, 1, 0, 1, 3),
    "pointwise_stride2": ((3, 4, 7, 7), 5, 1, 2, 0, 1, 1),
    "4x4_stride3_pad1": ((3, 2, 13, 11), 3, 4, 3, 1, 1, 1),
    "3x3_stride2_dilated": ((2, 2, 12, 12), 3, 3, 2, 1, 2, 1),
    "2x2_stride2_grouped": ((3, 4, 8, 9), 4, 2, 2, 0, 1, 2),
}

PATHS = {
    # name: constants forcing the path
    "default": {},
    "col2im_small_chunks": {"COL2IM_COST": -1e9, "CHUNK_IMAGES": 2, "CHUNK_COLUMNS": 0},
    "flipped_small_chunks": {"COL2IM_COST": 1e9, "CHUNK_IMAGES": 2, "CHUNK_COLUMNS": 0},
    "pointwise_stacked": {"POINTWISE_BATCHED_MIN": 1 << 30, "CHUNK_IMAGES": 3, "CHUNK_COLUMNS": 0},
    "pointwise_batched_tiny_chunks": {"POINTWISE_BATCHED_MIN": 1, "CHUNK_FLOATS": 1},
    "split_between_3_threads": {"PARALLEL_MIN": 1, "COPY_THREADS": 3, "CHUNK_IMAGES": 3, "CHUNK_COLUMNS": 0},
    "rows_col2im": {"ROWS_MIN_CHANNELS": 1, "ROWS_MAX_CHANNELS": 1 << 30, "COL2IM_COST": -1e9,
                    "CHUNK_COLUMNS": 100},
    "rows_flipped": {"ROWS_MIN_CHANNELS": 1, "ROWS_MAX_CHANNELS": 1 << 30, "COL2IM_COST": 1e9,
                     "CHUNK_COLUMNS": 1},
    "no_rows": {"ROWS_MIN_CHANNELS": None},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CONV_CASES)
def test_convolution_paths_match_reference(monkeypatch, case, path):
    for name, value in PATHS[path].items():
        monkeypatch.setattr(vision, name, value)
    shape, m, k, s, p, d, g = CONV_CASES[case]
    layer, bottoms, tops = layer_with(conv_text(m, k, s, p, d, g), [shape])
    (y,), (dx,), (dw, db) = run_layer(layer, bottoms, tops)
    want = reference_conv(bottoms[0].data, layer.blobs[0].data, layer.blobs[1].data, (s, s),
                          (p, p), (d, d), g, tops[0].diff)
    for got, ref in zip((y, dx, dw, db), want):
        assert got.dtype == F32
        numpy.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * numpy.abs(ref).max())


def test_the_forced_paths_are_taken(monkeypatch):
    layer, _, _ = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    monkeypatch.setattr(vision, "COL2IM_COST", 1e9)
    monkeypatch.setattr(vision, "CHUNK_IMAGES", 2)
    monkeypatch.setattr(vision, "CHUNK_COLUMNS", 0)
    flipped, b, t = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    assert flipped.flip_backward and flipped.chunk == 2
    # Small planes take more images per chunk: 4 x 81 columns wanted -> 4 images -> 5 images
    # in 2 even chunks of at most 3.
    monkeypatch.setattr(vision, "CHUNK_COLUMNS", 4 * 81)
    wide, b, t = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    assert wide.chunk == 3
    monkeypatch.setattr(vision, "CHUNK_COLUMNS", 0)
    monkeypatch.setattr(vision, "COL2IM_COST", -1e9)
    plain, b, t = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    assert not plain.flip_backward
    monkeypatch.setattr(vision, "POINTWISE_BATCHED_MIN", 1)
    pw, b, t = layer_with(conv_text(4, 1), [(5, 6, 7, 7)])
    assert pw.batched
    monkeypatch.setattr(vision, "POINTWISE_BATCHED_MIN", 1 << 30)
    pw, b, t = layer_with(conv_text(4, 1), [(5, 6, 7, 7)])
    assert pw.pointwise and not pw.batched
    strided, b, t = layer_with(conv_text(4, 1, stride=2), [(5, 6, 7, 7)])
    assert not strided.pointwise and strided.phased
    dilated, b, t = layer_with(conv_text(4, 3, stride=2, dilation=2), [(5, 6, 9, 9)])
    assert not dilated.phased
    monkeypatch.setattr(vision, "ROWS_MIN_CHANNELS", 4)
    rows, b, t = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    assert rows.rowwise
    for text in (conv_text(6, 5, pad=2, group=2), conv_text(6, 3, pad=2, dilation=2),
                 conv_text(6, 1)):
        other, b, t = layer_with(text, [(5, 4, 9, 9)])
        assert not other.rowwise
    fewer, b, t = layer_with(conv_text(6, 5, pad=2), [(5, 3, 9, 9)])
    assert not fewer.rowwise


@pytest.mark.parametrize("path", ["default", "rows_col2im", "rows_flipped", "no_rows"])
def test_rectangular_kernel_stride_and_pad_with_two_bottoms(monkeypatch, path):
    """kernel 3x5, stride 2x1, pad 1x2 (each axis its own), on two bottoms sharing weights."""
    for name, value in PATHS[path].items():
        monkeypatch.setattr(vision, name, value)
    text = ('name: "c" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
            'convolution_param { num_output: 5 kernel_h: 3 kernel_w: 5 stride_h: 2 stride_w: 1 '
            'pad_h: 1 pad_w: 2 }')
    layer, bottoms, tops = layer_with(text, [(3, 4, 9, 7), (3, 4, 9, 7)])
    ys, dxs, (dw, db) = run_layer(layer, bottoms, tops)
    want_dw, want_db = 0, 0
    for x, y, dx, top in zip(bottoms, ys, dxs, tops):
        ref = reference_conv(x.data, layer.blobs[0].data, layer.blobs[1].data, (2, 1), (1, 2),
                             (1, 1), 1, top.diff)
        for got, r in zip((y, dx), ref[:2]):
            numpy.testing.assert_allclose(got, r, rtol=1e-4, atol=1e-4 * numpy.abs(r).max())
        want_dw, want_db = want_dw + ref[2], want_db + ref[3]
    numpy.testing.assert_allclose(dw, want_dw, rtol=1e-4, atol=1e-4 * numpy.abs(want_dw).max())
    numpy.testing.assert_allclose(db, want_db, rtol=1e-4, atol=1e-4 * numpy.abs(want_db).max())


def test_paths_agree_on_a_3d_convolution_and_two_bottoms(monkeypatch):
    text = ('name: "c" type: "Convolution" bottom: "a" bottom: "b" top: "ya" top: "yb" '
            'convolution_param { num_output: 3 kernel_size: 3 pad: 1 }')
    results = []
    monkeypatch.setattr(vision, "CHUNK_COLUMNS", 0)
    for cost, chunk in ((-1e9, 8), (1e9, 2), (-1e9, 1)):
        monkeypatch.setattr(vision, "COL2IM_COST", cost)
        monkeypatch.setattr(vision, "CHUNK_IMAGES", chunk)
        results.append(run_layer(*layer_with(text, [(3, 2, 4, 5, 6), (3, 2, 4, 5, 6)])))
    for other in results[1:]:
        for got, ref in zip(sum(other, []), sum(results[0], [])):
            numpy.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_deconvolution_in_chunks_is_the_adjoint(monkeypatch, chunk):
    monkeypatch.setattr(vision, "CHUNK_IMAGES", chunk)
    monkeypatch.setattr(vision, "CHUNK_COLUMNS", 0)
    conv, cb, ct = layer_with(conv_text(4, 3, stride=2, pad=1, bias=False), [(5, 3, 9, 9)])
    deconv, db_, dt = layer_with(conv_text(4, 3, stride=2, pad=1, bias=False).replace(
        "Convolution", "Deconvolution").replace("num_output: 4", "num_output: 3"), [(5, 4, 5, 5)])
    deconv.blobs[0].data[...] = conv.blobs[0].data   # (C_conv_out=4, 3, 3, 3) both
    conv.forward(cb, ct)
    # <conv(x), v> == <x, deconv(v)> for the same weights.
    v = numpy.random.RandomState(5).standard_normal(ct[0].shape).astype(F32)
    db_[0].data[...] = v
    deconv.reshape(db_, dt)
    deconv.forward(db_, dt)
    lhs = numpy.sum(ct[0].data.astype(numpy.float64) * v)
    rhs = numpy.sum(cb[0].data.astype(numpy.float64) * dt[0].data)
    assert abs(lhs - rhs) <= 1e-4 * abs(lhs)


def test_batch_last_im2col_col2im_are_adjoint():
    r = numpy.random.RandomState(0)
    kernel, stride, dilation = (3, 2), (2, 1), (1, 2)
    xt = r.standard_normal((3, 9, 8, 4)).astype(F32)
    out = tuple((s - (d * (k - 1) + 1)) // st + 1
                for s, k, st, d in zip((9, 8), kernel, stride, dilation))
    col = numpy.empty((3,) + kernel + out + (4,), F32)
    vision._im2col_batch_last(xt, kernel, stride, dilation, col)
    assert col[1, 2, 1, 3, 2, 0] == xt[1, 3 * 2 + 2, 2 + 1 * 2, 0]
    v = r.standard_normal(col.shape).astype(F32)
    back = numpy.zeros_like(xt)
    vision._col2im_batch_last(v, kernel, stride, dilation, back)
    lhs = numpy.sum(col.astype(numpy.float64) * v)
    rhs = numpy.sum(xt.astype(numpy.float64) * back)
    assert abs(lhs - rhs) <= 1e-5 * abs(lhs)


# -- pooling: Caffe's loops ----------------------------------------------------------------------
def caffe_pool(x, method, kernel, stride, pad, ceil_mode, dy):
    """pooling_layer.cpp's CPU loops: top, mask (MAX) and bottom diff, float32."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    out_h = vision.pooled_size(h, kh, sh, ph, ceil_mode)
    out_w = vision.pooled_size(w, kw, sw, pw, ceil_mode)
    top = numpy.zeros((n, c, out_h, out_w), F32)
    mask = numpy.full((n, c, out_h, out_w), -1.0, F32)
    dx = numpy.zeros_like(x)
    for a in range(n):
        for b in range(c):
            for i in range(out_h):
                for j in range(out_w):
                    hs, ws = i * sh - ph, j * sw - pw
                    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                    size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    if method == "MAX":
                        best, idx = -FLT_MAX, -1
                        for u in range(hs, he):
                            for v in range(ws, we):
                                if x[a, b, u, v] > best:
                                    best, idx = x[a, b, u, v], u * w + v
                        top[a, b, i, j], mask[a, b, i, j] = best, idx
                        if idx >= 0:
                            dx[a, b, idx // w, idx % w] += dy[a, b, i, j]
                    else:
                        total = F32(0)
                        for u in range(hs, he):
                            for v in range(ws, we):
                                total = F32(total + x[a, b, u, v])
                        top[a, b, i, j] = total / F32(size)
                        dx[a, b, hs:he, ws:we] += dy[a, b, i, j] / F32(size)
    return top, mask, dx


POOL_CASES = {
    "3x3_s2": ((12, 12), 3, 2, 0, "CEIL"),
    "3x3_s2_odd": ((9, 11), 3, 2, 0, "CEIL"),
    "3x3_s1_pad1": ((7, 6), 3, 1, 1, "CEIL"),
    "2x2_s2": ((8, 8), 2, 2, 0, "CEIL"),
    "3x3_s2_pad1": ((10, 9), 3, 2, 1, "CEIL"),
    "3x3_s3_floor": ((11, 10), 3, 3, 0, "FLOOR"),
    "5x5_s2_pad2": ((9, 9), 5, 2, 2, "CEIL"),
    "4x3_s_3x2": ((10, 9), (4, 3), (3, 2), (1, 0), "CEIL"),
}


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", POOL_CASES)
def test_pooling_matches_caffe_loops(monkeypatch, case, method, threads):
    monkeypatch.setattr(vision, "COPY_THREADS", threads)
    monkeypatch.setattr(vision, "PARALLEL_MIN", 1)
    if threads > 1:   # several blocks of planes, shared out between the threads
        monkeypatch.setattr(vision, "POOL_BLOCK_FLOATS", 1)
    hw, k, s, p, mode = POOL_CASES[case]
    k, s, p = ((v, v) if isinstance(v, int) else v for v in (k, s, p))
    if method == "AVE" and case == "3x3_s2" or max(p) >= min(k):
        pytest.skip("covered by the other cases")
    r = numpy.random.RandomState(3)
    # Few distinct values: many ties inside windows; plus NaN, -FLT_MAX and -inf entries (MAX).
    x = r.randint(-3, 3, (2, 3) + hw).astype(F32)
    if method == "MAX":
        x[0, 0, 0, :3] = numpy.nan
        x[0, 1] = -FLT_MAX
        x[1, 2, 1, 1] = -numpy.inf
    tops = "top: 'y' top: 'm'" if method == "MAX" else "top: 'y'"
    text = (f'name: "p" type: "Pooling" bottom: "x" {tops} pooling_param {{ pool: {method} '
            f'kernel_h: {k[0]} kernel_w: {k[1]} stride_h: {s[0]} stride_w: {s[1]} '
            f'pad_h: {p[0]} pad_w: {p[1]} round_mode: {mode} }}')
    lp = text_format.Parse(text.replace("'", '"'), caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottom = Blob(x.shape)
    bottom.data[...] = x
    top = [Blob() for _ in lp.top]
    layer.setup([bottom], top)
    dy = r.standard_normal(top[0].shape).astype(F32)
    top[0].diff[...] = dy
    want_top, want_mask, want_dx = caffe_pool(x, method, k, s, p, mode == "CEIL", dy)
    for _ in range(2):  # twice: the buffers are reused
        layer.forward([bottom], top)
        layer.backward(top, [True], [bottom])
        numpy.testing.assert_array_equal(top[0].data, want_top)
        if method == "MAX":
            numpy.testing.assert_array_equal(top[1].data, want_mask)
        numpy.testing.assert_allclose(bottom.diff, want_dx, rtol=1e-6, atol=1e-6)


def test_workspace_typed_views_share_the_float_buffer():
    ws = vision.Workspace()
    a = ws.get_typed(numpy, "s", (3, 5), numpy.int8)
    assert a.dtype == numpy.int8 and a.shape == (3, 5) and a.flags.c_contiguous
    b = ws.get_typed(numpy, "s", (7,), numpy.bool_)
    b[...] = True
    assert ws.get(numpy, "s", (2,)).dtype == F32


# -- the prefetch thread ------------------------------------------------------------------------
def make_source(tmp_path, count=11, shape=(3, 6, 7)):
    r = numpy.random.RandomState(0)
    items = []
    for i in range(count):
        datum = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2],
                                data=r.randint(0, 256, shape).astype(numpy.uint8).tobytes(),
                                label=i)
        items.append((b"%08d" % i, datum.SerializeToString()))
    write_lmdb(tmp_path / "db", items)
    return str(tmp_path / "db")


def data_layer(source, prefetch, transform="mirror: true crop_size: 4 scale: 0.5", batch=4):
    text = (f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ {transform} }} '
            f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB '
            f'prefetch: {prefetch} }}')
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
    top = [Blob(), Blob()]
    rng.set_random_seed(77)
    layer.setup([], top)
    return layer, top


def batches(layer, top, count):
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    return out


def threads_named(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_prefetched_batches_are_the_synchronous_ones(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    want = batches(sync, stop, 9)          # wraps around the 11 records twice
    for depth in (1, 4):
        layer, top = data_layer(source, depth)
        got = batches(layer, top, 9)
        assert layer._prefetcher is not None and layer._prefetcher.thread.is_alive()
        for (a, la), (b, lb) in zip(got, want):
            assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
        layer.close()


def test_reading_state_rewinds_to_the_next_batch(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    want = batches(sync, stop, 3)
    sync_params = sync.transformer.last_params.copy()
    more = batches(sync, stop, 4)
    layer, top = data_layer(source, 4)
    got = batches(layer, top, 3)
    time.sleep(0.05)                        # let the thread run ahead
    # The cursor and the transformer are where the synchronous layer left them...
    assert layer.cursor.offset == sync.cursor.offset - 4 * 4
    assert numpy.array_equal(layer.transformer.last_params, sync_params)
    assert layer._prefetcher is None
    # ...and the batches that follow are the same ones.
    got += batches(layer, top, 4)
    for (a, la), (b, lb) in zip(got, want + more):
        assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
    assert numpy.array_equal(layer.load_batch().data, sync.load_batch().data)
    layer.close()


def test_solver_rank_set_after_prefetching_started(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    layer, top = data_layer(source, 4)
    batches(sync, stop, 1)
    batches(layer, top, 1)
    for l in (sync, layer):
        l.solver_count, l.solver_rank = 2, 1
    for (a, la), (b, lb) in zip(batches(layer, top, 3), batches(sync, stop, 3)):
        assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
    layer.close()


def test_thread_log_records_come_with_their_batch(tmp_path, caplog):
    source = make_source(tmp_path, count=6)
    layer, top = data_layer(source, 4)
    caplog.set_level(logging.INFO, logger="caffe_engine")
    layer.forward([], top)                  # records 0-3
    time.sleep(0.1)                         # the thread reads past the end meanwhile
    restarts = lambda: [r for r in caplog.records
                        if r.getMessage() == "Restarting data prefetching from start."]
    assert restarts() == []
    layer.forward([], top)                  # records 4, 5, 0, 1: the restart is logged now
    assert len(restarts()) == 1
    layer.close()


def test_thread_stops_on_close_and_when_the_layer_is_collected(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 2)
    layer.forward([], top)
    thread = layer._prefetcher.thread
    layer.close()
    assert not thread.is_alive()
    layer, top = data_layer(source, 2)
    layer.forward([], top)
    thread = layer._prefetcher.thread
    alive = weakref.ref(layer)
    del layer, top
    for _ in range(100):   # the layer is in a reference cycle: collected by the gc, once the
        gc.collect()       # thread is not holding it in the middle of a load
        if alive() is None:
            break
        time.sleep(0.01)
    assert alive() is None
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_an_error_in_the_thread_is_raised_by_forward(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 3, transform="crop_size: 4")
    calls = []
    real = layer._load_batch

    def failing():
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("bad record")
        return real()

    layer._load_batch = failing
    layer.forward([], top)
    with pytest.raises(ValueError, match="bad record"):
        layer.forward([], top)
    assert layer._prefetcher is None
    layer.forward([], top)                  # a new thread takes over at the failed batch
    layer.close()


def test_no_hang_at_interpreter_exit(tmp_path):
    source = make_source(tmp_path)
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from caffe_engine.blob import Blob
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from google.protobuf import text_format
text = ('name: "d" type: "Data" top: "data" top: "label" '
        'data_param {{ source: "{source}" batch_size: 2 backend: LMDB prefetch: 2 }}')
layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
top = [Blob(), Blob()]
layer.setup([], top)
layer.forward([], top)
print("forwarded", flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "forwarded" in r.stdout


def test_prefetch_zero_starts_no_thread(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 0)
    before = len(threads_named("prefetch:d"))
    layer.forward([], top)
    assert layer._prefetcher is None and len(threads_named("prefetch:d")) == before
    assert data_module.BatchPrefetcher is not None
    layer.close()


@pytest.mark.parametrize("path", ["default", "rows_col2im", "rows_flipped"])
@pytest.mark.parametrize("do_w, do_x", [(True, False), (False, True)])
def test_weight_or_data_gradient_alone(monkeypatch, path, do_w, do_x):
    """Only the gradients asked for are computed (a first layer; frozen weights), and they
    are the reference's; a diff not asked for is left as it was."""
    for name, value in PATHS[path].items():
        monkeypatch.setattr(vision, name, value)
    layer, bottoms, tops = layer_with(conv_text(6, 5, pad=2), [(5, 4, 9, 9)])
    layer.param_propagate_down = [do_w, do_w]
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    r = numpy.random.RandomState(1)
    tops[0].diff[...] = r.standard_normal(tops[0].shape)
    sentinel = F32(7)
    bottoms[0].diff[...] = sentinel
    for b in layer.blobs:
        b.diff[...] = sentinel
    layer.backward(tops, [do_x], bottoms)
    _, dx, dw, db = reference_conv(bottoms[0].data, layer.blobs[0].data, layer.blobs[1].data,
                                   (1, 1), (2, 2), (1, 1), 1, tops[0].diff)
    got_dx, got_dw, got_db = bottoms[0].diff, layer.blobs[0].diff, layer.blobs[1].diff
    if do_x:
        numpy.testing.assert_allclose(got_dx, dx, rtol=1e-4, atol=1e-4 * numpy.abs(dx).max())
    else:
        assert (got_dx == sentinel).all()
    if do_w:   # accumulated onto what was there
        numpy.testing.assert_allclose(got_dw, dw + sentinel, rtol=1e-4,
                                      atol=1e-4 * numpy.abs(dw).max())
        numpy.testing.assert_allclose(got_db, db + sentinel, rtol=1e-4,
                                      atol=1e-4 * numpy.abs(db).max())
    else:
        assert (got_dw == sentinel).all() and (got_db == sentinel).all()
