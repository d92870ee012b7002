"""Image file layers: ImageData (a list of "path label" lines) and WindowData (R-CNN windows).

Caffe: src/caffe/layers/image_data_layer.cpp, src/caffe/layers/window_data_layer.cpp,
src/caffe/util/io.cpp (``ReadImageToCVMat``), include/caffe/util/rng.hpp (``shuffle``).

Images are decoded with Pillow into what OpenCV's ``imread`` gives Caffe: uint8 (H, W, 3) in
**BGR** order for colour, (H, W) for grey. Resizing reproduces OpenCV's ``cv::resize`` with
``INTER_LINEAR`` on 8-bit images (see :func:`cv_resize_linear`).

Known differences from OpenCV-based Caffe:

* Resizing reproduces OpenCV's fixed-point INTER_LINEAR, including its vectorised rounding of
  the vertical pass: bit-identical to OpenCV 5's ``cv::resize`` on 300 random size pairs (the
  check in the tests needs cv2 and skips without it). OpenCV versions that round the last few
  elements of a row (those their SIMD loop leaves) with the scalar formula can differ there by 1.
* Grey images from colour files follow OpenCV's three routes (libjpeg's luma output for JPEG,
  libpng's truncated luma for PNG, ``cvtColor``'s rounded luma otherwise); PNG files with gamma
  chunks, which libpng would run through gamma tables, get the plain formula.
* JPEG decoding goes through Pillow's libjpeg; another libjpeg build (OpenCV's) may decode a few
  pixels differently. EXIF orientation is not applied (as in the OpenCV 2.4 Caffe was built
  with). 16-bit images are not converted as OpenCV does (OpenCV keeps the high byte).
"""
import logging
import math

import numpy

from .. import rng as caffe_rng
from ..data_transformer import DataTransformer
from ..errors import CaffeError
from ..io.staging import staging_for
from ..proto import caffe_pb2
from ..io.images import cv_resize_linear, image_to_chw, read_image, read_image_resized  # noqa: F401
from .base import Layer, register
from .data import Batch

logger = logging.getLogger("caffe_engine")


def _staging(layer, top):
    """The layer's staging (:mod:`caffe_engine.io.staging`), made for its tops' device on first
    use. Two slots: the batch is delivered in the forward that staged it."""
    staging = getattr(layer, "_staging", None)
    if staging is None:
        staging = layer._staging = staging_for(top[0].data, slots=2)
    return staging


def caffe_shuffle(items, stream):
    """Caffe's ``shuffle(begin, end, rng)`` in place: Fisher-Yates from the back, each index drawn
    by Boost's ``uniform_int(0, i)`` from ``stream``'s 32-bit words (rejection of the top bucket).

    Args:
        items: a list.
        stream: a :class:`~caffe_engine.rng.CaffeRNG`.
    """
    for i in range(len(items) - 1, 0, -1):
        # boost::random::detail::generate_uniform_int with brange = 2**32 - 1 > range = i.
        bucket = 0xFFFFFFFF // (i + 1)
        if 0xFFFFFFFF % (i + 1) == i:
            bucket += 1
        while True:
            j = stream.word() // bucket
            if j <= i:
                break
        items[i], items[j] = items[j], items[i]


# ------------------------------------------------------------------------------------------------
# Shared by both layers
# ------------------------------------------------------------------------------------------------
def _moved_transform_param(layer, deprecated_param, fields):
    """The layer's TransformationParameter with deprecated ``fields`` of ``deprecated_param``
    moved in (as Caffe's V1 upgrade does; the DataLayer here does the same)."""
    tp = caffe_pb2.TransformationParameter()
    tp.CopyFrom(layer.param.transform_param)
    for field in fields:
        if deprecated_param.HasField(field) and not tp.HasField(field):
            setattr(tp, field, getattr(deprecated_param, field))
    return tp


