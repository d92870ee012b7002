"""Image files decoded and resized as OpenCV does for Caffe (the one home of image reading:
the ImageData and WindowData layers, encoded Datum records, convert_imageset).

Caffe: src/caffe/util/io.cpp (``ReadImageToCVMat``, ``DecodeDatumToCVMat``), OpenCV's
``imread`` and ``cv::resize(..., INTER_LINEAR)``.

Images are decoded with Pillow into what OpenCV's ``imread`` gives Caffe: uint8 (H, W, 3) in
**BGR** order for colour, (H, W) for grey. Resizing reproduces OpenCV's fixed-point
INTER_LINEAR on 8-bit images (:func:`cv_resize_linear`). The known differences from
OpenCV-based Caffe are listed in :mod:`caffe_engine.layers.image_data`.
"""
import numpy

from ..errors import CaffeError

_COEF_BITS = 11                    # OpenCV's INTER_RESIZE_COEF_BITS
_COEF_SCALE = 1 << _COEF_BITS      # 2048


def read_image(path, is_color=True, error=CaffeError):
    """Decode an image file as OpenCV's ``imread`` does for Caffe.

    Args:
        path: the file.
        is_color: True: (H, W, 3) uint8 in BGR order (grey files are replicated, alpha dropped);
            False: (H, W) uint8 grey.
        error: callable turning a message into the exception to raise.

    Raises:
        the ``error`` exception: the file cannot be opened or decoded.
    """
    from PIL import Image
    try:
        with Image.open(path) as img:
            fmt = img.format
            if not is_color and fmt == "JPEG":
                img.draft("L", img.size)  # libjpeg's own grey output, as OpenCV asks for
            if is_color or img.mode not in ("L", "LA", "1"):
                img = img.convert("RGB")
            else:
                img = img.convert("L")
            array = numpy.asarray(img, dtype=numpy.uint8)
    except (OSError, ValueError, SyntaxError) as exc:
        raise error(f"could not open or find file {path} ({exc})") from None
    if is_color:
        return numpy.ascontiguousarray(array[:, :, ::-1])  # RGB -> BGR, as OpenCV
    if array.ndim == 3:
        array = _grey(array, fmt)
    return numpy.ascontiguousarray(array)


def _grey(rgb, fmt):
    """Colour -> grey as OpenCV's imread does: libpng's truncating 15-bit luma for PNG,
    ``cvtColor(BGR2GRAY)``'s rounded 14-bit luma for other formats."""
    r, g, b = (rgb[:, :, i].astype(numpy.int32) for i in range(3))
    if fmt == "PNG":
        grey = (r * 9797 + g * 19234 + b * 3737) >> 15
    else:
        grey = (r * 4899 + g * 9617 + b * 1868 + 8192) >> 14
    return grey.astype(numpy.uint8)


def _linear_taps(src_size, dst_size, vertical=False):
    """OpenCV's INTER_LINEAR source indices and fixed-point weights along one axis.

    Horizontally OpenCV moves an out-of-range tap onto the edge with weight (1, 0); vertically it
    keeps the weights and clips the two row indices (so both may name the edge row).

    Returns:
        (i0, i1, w0, w1): int arrays of shape (dst_size,); the output sample ``d`` is
        ``w0[d] * src[i0[d]] + w1[d] * src[i1[d]]`` in units of 1/2048.
    """
    scale = 1.0 / (dst_size / src_size)                   # OpenCV: 1./inv_scale
    d = numpy.arange(dst_size, dtype=numpy.float64)
    f = ((d + 0.5) * scale - 0.5).astype(numpy.float32)
    s = numpy.floor(f).astype(numpy.int64)
    f = (f - s.astype(numpy.float32)).astype(numpy.float32)
    if not vertical:
        low = s < 0
        f[low], s[low] = 0, 0
        high = s >= src_size - 1
        f[high], s[high] = 0, src_size - 1
    w1 = numpy.rint(f * numpy.float32(_COEF_SCALE)).astype(numpy.int64)   # round half even
    w0 = numpy.rint((numpy.float32(1) - f) * numpy.float32(_COEF_SCALE)).astype(numpy.int64)
    return (numpy.clip(s, 0, src_size - 1), numpy.clip(s + 1, 0, src_size - 1), w0, w1)


def cv_resize_linear(image, height, width):
    """Resize a uint8 (H, W) or (H, W, C) image as ``cv::resize(..., INTER_LINEAR)`` does.

    Same size: a copy. An exact 2x reduction on both axes: OpenCV's area average,
    ``(a + b + c + d + 2) >> 2``. Otherwise OpenCV's fixed-point bilinear interpolation: source
    positions ``(d + 0.5) * scale - 0.5`` in float32, 11-bit weights rounded half to even,
    horizontal taps summed exactly in integers, then the vertical pass rounded as OpenCV's SIMD
    code does, ``(((w0 * (r0 >> 4)) >> 16) + ((w1 * (r1 >> 4)) >> 16) + 2) >> 2``.

    Args:
        image: numpy uint8 array (H, W) or (H, W, C).
        height, width: the output size (positive).

    Returns:
        uint8 array (height, width[, C]).
    """
    image = numpy.asarray(image, dtype=numpy.uint8)
    src_h, src_w = image.shape[:2]
    if (src_h, src_w) == (height, width):
        return image.copy()
    if src_h == 2 * height and src_w == 2 * width:
        total = (image[0::2, 0::2].astype(numpy.int32) + image[0::2, 1::2]
                 + image[1::2, 0::2] + image[1::2, 1::2])
        return ((total + 2) >> 2).astype(numpy.uint8)
    x0, x1, a0, a1 = _linear_taps(src_w, width)
    y0, y1, b0, b1 = _linear_taps(src_h, height, vertical=True)
    src = image.astype(numpy.int64)
    extra = (slice(None),) * (image.ndim - 2)
    wshape = (1, width) + (1,) * (image.ndim - 2)
    rows = src[:, x0] * a0.reshape(wshape) + src[:, x1] * a1.reshape(wshape)  # (H, width, ...)
    hshape = (height,) + (1,) * (image.ndim - 1)
    r0 = rows[(y0,) + extra] >> 4
    r1 = rows[(y1,) + extra] >> 4
    out = (((b0.reshape(hshape) * r0) >> 16) + ((b1.reshape(hshape) * r1) >> 16) + 2) >> 2
    return numpy.clip(out, 0, 255).astype(numpy.uint8)


def read_image_resized(path, new_height=0, new_width=0, is_color=True, error=CaffeError):
    """Caffe's ``ReadImageToCVMat(path, new_height, new_width, is_color)``: decode, then resize
    when both sizes are positive."""
    image = read_image(path, is_color, error)
    if new_height > 0 and new_width > 0:
        image = cv_resize_linear(image, new_height, new_width)
    return image


def image_to_chw(image):
    """A decoded (H, W[, C]) uint8 image as a (C, H, W) array (what the transformer takes)."""
    if image.ndim == 2:
        return image[None]
    return numpy.ascontiguousarray(image.transpose(2, 0, 1))
