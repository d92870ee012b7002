"""Image file layers: ImageData (a list of "path label" lines) and WindowData (R-CNN windows).

Caffe: src/caffe/layers/image_data_layer.cpp, src/caffe/layers/window_data_layer.cpp,
src/caffe/util/io.cpp (``ReadImageToCVMat``), include/caffe/util/rng.hpp (``shuffle``).

Images are read, decoded and resized by OpenCV (:mod:`caffe_engine.io.images`), as Caffe's
``cv::imread`` and ``cv::resize(..., INTER_LINEAR)``: uint8 (H, W, 3) in **BGR** order for
colour, (H, W) for grey, the EXIF orientation applied (OpenCV 3.1 and later, as Caffe built with
them). Both layers prefetch (:mod:`caffe_engine.layers.prefetch`): the list order and every
random draw are taken on the prefetch thread in Caffe's order, the decoding and warping are
spread over the data threads.
"""
import copy
import logging
import math

import numpy

from .. import rng as caffe_rng
from ..data_transformer import DataTransformer
from ..proto import caffe_pb2
from ..io import workers as data_workers
from ..io.images import cv_resize_linear, image_to_chw, read_image, read_image_resized  # noqa: F401
from .base import register
from .prefetch import Batch, BasePrefetchingDataLayer, synced

logger = logging.getLogger("caffe_engine")


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
class ImageDataLayer(BasePrefetchingDataLayer):
    """Batches of image files named in a list file, decoded, resized, and transformed.

    Tops: ``data`` (N, C, H, W) float32 (C = 3, BGR, or 1 with ``is_color: false``; H, W the
    image's, or new_height/new_width, or crop_size); ``label`` (N,) float32, the integers of the
    list. N is ``batch_size``. Each batch takes the size of its first image; the others must have
    it, unless ``crop_size`` crops each on its own (see
    :class:`~caffe_engine.data_transformer.BatchPlan`).

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
    Four batches are loaded ahead (Caffe's default ``prefetch``).

    Attributes:
        lines, lines_id: the list (in its current order) and the next line to read, positioned
            after the last batch forwarded (reading them stops prefetching).

    Raises:
        CaffeError naming the layer: the list cannot be read or is empty; a line has no integer
        label; only one of new_height/new_width; batch_size 0; more skipped than listed; an image
        cannot be decoded; images of a batch differ in size without a crop; transformation errors.

    Caffe: src/caffe/layers/image_data_layer.cpp.
    """

    exact_num_top = 2
    size_hint = "; set new_height/new_width"

    lines = synced("lines", "The list of (path, label), in its current order.")
    lines_id = synced("lines_id", "The next line to read.")

    def layer_setup(self, bottom, top):
        p = self.param.image_data_param
        self.new_height, self.new_width = int(p.new_height), int(p.new_width)
        self.is_color = bool(p.is_color)
        self.root_folder = p.root_folder
        self.batch_size = int(p.batch_size)
        self.shuffle = bool(p.shuffle)
        if (self.new_height > 0) != (self.new_width > 0):
            raise self.error("new_height and new_width must be set at the same time")
        self._transformer = DataTransformer(
            _moved_transform_param(self, p, ("scale", "mean_file", "crop_size", "mirror")),
            self.phase, error=self.error)
        self._transformer.init_rand()

        logger.info("Opening file %s", p.source)
        self._lines = self._read_list(p.source)
        self.prefetch_rng = None
        if self.shuffle:
            logger.info("Shuffling data")
            self.prefetch_rng = caffe_rng.CaffeRNG(caffe_rng.get_rng().word())
            caffe_shuffle(self._lines, self.prefetch_rng)
        logger.info("A total of %d images.", len(self._lines))
        self._lines_id = 0
        if p.rand_skip:
            skip = caffe_rng.get_rng().word() % int(p.rand_skip)
            logger.info("Skipping first %d data points.", skip)
            if skip >= len(self._lines):
                raise self.error(f"not enough points to skip ({skip} of {len(self._lines)})")
            self._lines_id = skip
        if self.batch_size <= 0:
            raise self.error("image_data_param.batch_size must be positive")
        path = self._lines[self._lines_id][0]
        image = self._decode(self.root_folder + path, path)
        shape = (self.batch_size,) + self._transformer.output_shape(*image.shape)
        top[0].reshape(shape)
        logger.info("output data size: %s", ",".join(str(d) for d in shape))
        top[1].reshape((self.batch_size,))
        self._transformer.init_rand()
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

    def resume_state(self):
        """The list order (shuffled or not) and the next line (see solvers/snapshot.py)."""
        self._sync()
        return {"lines": [[path, label] for path, label in self._lines],
                "lines_id": self._lines_id}

    def restore_resume_state(self, state):
        """Continue from a :meth:`resume_state` snapshot."""
        self._sync()
        self._lines = [(str(path), int(label)) for path, label in state["lines"]]
        self._lines_id = int(state["lines_id"])

    # -- the loading state (the list is replaced, never changed, when it is shuffled) -----------
    def _prefetch_state(self):
        transformer = self._transformer
        return (self._lines, self._lines_id, copy.deepcopy(self.prefetch_rng),
                copy.deepcopy(transformer.rng), transformer.last_params)

    def _rewind(self, state):
        (self._lines, self._lines_id, self.prefetch_rng, self._transformer.rng,
         self._transformer.last_params) = state

    # -- batches -------------------------------------------------------------------------------
    def _read_batch(self):
        """The next ``batch_size`` lines in order: (paths, labels float32 (N,), names); at the
        end of the list back to its start, shuffled again with ``shuffle``."""
        paths, labels, names = [], [], []
        for _ in range(self.batch_size):
            path, label = self._lines[self._lines_id]
            paths.append(self.root_folder + path)
            names.append(f"image '{path}'")
            labels.append(label)
            self._lines_id += 1
            if self._lines_id >= len(self._lines):
                logger.debug("Restarting data prefetching from start.")
                self._lines_id = 0
                if self.shuffle:
                    lines = list(self._lines)
                    caffe_shuffle(lines, self.prefetch_rng)
                    self._lines = lines
        return paths, numpy.asarray(labels, dtype=numpy.float32), names

    def _decode(self, path, name):
        return image_to_chw(read_image_resized(path, self.new_height, self.new_width,
                                               self.is_color, self.error))