# ------------------------------------------------------------------------------------------------
# ImageData
# ------------------------------------------------------------------------------------------------
@register("ImageData")
class ImageDataLayer(Layer):
    """Batches of image files named in a list file, decoded, resized, and transformed.

    Tops: ``data`` (N, C, H, W) float32 (C = 3, BGR, or 1 with ``is_color: false``; H, W the
    image's, or new_height/new_width, or crop_size); ``label`` (N,) float32, the integers of the
    list. N is ``batch_size``. Without resizing, each batch takes the size of its first image
    and every image of a batch must have it.

    List file: one ``path label`` per line, the label after the last space (so paths may hold
    spaces); blank lines are skipped. Each path is read as ``root_folder + path`` (a plain
    concatenation, as Caffe: end root_folder with '/').

    Order: list order, wrapping at the end. With ``shuffle`` the list is shuffled at setup and at
    every wrap by the layer's own stream, seeded at setup from one word of the global stream.

    Random draws at setup from the global stream, in Caffe's order: the transformer's InitRand
    (one word when it needs randomness), the shuffle seed (shuffle only), the skip (rand_skip
    only: ``word % rand_skip`` lines are skipped), the transformer's second InitRand, the
    prefetch thread's seed (always).

    Fields read (image_data_param): source, root_folder (""), batch_size (1), shuffle (false),
    new_height, new_width (0: no resize; both or neither), is_color (true), rand_skip (0);
    deprecated scale, mean_file, crop_size, mirror are moved into transform_param when that does
    not set them. transform_param: see :class:`~caffe_engine.data_transformer.DataTransformer`.

    Raises:
        CaffeError naming the layer: the list cannot be read or is empty; a line has no integer
        label; only one of new_height/new_width; batch_size 0; more skipped than listed; an image
        cannot be decoded; images of a batch differ in size; transformation errors.

    Caffe: src/caffe/layers/image_data_layer.cpp.
    """

    exact_num_bottom = 0
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.image_data_param
        self.new_height, self.new_width = int(p.new_height), int(p.new_width)
        self.is_color = bool(p.is_color)
        self.root_folder = p.root_folder
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        if (self.new_height > 0) != (self.new_width > 0):
            raise self.error("new_height and new_width must be set at the same time")
        self.transformer = DataTransformer(
            _moved_transform_param(self, p, ("scale", "mean_file", "crop_size", "mirror")),
            self.phase, error=self.error)
        self.transformer.init_rand()

        logger.info("Opening file %s", p.source)
        self.lines = self._read_list(p.source)
        self.prefetch_rng = None
        if self.shuffle:
            logger.info("Shuffling data")
            self.prefetch_rng = caffe_rng.CaffeRNG(caffe_rng.get_rng().word())
            caffe_shuffle(self.lines, self.prefetch_rng)
        logger.info("A total of %d images.", len(self.lines))
        self.lines_id = 0
        if p.rand_skip:
            skip = caffe_rng.get_rng().word() % int(p.rand_skip)
            logger.info("Skipping first %d data points.", skip)
            if skip >= len(self.lines):
                raise self.error(f"not enough points to skip ({skip} of {len(self.lines)})")
            self.lines_id = skip
        if self.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        image = self._read(self.lines_id)
        shape = (self.batch_size,) + self.transformer.output_shape(*image_to_chw(image).shape)
        top[0].reshape(shape)
        logger.info("output data size: %s", ",".join(str(d) for d in shape))
        top[1].reshape((self.batch_size,))
        self.transformer.init_rand()
        self.thread_seed = caffe_rng.get_rng().word()

    def _read_list(self, source):
        try:
            with open(source) as f:
                text = f.read()
        except OSError as exc:
            raise self.error(f"cannot open image list '{source}': {exc.strerror}") from None
        lines = []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.rstrip("\r")
            if not line.strip():
                continue
            path, _, label = line.rpartition(" ")
            try:
                lines.append((path, int(label)))
            except ValueError:
                raise self.error(f"{source}:{number}: expected 'path label', "
                                 f"got {line!r}") from None
        if not lines:
            raise self.error(f"image list '{source}' is empty")
        return lines

    def _read(self, index):
        path = self.root_folder + self.lines[index][0]
        return read_image_resized(path, self.new_height, self.new_width, self.is_color, self.error)

    def reshape(self, bottom, top):
        """Nothing to do: the tops take each batch's shape in :meth:`forward` (as in Caffe)."""

    def resume_state(self):
        """The list order (shuffled or not) and the next line (see solvers/resume.py)."""
        return {"lines": [[path, label] for path, label in self.lines], "lines_id": self.lines_id}

    def restore_resume_state(self, state):
        """Continue from a :meth:`resume_state` snapshot."""
        self.lines = [(str(path), int(label)) for path, label in state["lines"]]
        self.lines_id = int(state["lines_id"])

    def load_batch(self):
        """Read, resize and transform the next ``batch_size`` images (Caffe's ``load_batch``).

        Returns:
            Batch(data float32 (N, C, H, W) numpy array, label float32 (N,) numpy array).
        """
        raw, labels = self._read_batch()
        return Batch(self.transformer.transform(raw), labels)

    def _read_batch(self):
        """The next ``batch_size`` images, untransformed: (uint8 (N, C, H, W), float32 (N,))."""
        images, labels = [], []
        for _ in range(self.batch_size):
            chw = image_to_chw(self._read(self.lines_id))
            if images and chw.shape != images[0].shape:
                raise self.error(f"image '{self.lines[self.lines_id][0]}' is {chw.shape[2]}x"
                                 f"{chw.shape[1]}, the batch's first {images[0].shape[2]}x"
                                 f"{images[0].shape[1]}; set new_height/new_width")
            images.append(chw)
            labels.append(self.lines[self.lines_id][1])
            self.lines_id += 1
            if self.lines_id >= len(self.lines):
                logger.debug("Restarting data prefetching from start.")
                self.lines_id = 0
                if self.shuffle:
                    caffe_shuffle(self.lines, self.prefetch_rng)
        return numpy.stack(images), numpy.asarray(labels, dtype=numpy.float32)

    def forward(self, bottom, top):
        """Read the next batch, draw its transform on the host and stage it
        (:mod:`caffe_engine.io.staging`: transformed here on the CPU; on the GPU the uint8
        images go to the device and are transformed there)."""
        staging = _staging(self, top)
        raw, labels = self._read_batch()
        staged = staging.stage(raw, labels, self.transformer.plan(raw.shape))
        staging.deliver(staged, top[0], top[1])


