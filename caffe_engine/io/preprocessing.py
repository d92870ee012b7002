"""Image preprocessing for feeding a Net from Python: pycaffe's ``caffe.io`` image half.

Caffe: python/caffe/io.py (``Transformer``, ``load_image``, ``resize_image``, ``oversample``).

Images live in Python as float arrays (H, W, K) with values in [0, 1], channels RGB (what
:func:`load_image` returns). A Net wants (K, H, W) float32, usually BGR and in [0, 255] minus a
mean. :class:`Transformer` keeps, per net input, the steps between the two and applies them in
pycaffe's order.

Differences from pycaffe, on purpose:

* Images are decoded with Pillow instead of scikit-image; the values are the same (8-bit
  samples / 255, 16-bit / 65535).
* :func:`resize_image` interpolates with its own NumPy code (pixel centres aligned, edges
  repeated: what scikit-image's ``resize`` does without anti-aliasing) instead of scikit-image or
  SciPy, for any number of channels. Orders 0 (nearest) and 1 (bilinear) need nothing more;
  higher orders use ``scipy.ndimage`` when it is installed.
* :meth:`Transformer.preprocess` never modifies the caller's array (pycaffe's in-place scaling
  can write into it when no resize or copy happened first); the values are the same.
"""
import numpy

from ..errors import CaffeError


class Transformer:
    """Per-input preprocessing between Python images and Net input blobs (pycaffe's).

    Args:
        inputs: dict input blob name -> its shape, e.g.
            ``{'data': net.blobs['data'].data.shape}`` (N, K, H, W).

    ``preprocess(name, image)`` applies, in order: cast to float32; resize to the blob's (H, W)
    if needed; ``transpose``; ``channel_swap`` (on the first axis after the transpose);
    ``* raw_scale``; ``- mean``; ``* input_scale``. ``deprocess`` inverts them (without the
    resize).

    Raises:
        CaffeError: a name that is not one of ``inputs``; a transpose or channel order of the
            wrong length; a mean whose channels or shape do not fit the input.
    """

    def __init__(self, inputs):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in dict(inputs).items()}
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def _check_input(self, name):
        if name not in self.inputs:
            raise CaffeError(f"{name} is not one of the net inputs: {sorted(self.inputs)}")

    def preprocess(self, in_, data):
        """Format an (H', W', K) image for input ``in_``.

        Returns:
            float32 array (K, H, W) with the steps set for ``in_`` applied (see the class).
        """
        self._check_input(in_)
        caffe_in = numpy.array(data, dtype=numpy.float32)  # a copy: the caller's array is kept
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        if raw_scale is not None:
            caffe_in *= raw_scale
        if mean is not None:
            caffe_in -= mean
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_, data):
        """Invert :meth:`preprocess` for one item (K, H, W) of input ``in_`` -> (H, W, K)."""
        self._check_input(in_)
        decaf_in = numpy.array(data).squeeze()
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if input_scale is not None:
            decaf_in /= input_scale
        if mean is not None:
            decaf_in += mean
        if raw_scale is not None:
            decaf_in /= raw_scale
        if channel_swap is not None:
            decaf_in = decaf_in[numpy.argsort(channel_swap), :, :]
        if transpose is not None:
            decaf_in = decaf_in.transpose(numpy.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_, order):
        """Axis order taking the image (H, W, K) to the blob's (K, H, W): usually (2, 0, 1)."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise CaffeError("Transpose order needs to have the same number of dimensions as the "
                             f"input: got {tuple(order)} for input shape {self.inputs[in_]}")
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_, order):
        """Channel order, applied after the transpose: (2, 1, 0) maps RGB to BGR."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise CaffeError("Channel swap needs to have the same number of dimensions as the "
                             f"input channels: got {tuple(order)} for {self.inputs[in_][1]} channels")
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_, scale):
        """Scale applied before the mean: 255 takes load_image's [0, 1] to Caffe's [0, 255]."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """Mean subtracted after ``raw_scale``: one value per channel (K,) or an image (K, H, W).

        Raises:
            CaffeError: K does not match the input's channels, or the image is not the input's
                (K, H, W) (a 2-D mean is taken as (1, H, W)).
        """
        self._check_input(in_)
        mean = numpy.asarray(mean)
        shape = mean.shape
        if mean.ndim == 1:
            if shape[0] != self.inputs[in_][1]:
                raise CaffeError(f"Mean channels incompatible with input: mean has {shape[0]}, "
                                 f"input {self.inputs[in_][1]}")
            mean = mean[:, numpy.newaxis, numpy.newaxis]
        else:
            if len(shape) == 2:
                shape = (1,) + shape
            if len(shape) != 3:
                raise CaffeError(f"Mean shape invalid: {mean.shape} (want (K,) or (K, H, W))")
            if shape != self.inputs[in_][1:]:
                raise CaffeError(f"Mean shape incompatible with input shape: {mean.shape} vs "
                                 f"{self.inputs[in_][1:]}")
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Scale applied last, after the mean (``raw_scale`` is applied before it)."""
        self._check_input(in_)
        self.input_scale[in_] = scale


# ------------------------------------------------------------------------------------------------
# Image I/O
# ------------------------------------------------------------------------------------------------
def load_image(filename, color=True):
    """Load an image file as float32 (H, W, 3) RGB or (H, W, 1) grey, values in [0, 1].

    As pycaffe: a grey file gives (H, W, 3) (replicated) with ``color=True`` and (H, W, 1) with
    ``color=False``; a colour file gives (H, W, 3) either way; alpha is dropped. 8-bit samples
    are divided by 255, 16-bit ones by 65535.

    Raises:
        CaffeError: the file cannot be opened or decoded.
    """
    from PIL import Image
    try:
        with Image.open(filename) as img:
            img.load()
            img = _to_array(img)
    except (OSError, ValueError, SyntaxError) as exc:
        raise CaffeError(f"cannot load image '{filename}': {exc}") from None
    if img.ndim == 2:
        img = img[:, :, numpy.newaxis]
        if color:
            img = numpy.tile(img, (1, 1, 3))
    return img


