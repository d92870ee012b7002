"""Data layers: records from a database, transformed into batches, loaded ahead by a thread.

Caffe: src/caffe/layers/data_layer.cpp, base_data_layer.cpp, src/caffe/internal_thread.cpp.

:class:`BatchPrefetcher` is Caffe's BasePrefetchingDataLayer thread: it calls the layer's
``load_batch`` into a queue of ``data_param.prefetch`` batches (default 4) while the net computes,
and ``forward`` takes the oldest. One thread loads the batches one after another, so the records,
the transformer's random draws and the log lines come in exactly the order of loading on the
caller's thread; log records the thread emits are held back with their batch and emitted when
that batch is forwarded. Reading the layer's ``cursor`` or ``transformer`` (a snapshot, a test,
a resume) first stops the thread and rewinds both to the first batch not yet forwarded, so what
is observed is always the synchronous state. The thread holds only a weak reference to its
layer, stops when the layer is collected or closed, and at interpreter exit.

What the thread queues is a *staged* batch (:mod:`caffe_engine.io.staging`, chosen by the
tops' device at the first forward): on the CPU the transformed float32 batch, as before; on
the GPU the raw uint8 records, their crop/mirror draws and the labels, already on their way to
the device in pinned memory on the staging's own stream; ``forward`` then waits for that copy
on the device and transforms into the top there.
"""
import atexit
import collections
import copy
import logging
import queue
import threading
import weakref

import numpy

from .. import rng as caffe_rng
from ..data_transformer import DataTransformer
from ..errors import CaffeError
from ..io.staging import staging_for
from ..proto import caffe_pb2
from .base import Layer, register

logger = logging.getLogger("caffe_engine")

#: One loaded batch: ``data`` float32 (N, C, H, W), ``label`` float32 (N,) or None.
Batch = collections.namedtuple("Batch", ["data", "label"])


# ------------------------------------------------------------------------------------------------
# The prefetch thread
# ------------------------------------------------------------------------------------------------
_thread_local = threading.local()


class _HoldOnPrefetchThread(logging.Filter):
    """Keep records logged on a prefetch thread with the batch being loaded (see module doc)."""

    def filter(self, record):
        held = getattr(_thread_local, "held", None)
        if held is None:
            return True
        held.append(record)
        return False


if not any(isinstance(f, _HoldOnPrefetchThread) for f in logger.filters):
    logger.addFilter(_HoldOnPrefetchThread())

#: One queue entry: the loaded batch (or the exception loading raised), the owner's state just
#: before loading it (to rewind to), and the log records held back while loading it.
_Loaded = collections.namedtuple("_Loaded", ["batch", "error", "state", "records"])

_live_prefetchers = weakref.WeakSet()


class BatchPrefetcher:
    """A background thread that loads an owner's batches ahead into a bounded queue.

    The owner provides ``_load_batch()`` (the next batch, advancing its state),
    ``_prefetch_state()`` (a snapshot of that state) and ``_rewind(state)``. The thread keeps only a
    weak reference to the owner between loads.

    Args:
        owner: the layer.
        depth: most batches loaded ahead (Caffe's ``data_param.prefetch``), >= 1.
        name: the thread's name.
    """

    def __init__(self, owner, depth, name):
        self.queue = queue.Queue(maxsize=max(1, int(depth)))
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=BatchPrefetcher._run, name=name, daemon=True,
                                       args=(weakref.ref(owner), self.queue, self.stop_event))
        # When the owner is collected the thread ends by itself (weak reference); this also
        # wakes it at once.
        self._finalizer = weakref.finalize(owner, self.stop_event.set)
        _live_prefetchers.add(self)
        self.thread.start()

    @staticmethod
    def _run(ref, out, stop):
        while not stop.is_set():
            owner = ref()
            if owner is None:
                return
            _thread_local.held = held = []
            state = None
            try:
                state = owner._prefetch_state()
                item = _Loaded(owner._load_batch(), None, state, held)
            except BaseException as exc:  # handed to forward, which raises it
                item = _Loaded(None, exc, state, held)
            finally:
                _thread_local.held = None
            del owner
            while True:
                try:
                    out.put(item, timeout=0.1)
                    break
                except queue.Full:
                    if stop.is_set() or ref() is None:
                        return
            if item.error is not None:
                return

    def get(self):
        """The next loaded entry (blocks until the thread has loaded it)."""
        while True:
            try:
                return self.queue.get(timeout=0.1)
            except queue.Empty:
                if not self.thread.is_alive():
                    try:
                        return self.queue.get_nowait()
                    except queue.Empty:
                        raise RuntimeError(f"{self.thread.name} ended without a batch") from None

    def stop(self):
        """Stop the thread; return the entries it loaded that were not taken, oldest first."""
        self.stop_event.set()
        pending = []
        while self.thread.is_alive():
            try:
                pending.append(self.queue.get(timeout=0.05))
            except queue.Empty:
                pass
        self.thread.join()
        self._finalizer.detach()
        while True:
            try:
                pending.append(self.queue.get_nowait())
            except queue.Empty:
                break
        _live_prefetchers.discard(self)
        return pending


