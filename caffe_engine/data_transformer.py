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
run the arithmetic on the device (:mod:`caffe_engine.io.staging`).
"""
import logging

import numpy

from . import kernels
from . import rng as caffe_rng
from .backend import get_array_module
from .errors import CaffeError
from .proto.caffe_pb2 import TRAIN

logger = logging.getLogger("caffe_engine")


def datum_to_array(datum, error=CaffeError):
    """The pixels of a ``caffe_pb2.Datum`` as a (C, H, W) array, uint8 (``data``) or float32 (``float_data``).

    Args:
        datum: the Datum.
        error: callable turning a message into the exception to raise.

    Raises:
        the ``error`` exception: the Datum is encoded (JPEG/PNG), has no channels, or its byte or
        float count does not match ``channels * height * width``.
    """
    if datum.encoded:
        raise error("encoded Datum records (JPEG/PNG) are not supported; "
                    "store raw pixels (convert_imageset without --encoded)")
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
            ``force_color`` / ``force_gray`` apply to encoded records only and are ignored.
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
        if param.force_color or param.force_gray:
            logger.warning("force_color and force_gray only for encoded datum")

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

    def _rand(self, n):
        if self.rng is None:
            raise self.error("the data transformer needs randomness but init_rand() was not called")
        return self.rng.word() % n

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
        """(C, H', W') the transformed ``datum`` will have."""
        return self.output_shape(*datum_to_array(datum, self.error).shape)

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

    def draw_params(self, n, height, width):
        """Draw ``[mirror, h_off, w_off]`` for ``n`` images of size ``height`` x ``width``.

        Per image, in Caffe's order: mirror (when ``mirror``), then h_off, w_off (crop in TRAIN).
        Without randomness: no mirror, centre crop (or offset 0 without crop).

        Returns:
            int64 array (n, 3).
        """
        crop = self.crop_size
        params = numpy.zeros((n, 3), numpy.int64)
        if crop and self.phase != TRAIN:
            params[:, 1] = (height - crop) // 2
            params[:, 2] = (width - crop) // 2
        random_crop = bool(crop) and self.phase == TRAIN
        if self.mirror or random_crop:
            for i in range(n):
                if self.mirror:
                    params[i, 0] = self._rand(2)
                if random_crop:
                    params[i, 1] = self._rand(height - crop + 1)
                    params[i, 2] = self._rand(width - crop + 1)
        return params

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

    def stack_datums(self, datums):
        """The raw values of ``caffe_pb2.Datum`` records of one shape: (N, C, H, W), uint8
        (``data``) or float32 (``float_data``), untransformed.

        Raises:
            the ``error`` exception: a record is invalid (see :func:`datum_to_array`) or differs
            in shape from the first.
        """
        arrays = [datum_to_array(d, self.error) for d in datums]
        first = arrays[0].shape
        for i, a in enumerate(arrays):
            if a.shape != first:
                raise self.error(f"record {i} of the batch has shape {a.shape}, the first {first}; "
                                 "all records of a batch must have one shape")
        return numpy.stack(arrays)

    def transform_datums(self, datums):
        """Transform a list of ``caffe_pb2.Datum`` records of one shape into (N, C, H', W') float32.

        Raises:
            the ``error`` exception: a record is invalid (see :func:`datum_to_array`) or differs
            in shape from the first.
        """
        return self.transform(self.stack_datums(datums))

    def transform_datum(self, datum):
        """Transform one Datum into a (C, H', W') float32 array."""
        return self.transform_datums([datum])[0]


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
