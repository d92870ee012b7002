"""The BlobProto codec: arrays and blobs to and from ``caffe_pb2.BlobProto``, and binary
``.binaryproto`` files (e.g. the mean image of a dataset). The one home of these rules;
``.caffemodel`` and ``.solverstate`` readers, pycaffe's ``caffe.io`` and the tools use it.

Caffe: src/caffe/blob.cpp (``Blob::FromProto``, ``Blob::ToProto``, ``Blob::ShapeEquals``),
tools/compute_image_mean.cpp, src/caffe/util/io.cpp (``ReadProtoFromBinaryFile``).

Caffe's rules, as :func:`proto_to_array` applies them:

- the shape is the legacy ``(num, channels, height, width)`` when any of those four fields is
  set (files from before N-D blobs, and what ``compute_image_mean`` writes), else
  ``shape.dim``; against a target shape, legacy 1 x 1 x 1 x N equals (N,) (the target padded
  on the left with 1s to four axes, :func:`proto_shape`);
- the values are ``double_data`` when it has any, else ``data`` (likewise ``double_diff`` /
  ``diff``), and their count must be the shape's.
"""
import os

import numpy

from .. import backend
from ..errors import CaffeError

LEGACY_FIELDS = ("num", "channels", "height", "width")


class BlobProtoCountError(CaffeError, ValueError):
    """A BlobProto's number of values does not fit its shape (e.g. values and no shape at
    all); also a ValueError, which pycaffe's ``caffe.io.blobproto_to_array`` raises there (its
    NumPy reshape fails)."""


def _pb2():
    from ..proto import caffe_pb2
    return caffe_pb2


def is_legacy(proto):
    """Whether a BlobProto gives its shape with the legacy 4-D fields."""
    return any(proto.HasField(f) for f in LEGACY_FIELDS)


def proto_shape(proto, target_shape=None):
    """The shape a BlobProto describes, as a tuple of ints.

    With a legacy 4-D proto and ``target_shape`` given, returns ``target_shape`` when the proto's
    (num, channels, height, width) equals the target padded on the left with 1s to four axes,
    as Caffe's ShapeEquals accepts.
    """
    if is_legacy(proto):
        legacy = (proto.num, proto.channels, proto.height, proto.width)
        if target_shape is not None and len(target_shape) <= 4:
            if (1,) * (4 - len(target_shape)) + tuple(target_shape) == legacy:
                return tuple(target_shape)
        return legacy
    return tuple(int(d) for d in proto.shape.dim)


def proto_to_array(proto, diff=False, dtype=numpy.float32, what="BlobProto"):
    """A BlobProto's values (``diff``: its gradient) as an array of its shape.

    Args:
        proto: a ``caffe_pb2.BlobProto``.
        diff: read ``double_diff`` / ``diff`` instead of the data.
        dtype: the array's dtype (float32 as Caffe's blobs; pycaffe's ``caffe.io`` gives float64).
        what: how errors name the proto (e.g. its file and layer).

    Returns:
        numpy.ndarray of :func:`proto_shape` (legacy shapes keep their four axes).

    Raises:
        BlobProtoCountError: the number of values does not match the shape (a proto with no
            shape fields at all describes a scalar: one value).
    """
    doubles, floats = (proto.double_diff, proto.diff) if diff else (proto.double_data, proto.data)
    if len(doubles):
        values = numpy.asarray(doubles, dtype=numpy.float64)
    else:
        values = numpy.asarray(floats, dtype=numpy.float32)
    shape = proto_shape(proto)
    count = int(numpy.prod(shape, dtype=numpy.int64)) if shape else 1
    if values.size != count:
        raise BlobProtoCountError(f"{what}: holds {values.size} values but its shape {shape} "
                                  f"needs {count}")
    return values.astype(dtype, copy=False).reshape(shape)


