"""Caffe's BasePrefetchingDataLayer: batches loaded ahead by a thread while the net computes.

Caffe: src/caffe/layers/base_data_layer.cpp, src/caffe/internal_thread.cpp,
src/caffe/util/blocking_queue.cpp.

:class:`BatchPrefetcher` is the layer's thread: it calls the layer's ``_load_batch`` into a queue
that keeps ``prefetch - 1`` batches ready (Caffe's ``data_param.prefetch``, default 4; see
:func:`queue_depth`) and ``forward`` takes the oldest. It is started at the end of setup, as Caffe's ``StartInternalThread``. When ``forward``
finds the queue empty it logs Caffe's ``Data layer prefetch queue empty``, once every 1,000
times (glog's ``LOG_EVERY_N``, counted over all layers of the process as Caffe's one call site),
and waits; :attr:`BasePrefetchingDataLayer.wait_seconds` adds up the time waited.

One thread loads the batches one after another, so the records, the random draws and the log
lines come in exactly the order of loading on the caller's thread. Within a batch the per-record
work -- decoding, cropping, mirroring, the mean -- is spread over the data threads
(:mod:`caffe_engine.io.workers`), each record's result depending on that record alone: the
batches are the same, bit for bit, with any number of threads, prefetched or not. Log records
emitted while loading a batch (on the prefetch thread or on a data thread working for it) are
held back with that batch and emitted when it is forwarded.

Reading the layer's loading state (its ``cursor``, ``transformer``, the subclass's own; a
snapshot, a test, a resume) first stops the thread and rewinds that state to the first batch
not yet forwarded, so what is observed is always the synchronous state. The thread holds only a
weak reference to its layer, and stops when the layer is collected or closed, and at
interpreter exit.

What the thread queues is a *staged* batch (:mod:`caffe_engine.io.staging`, chosen by the tops'
device at setup): on the CPU the transformed float32 batch; on the GPU the raw uint8 records,
their crop/mirror draws and the labels, already on their way to the device in pinned memory on
the staging's own stream; ``forward`` then waits for that copy on the device and transforms
into the top there.
"""
import atexit
import collections
import logging
import queue
import threading
import time
import weakref

import numpy

from ..io import workers as data_workers
from ..io.staging import HostStaging, staging_for
from .base import Layer

logger = logging.getLogger("caffe_engine")

#: One loaded batch: ``data`` float32 (N, C, H, W), ``label`` float32 (N,) or None.
Batch = collections.namedtuple("Batch", ["data", "label"])

#: Caffe's message when ``forward`` finds no batch ready (BlockingQueue::pop's log_on_wait).
QUEUE_EMPTY = "Data layer prefetch queue empty"
#: ... logged on the 1st, 1001st, ... time (glog's LOG_EVERY_N(INFO, 1000)).
QUEUE_EMPTY_EVERY = 1000

_thread_local = threading.local()
_waits = {"count": 0}
_waits_lock = threading.Lock()


class _HoldOnPrefetchThread(logging.Filter):
    """Keep records logged while loading a batch with that batch (see module doc)."""

    def filter(self, record):
        held = getattr(_thread_local, "held", None)
        if held is None:
            return True
        held.append(record)
        return False


if not any(isinstance(f, _HoldOnPrefetchThread) for f in logger.filters):
    logger.addFilter(_HoldOnPrefetchThread())


