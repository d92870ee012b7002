"""Blob <-> BlobProto conversion: the payload of ``.caffemodel``, ``.solverstate`` and means.

Caffe: src/caffe/blob.cpp (Blob::FromProto, Blob::ToProto, Blob::ShapeEquals). A BlobProto
carries its shape either as ``shape.dim`` or, in files from before N-D blobs, as the legacy
``num/channels/height/width`` quadruple, which is matched against the trailing four axes of
the target (so a bias of shape (N,) equals legacy 1 x 1 x 1 x N). Values are float32 ``data``
or float64 ``double_data``.
"""
import numpy

from .. import backend


def _is_legacy(bp):
    return bp.HasField("num") or bp.HasField("channels") or bp.HasField("height") or bp.HasField("width")


def proto_shape(bp, target_shape=None):
    """The shape a BlobProto describes, as a tuple.

    With a legacy 4-D proto and ``target_shape`` given, returns ``target_shape`` when the proto's
    (num, channels, height, width) equals the target padded on the left with 1s to four axes,
    as Caffe's ShapeEquals accepts.
    """
    if _is_legacy(bp):
        legacy = (bp.num, bp.channels, bp.height, bp.width)
        if target_shape is not None and len(target_shape) <= 4:
            padded = (1,) * (4 - len(target_shape)) + tuple(target_shape)
            if padded == legacy:
                return tuple(target_shape)
        return legacy
    return tuple(int(d) for d in bp.shape.dim)


def blob_from_proto(bp):
    """The values of a BlobProto as a float32 NumPy array of its shape (legacy shape if 4-D)."""
    if len(bp.double_data):
        values = numpy.asarray(bp.double_data, dtype=numpy.float64).astype(numpy.float32)
    else:
        values = numpy.asarray(bp.data, dtype=numpy.float32)
    shape = proto_shape(bp)
    count = int(numpy.prod(shape)) if shape else 1
    if values.size != count:
        from ..errors import CaffeError
        raise CaffeError(f"blob proto holds {values.size} values for shape {shape}")
    return values.reshape(shape)


def array_to_proto(array, bp, diff=None):
    """Fill BlobProto ``bp`` with a float32 array's shape and values (and ``diff`` if given)."""
    array = numpy.asarray(array, dtype=numpy.float32)
    bp.Clear()
    bp.shape.dim.extend(int(d) for d in array.shape)
    bp.data.extend(array.ravel().tolist())
    if diff is not None:
        bp.diff.extend(numpy.asarray(diff, dtype=numpy.float32).ravel().tolist())
    return bp


def blob_to_proto(blob, bp, write_diff=False):
    """Serialize a Blob into BlobProto ``bp`` as Caffe's Blob::ToProto (float data, shape)."""
    return array_to_proto(backend.to_numpy(blob.data), bp,
                          backend.to_numpy(blob.diff) if write_diff else None)
