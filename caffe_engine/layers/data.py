"""The Data layer: Datum records from an LMDB or a LevelDB, decoded, transformed, prefetched.

Caffe: src/caffe/layers/data_layer.cpp, base_data_layer.cpp. The prefetch thread, the data
threads and the staging are :mod:`caffe_engine.layers.prefetch`'s.
"""
import copy
import logging

import numpy

from .. import backend
from .. import rng as caffe_rng
from ..data_transformer import DataTransformer
from ..errors import CaffeError
from ..proto import caffe_pb2
from .base import register
from .prefetch import Batch, BasePrefetchingDataLayer, BatchPrefetcher, synced  # noqa: F401

logger = logging.getLogger("caffe_engine")

# DataParameter's deprecated transformation fields, moved into transform_param as Caffe's
# UpgradeNetDataTransformation does.
_DEPRECATED_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


class _RecordNames:
    """Names of a batch's records for messages, made only when one is needed."""

    __slots__ = ("path", "keys")

    def __init__(self, path, keys):
        self.path, self.keys = path, keys

    def __getitem__(self, i):
        key = self.keys[i].decode("utf-8", "replace")
        return f"record '{key}' of '{self.path}'"

    def __len__(self):
        return len(self.keys)


@register("Data")
class DataLayer(BasePrefetchingDataLayer):
    """Batches of ``Datum`` records from an LMDB or a LevelDB, in key order, wrapping at the end.

    Tops: ``data`` (N, C, H, W) float32, the transformed records; optional ``label`` (N,) float32.
    N is ``batch_size``; C, H, W come from the first record of each batch (and ``crop_size``).

    Records are raw pixels (``data`` bytes or ``float_data``) or encoded images (``encoded:
    true``: JPEG/PNG bytes, decoded by OpenCV as ``transform_param.force_color`` /
    ``force_gray`` say, else with the file's own channels), each by its own flag; see
    :class:`~caffe_engine.data_transformer.DataTransformer` for the decoding and for which
    records may share a batch.

    Prototxt fields read:
        data_param.source: the database folder (relative to the working directory).
        data_param.batch_size: records per batch (required, > 0).
        data_param.backend: LEVELDB (the proto default) or LMDB; see :mod:`caffe_engine.io.db`.
        data_param.prefetch: batches a background thread loads ahead (default 4, as Caffe);
            0 loads each batch in ``forward`` on the caller's thread.
        data_param.rand_skip: deprecated in Caffe's DataLayer, which ignores it; ignored here too.
        data_param.scale / mean_file / crop_size / mirror: deprecated; moved into transform_param.
        transform_param: see :class:`~caffe_engine.data_transformer.DataTransformer`.

    Random draws at setup, from the global stream, in Caffe's order: the transformer's
    ``InitRand`` (one word, only if it needs randomness: mirror, or crop in TRAIN), its second
    ``InitRand`` (one more word, which seeds it), then one word for the prefetch thread's seed
    (always). Nothing is drawn from the global stream afterwards.

    Each instance has its own cursor, so the TRAIN and TEST nets both start at the first record.
    The prefetch thread (:mod:`caffe_engine.layers.prefetch`, started at setup) reads the
    records in order, has the data threads decode and transform them, and stages the batch
    ahead of time; :meth:`load_batch` does the same synchronously, on the host. Batches, records
    and random draws are exactly those of loading in ``forward`` with one thread.

    Attributes:
        solver_count, solver_rank: with several solvers each TRAIN instance keeps the records whose
            running offset ``% solver_count == solver_rank`` (Caffe's ``Skip``); taken at
            construction from pycaffe's ``caffe.set_solver_count`` / ``set_solver_rank``
            (default 1, 0), set again by a solver. TEST instances read every record.
        thread_seed: the word drawn for the prefetch thread's own stream.
        cursor, transformer: the database cursor (LMDBCursor or LevelDBCursor) and the
            DataTransformer, positioned after the last batch forwarded.

    Raises:
        CaffeError naming the layer: a missing/unreadable/corrupt/empty source or one of the other
        backend, batch_size 0, a bad transformation parameter; and naming the record (its key and
        database) as well: a record that is not a Datum, cannot be decoded, or does not fit the
        batch (from ``forward`` when prefetched).

    Caffe: src/caffe/layers/data_layer.cpp, base_data_layer.cpp
    """

    min_top = 1
    max_top = 2

    def __init__(self, param, phase):
        super().__init__(param, phase)
        from ..io.db import backend_name, open_db
        dp = param.data_param
        backend_kind = backend_name(dp.backend)
        # Caffe opens the database in the layer's constructor ("Opened lmdb ..." precedes setup).
        try:
            self._cursor = open_db(dp.source, backend_kind)
        except CaffeError as exc:
            unset = "" if dp.HasField("backend") else ", the default when unset"
            raise self.error(f"data_param.source (backend {backend_kind.upper()}{unset}): "
                             f"{exc}") from None
        logger.info("Opened %s %s", backend_kind, dp.source)
        self.batch_size = int(dp.batch_size)
        self.prefetch = int(dp.prefetch)
        # Caffe's DataLayer::Skip reads the process-wide Caffe::solver_count / solver_rank
        # (pycaffe's set_solver_count / set_solver_rank).
        self._solver_count = backend.solver_count()
        self._solver_rank = backend.solver_rank()
        self.output_labels = False
        self.thread_seed = None

    # -- state the prefetch thread advances: reading it stops the thread and rewinds --------------
    cursor = synced("cursor", "The database cursor; reading or setting it stops prefetching.")
    solver_count = synced("solver_count", "Ranks sharing the records; setting it stops "
                                          "prefetching.", on_read=False)
    solver_rank = synced("solver_rank", "This rank's share of the records; setting it stops "
                                        "prefetching.", on_read=False)

    def _prefetch_state(self):
        cursor, transformer = self._cursor, self._transformer
        return (cursor.offset, cursor.key(), copy.deepcopy(transformer.rng),
                transformer.last_params)

    def _rewind(self, state):
        offset, key, rng, last_params = state
        if not self._cursor.seek(key):
            raise self.error(f"cannot rewind the prefetched cursor to record {key!r}")
        self._cursor.offset = offset
        self._transformer.rng = rng
        self._transformer.last_params = last_params

    # -- setup -----------------------------------------------------------------------------------
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
        self._transformer = DataTransformer(self.transform_param(), self.phase, error=self.error)
        self._transformer.init_rand()
        # DataLayer::DataLayerSetUp: shape the tops from the first record.
        first = self._names([self._cursor.key()])[0]
        shape = (self.batch_size,) + self._transformer.output_shape(
            *self._transformer.record_pixels(self._parse(self._cursor.value()), first).shape)
        top[0].reshape(shape)
        logger.info("output data size: %s", ",".join(str(d) for d in shape))
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        # BasePrefetchingDataLayer::LayerSetUp: InitRand again, then the thread takes its seed.
        self._transformer.init_rand()
        self.thread_seed = caffe_rng.get_rng().word()

    def _names(self, keys):
        return _RecordNames(self._cursor.path, keys)

    def _parse(self, raw):
        datum = caffe_pb2.Datum()
        try:
            datum.ParseFromString(raw)
        except Exception:  # google.protobuf.message.DecodeError
            raise self.error(f"{self._names([self._cursor.key()])[0]} is not a Datum") from None
        return datum

    def _skip(self):
        keep = (self._cursor.offset % self._solver_count == self._solver_rank
                or self.phase == caffe_pb2.TEST)
        return not keep

    # -- batches ---------------------------------------------------------------------------------
    def _read_batch(self):
        """The next ``batch_size`` Datums in order (skipping other ranks' records), their labels
        (float32 (N,) or None) and names; advances the cursor."""
        cursor = self._cursor
        datums, keys = [], []
        for _ in range(self.batch_size):
            while self._skip():
                cursor.next()
            keys.append(cursor.key())
            datums.append(self._parse(cursor.value()))
            cursor.next()
        label = None
        if self.output_labels:
            label = numpy.array([d.label for d in datums], dtype=numpy.float32)
        return datums, label, self._names(keys)

    def _decode(self, datum, name):
        return self._transformer.record_pixels(datum, name)

    def close(self):
        """Stop prefetching and close the database (the layer cannot be forwarded afterwards)."""
        try:
            super().close()
        finally:
            self._cursor.close()