def _count_wait():
    """Count one wait for an empty queue; log Caffe's line on the 1st, 1001st, ... wait."""
    with _waits_lock:
        _waits["count"] += 1
        log = _waits["count"] % QUEUE_EMPTY_EVERY == 1 or QUEUE_EMPTY_EVERY == 1
    if log:
        logger.info(QUEUE_EMPTY)


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
        depth: most batches the queue holds (:func:`queue_depth`), >= 1.
        name: the thread's name.
    """

    def __init__(self, owner, depth, name):
        self.queue = queue.Queue(maxsize=max(1, int(depth)))
        self.stop_event = threading.Event()
        self._unqueued = []       # a batch loaded when the stop came, the queue full
        self.thread = threading.Thread(target=BatchPrefetcher._run, name=name, daemon=True,
                                       args=(weakref.ref(owner), self.queue, self.stop_event,
                                             self._unqueued))
        # When the owner is collected the thread ends by itself (weak reference); this also
        # wakes it at once.
        self._finalizer = weakref.finalize(owner, self.stop_event.set)
        _live_prefetchers.add(self)
        self.thread.start()

    @staticmethod
    def _run(ref, out, stop, unqueued):
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
                        unqueued.append(item)
                        return
            if item.error is not None:
                return

    def get(self):
        """The next loaded entry (blocks until the thread has loaded it; an empty queue is
        counted and logged as Caffe's ``BlockingQueue::pop`` does)."""
        try:
            return self.queue.get_nowait()
        except queue.Empty:
            _count_wait()
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
        return pending + self._unqueued


def queue_depth(prefetch):
    """Loaded batches the queue holds for ``data_param.prefetch`` = ``prefetch`` (>= 1).

    Caffe's ``prefetch`` buffers hold the batch in the top and up to ``prefetch - 1`` loaded
    ones, its thread waiting for a free buffer before it loads. Here the thread loads, then
    waits for room in the queue holding the batch, and the top holds one more: a queue of
    ``prefetch - 2`` (at least 1) keeps ``prefetch - 1`` batches ready and ``prefetch``
    buffers in all, as Caffe's, from ``prefetch`` 3 on (the default 4: 77 MB, not 115, for
    VGG-16's batch of 32)."""
    return max(1, int(prefetch) - 2)


@atexit.register
def _stop_all_prefetchers():
    for prefetcher in list(_live_prefetchers):
        prefetcher.stop_event.set()
    for prefetcher in list(_live_prefetchers):
        prefetcher.thread.join(timeout=5)


def synced(name, doc, on_read=True):
    """A layer attribute kept in ``_<name>`` whose setter (and getter when ``on_read``) first
    stops the prefetch thread and rewinds to the first batch not yet forwarded."""
    slot = "_" + name

    def get(self):
        if on_read:
            self._sync()
        return getattr(self, slot)

    def set(self, value):
        self._sync()
        setattr(self, slot, value)
    return property(get, set, doc=doc)


class BasePrefetchingDataLayer(Layer):
    """A data layer whose batches a :class:`BatchPrefetcher` loads ahead (Caffe's
    BasePrefetchingDataLayer), their records decoded and transformed over the data threads.

    A subclass sets ``prefetch`` (batches loaded ahead; 0: each batch is loaded in ``forward``
    on the caller's thread) and ``_transformer`` in its setup, and provides:

    * ``_read_batch()``: the next batch's items, read in order on the loading thread
      (advancing the layer's state): ``(items, labels float32 (N,) or None, names)``, ``names``
      indexable by record (what names a record in messages);
    * ``_decode(item, name)``: one item's pixels as a (C, H, W) array (uint8 or float32), called
      on the data threads: it must not touch the layer's state;
    * ``_prefetch_state()`` / ``_rewind(state)``: a snapshot of everything ``_read_batch`` and the
      transformer's draws advance, and putting it back.

    or overrides ``_load_batch`` / :meth:`load_batch` where its batches are not records through
    the transformer (WindowData).

    Attributes:
        wait_seconds: the time ``forward`` has spent waiting for the prefetch thread (seconds).
        transformer: the DataTransformer, positioned after the last batch forwarded.
    """

    exact_num_bottom = 0
    prefetch = 4
    _prefetcher = None
    _staging = None
    _transformer = None
    #: what the records-of-a-batch error adds when sizes differ without a crop
    size_hint = ""

    transformer = synced("transformer", "The DataTransformer; reading or setting it stops "
                                        "prefetching.")

    def __init__(self, param, phase):
        super().__init__(param, phase)
        self.wait_seconds = 0.0

    def setup(self, bottom, top):
        """Caffe's SetUp, then the prefetch thread starts (``StartInternalThread``)."""
        self._sync()
        super().setup(bottom, top)
        queued = queue_depth(self.prefetch) if self.prefetch > 0 else 0
        self._staging = staging_for(top[0].data, slots=queued + 2)
        if self.prefetch > 0:
            self._start()

    def _start(self):
        self._prefetcher = BatchPrefetcher(self, queue_depth(self.prefetch),
                                           f"prefetch:{self.name}")

    def reshape(self, bottom, top):
        """Nothing to do: the tops take each batch's shape in :meth:`forward` (as in Caffe)."""

    # -- the loading state ---------------------------------------------------------------------
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

    # -- batches -------------------------------------------------------------------------------
    def _load(self, staging):
        """Read the next batch in order, then decode, check and transform (or, for the device,
        gather) each record over the data threads into ``staging``; returns the staged batch.
        The first record is decoded first: the batch takes its shape (Caffe's ``load_batch``)."""
        items, labels, names = self._read_batch()
        first = self._decode(items[0], names[0])
        plan = self._transformer.start_batch(first, len(items), names, self.size_hint,
                                             windows=staging.on_device)
        target = staging.batch(plan, first)
        held = getattr(_thread_local, "held", None)

        def record(i):
            before = getattr(_thread_local, "held", None)
            _thread_local.held = held     # log records go with the batch being loaded
            try:
                target.put(i, first if i == 0 else self._decode(items[i], names[i]))
            finally:
                _thread_local.held = before
        data_workers.shared().run(record, len(items))
        return staging.finish(target, labels)

    def load_batch(self):
        """Read the next batch and transform it on the host (Caffe's ``load_batch``). Called on
        the caller's thread it first stops prefetching (and rewinds), so it returns the batch
        the next ``forward`` would have output.

        Returns:
            Batch(data float32 (N, C, H, W) numpy array, label float32 (N,) numpy array or None).
        """
        self._sync()
        staged = self._load(HostStaging(1))
        return Batch(staged.data, staged.label)

    def _load_batch(self):
        """Read the next batch and stage it (what the prefetch thread queues): see
        :mod:`caffe_engine.io.staging`."""
        return self._load(self._staging)

    def next_batch(self):
        """The staged batch the next forward outputs: from the prefetch queue (the thread is
        started again after a stop), or loaded here when ``prefetch`` is 0."""
        if self.prefetch <= 0:
            return self._load_batch()
        if self._prefetcher is None:
            self._start()
        started = time.perf_counter()
        item = self._prefetcher.get()
        self.wait_seconds += time.perf_counter() - started
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
        self._staging.recycle()
        staged = self.next_batch()
        self._staging.deliver(staged, top[0], top[1] if len(top) > 1 else None)

    def close(self):
        """Stop prefetching, rewound to the first batch not forwarded (a later ``forward``
        starts a new thread there)."""
        self._sync()