def _to_array(img):
    mode = img.mode
    if mode in ("1", "L", "LA"):
        return numpy.asarray(img.convert("L"), dtype=numpy.float32) / numpy.float32(255)
    if mode.startswith("I;16") or mode == "I":
        return (numpy.asarray(img, dtype=numpy.float64) / 65535.0).astype(numpy.float32)
    if mode == "F":
        return numpy.asarray(img, dtype=numpy.float32)
    if mode != "RGB":
        img = img.convert("RGB")   # RGBA, P (palette), CMYK, YCbCr ...
    return numpy.asarray(img, dtype=numpy.float32) / numpy.float32(255)


def resize_image(im, new_dims, interp_order=1):
    """Resize an (H, W, K) image to ``new_dims`` = (height, width), any K.

    Output pixel (y, x) samples the input at ``((y + 0.5) * H / height - 0.5, ...)``
    (pixel centres aligned), edges repeated. ``interp_order`` 0 is nearest, 1 bilinear; 2..5
    use ``scipy.ndimage.map_coordinates`` (spline) when SciPy is installed.

    Returns:
        float32 array (height, width, K).

    Raises:
        CaffeError: a size that is not positive, or an order that cannot be served.
    """
    im = numpy.asarray(im)
    height, width = (int(d) for d in new_dims)
    if height <= 0 or width <= 0:
        raise CaffeError(f"resize_image: new size must be positive, got {tuple(new_dims)}")
    src_h, src_w = im.shape[:2]
    if im.size and im.min() == im.max():   # a constant image stays constant (pycaffe's shortcut)
        out = numpy.empty((height, width) + im.shape[2:], numpy.float32)
        out.fill(im.flat[0])
        return out
    ys = (numpy.arange(height) + 0.5) * (src_h / height) - 0.5
    xs = (numpy.arange(width) + 0.5) * (src_w / width) - 0.5
    if interp_order == 0:
        yi = numpy.clip(numpy.floor(ys + 0.5).astype(int), 0, src_h - 1)
        xi = numpy.clip(numpy.floor(xs + 0.5).astype(int), 0, src_w - 1)
        return im[yi][:, xi].astype(numpy.float32)
    if interp_order == 1:
        ys = numpy.clip(ys, 0, src_h - 1)
        xs = numpy.clip(xs, 0, src_w - 1)
        y0 = numpy.floor(ys).astype(int)
        x0 = numpy.floor(xs).astype(int)
        y1 = numpy.minimum(y0 + 1, src_h - 1)
        x1 = numpy.minimum(x0 + 1, src_w - 1)
        fy = (ys - y0).reshape((-1, 1) + (1,) * (im.ndim - 2))
        fx = (xs - x0).reshape((1, -1) + (1,) * (im.ndim - 2))
        src = im.astype(numpy.float64)
        top = src[y0][:, x0] * (1 - fx) + src[y0][:, x1] * fx
        bottom = src[y1][:, x0] * (1 - fx) + src[y1][:, x1] * fx
        return (top * (1 - fy) + bottom * fy).astype(numpy.float32)
    try:
        from scipy import ndimage
    except ImportError:
        raise CaffeError(f"resize_image: interp_order {interp_order} needs SciPy "
                         "(orders 0 and 1 work without it)") from None
    yy, xx = numpy.meshgrid(numpy.clip(ys, 0, src_h - 1), numpy.clip(xs, 0, src_w - 1), indexing="ij")
    channels = im.reshape(src_h, src_w, -1).astype(numpy.float64)
    out = numpy.stack([ndimage.map_coordinates(channels[:, :, k], [yy, xx], order=interp_order,
                                               mode="nearest")
                       for k in range(channels.shape[2])], axis=-1)
    return out.reshape((height, width) + im.shape[2:]).astype(numpy.float32)


def oversample(images, crop_dims):
    """Ten crops per image: the four corners and the centre, then the same mirrored.

    Args:
        images: a sequence of N (H, W, K) arrays, all of one shape.
        crop_dims: (height, width) of the crops.

    Returns:
        float32 array (10 * N, height, width, K): for each image the corners (top-left,
        top-right, bottom-left, bottom-right), the centre, then those five flipped left-right.
    """
    im_shape = numpy.array(images[0].shape)
    crop_dims = numpy.array(crop_dims)
    im_center = im_shape[:2] / 2.0
    h_indices = (0, im_shape[0] - crop_dims[0])
    w_indices = (0, im_shape[1] - crop_dims[1])
    crops_ix = numpy.empty((5, 4), dtype=int)
    curr = 0
    for i in h_indices:
        for j in w_indices:
            crops_ix[curr] = (i, j, i + crop_dims[0], j + crop_dims[1])
            curr += 1
    crops_ix[4] = numpy.tile(im_center, (1, 2)) + numpy.concatenate([-crop_dims / 2.0, crop_dims / 2.0])
    crops_ix = numpy.tile(crops_ix, (2, 1))
    crops = numpy.empty((10 * len(images), crop_dims[0], crop_dims[1], im_shape[-1]), dtype=numpy.float32)
    ix = 0
    for im in images:
        for crop in crops_ix:
            crops[ix] = im[crop[0]:crop[2], crop[1]:crop[3], :]
            ix += 1
        crops[ix - 5:ix] = crops[ix - 5:ix, :, ::-1, :]  # the second five are mirrored
    return crops
