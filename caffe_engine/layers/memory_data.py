"""MemoryData: batches served from arrays the caller hands over (pycaffe's ``set_input_arrays``).

Caffe: src/caffe/layers/memory_data_layer.cpp, python/caffe/_caffe.cpp (``Net_SetInputArrays``),
python/caffe/pycaffe.py (``_Net_set_input_arrays``).
"""
import numpy

from ..data_transformer import DataTransformer
from ..io.staging import staging_for
from .base import Layer, register


@register("MemoryData")
class MemoryDataLayer(Layer):
    """Serves consecutive ``batch_size`` slices of arrays given with :meth:`reset`.

    Tops: ``data`` (N, C, H, W) float32 and ``label``: (N,) after setup, (N, 1, 1, 1) after each
    forward (Caffe's MemoryDataLayer reshapes it so). N = batch_size.

    Use: ``layer.reset(data, labels, n)`` (Caffe's ``Reset``) or ``layer.set_input_arrays(data,
    labels)`` (pycaffe's, which also accepts a (n,) label vector), then every forward outputs the
    next batch, wrapping at ``n``. The arrays are copied when given (Caffe keeps a pointer to the
    caller's memory; pycaffe keeps the arrays alive), so later changes to them are not seen.
    :meth:`add_datum_vector` transforms a list of Datum records with transform_param first (Caffe's
    ``AddDatumVector``); array data are never transformed (a transform_param only warns).

    Each forward hands its slice to the staging (:mod:`caffe_engine.io.staging`): copied into
    the tops on the CPU; on the GPU copied to the device from pinned memory on the staging's
    stream, labels in the same transfer, the training stream waiting for it on the device.

    The transformer is built at setup as in every Caffe data layer, so its InitRand takes one
    word of the global stream when it needs randomness (mirror, or crop in TRAIN).

    Fields read (memory_data_param): batch_size, channels, height, width (all required, > 0).

    Raises:
        CaffeError naming the layer: a size not positive; forward before any data; arrays of the
        wrong shape, count or length (not a multiple of batch_size).

    Caffe: src/caffe/layers/memory_data_layer.cpp.
    """

    exact_num_bottom = 0
    exact_num_top = 2
    _staging = None

    def layer_setup(self, bottom, top):
        p = self.param.memory_data_param
        self.batch_size = int(p.batch_size)
        self.channels, self.height, self.width = int(p.channels), int(p.height), int(p.width)
        self.transformer = DataTransformer(self.param.transform_param, self.phase, error=self.error)
        self.transformer.init_rand()
        if self.batch_size * self.channels * self.height * self.width <= 0:
            raise self.error("batch_size, channels, height, and width must be specified and "
                             "positive in memory_data_param")
        top[0].reshape((self.batch_size, self.channels, self.height, self.width))
        top[1].reshape((self.batch_size,))
        self.data = None
        self.labels = None
        self.n = 0
        self.pos = 0
        self.has_new_data = False

    def reshape(self, bottom, top):
        """Nothing: forward shapes the tops (as Caffe's Forward does)."""

    # -- feeding -------------------------------------------------------------------------------
    def reset(self, data, labels, n):
        """Serve ``data[:n]`` and ``labels[:n]`` from the start (Caffe's ``Reset``).

        Args:
            data: array-like of at least ``n * channels * height * width`` values.
            labels: array-like of at least ``n`` values.
            n: number of items, a multiple of ``batch_size``.

        Raises:
            CaffeError naming the layer: ``n`` not a positive multiple of batch_size; too few
            values.
        """
        n = int(n)
        if n <= 0 or n % self.batch_size:
            raise self.error(f"n must be a positive multiple of batch size {self.batch_size}, "
                             f"got {n}")
        size = self.channels * self.height * self.width
        data = numpy.asarray(data, dtype=numpy.float32).ravel()
        labels = numpy.asarray(labels, dtype=numpy.float32).ravel()
        if data.size < n * size or labels.size < n:
            raise self.error(f"reset with n={n} needs {n * size} data values and {n} labels, "
                             f"got {data.size} and {labels.size}")
        if self.param.HasField("transform_param"):
            import logging
            logging.getLogger("caffe_engine").warning(
                "%s does not transform array data on Reset()", self.type)
        self.data = data[:n * size].reshape(n, self.channels, self.height, self.width).copy()
        self.labels = labels[:n].copy()
        self.n = n
        self.pos = 0

    def set_input_arrays(self, data, labels):
        """pycaffe's ``net.set_input_arrays(data, labels)`` for this layer.

        Args:
            data: float32 C-contiguous array (n, channels, height, width).
            labels: float32 array (n,) or (n, 1, 1, 1).

        Raises:
            CaffeError naming the layer: not float32 / C-contiguous / 4-D of the layer's C, H, W;
            n differs between the arrays; n not a multiple of batch_size.
        """
        labels = numpy.asarray(labels)
        if labels.ndim == 1:
            labels = numpy.ascontiguousarray(labels[:, None, None, None])
        self._check_array(data, "data array", (self.channels, self.height, self.width))
        self._check_array(labels, "labels array", (1, 1, 1))
        if data.shape[0] != labels.shape[0]:
            raise self.error("data and labels must have the same first dimension")
        if data.shape[0] % self.batch_size:
            raise self.error("first dimensions of input arrays must be a multiple of batch size")
        self.reset(data, labels, data.shape[0])

    def _check_array(self, array, what, chw):
        if not isinstance(array, numpy.ndarray) or not array.flags["C_CONTIGUOUS"]:
            raise self.error(f"{what} must be C contiguous")
        if array.ndim != 4:
            raise self.error(f"{what} must be 4-d")
        if array.dtype != numpy.float32:
            raise self.error(f"{what} must be float32")
        if tuple(array.shape[1:]) != chw:
            expected = ", ".join(str(d) for d in chw)
            raise self.error(f"{what} has shape {array.shape}; expected (n, {expected})")

    def add_datum_vector(self, datums):
        """Transform Datum records with transform_param and serve them (Caffe's ``AddDatumVector``).

        Raises:
            CaffeError naming the layer: previous added data not yet consumed; no records; a
            count not a multiple of batch_size; records not matching the layer's C, H, W.
        """
        if self.has_new_data:
            raise self.error("can't add data until current data has been consumed")
        if not datums:
            raise self.error("there is no datum to add")
        if len(datums) % self.batch_size:
            raise self.error("the added data must be a multiple of the batch size")
        data = self.transformer.transform_datums(list(datums))
        if data.shape[1:] != (self.channels, self.height, self.width):
            raise self.error(f"transformed records are {data.shape[1:]}, the layer's "
                             f"{(self.channels, self.height, self.width)}")
        labels = numpy.asarray([d.label for d in datums], dtype=numpy.float32)
        self.reset(data, labels, len(datums))
        self.has_new_data = True

    def resume_state(self):
        """The position in the current arrays (the arrays are the caller's to give again)."""
        return {"pos": self.pos}

    def restore_resume_state(self, state):
        self.pos = int(state["pos"])
        if self.n:
            self.pos %= self.n

    # -- running -------------------------------------------------------------------------------
    def forward(self, bottom, top):
        if self.data is None:
            raise self.error("MemoryData needs to be initialized by calling reset() or "
                             "set_input_arrays()")
        n = self.batch_size
        if self._staging is None:
            self._staging = staging_for(top[0].data, slots=2)
        staged = self._staging.stage(self.data[self.pos:self.pos + n],
                                     self.labels[self.pos:self.pos + n].reshape(n, 1, 1, 1))
        self._staging.deliver(staged, top[0], top[1])
        self.pos = (self.pos + n) % self.n
        if self.pos == 0:
            self.has_new_data = False
