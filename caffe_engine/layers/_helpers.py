"""Helpers that several layer families share; no layers.

``_axis``: an axis made canonical, with errors naming the layer (concat_slice, shape,
reduction, eltwise). ``_share_whole``: a top sharing a whole blob's data and diff (concat_slice,
endpoints). (Checks of input values, raised at once on the CPU and deferred on the device:
``backend.check_values``.)

Caffe: include/caffe/blob.hpp (``CanonicalAxisIndex``, ``ShareData``, ``ShareDiff``).
"""


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
