"""Reading and writing Caffe's files, and pycaffe's ``caffe.io`` helpers.

The file modules are imported where they are used (``from caffe_engine.io import lmdb_source``),
so importing this package costs little and needs neither ``lmdb`` nor a parsed schema. What
pycaffe scripts call as ``caffe.io.<name>`` is exported here: :class:`Transformer`,
:func:`load_image`, :func:`resize_image`, :func:`oversample` (from ``preprocessing``) and the
array/protobuf conversions (from ``arrays``).
"""
from .arrays import (array_to_blobproto, array_to_datum, arraylist_to_blobprotovecor_str,  # noqa: F401
                     arraylist_to_blobprotovector_str, blobproto_to_array,
                     blobprotovector_str_to_arraylist, datum_to_array, decode_datum)
from .preprocessing import Transformer, load_image, oversample, resize_image  # noqa: F401