def array_to_proto(array, proto=None, diff=None, legacy=False):
    """Fill a BlobProto (a new one when ``proto`` is None) with ``array``'s shape and float32
    values, and ``diff``'s when given (Caffe's Blob::ToProto).

    Args:
        legacy: write the ``num/channels/height/width`` fields (the shape padded with leading
            1s to four axes, as ``compute_image_mean`` does) instead of ``shape.dim``.

    Returns:
        the BlobProto.

    Raises:
        CaffeError: ``legacy`` for an array of more than 4 axes.
    """
    array = numpy.asarray(array, dtype=numpy.float32)
    if proto is None:
        proto = _pb2().BlobProto()
    else:
        proto.Clear()
    if legacy:
        if array.ndim > 4:
            raise CaffeError(f"a legacy BlobProto holds at most 4 axes, got shape {array.shape}")
        proto.num, proto.channels, proto.height, proto.width = (1,) * (4 - array.ndim) + array.shape
    else:
        proto.shape.dim.extend(int(d) for d in array.shape)
    fields = [(_DATA_TAG, array)]
    if diff is not None:
        fields.append((_DIFF_TAG, numpy.asarray(diff, dtype=numpy.float32)))
    # The values go in as wire bytes, parsed by protobuf's C code, rather than one Python float
    # per element (10x faster; the same message, the same serialization).
    proto.MergeFromString(_packed_floats(fields))
    return proto


#: Wire tags of BlobProto's packed ``data`` (field 5) and ``diff`` (field 6): (field << 3) | 2.
_DATA_TAG, _DIFF_TAG = b"\x2a", b"\x32"


def _varint(n):
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _packed_floats(fields):
    """Protobuf's wire bytes of packed ``repeated float`` fields: ``fields`` is a list of
    (tag, array), each array's values written as little-endian float32 after its tag and length
    (an empty array writes nothing, as protobuf does). One buffer, the values copied once."""
    heads = [tag + _varint(4 * a.size) if a.size else b"" for tag, a in fields]
    wire = numpy.empty(sum(len(h) + 4 * a.size for h, (_, a) in zip(heads, fields)), numpy.uint8)
    at = 0
    for head, (_, a) in zip(heads, fields):
        wire[at:at + len(head)] = numpy.frombuffer(head, numpy.uint8)
        at += len(head)
        wire[at:at + 4 * a.size].view("<f4").reshape(a.shape)[...] = a
        at += 4 * a.size
    return memoryview(wire)


def blob_to_proto(blob, proto, write_diff=False):
    """Serialize a Blob into BlobProto ``proto`` as Caffe's Blob::ToProto (shape, float data)."""
    return array_to_proto(backend.to_numpy(blob.data), proto,
                          backend.to_numpy(blob.diff) if write_diff else None)


def read_blobproto(path):
    """Read a ``.binaryproto`` file into a float32 array (see :func:`proto_to_array`).

    Raises:
        CaffeError: the file is missing, unreadable, not a BlobProto, or inconsistent.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CaffeError(f"cannot read BlobProto file '{path}': {exc.strerror or exc}") from None
    proto = _pb2().BlobProto()
    try:
        proto.ParseFromString(raw)
    except Exception:  # google.protobuf.message.DecodeError and friends
        raise CaffeError(f"'{path}' is not a binary BlobProto") from None
    return proto_to_array(proto, what=f"BlobProto file '{path}'")


def write_blobproto(path, array, legacy=None):
    """Write ``array`` as a binary BlobProto to ``path``, atomically.

    Args:
        legacy: see :func:`array_to_proto`; None: legacy when the array has at most 4 axes
            (what Caffe's compute_image_mean writes).

    Raises:
        CaffeError: the file cannot be written, or ``legacy`` for more than 4 axes.
    """
    path = str(path)
    array = numpy.asarray(array, dtype=numpy.float32)
    data = array_to_proto(array, legacy=array.ndim <= 4 if legacy is None else legacy)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data.SerializeToString())
        os.replace(tmp, path)
    except OSError as exc:
        raise CaffeError(f"cannot write BlobProto file '{path}': {exc.strerror or exc}") from None