# ------------------------------------------------------------------------------------------------
# WindowData
# ------------------------------------------------------------------------------------------------
def _c_round(x):
    """C's ``round``: halves away from zero."""
    x = float(x)
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


@register("WindowData")
class WindowDataLayer(BasePrefetchingDataLayer):
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

    Batches are prefetched (four ahead): the windows and mirror flags are drawn on the prefetch
    thread, the images read and warped over the data threads.

    Caffe: src/caffe/layers/window_data_layer.cpp.
    """

    exact_num_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.window_data_param
        self.wp = p
        tp = _moved_transform_param(self, p, ("crop_size", "mirror", "mean_file"))
        self._transformer = DataTransformer(tp, self.phase, error=self.error)
        self._transformer.init_rand()
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
        if self._transformer.mean is not None:
            m = self._transformer.mean
            self.mean = m.reshape(m.shape[-3:]) if m.ndim >= 3 else None
            if self.mean is None:
                raise self.error(f"the mean file has shape {m.shape}; expected (1, C, H, W)")
        elif self._transformer.mean_values is not None:
            values = self._transformer.mean_values
            if values.size not in (1, channels):
                raise self.error(f"specify either 1 mean_value or as many as channels: {channels}")
            self.mean_values = numpy.broadcast_to(values, (channels,)).astype(numpy.float32)
        self._transformer.init_rand()
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

    def resume_state(self):
        """Nothing beyond the layer's streams (see solvers/snapshot.py), read once prefetching has
        stopped and rewound."""
        self._sync()
        return {}

    def restore_resume_state(self, state):
        """Stop prefetching: the streams restored next are the layer's whole position."""
        self._sync()

    def _prefetch_state(self):
        return copy.deepcopy(self.prefetch_rng), copy.deepcopy(self._transformer.rng)

    def _rewind(self, state):
        self.prefetch_rng, self._transformer.rng = state

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

    def _sample(self):
        """Draw the next batch's windows and mirror flags, in Caffe's order: background windows
        first, then foreground ones, each window followed by its mirror draw."""
        num_fg = int(numpy.float32(self.batch_size) * numpy.float32(self.wp.fg_fraction))
        picks = []
        for windows, count, what in ((self.bg_windows, self.batch_size - num_fg, "background"),
                                     (self.fg_windows, num_fg, "foreground")):
            if count and not windows:
                raise self.error(f"a batch needs {count} {what} windows but the window file "
                                 f"has none")
            for _ in range(count):
                window = windows[self._prefetch_rand() % len(windows)]
                do_mirror = self.mirror and self._prefetch_rand() % 2 == 1
                picks.append((window, do_mirror))
        return picks

    def _fill(self, data, item, window, do_mirror):
        """Warp one window into ``data[item]`` (the values ``(pixel - mean) * scale``); runs on
        the data threads."""
        crop = self.crop_size
        scale = numpy.float32(self.wp.scale)
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

    def _window_batch(self):
        """Sample and warp the next batch of windows: Batch(data, label)."""
        crop = self.crop_size
        picks = self._sample()
        data = numpy.zeros((self.batch_size, self.channels, crop, crop), numpy.float32)
        labels = numpy.array([window[1] for window, _ in picks], numpy.float32)
        data_workers.shared().run(lambda i: self._fill(data, i, *picks[i]), len(picks))
        return Batch(data, labels)

    def load_batch(self):
        """Sample and warp the next batch of windows (Caffe's ``load_batch``); first stops
        prefetching, so this is the batch the next ``forward`` would have output.

        Returns:
            Batch(data float32 (N, C, crop, crop) numpy array, label float32 (N,) numpy array).
        """
        self._sync()
        return self._window_batch()

    def _load_batch(self):
        batch = self._window_batch()
        return self._staging.stage(batch.data, batch.label)
