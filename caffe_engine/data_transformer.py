"""Caffe's DataTransformer: Datum records -> float32 (C, H, W) arrays, with crop, mirror, mean, scale.

Caffe: src/caffe/data_transformer.cpp (``Transform(const Datum&, Blob*)``, ``InferBlobShape``,
``InitRand``, ``Rand``).

Per element, in float32 as Caffe computes it::

    out = (x - mean) * scale      # mean from mean_file (indexed at the crop offset) or mean_value
    out = x * scale               # without a mean

where ``x`` is the uint8 ``data`` byte (or the ``float_data`` value) of the uncropped record.

Randomness (bit-exact with Caffe): a transformer *needs* randomness when ``mirror`` is set (any phase)
or when ``crop_size`` is set in TRAIN. Each :meth:`DataTransformer.init_rand` call then takes one
word from the global stream (``caffe_rng_rand()``) and seeds the transformer's own mt19937 with it;
Caffe's data layers call it twice, so the second word wins. Per image, from the transformer's own
stream: ``mirror = word % 2`` (only when ``mirror``), then ``h_off = word % (H - crop + 1)`` and
``w_off = word % (W - crop + 1)`` (only when cropping in TRAIN; TEST takes the centre,
``(H - crop) // 2``). An image is mirrored by reversing its columns after the crop.

The arithmetic is the kernel set's ``transform`` (:mod:`caffe_engine.kernels`: one pass over
the batch with the compiled kernels, crop windows and column-reversed views with the reference
ones); elementwise it is exactly Caffe's per-pixel loop ``(x - mean) * scale`` in float32.
:meth:`DataTransformer.plan` is the host half (checks and random draws, in Caffe's order) and
:meth:`TransformPlan.run` the arithmetic, so the Data layer can draw on its loading thread and
run the arithmetic on the device (:mod:`caffe_engine.io.staging`), or over the data threads
(:mod:`caffe_engine.io.workers`) one record each.

Encoded records (``encoded: true``, JPEG/PNG bytes, as ``convert_imageset --encoded`` writes)
are decoded by OpenCV (:mod:`caffe_engine.io.images`) as Caffe's ``Transform(const Datum&)``
does: ``force_color`` decodes in colour (BGR), ``force_gray`` in grey (both set is Caffe's
error), neither keeps the file's own channels (``DecodeDatumToCVMatNative``); the pixels are
then transformed as a raw record's. Each record is decoded or not by its own ``encoded`` flag.

Records of one batch (:meth:`DataTransformer.plan_records`, Caffe's ``DataLayer::load_batch``):
the batch takes its shape from the first record; every later record must have its channels,
and its height and width too unless ``crop_size`` is set, in which case any record at least
the crop's size is cropped on its own (its random offsets drawn from its own size).
"""
import logging

import numpy

from . import kernels
from . import rng as caffe_rng
from .backend import get_array_module
from .errors import CaffeError
from .io.images import decode_image, image_to_chw
from .proto.caffe_pb2 import TRAIN

logger = logging.getLogger("caffe_engine")


def datum_to_array(datum, error=CaffeError):
    """The pixels of a ``caffe_pb2.Datum`` as a (C, H, W) array, uint8 (``data``) or float32 (``float_data``).

    Args:
        datum: the Datum.
        error: callable turning a message into the exception to raise.

    Raises:
        the ``error`` exception: the Datum is encoded (decode it with
        :meth:`DataTransformer.record_pixels`), has no channels, or its byte or float count does
        not match ``channels * height * width``.
    """
    if datum.encoded:
        raise error("the Datum is encoded (JPEG/PNG bytes): decode it first")
    c, h, w = datum.channels, datum.height, datum.width
    if c <= 0 or h <= 0 or w <= 0:
        raise error(f"Datum has shape {c}x{h}x{w}; channels, height and width must be positive")
    if len(datum.data):
        values = numpy.frombuffer(datum.data, dtype=numpy.uint8)
    else:
        values = numpy.asarray(datum.float_data, dtype=numpy.float32)
    if values.size != c * h * w:
        raise error(f"Datum holds {values.size} values but channels x height x width is "
                    f"{c}x{h}x{w} = {c * h * w}")
    return values.reshape(c, h, w)


