"""How the coordinates of one NetSpec top map onto another's (pycaffe's ``caffe.coord_map``).

Caffe: python/caffe/coord_map.py, written for the fully convolutional nets (FCN), whose
upsampled score maps are cropped back onto the input with :func:`crop`.

A map is a triple ``(axis, a, b)``: output coordinate ``y`` of a layer relates to input
coordinate ``x`` by ``x = a * y + b`` (per spatial axis from ``axis`` on; ``a`` and ``b`` are
NumPy arrays or scalars). ``axis`` None means "any axis": the identity of pointwise layers,
``(None, 1, 0)``. A convolution or pooling window of extent ``k`` (dilation included), stride
``s`` and pad ``p`` maps ``y`` to the window's centre, ``x = s*y - p + (k-1)/2``; stored, as
Caffe's tool does, as the map from the bottom to the top: ``(axis, 1/s, (p - (k-1)/2) / s)``.
"""
import numpy

from .net_spec import layers as _layers

PASS_THROUGH_LAYERS = ("AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU",
                       "Log", "LRN", "Exp", "MVN", "Power", "ReLU", "PReLU", "Scale",
                       "Sigmoid", "Split", "TanH", "Threshold")


class UndefinedMapException(Exception):
    """The layer type has no coordinate map (e.g. InnerProduct, Concat over channels)."""


class AxisMismatchException(Exception):
    """Two maps act on different first axes and cannot be composed."""


class CropError(AssertionError, ValueError):
    """What pycaffe's tool refuses with ``assert``: legacy ``_h``/``_w`` fields, or a crop that
    would scale, or take a negative or fractional offset.

    An AssertionError, as pycaffe raises (its tests catch that), raised explicitly so that
    ``python -O`` keeps the check; also a ValueError, as the engine raised before.
    """


def _vector(value):
    return numpy.array(value, ndmin=1)


def conv_params(fn):
    """``(axis, stride, extent, pad)`` of a Convolution, Deconvolution, Im2col or Pooling
    NetSpec function ``fn``; ``extent`` is the dilated kernel size ``(k - 1) * dilation + 1``.

    Parameters come from ``convolution_param=dict(...)`` / ``pooling_param=dict(...)`` or from
    the flat keyword arguments NetSpec files under them.

    Raises:
        CropError: the layer uses the legacy ``kernel_h``/``stride_w``/``pad_h`` ... fields,
            which (as in Caffe's tool) cropping does not support.
    """
    params = fn.params.get("convolution_param", fn.params.get("pooling_param", fn.params))
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(params)
    if legacy:
        raise CropError(f"cropping does not support legacy _h/_w params ({fn.type_name} uses "
                        f"{', '.join(sorted(legacy))})")
    extent = (_vector(params["kernel_size"]) - 1) * _vector(params.get("dilation", 1)) + 1
    return (params.get("axis", 1), _vector(params.get("stride", 1)), extent,
            _vector(params.get("pad", 0)))


def crop_params(fn):
    """``(axis, offset)`` of a Crop NetSpec function, with Caffe's defaults (axis 2, offset 0)."""
    params = fn.params.get("crop_param", fn.params)
    return params.get("axis", 2), _vector(params.get("offset", 0))


def coord_map(fn):
    """The map ``(axis, a, b)`` from the bottom of NetSpec function ``fn`` to its top.

    Raises:
        UndefinedMapException: a layer type without a spatial map.
    """
    kind = fn.type_name
    if kind in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = conv_params(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if kind == "Deconvolution":
        axis, stride, extent, pad = conv_params(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if kind in PASS_THROUGH_LAYERS:
        return None, 1, 0
    if kind == "Crop":
        axis, offset = crop_params(fn)
        # A Crop's axis is its first cropped axis; a convolution's is the channel axis just
        # before its spatial ones: one less, so that the two maps compose.
        return axis - 1, 1, -offset
    raise UndefinedMapException(f"no coordinate map for a {kind} layer")


def compose(base_map, next_map):
    """The map of ``next_map`` applied after ``base_map``: scales multiply, and the further
    shift is scaled by the base's scale.

    Raises:
        AxisMismatchException: both maps name an axis and the axes differ.
    """
    ax1, a1, b1 = base_map
    ax2, a2, b2 = next_map
    if ax1 is not None and ax2 is not None and ax1 != ax2:
        raise AxisMismatchException(f"cannot compose maps on axes {ax1} and {ax2}")
    return (ax2 if ax1 is None else ax1), a1 * a2, a1 * b2 + b1


def inverse(coord_map):
    """The map back: ``(axis, 1/a, -b/a)``."""
    axis, a, b = coord_map
    return axis, 1 / a, -b / a


def _mappable_bottoms(top):
    """The bottoms whose coordinates ``top`` depends on: all of them, except that a Crop's
    second bottom only gives the output size."""
    inputs = top.fn.inputs
    return inputs[:1] if top.fn.type_name == "Crop" else inputs


def _maps_to_ancestors(top):
    """{ancestor top: map from that ancestor to ``top``} through layers with a defined map."""
    maps = {top: (None, 1, 0)}
    frontier = [top]
    while frontier:
        current = frontier.pop()
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _mappable_bottoms(current):
            maps[bottom] = compose(maps[current], step)
            frontier.append(bottom)
    return maps


def coord_map_from_to(top_from, top_to):
    """The map from ``top_from``'s coordinates to ``top_to``'s, through their nearest common
    ancestor (both walked back through layers with a defined map).

    Raises:
        RuntimeError: the two tops share no ancestor through spatial layers (pycaffe's error).
    """
    from_maps = _maps_to_ancestors(top_from)
    to_maps = {top_to: (None, 1, 0)}
    frontier = [top_to]
    while frontier:
        current = frontier.pop()
        if current in from_maps:
            return compose(to_maps[current], inverse(from_maps[current]))
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _mappable_bottoms(current):
            to_maps[bottom] = compose(to_maps[current], step)
            frontier.append(bottom)
    raise RuntimeError("Could not compute map between tops; are they connected by spatial layers?")


def crop(top_from, top_to):
    """A NetSpec Crop layer cutting ``top_from`` to ``top_to``'s extent and alignment (FCN's).

    Returns:
        the Crop layer's top, with ``crop_param { axis offset... }`` from the map between them
        (``axis`` the first spatial axis: the maps' channel axis + 1).

    Raises:
        CropError: the map scales (a != 1), or would crop at a negative or fractional offset
            (pycaffe's messages).
    """
    axis, a, b = coord_map_from_to(top_from, top_to)
    a, b = numpy.asarray(a), numpy.asarray(b)
    if not (a == 1).all():
        raise CropError(f"scale mismatch on crop (a = {a})")
    if not (b <= 0).all():
        raise CropError(f"cannot crop negative offset (b = {b})")
    if not (numpy.round(b) == b).all():
        raise CropError(f"cannot crop noninteger offset (b = {b})")
    offsets = [int(v) for v in numpy.ravel(-numpy.round(b))]
    return _layers.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=offsets))
