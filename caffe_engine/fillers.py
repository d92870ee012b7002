"""Parameter fillers, drawing from Caffe's global random stream in Caffe's order.

Caffe: include/caffe/filler.hpp. Each filler writes a float32 array of the blob's shape and
draws, in order, exactly the words Caffe's would (see ``rng``), so that the same
``random_seed`` gives the same weights bit for bit. Fan-in and fan-out follow Caffe:
``fan_in = count / shape[0]``, ``fan_out = count / shape[1]`` (``count`` for 1-D blobs).

FillerParameter fields read (defaults): ``type`` ("constant"), ``value`` (0), ``min`` (0),
``max`` (1), ``mean`` (0), ``std`` (1), ``sparse`` (-1), ``variance_norm`` (FAN_IN).

=====================  ===================================================================
type                   values (float32)
=====================  ===================================================================
constant               ``value``; draws nothing
uniform                ``U[min, max]`` (``rng.uniform``)
gaussian               ``N(mean, std)`` (``rng.gaussian``); with ``sparse >= 0`` all the
                       gaussians are drawn first, then a ``bernoulli<float>`` mask with
                       ``p = float(sparse) / float(shape[0])`` multiplies them (negative
                       values masked out become -0.0, as in Caffe)
positive_unitball      ``U[0, 1]``, each of the ``shape[0]`` rows divided by its float32 sum
                       accumulated left to right
xavier                 ``U[-s, s]``, ``s = sqrt(3 / n)``
msra                   ``N(0, sqrt(2 / n))``
bilinear               the bilinear upsampling kernel (4-D, square); draws nothing
=====================  ===================================================================

``n`` is ``fan_in``, ``fan_out`` or ``(fan_in + fan_out) / 2`` by ``variance_norm``.
"""
import math

import numpy

from . import backend
from .errors import CaffeError
from .proto import caffe_pb2
from .rng import get_rng

f32 = numpy.float32


def _fans(shape):
    count = int(numpy.prod(shape)) if shape else 1
    fan_in = count // shape[0] if shape else count
    fan_out = count // shape[1] if len(shape) > 1 else count
    return count, fan_in, fan_out


def _norm_n(param, shape):
    _, fan_in, fan_out = _fans(shape)
    norm = param.variance_norm
    if norm == caffe_pb2.FillerParameter.AVERAGE:
        return f32((fan_in + fan_out) / 2.0)
    if norm == caffe_pb2.FillerParameter.FAN_OUT:
        return f32(fan_out)
    return f32(fan_in)


def _no_sparse(param):
    # Caffe: CHECK_EQ(sparse, -1) "Sparsity not supported by this Filler."
    if param.sparse != -1:
        raise CaffeError(f"filler '{param.type}' does not support sparse "
                         f"(got sparse: {param.sparse})")


def _constant(param, shape, rng, out=None):
    _no_sparse(param)
    return numpy.full(shape, f32(param.value), f32)


def _uniform(param, shape, rng, out=None):
    if f32(param.min) > f32(param.max):
        raise CaffeError(f"uniform filler needs min <= max, got min {param.min} max {param.max}")
    values = rng.uniform(int(numpy.prod(shape)), param.min, param.max, out=out).reshape(shape)
    _no_sparse(param)
    return values


def _gaussian(param, shape, rng, out=None):
    if not f32(param.std) > 0:
        raise CaffeError(f"gaussian filler needs std > 0, got {param.std}")
    if param.sparse < -1:
        raise CaffeError(f"gaussian filler needs sparse >= -1, got {param.sparse}")
    count = int(numpy.prod(shape))
    if param.sparse >= 0:
        out = None      # checked below, once the gaussians are drawn
    values = rng.gaussian(count, param.mean, param.std, out=out)
    if param.sparse >= 0:
        if not shape:
            raise CaffeError("gaussian filler with sparse needs a blob with at least one axis")
        p = f32(param.sparse) / f32(shape[0])
        if p > 1:
            raise CaffeError(f"gaussian filler: sparse {param.sparse} exceeds the {shape[0]} "
                             f"outputs (non-zero probability {p} > 1)")
        values = values * rng.bernoulli(count, p, dtype=f32).astype(f32)
    return values.reshape(shape)


def _positive_unitball(param, shape, rng, out=None):
    count = int(numpy.prod(shape))
    values = rng.uniform(count, 0.0, 1.0)
    rows = values.reshape(shape[0] if shape else 1, -1)
    # Caffe sums each row in a float loop, left to right: cumsum keeps that order.
    sums = numpy.cumsum(rows, axis=1, dtype=f32)[:, -1:]
    rows /= sums
    _no_sparse(param)
    return rows.reshape(shape)


def _xavier(param, shape, rng, out=None):
    scale = f32(math.sqrt(f32(3.0) / _norm_n(param, shape)))
    values = rng.uniform(int(numpy.prod(shape)), -scale, scale, out=out).reshape(shape)
    _no_sparse(param)
    return values


def _msra(param, shape, rng, out=None):
    std = f32(math.sqrt(f32(2.0) / _norm_n(param, shape)))
    values = rng.gaussian(int(numpy.prod(shape)), 0.0, std, out=out).reshape(shape)
    _no_sparse(param)
    return values


def _bilinear(param, shape, rng, out=None):
    if len(shape) != 4 or shape[2] != shape[3]:
        raise CaffeError(f"bilinear filler needs a 4-D blob with square kernels, got {shape}")
    # Caffe (at the reference commit): f = ceil(width / 2.), c = (width - 1) / (2. * f) in
    # double stored as float; then everything in float. (Later Caffe changed c for odd widths;
    # the fixtures show this one.)
    width = shape[3]
    f = math.ceil(width / 2.0)
    c = f32((width - 1) / (2.0 * f))
    idx = numpy.arange(int(numpy.prod(shape)))
    x = (idx % width).astype(f32)
    y = ((idx // width) % shape[2]).astype(f32)
    one = f32(1)
    values = (one - numpy.abs(x / f32(f) - c)) * (one - numpy.abs(y / f32(f) - c))
    _no_sparse(param)
    return values.astype(f32).reshape(shape)


FILLERS = {
    "constant": _constant,
    "uniform": _uniform,
    "gaussian": _gaussian,
    "positive_unitball": _positive_unitball,
    "xavier": _xavier,
    "msra": _msra,
    "bilinear": _bilinear,
}


def fill(blob, filler_param, rng=None):
    """Fill ``blob.data`` in place as Caffe's filler ``filler_param.type`` would.

    Args:
        blob: a Blob of any shape (float32 data on either backend).
        filler_param: caffe_pb2.FillerParameter (type default "constant").
        rng: a CaffeRNG (default: the process-wide stream).

    Raises:
        CaffeError: unknown filler type, or parameters on which Caffe's filler aborts (std <= 0,
            min > max, sparse on a filler other than gaussian, sparse beyond shape[0], a
            non-square or non-4-D bilinear blob).
    """
    fn = FILLERS.get(filler_param.type)
    if fn is None:
        raise CaffeError(f"unknown filler type '{filler_param.type}' "
                         f"(known: {', '.join(sorted(FILLERS))})")
    data = blob.data
    # The random fillers draw straight into a NumPy blob (``out``): no second pass over it.
    direct = (type(data) is numpy.ndarray and data.dtype == f32 and data.flags.c_contiguous
              and data.size > 0)
    values = fn(filler_param, tuple(blob.shape), rng or get_rng(), out=data if direct else None)
    if direct and numpy.may_share_memory(values, data):
        return          # the draws went into the blob itself
    xp = backend.get_array_module(data)
    data[...] = xp.asarray(values)
