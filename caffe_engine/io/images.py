"""Images decoded and resized by OpenCV, as Caffe does: the one home of image reading (the
ImageData and WindowData layers, encoded Datum records, convert_imageset, compute_image_mean).

Caffe: src/caffe/util/io.cpp (``ReadImageToCVMat``, ``DecodeDatumToCVMat``,
``DecodeDatumToCVMatNative``), which call OpenCV's ``cv::imread`` / ``cv::imdecode`` and
``cv::resize(..., INTER_LINEAR)``. This module calls the same functions through OpenCV's Python
wheel (``cv2``), so the pixels are OpenCV's own, bit for bit.

Three decode modes, OpenCV's read flags:

* ``"color"`` (``IMREAD_COLOR``): uint8 (H, W, 3), **BGR**; grey files replicated, alpha dropped,
  the EXIF orientation applied.
* ``"gray"`` (``IMREAD_GRAYSCALE``): uint8 (H, W); colour JPEGs take libjpeg's own luma output,
  other formats OpenCV's conversion; the EXIF orientation applied.
* ``"native"`` (``IMREAD_UNCHANGED``, Caffe's ``imdecode(..., -1)``): the file's own channels
  (grey (H, W); BGR (H, W, 3); BGRA (H, W, 4) for RGBA, grey+alpha and palette images with
  transparency), its own depth (a 16-bit PNG stays uint16, which the data transformer refuses
  as Caffe does), no EXIF rotation.

Why OpenCV and not Pillow (measured, ``docs/data.md``): both wrap libjpeg-turbo and gave the
same JPEG pixels here, but OpenCV is what Caffe calls, so its grey conversions, native channel
counts and EXIF handling are Caffe's by construction (Pillow needs each re-implemented), and its
decode was the faster of the two. Both release the GIL while decoding.
"""
import numpy

from ..errors import CaffeError

#: The decode modes and OpenCV's read flag for each (``cv::IMREAD_*``).
MODES = {"color": 1, "gray": 0, "native": -1}


def _cv2():
    try:
        import cv2
    except ImportError as exc:  # a broken install: cv2 is a dependency of the package
        raise CaffeError(f"decoding images needs OpenCV (pip install opencv-python-headless): "
                         f"{exc}") from None
    return cv2


def decode_image(data, mode="color"):
    """Decode an encoded image (JPEG, PNG, BMP, ...) held in memory, as ``cv::imdecode``.

    Args:
        data: the file's bytes (bytes, bytearray, memoryview or uint8 array).
        mode: "color", "gray" or "native" (see the module docstring).

    Returns:
        numpy array (H, W) or (H, W, C), uint8 (uint16 for a 16-bit file in native mode),
        channels in BGR(A) order; or None when the bytes are not a decodable image (as
        OpenCV's empty ``Mat``).
    """
    buf = numpy.frombuffer(data, numpy.uint8) if not isinstance(data, numpy.ndarray) else data
    if buf.size == 0:
        return None
    return _cv2().imdecode(buf, MODES[mode])


def read_image(path, is_color=True, error=CaffeError):
    """Decode an image file as Caffe's ``cv::imread(path, is_color ? IMREAD_COLOR :
    IMREAD_GRAYSCALE)``.

    Args:
        path: the file.
        is_color: True: (H, W, 3) uint8 BGR; False: (H, W) uint8 grey.
        error: callable turning a message into the exception to raise.

    Raises:
        the ``error`` exception: the file cannot be opened or decoded (Caffe's "Could not open
        or find file").
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise error(f"could not open or find file {path} ({exc.strerror})") from None
    image = decode_image(data, "color" if is_color else "gray")
    if image is None:
        raise error(f"could not open or find file {path} (not a decodable image)")
    return image


def cv_resize_linear(image, height, width):
    """Resize a uint8 (H, W) or (H, W, C) image with ``cv::resize(..., INTER_LINEAR)``, what
    Caffe's ``ReadImageToCVMat`` and WindowData call.

    Args:
        image: numpy uint8 array (H, W) or (H, W, C) (any strides).
        height, width: the output size (positive).

    Returns:
        uint8 array (height, width[, C]) (C kept, 1 included).
    """
    image = numpy.asarray(image, dtype=numpy.uint8)
    out = _cv2().resize(numpy.ascontiguousarray(image), (int(width), int(height)),
                        interpolation=_cv2().INTER_LINEAR)
    if image.ndim == 3 and out.ndim == 2:   # OpenCV drops a single channel's axis
        out = out[:, :, None]
    return out


def read_image_resized(path, new_height=0, new_width=0, is_color=True, error=CaffeError):
    """Caffe's ``ReadImageToCVMat(path, new_height, new_width, is_color)``: decode, then resize
    when both sizes are positive."""
    image = read_image(path, is_color, error)
    if new_height > 0 and new_width > 0:
        image = cv_resize_linear(image, new_height, new_width)
    return image


def image_to_chw(image):
    """A decoded (H, W[, C]) image as a (C, H, W) view (no copy: what the transformer takes)."""
    if image.ndim == 2:
        return image[None]
    return image.transpose(2, 0, 1)