# ------------------------------------------------------------------------------------------------
# WindowData
# ------------------------------------------------------------------------------------------------
def _c_round(x):
    """C's ``round``: halves away from zero."""
    x = float(x)
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


@register("WindowData")
class WindowDataLayer(Layer):
    """R-CNN training windows: boxes cut from images, warped to ``crop_size``, fg/bg sampled.

    Tops: ``data`` (N, C, crop, crop) float32 (BGR); ``label`` (N,) float32 (0 = background).

    Window file, repeated per image (whitespace-separated)::

        # image_index
        image_path            (read as root_folder + image_path)
        channels height width
        num_windows
        class_index overlap x1 y1 x2 y2      (num_windows lines; pixels, inclusive)

    A window with ``overlap >= fg_threshold`` is foreground (its class must be > 0); one with
    ``overlap < bg_threshold`` background (label 0); others are dropped. Each batch holds
    ``N - int(N * fg_fraction)`` background windows, then the foreground ones, each drawn
    uniformly (``word % count``) from the layer's own stream, followed by a mirror draw
    (``word % 2``) when ``mirror``.

    A window is cut out and warped with bilinear resizing to ``crop_size`` square. With
    ``context_pad`` > 0 or ``crop_mode: "square"`` the box is first enlarged (to a square, then
    by ``crop / (crop - 2 * context_pad)``), clipped to the image, and the clipped part warped and
    placed where it falls in the crop; the rest stays 0. Values are ``(pixel - mean) * scale``.

    Random draws at setup from the global stream: the transformer's InitRand (when mirror, or
    crop in TRAIN), the layer's stream seed (when mirror or crop_size), the second InitRand, the
    prefetch thread's seed.

    Fields read: window_data_param.source, root_folder (""), batch_size, fg_threshold (0.5),
    bg_threshold (0.5), fg_fraction (0.25), context_pad (0), crop_mode ("warp" or "square"),
    cache_images (false: decode each window's image on every use; true: keep decoded images),
    scale (1; transform_param.scale is not used, as in Caffe); transform_param.crop_size
    (required), mirror, mean_file (indexed at the centre crop offset) or mean_value. The
    deprecated window_data_param crop_size / mirror / mean_file are moved into transform_param
    when that does not set them.

    Raises:
        CaffeError naming the layer: the window file cannot be read, is empty or malformed; a
        foreground window with class 0; crop_size 0; an empty window list a batch needs; a
        window outside its image; an image that cannot be decoded or is not 3-channel.

    Caffe: src/caffe/layers/window_data_layer.cpp.
    """

    exact_num_bottom = 0
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.window_data_param
        self.wp = p
        tp = _moved_transform_param(self, p, ("crop_size", "mirror", "mean_file"))
        self.transformer = DataTransformer(tp, self.phase, error=self.error)
        self.transformer.init_rand()
        self.crop_size = int(tp.crop_size)
        self.mirror = bool(tp.mirror)
        self.prefetch_rng = None
        if self.mirror or self.crop_size:
            self.prefetch_rng = caffe_rng.CaffeRNG(caffe_rng.get_rng().word())
        self.cache_images = bool(p.cache_images)
        self._cache = {}
        self.images, self.fg_windows, self.bg_windows, channels = self._read_windows(p)
        logger.info("Amount of context padding: %d", p.context_pad)
        logger.info("Crop mode: %s", p.crop_mode)
        if self.crop_size <= 0:
            raise self.error("transform_param.crop_size must be positive for WindowData")
        if p.crop_mode not in ("warp", "square"):
            raise self.error(f"crop_mode must be \"warp\" or \"square\", got {p.crop_mode!r}")
        if 2 * int(p.context_pad) >= self.crop_size and p.context_pad:
            raise self.error(f"context_pad {p.context_pad} leaves nothing of crop_size "
                             f"{self.crop_size}")
        self.batch_size = int(p.batch_size)
        if self.batch_size <= 0:
            raise self.error("window_data_param.batch_size must be positive")
        self.channels = channels
        top[0].reshape((self.batch_size, channels, self.crop_size, self.crop_size))
        top[1].reshape((self.batch_size,))
        logger.info("output data size: %d,%d,%d,%d", self.batch_size, channels, self.crop_size,
                    self.crop_size)
        # The mean, as the layer reads it (the transformer has loaded the file).
        self.mean = None
        self.mean_values = None
        if self.transformer.mean is not None:
            m = self.transformer.mean
            self.mean = m.reshape(m.shape[-3:]) if m.ndim >= 3 else None
            if self.mean is None:
                raise self.error(f"the mean file has shape {m.shape}; expected (1, C, H, W)")
        elif self.transformer.mean_values is not None:
            values = self.transformer.mean_values
            if values.size not in (1, channels):
                raise self.error(f"specify either 1 mean_value or as many as channels: {channels}")
            self.mean_values = numpy.broadcast_to(values, (channels,)).astype(numpy.float32)
        self.transformer.init_rand()
        self.thread_seed = caffe_rng.get_rng().word()

    def _read_windows(self, p):
        try:
            with open(p.source) as f:
                tokens = f.read().split()
        except OSError as exc:
            raise self.error(f"failed to open window file '{p.source}': {exc.strerror}") from None
        if len(tokens) < 2:
            raise self.error(f"window file '{p.source}' is empty")
        fg_threshold = numpy.float32(p.fg_threshold)
        bg_threshold = numpy.float32(p.bg_threshold)
        images, fg, bg = [], [], []
        channels = 0
        pos = 0

        def take(kind, count=1):
            nonlocal pos
            if pos + count > len(tokens):
                raise self.error(f"window file '{p.source}' ends in the middle of an image entry")
            values = tokens[pos:pos + count]
            pos += count
            try:
                return [kind(v) for v in values]
            except ValueError:
                raise self.error(f"window file '{p.source}': bad value among {values}") from None

        while pos < len(tokens):
            hashtag, = take(str)
            if hashtag != "#":
                raise self.error(f"window file '{p.source}': expected '#', got {hashtag!r}")
            image_index, = take(int)
            path, = take(str)
            c, h, w = take(int, 3)
            channels = c
            images.append((p.root_folder + path, (c, h, w)))
            if self.cache_images:
                self._cache[len(images) - 1] = read_image(images[-1][0], True, self.error)
            num_windows, = take(int)
            for _ in range(num_windows):
                label, = take(int)
                overlap, = take(float)
                x1, y1, x2, y2 = take(int, 4)
                overlap = numpy.float32(overlap)
                window = [image_index, label, overlap, x1, y1, x2, y2]
                if overlap >= fg_threshold:
                    if label <= 0:
                        raise self.error(f"foreground window of image {image_index} has class "
                                         f"{label}; foreground classes must be > 0")
                    fg.append(window)
                elif overlap < bg_threshold:
                    window[1], window[2] = 0, numpy.float32(0)
                    bg.append(window)
        logger.info("Number of images: %d", len(images))
        return images, fg, bg, channels

    def _image(self, index):
        if not 0 <= index < len(self.images):
            raise self.error(f"window refers to image {index}; the window file lists "
                             f"{len(self.images)}")
        if index in self._cache:
            return self._cache[index]
        return read_image(self.images[index][0], True, self.error)

    def reshape(self, bottom, top):
        pass

    def _prefetch_rand(self):
        return self.prefetch_rng.word()

    def _warp(self, img, window, do_mirror):
        """(warped uint8 (h, w, C), pad_h, pad_w) of one window, as Caffe's load_batch cuts it."""
        f32 = numpy.float32
        crop = self.crop_size
        context_pad = int(self.wp.context_pad)
        use_square = self.wp.crop_mode == "square"
        rows, cols = img.shape[:2]
        x1, y1, x2, y2 = (int(v) for v in window[3:7])
        out_w = out_h = crop
        pad_w = pad_h = 0
        if context_pad > 0 or use_square:
            context_scale = f32(crop) / f32(crop - 2 * context_pad)
            half_height = f32(f32(y2 - y1 + 1) / 2.0)
            half_width = f32(f32(x2 - x1 + 1) / 2.0)
            center_x = f32(x1) + half_width
            center_y = f32(y1) + half_height
            if use_square:
                half_width = half_height = max(half_height, half_width)
            x1 = _c_round(center_x - half_width * context_scale)
            x2 = _c_round(center_x + half_width * context_scale)
            y1 = _c_round(center_y - half_height * context_scale)
            y2 = _c_round(center_y + half_height * context_scale)
            unclipped_height = y2 - y1 + 1
            unclipped_width = x2 - x1 + 1
            pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
            pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
            x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
            clipped_height = y2 - y1 + 1
            clipped_width = x2 - x1 + 1
            scale_x = f32(crop) / f32(unclipped_width)
            scale_y = f32(crop) / f32(unclipped_height)
            out_w = _c_round(f32(clipped_width) * scale_x)
            out_h = _c_round(f32(clipped_height) * scale_y)
            pad_x1 = _c_round(f32(pad_x1) * scale_x)
            pad_x2 = _c_round(f32(pad_x2) * scale_x)
            pad_y1 = _c_round(f32(pad_y1) * scale_y)
            pad_h = pad_y1
            pad_w = pad_x2 if do_mirror else pad_x1
            out_h = min(out_h, crop - pad_h)
            out_w = min(out_w, crop - pad_w)
        if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows):
            raise self.error(f"window ({window[3]}, {window[4]}, {window[5]}, {window[6]}) of "
                             f"image {window[0]} does not fit its {cols}x{rows} image")
        if out_w <= 0 or out_h <= 0:
            raise self.error(f"window ({window[3]}, {window[4]}, {window[5]}, {window[6]}) of "
                             f"image {window[0]} warps to an empty region")
        warped = cv_resize_linear(img[y1:y2 + 1, x1:x2 + 1], out_h, out_w)
        if do_mirror:
            warped = warped[:, ::-1]
        return warped, pad_h, pad_w

    def load_batch(self):
        """Sample and warp the next batch of windows (Caffe's ``load_batch``).

        Returns:
            Batch(data float32 (N, C, crop, crop) numpy array, label float32 (N,) numpy array).
        """
        crop = self.crop_size
        scale = numpy.float32(self.wp.scale)
        data = numpy.zeros((self.batch_size, self.channels, crop, crop), numpy.float32)
        labels = numpy.zeros(self.batch_size, numpy.float32)
        num_fg = int(numpy.float32(self.batch_size) * numpy.float32(self.wp.fg_fraction))
        item = 0
        for windows, count, what in ((self.bg_windows, self.batch_size - num_fg, "background"),
                                     (self.fg_windows, num_fg, "foreground")):
            if count and not windows:
                raise self.error(f"a batch needs {count} {what} windows but the window file "
                                 f"has none")
            for _ in range(count):
                window = windows[self._prefetch_rand() % len(windows)]
                do_mirror = self.mirror and self._prefetch_rand() % 2 == 1
                img = self._image(int(window[0]))
                if img.shape[2] != self.channels:
                    raise self.error(f"image {window[0]} has {img.shape[2]} channels, the window "
                                     f"file says {self.channels}")
                warped, pad_h, pad_w = self._warp(img, window, do_mirror)
                h, w = warped.shape[:2]
                pixels = warped.transpose(2, 0, 1).astype(numpy.float32)    # (C, h, w)
                if self.mean is not None:
                    mean_off = (self.mean.shape[2] - crop) // 2
                    top, left = mean_off + pad_h, mean_off + pad_w
                    mean = self.mean[:, top:top + h, left:left + w]
                    if mean.shape != pixels.shape or top < 0 or left < 0:
                        raise self.error(f"the mean file's shape {self.mean.shape} does not "
                                         f"cover crop_size {crop}")
                    pixels = (pixels - mean) * scale
                elif self.mean_values is not None:
                    pixels = (pixels - self.mean_values[:, None, None]) * scale
                else:
                    pixels = pixels * scale
                data[item, :, pad_h:pad_h + h, pad_w:pad_w + w] = pixels
                labels[item] = window[1]
                item += 1
        return Batch(data, labels)

    def next_batch(self):
        """The batch the next forward outputs (a prefetch thread may replace this)."""
        return self.load_batch()

    def forward(self, bottom, top):
        batch = self.next_batch()
        staging = _staging(self, top)
        staging.deliver(staging.stage(batch.data, batch.label), top[0], top[1])