class DataTransformer:
    """Crop, mirror, mean subtraction and scaling of (C, H, W) records, as Caffe's DataTransformer.

    Args:
        param: caffe_pb2.TransformationParameter. Fields read: ``scale`` (default 1),
            ``mirror`` (false), ``crop_size`` (0 = no crop), ``mean_file`` (a BlobProto path,
            relative to the working directory), ``mean_value`` (one value, or one per channel).
            ``force_color`` / ``force_gray``: how encoded records are decoded (colour, grey;
            neither: the file's own channels); raw records ignore them (one warning).
        phase: caffe_pb2.TRAIN or caffe_pb2.TEST (random crops in TRAIN, centre crops in TEST).
        error: callable turning a message into the exception to raise (a layer passes its
            ``error`` so that messages name it); default CaffeError.

    Attributes:
        rng: the transformer's own CaffeRNG once :meth:`init_rand` has run (None when not needed).
        last_params: int array (N, 3) of ``[mirror, h_off, w_off]`` of the last transformed batch.

    Raises:
        the ``error`` exception: both ``mean_file`` and ``mean_value`` given; the mean file cannot
        be read.
    """

    def __init__(self, param, phase, error=CaffeError):
        self.param = param
        self.phase = phase
        self.error = error
        self.scale = numpy.float32(param.scale)
        self.crop_size = int(param.crop_size)
        self.mirror = bool(param.mirror)
        self.mean = None
        self.mean_values = None
        self.rng = None
        self.last_params = numpy.zeros((0, 3), numpy.int64)
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise error("cannot specify transform_param mean_file and mean_value at the same time")
            from .io.blobproto import read_blobproto
            logger.info("Loading mean file from: %s", param.mean_file)
            try:
                self.mean = read_blobproto(param.mean_file)
            except CaffeError as exc:
                raise error(f"transform_param.mean_file: {exc}") from None
        elif len(param.mean_value):
            self.mean_values = numpy.asarray(param.mean_value, dtype=numpy.float32)
        self.force_color = bool(param.force_color)
        self.force_gray = bool(param.force_gray)
        self._warned_force = False

    # -- randomness ----------------------------------------------------------------------------
    @property
    def needs_rand(self):
        """Whether transforming draws random numbers (mirror, or crop in TRAIN)."""
        return self.mirror or (self.phase == TRAIN and self.crop_size > 0)

    def init_rand(self, stream=None):
        """Caffe's ``InitRand``: when randomness is needed, seed the own stream from one word.

        Args:
            stream: the CaffeRNG to draw the seed from; default the process-wide stream.
        """
        if self.needs_rand:
            seed = (stream or caffe_rng.get_rng()).word()
            self.rng = caffe_rng.CaffeRNG(seed)
        else:
            self.rng = None

    # -- shapes --------------------------------------------------------------------------------
    def output_shape(self, channels, height, width):
        """(C, H', W') of a transformed (C, H, W) record (Caffe's ``InferBlobShape`` without N).

        Raises:
            the ``error`` exception: the record is smaller than ``crop_size``.
        """
        crop = self.crop_size
        if crop:
            if height < crop or width < crop:
                raise self.error(f"crop_size {crop} is larger than the {height}x{width} input")
            return (channels, crop, crop)
        return (channels, height, width)

    def infer_shape(self, datum):
        """(C, H', W') the transformed ``datum`` will have (Caffe's ``InferBlobShape``; an
        encoded record is decoded)."""
        return self.output_shape(*self.record_pixels(datum).shape)

    # -- records -------------------------------------------------------------------------------
    def record_pixels(self, datum, where=None):
        """A Datum's pixels as a (C, H, W) array: uint8 or float32 for a raw record; for an
        encoded one the decoded image (a view of OpenCV's (H, W, C) array), in colour with
        ``force_color``, in grey with ``force_gray``, else with the file's own channels.
        Thread-safe (the data threads call it).

        Args:
            datum: a ``caffe_pb2.Datum``.
            where: what names the record in messages (e.g. its key and database), or None.

        Raises:
            the ``error`` exception: both force flags with an encoded record; bytes that do not
            decode; a decoded image deeper than 8 bits (Caffe: "Image data type must be unsigned
            byte"); a raw record of the wrong size (see :func:`datum_to_array`).
        """
        prefix = f"{where}: " if where else ""
        if not datum.encoded:
            if (self.force_color or self.force_gray) and not self._warned_force:
                self._warned_force = True
                logger.warning("force_color and force_gray only for encoded datum")
            return datum_to_array(datum, lambda msg: self.error(prefix + msg))
        if self.force_color and self.force_gray:
            raise self.error("cannot set both force_color and force_gray")
        mode = "color" if self.force_color else "gray" if self.force_gray else "native"
        image = decode_image(datum.data, mode)
        if image is None:
            raise self.error(f"{prefix}could not decode the encoded image "
                             f"({len(datum.data)} bytes; not a complete JPEG/PNG)")
        if image.dtype != numpy.uint8:
            raise self.error(f"{prefix}Image data type must be unsigned byte (the decoded "
                             f"image is {image.dtype}; store 8-bit images)")
        return image_to_chw(image)

    def start_batch(self, first, n, names=None, hint="", windows=False):
        """Start a batch of ``n`` records whose first record's pixels are ``first`` (C, H, W),
        as Caffe's ``DataLayer::load_batch`` shapes it from its first record: check that one,
        draw every record's random words (:meth:`draw_words`) and return the
        :class:`BatchPlan` that places each record (in any order, from any thread).

        Args:
            first: the first record's pixels.
            n: records in the batch.
            names: what names record i in messages (indexable), or None.
            hint: added to the message when sizes differ without a crop.
            windows: when cropping without a mean file, hand each record's crop window to the
                transform (offsets 0) rather than the whole record (the device staging packs
                windows: one shape for records of any size).

        Raises:
            the ``error`` exception: the first record is smaller than the crop, or the mean does
            not match it.
        """
        return BatchPlan(self, first.shape, n, names, hint, windows)

    # -- transforming --------------------------------------------------------------------------
    def _check_mean(self, channels, height, width):
        if self.mean is not None:
            mshape = self.mean.shape
            lead = int(numpy.prod(mshape[:-3], dtype=numpy.int64)) if len(mshape) > 3 else 1
            if len(mshape) < 3 or lead != 1 or tuple(mshape[-3:]) != (channels, height, width):
                raise self.error(f"the mean file's shape {mshape} does not match the "
                                 f"{channels}x{height}x{width} input")
            return self.mean.reshape(channels, height, width)
        if self.mean_values is not None:
            values = self.mean_values
            if values.size not in (1, channels):
                raise self.error(f"specify either 1 mean_value or as many as channels: {channels} "
                                 f"(got {values.size})")
            return numpy.broadcast_to(values, (channels,)).reshape(channels, 1, 1)
        return None

    def draw_words(self, n):
        """The words ``n`` images' random draws take from the transformer's stream, in Caffe's
        order (per image: mirror when ``mirror``, then h_off, w_off when cropping in TRAIN; one
        word per ``Rand(n)``), as an int64 array (n, k); k is 0 without randomness. How many
        words an image takes does not depend on its size, so they can be drawn before the
        records are decoded."""
        random_crop = bool(self.crop_size) and self.phase == TRAIN
        per_image = int(self.mirror) + 2 * int(random_crop)
        if not (n and per_image):
            return numpy.zeros((n, per_image), numpy.int64)
        if self.rng is None:
            raise self.error("the data transformer needs randomness but init_rand() was not "
                             "called")
        return self.rng.words(n * per_image).astype(numpy.int64).reshape(n, per_image)

    def params_from_words(self, words, height, width):
        """``[mirror, h_off, w_off]`` (int64 (n, 3)) of images of size ``height`` x ``width``
        (ints, or one per image) from their :meth:`draw_words` words: ``word % range`` as
        Caffe's ``Rand``. Without randomness: no mirror, centre crop (offset 0 without crop)."""
        n = len(words)
        crop = self.crop_size
        heights = numpy.broadcast_to(numpy.asarray(height, numpy.int64), (n,))
        widths = numpy.broadcast_to(numpy.asarray(width, numpy.int64), (n,))
        params = numpy.zeros((n, 3), numpy.int64)
        if crop and self.phase != TRAIN:
            params[:, 1] = (heights - crop) // 2
            params[:, 2] = (widths - crop) // 2
        if self.mirror:
            params[:, 0] = words[:, 0] % 2
        if crop and self.phase == TRAIN:
            params[:, 1] = words[:, -2] % (heights - crop + 1)
            params[:, 2] = words[:, -1] % (widths - crop + 1)
        return params

    def draw_params(self, n, height, width):
        """Draw ``[mirror, h_off, w_off]`` for ``n`` images of size ``height`` x ``width`` (ints,
        or one per image): :meth:`draw_words`, then :meth:`params_from_words`.

        Returns:
            int64 array (n, 3).
        """
        return self.params_from_words(self.draw_words(n), height, width)

    def plan(self, shape):
        """Check a batch of records of ``shape`` and draw its random crops and mirrors: the
        host half of :meth:`transform` (the draws, in Caffe's order; ``last_params`` is set).
        The arithmetic is :meth:`TransformPlan.run`, on the host or on the device.

        Args:
            shape: (N, C, H, W) of the records.

        Returns:
            TransformPlan.

        Raises:
            the ``error`` exception: not 4-D, the records are smaller than the crop, or the
            mean does not match them.
        """
        if len(shape) != 4:
            raise self.error("the transformer takes (N, C, H, W) records, got shape "
                             f"{tuple(shape)}")
        n, c, h, w = (int(d) for d in shape)
        _, out_h, out_w = self.output_shape(c, h, w)
        mean = self._check_mean(c, h, w)
        params = self.draw_params(n, h, w)
        self.last_params = params
        return TransformPlan(self, (n, c, out_h, out_w), params, mean, self.scale)

    def mean_like(self, mean, out):
        """``mean`` (a host array from :meth:`plan`, or None) on ``out``'s device: itself for
        NumPy, a device copy made once per shape otherwise (the first use copies it)."""
        xp = get_array_module(out)
        if mean is None or xp is numpy:
            return mean
        cache = self.__dict__.setdefault("_device_means", {})
        key = (xp.__name__, mean.shape)
        if key not in cache:
            cache[key] = xp.asarray(numpy.ascontiguousarray(mean, dtype=numpy.float32))
        return cache[key]

    def transform(self, batch):
        """Transform a batch of records.

        Args:
            batch: array (N, C, H, W), uint8 or float32 (the records' raw values).

        Returns:
            float32 numpy array (N, C, H', W'), H' = W' = ``crop_size`` when cropping.

        Raises:
            the ``error`` exception: the records are smaller than the crop, or the mean does not
            match them.
        """
        batch = numpy.asarray(batch)
        plan = self.plan(batch.shape)
        out = numpy.empty(plan.out_shape, numpy.float32)
        plan.run(batch, out)
        return out

    def transform_datums(self, datums):
        """Transform a list of ``caffe_pb2.Datum`` records (raw or encoded) into (N, C, H', W')
        float32, under :meth:`plan_records`'s rules.

        Raises:
            the ``error`` exception: a record is invalid (see :meth:`record_pixels`) or does not
            fit the first (see :class:`BatchPlan`).
        """
        records = [self.record_pixels(d) for d in datums]
        batch = self.start_batch(records[0], len(records))
        out = numpy.empty(batch.out_shape, numpy.float32)
        for i, record in enumerate(records):
            batch.transform(i, record, out)
        return out

    def transform_datum(self, datum):
        """Transform one Datum into a (C, H', W') float32 array."""
        return self.transform_datums([datum])[0]


