"""Helpers that several layer families share; no layers.

``_axis``: an axis made canonical, with errors naming the layer (concat_slice, shape,
reduction, eltwise). ``_share_whole``: a top sharing a whole blob's data and diff (concat_slice,
endpoints). ``_check_values``: a check of input values (labels, indices) that raises at once
on the CPU and is deferred on the device (loss layers, Accuracy, BatchReindex, Embed).

Caffe: include/caffe/blob.hpp (``CanonicalAxisIndex``, ``ShareData``, ``ShareDiff``).
"""
from .. import backend
from ..backend import get_array_module


def _axis(layer, blob, axis):
    """``blob.canonical_axis(axis)`` with a CaffeError naming the layer."""
    try:
        return blob.canonical_axis(axis)
    except IndexError as exc:
        raise layer.error(str(exc)) from None


def _share_whole(top, bottom):
    """``top`` shares ``bottom``'s data and diff arrays (one-bottom Concat, one-top Slice)."""
    top.share_data(bottom)
    top.share_diff(bottom)


def _check_values(key, bad, values, make_error):
    """Raise ``make_error(v)`` for the first ``values`` element ``v`` (C order) where ``bad``.

    Off the device (:func:`caffe_engine.backend.on_device` False: NumPy) the check is
    immediate, as Caffe's CPU ``CHECK``s. On the device nothing is read: the flag and the first
    bad value are computed there and handed to :func:`caffe_engine.backend.defer_check` under
    ``key``, to be raised at the next display, test or pycaffe forward
    (:func:`caffe_engine.backend.raise_deferred`); Caffe's GPU kernels do not check at all.

    Args:
        key: the deferred check's key (the layer, or (layer, what) for a second check).
        bad: bool array; values: array of the same size; make_error: value -> CaffeError.
    """
    if bad.size == 0:
        return
    if not backend.on_device(bad):
        if bad.any():
            raise make_error(values[bad.reshape(values.shape)].ravel()[0])
        return
    xp = get_array_module(bad)
    flat = bad.ravel()
    first = xp.take(values.ravel(), xp.argmax(flat.astype(xp.int8)))
    backend.defer_check(key, flat.any(), first, make_error)
