"""Parameter fillers, drawing from Caffe's global random stream in Caffe's order.

Caffe: include/caffe/filler.hpp. Each filler writes a float32 array of the blob's shape and
draws, in order, exactly the words Caffe's would (see ``rng``). Fan-in and fan-out follow
Caffe: ``fan_in = count / shape[0]``, ``fan_out = count / shape[1]`` (``count`` for 1-D blobs).
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


def _constant(param, shape, rng):
    return numpy.full(shape, f32(param.value), f32)


def _uniform(param, shape, rng):
    return rng.uniform(int(numpy.prod(shape)), param.min, param.max).reshape(shape)


def _gaussian(param, shape, rng):
    count = int(numpy.prod(shape))
    values = rng.gaussian(count, param.mean, param.std)
    if param.sparse >= 0:
        if not shape:
            raise CaffeError("gaussian filler with sparse needs a blob with at least one axis")
        p = f32(param.sparse) / f32(shape[0])
        values = values * rng.bernoulli(count, float(p)).astype(f32)
    return values.reshape(shape)


def _positive_unitball(param, shape, rng):
    count = int(numpy.prod(shape))
    values = rng.uniform(count, 0.0, 1.0)
    rows = values.reshape(shape[0] if shape else 1, -1)
    rows /= rows.sum(axis=1, dtype=f32, keepdims=True)
    return rows.reshape(shape)


def _xavier(param, shape, rng):
    scale = f32(math.sqrt(f32(3.0) / _norm_n(param, shape)))
    return rng.uniform(int(numpy.prod(shape)), -scale, scale).reshape(shape)


def _msra(param, shape, rng):
    std = f32(math.sqrt(f32(2.0) / _norm_n(param, shape)))
    return rng.gaussian(int(numpy.prod(shape)), 0.0, std).reshape(shape)


def _bilinear(param, shape, rng):
    if len(shape) != 4 or shape[2] != shape[3]:
        raise CaffeError(f"bilinear filler needs a 4-D blob with square kernels, got {shape}")
    width = shape[3]
    f = math.ceil(width / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    idx = numpy.arange(int(numpy.prod(shape)))
    x = idx % width
    y = (idx // width) % shape[2]
    values = (1 - numpy.abs(x / f - c)) * (1 - numpy.abs(y / f - c))
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
        blob: a Blob of any shape.
        filler_param: caffe_pb2.FillerParameter (type default "constant").
        rng: a CaffeRNG (default: the process-wide stream).

    Raises:
        CaffeError: unknown filler type.
    """
    fn = FILLERS.get(filler_param.type)
    if fn is None:
        raise CaffeError(f"unknown filler type '{filler_param.type}' (known: {', '.join(sorted(FILLERS))})")
    values = fn(filler_param, tuple(blob.shape), rng or get_rng())
    xp = backend.get_array_module(blob.data)
    blob.data[...] = xp.asarray(values)