class BatchPlan:
    """One batch of records under Caffe's rules (``DataLayer::load_batch`` with
    ``Transform(const Datum&, Blob*)``'s checks), its random words already drawn, so that each
    record can be checked and transformed on its own, on any thread, once it is decoded.

    The batch takes its shape from the first record: (N, C, H', W'), H' x W' the crop or the
    first record's size. Record i must have C channels; without a crop the first record's
    height and width; with a crop at least the crop's size, and then it is cropped at offsets
    drawn from its own size (``word % (H_i - crop + 1)``); with a mean file, the mean's shape.

    Attributes:
        out_shape: (N, C, H', W').
        params: int64 (N, 3) ``[mirror, h_off, w_off]`` drawn for each record, filled in as
            records are placed (the transformer's ``last_params``).
        mean: None, float32 (C, H, W) or (C, 1, 1) on the host.
        scale: float32.
    """

    def __init__(self, transformer, first_shape, n, names, hint, windows):
        t = self.transformer = transformer
        c, h, w = (int(d) for d in first_shape)
        self.first_shape, self.names, self.hint = (c, h, w), names, hint
        _, out_h, out_w = t.output_shape(c, h, w)
        self.out_shape = (n, c, out_h, out_w)
        self.mean = t._check_mean(c, h, w)
        self.scale = t.scale
        self.windows = bool(windows and t.crop_size and t.mean is None)
        self._words = t.draw_words(n)
        self.params = numpy.zeros((n, 3), numpy.int64)
        t.last_params = self.params

    def _name(self, i):
        return self.names[i] if self.names is not None else f"record {i} of the batch"

    def transform_plan(self, params):
        """This batch's :class:`TransformPlan` with ``params`` in place of :attr:`params` (the
        same values, e.g. as the int32 (N, 3) a device staging packed)."""
        return TransformPlan(self.transformer, self.out_shape, params, self.mean, self.scale)

    def place(self, i, record):
        """Check record i (C, H, W) against the batch and fix its crop and mirror.

        Returns:
            (pixels, params row int64 (3,)): what the transform reads and with which
            ``[mirror, h_off, w_off]`` -- the record and its drawn offsets, or with
            ``windows`` its crop window and offsets 0.

        Raises:
            the transformer's ``error`` exception, naming the record: other channels; without
            a crop another size; smaller than the crop; not the mean file's shape.
        """
        t = self.transformer
        c, h, w = self.first_shape
        rc, rh, rw = record.shape
        if rc != c:
            raise t.error(f"{self._name(i)} has {rc} channels, the batch's first record {c}")
        if t.crop_size:
            t.output_shape(rc, rh, rw)              # at least the crop
        elif (rh, rw) != (h, w):
            raise t.error(f"{self._name(i)} is {rh}x{rw}, the batch's first record {h}x{w}: "
                          "without crop_size all records of a batch must have one size"
                          + self.hint)
        if t.mean is not None and (rh, rw) != (h, w):
            t._check_mean(rc, rh, rw)               # raises: the mean has the first's shape
        params = t.params_from_words(self._words[i:i + 1], rh, rw)[0]
        self.params[i] = params
        if not self.windows:
            return record, params
        crop = t.crop_size
        window = record[:, params[1]:params[1] + crop, params[2]:params[2] + crop]
        return window, numpy.array([params[0], 0, 0], numpy.int64)

    def transform(self, i, record, out):
        """Place record i and write it transformed into ``out[i]`` (``out`` float32
        :attr:`out_shape`, host or device) with the kernel set of ``out``'s device."""
        pixels, params = self.place(i, record)
        mean = self.transformer.mean_like(self.mean, out)
        kernels.for_array(out).transform(pixels[None], out[i:i + 1], params[None], mean,
                                         self.scale)


class TransformPlan:
    """One batch's transform as :meth:`DataTransformer.plan` drew it on the host.

    Attributes:
        out_shape: (N, C, H', W') of the result.
        params: int64 (N, 3) ``[mirror, h_off, w_off]`` per image (host).
        mean: None, float32 (C, H, W) or (C, 1, 1) (host).
        scale: float32.
    """

    __slots__ = ("transformer", "out_shape", "params", "mean", "scale")

    def __init__(self, transformer, out_shape, params, mean, scale):
        self.transformer = transformer
        self.out_shape, self.params, self.mean, self.scale = out_shape, params, mean, scale

    def run(self, batch, out, params=None):
        """Write the transformed ``batch`` (N, C, H, W) into ``out`` (:attr:`out_shape`,
        float32) with the kernel set of ``out``'s device (``transform``); ``params``: this
        plan's, or the same values already on the device (int32 (N, 3))."""
        mean = self.transformer.mean_like(self.mean, out)
        kernels.for_array(out).transform(batch, out, self.params if params is None else params,
                                         mean, self.scale)
