"""NumPy arrays to and from Caffe's protobuf records: pycaffe's ``caffe.io`` conversion half.

Caffe: python/caffe/io.py (``blobproto_to_array``, ``array_to_blobproto``,
``arraylist_to_blobprotovector_str``, ``blobprotovector_str_to_arraylist``, ``array_to_datum``,
``datum_to_array``).

Same values, dtypes and shapes as pycaffe: values read from float fields come back as float64
arrays (pycaffe builds them from Python floats), bytes of a Datum as uint8. The BlobProto
rules are the codec's, :mod:`caffe_engine.io.blobproto`.
"""
import numpy

from ..errors import CaffeError
from .blobproto import array_to_proto, proto_to_array


def _pb2():
    from ..proto import caffe_pb2
    return caffe_pb2


def blobproto_to_array(blob, return_diff=False):
    """A ``BlobProto``'s ``data`` (or ``diff``) as a float64 array of its shape, by the
    codec's rules (:func:`caffe_engine.io.blobproto.proto_to_array`: the legacy 4-D shape when
    any of its fields is set, else ``shape.dim``; neither: a scalar).

    Raises:
        BlobProtoCountError: the number of values does not fit the shape; a CaffeError, and
            the ValueError pycaffe raises there.
    """
    return proto_to_array(blob, diff=return_diff, dtype=numpy.float64)


def array_to_blobproto(arr, diff=None):
    """A ``BlobProto`` with ``shape.dim`` = ``arr.shape`` and the values of ``arr`` (and ``diff``)."""
    return array_to_proto(arr, diff=diff)


def arraylist_to_blobprotovector_str(arraylist):
    """Serialize a list of arrays as a ``BlobProtoVector`` (bytes)."""
    vec = _pb2().BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(arr) for arr in arraylist])
    return vec.SerializeToString()


#: pycaffe's older, misspelt name.
arraylist_to_blobprotovecor_str = arraylist_to_blobprotovector_str


def blobprotovector_str_to_arraylist(data):
    """The arrays of a serialized ``BlobProtoVector``."""
    vec = _pb2().BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None):
    """A ``Datum`` from a (C, H, W) array: uint8 arrays go to ``data`` (bytes), others to
    ``float_data``; ``label`` is set when given.

    Raises:
        CaffeError: the array is not 3-D.
    """
    arr = numpy.asarray(arr)
    if arr.ndim != 3:
        raise CaffeError(f"Incorrect array shape: a Datum holds (C, H, W), got {arr.shape}")
    datum = _pb2().Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == numpy.uint8:
        datum.data = arr.tobytes()
    else:
        datum.float_data.extend(arr.astype(float).flat)
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum):
    """A ``Datum``'s pixels as (C, H, W): uint8 from ``data``, float64 from ``float_data``.
    The label is ``datum.label``. Encoded (JPEG/PNG) records: decode with
    :func:`decode_datum` first.

    Raises:
        CaffeError: the value count does not fit ``channels x height x width``.
    """
    shape = (datum.channels, datum.height, datum.width)
    if len(datum.data):
        values = numpy.frombuffer(datum.data, dtype=numpy.uint8)
    else:
        values = numpy.array(datum.float_data, dtype=numpy.float64)
    if values.size != int(numpy.prod(shape, dtype=numpy.int64)):
        raise CaffeError(f"Datum holds {values.size} values, which do not fit its shape {shape}")
    return values.reshape(shape)


def decode_datum(datum, is_color=None):
    """An encoded Datum (``encoded: true``, JPEG/PNG bytes) as a plain uint8 one, decoded by
    OpenCV as Caffe's ``DecodeDatumNative`` (``is_color`` None: the file's own channels) or
    ``DecodeDatum(datum, is_color)`` (forced colour or grey). Channels are BGR(A), as OpenCV
    decodes them for Caffe. A plain Datum is returned as is. (An engine addition: pycaffe's
    ``caffe.io`` has no decoder; its ``datum_to_array`` reads raw records only, as here.)

    Raises:
        CaffeError: the bytes cannot be decoded, or decode to more than 8 bits per sample.
    """
    if not datum.encoded:
        return datum
    from .images import decode_image, image_to_chw
    mode = "native" if is_color is None else "color" if is_color else "gray"
    image = decode_image(datum.data, mode)
    if image is None:
        raise CaffeError("cannot decode an encoded Datum: not a readable image")
    if image.dtype != numpy.uint8:
        raise CaffeError(f"cannot decode an encoded Datum to bytes: its samples are {image.dtype}")
    chw = image_to_chw(image)
    out = _pb2().Datum()
    out.channels, out.height, out.width = (int(d) for d in chw.shape)
    out.data = numpy.ascontiguousarray(chw).tobytes()
    out.label = datum.label
    return out