@atexit.register
def _stop_all_prefetchers():
    for prefetcher in list(_live_prefetchers):
        prefetcher.stop_event.set()
    for prefetcher in list(_live_prefetchers):
        prefetcher.thread.join(timeout=5)


# DataParameter's deprecated transformation fields, moved into transform_param as Caffe's
# UpgradeNetDataTransformation does.
_DEPRECATED_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")


def _synced(name, doc, on_read=True):
    """A DataLayer attribute kept in ``_<name>`` whose setter (and getter when ``on_read``)
    first stops the prefetch thread and rewinds to the first batch not yet forwarded."""
    slot = "_" + name

    def get(self):
        if on_read:
            self._sync()
        return getattr(self, slot)

    def set(self, value):
        self._sync()
        setattr(self, slot, value)
    return property(get, set, doc=doc)


@register("Data")
class DataLayer(Layer):
    """Batches of ``Datum`` records from an LMDB or a LevelDB, in key order, wrapping at the end.

    Tops: ``data`` (N, C, H, W) float32, the transformed records; optional ``label`` (N,) float32.
    N is ``batch_size``; C, H, W come from the first record (and ``crop_size``).

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
    The prefetch thread (started by the first ``forward``) reads the records, draws their crops
    and mirrors and stages the batch ahead of time (:mod:`caffe_engine.io.staging`: transformed
    on the thread on the CPU; on the GPU copied raw, uint8, from pinned memory on a stream of
    its own, with ``data_param.prefetch + 2`` buffers, and transformed on the device in
    ``forward``); :meth:`load_batch` does the same synchronously, on the host. Batches, records
    and random draws are exactly those of loading in ``forward`` (see the module docstring for
    how ``cursor`` and ``transformer`` stay exact when read).

    Attributes:
        solver_count, solver_rank: with several solvers each TRAIN instance keeps the records whose
            running offset ``% solver_count == solver_rank`` (Caffe's ``Skip``); default 1, 0.
        thread_seed: the word drawn for the prefetch thread's own stream.
        cursor, transformer: the database cursor (LMDBCursor or LevelDBCursor) and the
            DataTransformer, positioned after the last batch forwarded.

    Raises:
        CaffeError naming the layer: a missing/unreadable/corrupt/empty source or one of the other
        backend, batch_size 0, a bad record or transformation parameter (from ``forward`` when
        prefetched).

    Caffe: src/caffe/layers/data_layer.cpp, base_data_layer.cpp
    """

    exact_num_bottom = 0
    min_top = 1
    max_top = 2
    _prefetcher = None
    _staging = None

    def __init__(self, param, phase):
        super().__init__(param, phase)
        from ..io.db import backend_name, open_db
        dp = param.data_param
        backend = backend_name(dp.backend)
        # Caffe opens the database in the layer's constructor ("Opened lmdb ..." precedes setup).
        try:
            self._cursor = open_db(dp.source, backend)
        except CaffeError as exc:
            unset = "" if dp.HasField("backend") else ", the default when unset"
            raise self.error(f"data_param.source (backend {backend.upper()}{unset}): {exc}") from None
        logger.info("Opened %s %s", backend, dp.source)
        self.batch_size = int(dp.batch_size)
        self.prefetch = int(dp.prefetch)
        self._solver_count = 1
        self._solver_rank = 0
        self.output_labels = False
        self._transformer = None
        self.thread_seed = None

    # -- state the prefetch thread advances: reading it stops the thread and rewinds --------------
    cursor = _synced("cursor", "The database cursor; reading or setting it stops prefetching.")
    transformer = _synced("transformer", "The DataTransformer; reading or setting it stops "
                                         "prefetching.")
    solver_count = _synced("solver_count", "Ranks sharing the records; setting it stops "
                                           "prefetching.", on_read=False)
    solver_rank = _synced("solver_rank", "This rank's share of the records; setting it stops "
                                         "prefetching.", on_read=False)

    def _sync(self):
        """Stop prefetching and rewind to the first batch not yet forwarded (no-op without)."""
        prefetcher = self._prefetcher
        if prefetcher is None or threading.current_thread() is prefetcher.thread:
            return
        self._prefetcher = None
        pending = prefetcher.stop()
        self._discard(pending)
        if pending and pending[0].state is not None:
            self._rewind(pending[0].state)

    def _discard(self, pending):
        """Free the staging slots of loaded entries that will not be forwarded."""
        for item in pending:
            if item.batch is not None and self._staging is not None:
                self._staging.discard(item.batch)

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
        self._sync()
        self.output_labels = len(top) > 1
        # BaseDataLayer::LayerSetUp: build the transformer, InitRand.
        self._transformer = DataTransformer(self.transform_param(), self.phase, error=self.error)
        self._transformer.init_rand()
        # DataLayer::DataLayerSetUp: shape the tops from the first record.
        shape = (self.batch_size,) + self._transformer.infer_shape(
            self._parse(self._cursor.value()))
        top[0].reshape(shape)
        logger.info("output data size: %s", ",".join(str(d) for d in shape))
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        # BasePrefetchingDataLayer::LayerSetUp: InitRand again, then the thread takes its seed.
        self._transformer.init_rand()
        self.thread_seed = caffe_rng.get_rng().word()

    def reshape(self, bottom, top):
        """Nothing to do: the tops take each batch's shape in :meth:`forward` (as in Caffe)."""

    def _parse(self, raw):
        datum = caffe_pb2.Datum()
        try:
            datum.ParseFromString(raw)
        except Exception:  # google.protobuf.message.DecodeError
            key = self._cursor.key().decode("utf-8", "replace")
            raise self.error(f"record '{key}' of '{self._cursor.path}' is not a Datum") from None
        return datum

    def _skip(self):
        keep = (self._cursor.offset % self._solver_count == self._solver_rank
                or self.phase == caffe_pb2.TEST)
        return not keep

    # -- batches ---------------------------------------------------------------------------------
    def _read(self):
        """The next ``batch_size`` records, untransformed: (raw (N, C, H, W) uint8 or float32,
        labels float32 (N,) or None); advances the cursor."""
        cursor = self._cursor
        datums = []
        for _ in range(self.batch_size):
            while self._skip():
                cursor.next()
            datums.append(self._parse(cursor.value()))
            cursor.next()
        raw = self._transformer.stack_datums(datums)
        label = None
        if self.output_labels:
            label = numpy.array([d.label for d in datums], dtype=numpy.float32)
        return raw, label

    def load_batch(self):
        """Read the next ``batch_size`` records and transform them (Caffe's ``load_batch``).

        Called on the caller's thread it first stops prefetching (and rewinds), so it returns the
        batch the next ``forward`` would have output.

        Returns:
            Batch(data float32 (N, C, H, W) numpy array, label float32 (N,) numpy array or None).
        """
        self._sync()
        raw, label = self._read()
        return Batch(self._transformer.transform(raw), label)

    def _load_batch(self):
        """Read the next batch, draw its transform and stage it (what the prefetch thread
        queues): see :mod:`caffe_engine.io.staging`."""
        raw, label = self._read()
        return self._staging.stage(raw, label, self._transformer.plan(raw.shape))

    def next_batch(self):
        """The staged batch the next forward outputs: from the prefetch queue (started on first
        use), or loaded here when ``data_param.prefetch`` is 0. Needs the staging (made by the
        first ``forward``)."""
        if self.prefetch <= 0:
            return self._load_batch()
        if self._prefetcher is None:
            self._prefetcher = BatchPrefetcher(self, self.prefetch, f"prefetch:{self.name}")
        item = self._prefetcher.get()
        for record in item.records:
            logger.handle(record)
        if item.error is not None:
            # The thread has ended; the next forward starts a new one at the failed batch.
            self._discard(self._prefetcher.stop())
            self._prefetcher = None
            if item.state is not None:
                self._rewind(item.state)
            raise item.error
        return item.batch

    def forward(self, bottom, top):
        if self._staging is None:
            # The queue holds ``prefetch`` batches, one more is being loaded and one delivered.
            self._staging = staging_for(top[0].data, slots=max(self.prefetch, 0) + 2)
        staged = self.next_batch()
        self._staging.deliver(staged, top[0], top[1] if self.output_labels else None)

    def close(self):
        """Stop prefetching and close the database (the layer cannot be forwarded afterwards)."""
        prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            self._discard(prefetcher.stop())
        self._cursor.close()
