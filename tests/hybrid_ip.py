"""Shared by the model-parallel InnerProduct tests (tests/layers/test_model_parallel.py,
tests/parallel/test_hybrid_inner_product.py): the cases, a layer with random params, each
rank's data, one pass, and the oracle -- one plain layer on the concatenation of every rank's
batch.

Tolerance: the slice GEMMs and the group's sums reorder float32 additions: rtol 1e-5 with
atol 1e-5 (values of order 1, K <= 24, at most 4 ranks' rows summed).
"""
import numpy
from google.protobuf import text_format

from caffe_engine.blob import Blob
from caffe_engine.layers.base import create_layer
from caffe_engine.proto import caffe_pb2
from gradient_check import put

RTOL, ATOL = 1e-5, 1e-5

CASES = {   # inner_product_param, one rank's bottom shape
    "uneven": ("num_output: 5", (3, 2, 2)),
    "even": ("num_output: 12", (4, 3)),
    "transpose": ("num_output: 6 transpose: true", (2, 5)),
    "axis2_no_bias": ("num_output: 7 axis: 2 bias_term: false", (2, 3, 4)),
    "transpose_axis2_uneven": ("num_output: 9 axis: 2 transpose: true", (2, 2, 3, 2)),
}


def make_ip(ip, bottom_shape, seed=0):
    """A set-up InnerProduct layer with random params (the same for a seed), its blobs."""
    lp = text_format.Parse(f'name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                           f'inner_product_param {{ {ip} }}', caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottom, top = Blob(bottom_shape), Blob()
    layer.setup([bottom], [top])
    r = numpy.random.RandomState(seed)
    for blob in layer.blobs:
        put(blob.data, r.standard_normal(blob.shape))
    return layer, bottom, top


def rank_data(shape, top_shape, rank):
    """Rank ``rank``'s bottom values and top diff (float32)."""
    r = numpy.random.RandomState(100 + rank)
    return (r.standard_normal(shape).astype(numpy.float32),
            r.standard_normal(top_shape).astype(numpy.float32))


def run_layer(layer, bottom, top, x, dy, propagate_down=True):
    """reshape, forward, backward with top diff ``dy`` (bottom diff pre-set to 7); returns
    (top data, bottom diff) copies."""
    put(bottom.data, x)
    put(bottom.diff, 7.0)
    layer.reshape([bottom], [top])
    layer.forward([bottom], [top])
    y = top.data.copy()
    put(top.diff, dy)
    layer.backward([top], [propagate_down], [bottom])
    return y, bottom.diff.copy()


def reference(ip, shape, ranks, propagate_down=True, lr=(True, True)):
    """One plain layer on the concatenation of ``ranks`` ranks' batches: (top, bottom diff,
    param diffs, one rank's top shape)."""
    _, _, top = make_ip(ip, shape)
    top_shape = top.shape
    xs, dys = zip(*(rank_data(shape, top_shape, r) for r in range(ranks)))
    big = (ranks * shape[0],) + tuple(shape[1:])
    layer, bottom, top = make_ip(ip, big)
    layer.param_propagate_down = list(lr[:len(layer.blobs)])
    y, dx = run_layer(layer, bottom, top, numpy.concatenate(xs), numpy.concatenate(dys),
                      propagate_down)
    return y, dx, [b.diff.copy() for b in layer.blobs], top_shape


def assert_rows(got, want, rank, rows):
    """``got`` equals rank ``rank``'s ``rows`` rows of ``want`` within the tolerance."""
    numpy.testing.assert_allclose(got, want[rank * rows:(rank + 1) * rows], rtol=RTOL,
                                  atol=ATOL)
