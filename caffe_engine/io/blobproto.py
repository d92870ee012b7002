"""Binary ``BlobProto`` files (``.binaryproto``), e.g. the mean image of a dataset.

Caffe: src/caffe/blob.cpp (``Blob::FromProto`` / ``ToProto``), tools/compute_image_mean.cpp,
src/caffe/util/io.cpp (``ReadProtoFromBinaryFile``).

A BlobProto gives its shape either with the legacy ``num, channels, height, width`` fields (what
``compute_image_mean`` writes) or with ``shape { dim: ... }``; its values are in ``data`` (float) or
``double_data``. :func:`read_blobproto` returns them as a float32 NumPy array of that shape;
:func:`write_blobproto` writes one.
"""
import numpy

from ..errors import CaffeError


def _pb2():
    from ..proto import caffe_pb2
    return caffe_pb2


def blobproto_to_array(proto, what="BlobProto"):
    """A ``caffe_pb2.BlobProto``'s values as a float32 array of its shape.

    Args:
        proto: the BlobProto.
        what: how to name it in errors (e.g. the file path).

    Returns:
        numpy.ndarray, float32, shape ``shape.dim`` when ``shape`` is set, else the legacy
        ``(num, channels, height, width)``.

    Raises:
        CaffeError: the number of values does not match the shape.
    """
    if proto.HasField("shape"):
        shape = tuple(int(d) for d in proto.shape.dim)
    else:
        shape = (proto.num, proto.channels, proto.height, proto.width)
    count = int(numpy.prod(shape, dtype=numpy.int64))
    if len(proto.double_data) and not len(proto.data):
        values = numpy.asarray(proto.double_data, dtype=numpy.float64).astype(numpy.float32)
    else:
        values = numpy.asarray(proto.data, dtype=numpy.float32)
    if values.size != count:
        raise CaffeError(f"{what}: holds {values.size} values but its shape {shape} needs {count}")
    return values.reshape(shape)


def array_to_blobproto(array, legacy=None):
    """A BlobProto holding ``array`` (float32 values in ``data``).

    Args:
        array: array-like of up to 4 axes for the legacy fields, any number otherwise.
        legacy: write ``num/channels/height/width`` (shape padded to 4 axes with leading 1s, as
            ``compute_image_mean`` does) instead of ``shape``. ``None``: legacy when the array has
            at most 4 axes.

    Raises:
        CaffeError: ``legacy`` requested for an array of more than 4 axes.
    """
    array = numpy.asarray(array, dtype=numpy.float32)
    if legacy is None:
        legacy = array.ndim <= 4
    proto = _pb2().BlobProto()
    if legacy:
        if array.ndim > 4:
            raise CaffeError(f"a legacy BlobProto holds at most 4 axes, got shape {array.shape}")
        num, channels, height, width = (1,) * (4 - array.ndim) + array.shape
        proto.num, proto.channels, proto.height, proto.width = num, channels, height, width
    else:
        proto.shape.dim.extend(int(d) for d in array.shape)
    proto.data.extend(array.ravel().tolist())
    return proto


def read_blobproto(path):
    """Read a ``.binaryproto`` file into a float32 array (see :func:`blobproto_to_array`).

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
    return blobproto_to_array(proto, what=f"BlobProto file '{path}'")


def write_blobproto(path, array, legacy=None):
    """Write ``array`` as a binary BlobProto to ``path`` (see :func:`array_to_blobproto`).

    Raises:
        CaffeError: the file cannot be written.
    """
    path = str(path)
    data = array_to_blobproto(array, legacy=legacy).SerializeToString()
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as exc:
        raise CaffeError(f"cannot write BlobProto file '{path}': {exc.strerror or exc}") from None
