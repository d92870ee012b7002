"""Data layers: records from a database, transformed into batches.

Caffe: src/caffe/layers/data_layer.cpp, base_data_layer.cpp, src/caffe/internal_thread.cpp.
"""
import collections
import logging

import numpy

from .. import rng as caffe_rng
from ..backend import get_array_module
from ..data_transformer import DataTransformer
from ..errors import CaffeError
from ..proto import caffe_pb2
from .base import Layer, register

logger = logging.getLogger("caffe_engine")

#: One loaded batch: ``data`` float32 (N, C, H, W), ``label`` float32 (N,) or None.
Batch = collections.namedtuple("Batch", ["data", "label"])

# DataParameter's deprecated transformation fields, moved into transform_param as Caffe's
# UpgradeNetDataTransformation does.
_DEPRECATED_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


@register("Data")
class DataLayer(Layer):
    """Batches of ``Datum`` records read from an LMDB in key order, wrapping at the end.

    Tops: ``data`` (N, C, H, W) float32, the transformed records; optional ``label`` (N,) float32.
    N is ``batch_size``; C, H, W come from the first record (and ``crop_size``).

    Prototxt fields read:
        data_param.source: the LMDB directory (relative to the working directory).
        data_param.batch_size: records per batch (required, > 0).
        data_param.backend: must be LMDB (the proto default, LEVELDB, is rejected).
        data_param.rand_skip: deprecated in Caffe's DataLayer, which ignores it; ignored here too.
        data_param.scale / mean_file / crop_size / mirror: deprecated; moved into transform_param.
        transform_param: see :class:`~caffe_engine.data_transformer.DataTransformer`.

    Random draws at setup, from the global stream, in Caffe's order: the transformer's
    ``InitRand`` (one word, only if it needs randomness: mirror, or crop in TRAIN), its second
    ``InitRand`` (one more word, which seeds it), then one word for the prefetch thread's seed
    (always). Nothing is drawn from the global stream afterwards.

    Each instance has its own cursor, so the TRAIN and TEST nets both start at the first record.
    :meth:`load_batch` does all reading and transforming so that a prefetch thread can call it.

    Attributes:
        solver_count, solver_rank: with several solvers each TRAIN instance keeps the records whose
            running offset ``% solver_count == solver_rank`` (Caffe's ``Skip``); default 1, 0.
        thread_seed: the word drawn for the prefetch thread's own stream.

    Raises:
        CaffeError naming the layer: backend not LMDB, missing/unreadable/empty source, batch_size
        0, a bad record or transformation parameter.

    Caffe: src/caffe/layers/data_layer.cpp
    """

    exact_num_bottom = 0
    min_top = 1
    max_top = 2

    def __init__(self, param, phase):
        super().__init__(param, phase)
        from ..io.lmdb_source import LMDBCursor
        dp = param.data_param
        if dp.backend != caffe_pb2.DataParameter.LMDB:
            unset = "" if dp.HasField("backend") else " (the default when unset)"
            raise self.error(f"data_param.backend is LEVELDB{unset}; only LMDB is supported "
                             "(set backend: LMDB)")
        # Caffe opens the database in the layer's constructor ("Opened lmdb ..." precedes setup).
        try:
            self.cursor = LMDBCursor(dp.source)
        except CaffeError as exc:
            raise self.error(f"data_param.source: {exc}") from None
        logger.info("Opened lmdb %s", dp.source)
        self.batch_size = int(dp.batch_size)
        self.solver_count = 1
        self.solver_rank = 0
        self.output_labels = False
        self.transformer = None
        self.thread_seed = None

    def transform_param(self):
        """The layer's TransformationParameter, with deprecated data_param fields moved in."""
        tp = caffe_pb2.TransformationParameter()
        tp.CopyFrom(self.param.transform_param)
        dp = self.param.data_param
        for field in _DEPRECATED_TRANSFORM_FIELDS:
            if dp.HasField(field):
                setattr(tp, field, getattr(dp, field))
        return tp

    def layer_setup(self, bottom, top):
        if self.batch_size <= 0:
            raise self.error("data_param.batch_size must be positive")
        self.output_labels = len(top) > 1
        # BaseDataLayer::LayerSetUp: build the transformer, InitRand.
        self.transformer = DataTransformer(self.transform_param(), self.phase, error=self.error)
        self.transformer.init_rand()
        # DataLayer::DataLayerSetUp: shape the tops from the first record.
        shape = (self.batch_size,) + self.transformer.infer_shape(self._parse(self.cursor.value()))
        top[0].reshape(shape)
        logger.info("output data size: %s", ",".join(str(d) for d in shape))
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        # BasePrefetchingDataLayer::LayerSetUp: InitRand again, then the thread takes its seed.
        self.transformer.init_rand()
        self.thread_seed = caffe_rng.get_rng().word()

    def reshape(self, bottom, top):
        """Nothing to do: the tops take each batch's shape in :meth:`forward` (as in Caffe)."""

    def _parse(self, raw):
        datum = caffe_pb2.Datum()
        try:
            datum.ParseFromString(raw)
        except Exception:  # google.protobuf.message.DecodeError
            key = self.cursor.key().decode("utf-8", "replace")
            raise self.error(f"record '{key}' of '{self.cursor.path}' is not a Datum") from None
        return datum

    def _skip(self):
        keep = (self.cursor.offset % self.solver_count == self.solver_rank
                or self.phase == caffe_pb2.TEST)
        return not keep

    def load_batch(self):
        """Read the next ``batch_size`` records and transform them (Caffe's ``load_batch``).

        Returns:
            Batch(data float32 (N, C, H, W) numpy array, label float32 (N,) numpy array or None).
        """
        datums = []
        for _ in range(self.batch_size):
            while self._skip():
                self.cursor.next()
            datums.append(self._parse(self.cursor.value()))
            self.cursor.next()
        data = self.transformer.transform_datums(datums)
        label = None
        if self.output_labels:
            label = numpy.array([d.label for d in datums], dtype=numpy.float32)
        return Batch(data, label)

    def next_batch(self):
        """The batch the next forward outputs (a prefetch thread replaces this with its queue)."""
        return self.load_batch()

    def forward(self, bottom, top):
        batch = self.next_batch()
        top[0].reshape(batch.data.shape)
        xp = get_array_module(top[0].data)
        top[0].data[...] = xp.asarray(batch.data)
        if self.output_labels:
            top[1].reshape(batch.label.shape)
            top[1].data[...] = xp.asarray(batch.label)

    def close(self):
        """Close the database (the layer cannot be forwarded afterwards)."""
        self.cursor.close()
