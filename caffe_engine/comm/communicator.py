"""The communicator seam: rank, world size, and an in-place allreduce of one flat float32 buffer.

A layer never knows about ranks and a communicator never knows about layers: they meet in flat
gradient buffers (see :mod:`.buckets`). Every algorithm has the same interface:

    comm = get_communicator("tree")          # or "ring", "ps", "mpi", "hier", "nccl"
    comm.allreduce_(buf, op="mean")          # in place, blocking
    h = comm.allreduce_async_(buf)           # in place, returns at once
    ...                                      # compute something else
    h.wait()                                 # buf now holds the sum on every rank

``buf`` is one C-contiguous float32 array (any shape; it is treated as flat). ``op`` is
``"sum"`` or ``"mean"``; the mean multiplies the sum by ``float32(1 / size)`` as Caffe's
multi-GPU solvers do (``caffe_gpu_scal(size, 1 / Caffe::solver_count(), diff)``).

Determinism: every algorithm has a fixed topology and a fixed summation order, and all ranks end
with bitwise identical buffers (the tree and the parameter server broadcast the root's sum; the
ring's all-gather copies each reduced segment from the one rank that reduced it; the
hierarchical allreduce broadcasts its node leaders' common result within each node).

Compressed gradients (:mod:`.compress`): ``allreduce_compressed_(buf, compressor)`` and
``allreduce_compressed_async_`` run a :class:`~.compress.BucketCompressor` (fp16, Top-k,
gTop-k) instead of the algorithm's dense sum, on the same threads and duplicates, so they queue
behind (and overlap like) the dense operations; only MPI communicators and the local one have
them (not ``nccl``).

Non-blocking operations run on one background *progress thread* per communicator, over a
duplicate of the MPI communicator (``Dup``), in the order they were launched. The choice: MPI
libraries (MPICH included) make progress on a transfer only while some thread is inside an MPI
call, so non-blocking requests alone would only move when the main thread waits; a thread that
runs the whole algorithm, with the GIL released inside each MPI call and each large NumPy add,
overlaps communication with the backward pass. Blocking calls run on the calling thread over a
second duplicate, so the two streams of operations can never match each other's messages.
This needs ``MPI_THREAD_MULTIPLE``, which mpi4py requests by default.

Device (CuPy) buffers: ``nccl`` reduces them on the GPU; the MPI algorithms reduce them in a
pinned host mirror, copied in chunks on their own CUDA streams so that the copies overlap the
transfers (:mod:`.pinned_mirror`; the mirror's chunks are waited for and copied back by the
algorithms themselves). NumPy buffers are reduced where they are, as before.

Fault handling: every blocking wait inside a communicator runs under a process-wide watchdog. If
one operation waits longer than ``timeout`` seconds (default 50, env ``CAFFE_COMM_TIMEOUT``;
0 disables), the watchdog prints one line naming the rank and the operation and calls
``MPI_Abort`` on ``COMM_WORLD``, so every rank exits non-zero instead of hanging. A rank that
is killed is detected at once by the peer watch (:mod:`.peer_watch`), or by ``mpiexec``.

Without mpi4py, or with a world of one process, :func:`get_communicator` returns a
:class:`LocalCommunicator` whose operations are no-ops: nothing changes without MPI.

The algorithms register themselves by name (:mod:`.registry`); this module never imports one.

Errors: unknown algorithm names, buffers that are not float32 / contiguous, and an unusable
NCCL raise :class:`~caffe_engine.errors.CaffeError` with a one-line message.
"""
import contextlib
import queue
import threading
import time

import numpy

from .. import environment
from ..errors import CaffeError
from . import pinned_mirror, registry
from .launcher import abort_world, launched_under_mpi, mpi_module
from .registry import ALGORITHMS  # noqa: F401  (the registered names, a live view)
from .pinned_mirror import NO_STAGE

OPS = ("sum", "mean")
DEFAULT_TIMEOUT = 50.0

# --------------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------------
def default_timeout():
    """Seconds a communicator wait may take before the job is aborted (``CAFFE_COMM_TIMEOUT``)."""
    value = environment.read("CAFFE_COMM_TIMEOUT")
    return DEFAULT_TIMEOUT if value is None else value


# --------------------------------------------------------------------------------------------
# Watchdog: a wait that never ends becomes MPI_Abort
# --------------------------------------------------------------------------------------------
class Watchdog:
    """Aborts the job when a registered wait outlives its deadline.

    One daemon thread per process wakes about every half second (or a quarter of the shortest
    timeout) and checks the open waits; ``watch(what, timeout)`` is a context manager around
    one blocking operation. ``on_timeout(message)`` defaults to :func:`abort_world`.
    """

    def __init__(self, on_timeout=None):
        self.on_timeout = on_timeout or abort_world
        self._open = {}
        self._lock = threading.Lock()
        self._thread = None
        self._counter = 0

    @contextlib.contextmanager
    def watch(self, what, timeout, rank=0, size=1):
        if not timeout or timeout <= 0:
            yield
            return
        with self._lock:
            self._counter += 1
            key = self._counter
            self._open[key] = (time.monotonic() + timeout, timeout, what, rank, size)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="caffe-comm-watchdog",
                                                daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._open.pop(key, None)

    def _run(self):
        while True:
            with self._lock:
                entries = list(self._open.values())
            shortest = min((e[1] for e in entries), default=2.0)
            time.sleep(min(0.5, shortest / 4))
            now = time.monotonic()
            with self._lock:
                late = [e for e in self._open.values() if now > e[0]]
            if late:
                _, timeout, what, rank, size = late[0]
                self.on_timeout(
                    f"caffe_engine: rank {rank} of {size}: {what} waited more than {timeout:g} s "
                    "for the other ranks; one of them has probably died or hung. Aborting all "
                    "ranks (MPI_Abort).")
                with self._lock:  # a test's on_timeout may return: do not fire again
                    for k in [k for k, e in self._open.items() if e in late]:
                        self._open.pop(k, None)


WATCHDOG = Watchdog()


# --------------------------------------------------------------------------------------------
# Handles and the progress thread
# --------------------------------------------------------------------------------------------
class Handle:
    """The pending result of ``allreduce_async_``: ``wait()`` blocks and returns the buffer.

    An exception raised by the operation (on the progress thread) is re-raised by ``wait``.
    """

    def __init__(self, buf):
        self.buf = buf
        self._event = threading.Event()
        self._error = None

    def _finish(self, error=None):
        self._error = error
        self._event.set()

    def done(self):
        """Whether the operation has finished (never blocks)."""
        return self._event.is_set()

    def wait(self, timeout=None):
        """Block until the operation is done; return the buffer.

        Raises:
            CaffeError: ``timeout`` seconds passed first (the operation goes on).
            Whatever the operation raised.
        """
        if not self._event.wait(timeout):
            raise CaffeError(f"allreduce did not finish within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return self.buf


class _CompletedHandle(Handle):
    def __init__(self, buf):
        super().__init__(buf)
        self._finish()


class _ProgressThread:
    """Runs submitted operations one at a time, in submission order, on a daemon thread."""

    def __init__(self, name):
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, handle):
        self._queue.put((fn, handle))
        return handle

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, handle = item
            try:
                fn()
            except BaseException as exc:  # handed to wait()
                handle._finish(exc)
            else:
                handle._finish()

    def stop(self):
        self._queue.put(None)
        self._thread.join()


# --------------------------------------------------------------------------------------------
# Buffers
# --------------------------------------------------------------------------------------------
def _is_cupy(a):
    return type(a).__module__.startswith("cupy")


def local_place(mpi_comm, MPI, key=0):
    """``(local rank, local size)``: this process's place among the ranks of ``mpi_comm`` on
    its machine (an ``MPI_COMM_TYPE_SHARED`` split ordered by ``key``; collective)."""
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=key)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def check_buffer(buf, what="allreduce"):
    """Validate ``buf`` (float32, C-contiguous, writeable) and return a flat view of it.

    Raises:
        CaffeError: another dtype, a non-contiguous or read-only array.
    """
    if not hasattr(buf, "dtype") or buf.dtype != numpy.float32:
        raise CaffeError(f"{what}: the buffer must be a float32 array, "
                         f"got {getattr(buf, 'dtype', type(buf).__name__)}")
    if not buf.flags.c_contiguous:
        raise CaffeError(f"{what}: the buffer must be C-contiguous")
    if not _is_cupy(buf) and not buf.flags.writeable:
        raise CaffeError(f"{what}: the buffer is read-only")
    return buf.reshape(-1)


def _check_op(op):
    if op not in OPS:
        raise CaffeError(f"allreduce: op must be 'sum' or 'mean', got {op!r}")


def _run_compressed(comm, MPI, rank, size, buf, compressor, op):
    """``compressor``'s sum of ``buf`` over ``comm`` (staged through host memory for CuPy),
    then the mean's ``* float32(1 / size)``; returns ``buf``."""
    _check_op(op)
    flat = check_buffer(buf, "compressed allreduce")
    if flat.size != compressor.count:
        raise CaffeError(f"compressed allreduce: the buffer has {flat.size} floats, the "
                         f"compressor was made for {compressor.count}")
    if flat.size == 0:
        return buf
    host = flat.get() if _is_cupy(flat) else flat
    compressor.allreduce_sum_(comm, MPI, rank, size, host)
    if op == "mean":
        host *= numpy.float32(1.0 / size)
    if host is not flat:
        flat.set(host)
    return buf


# --------------------------------------------------------------------------------------------
# Communicators
# --------------------------------------------------------------------------------------------
class Communicator:
    """Interface of every communicator (see the module docstring).

    Attributes:
        name: the algorithm's name ("tree", "ring", "ps", "mpi", "hier", "nccl", "local").
        rank, size: this process's rank and the number of processes.
        timeout: seconds one wait may take before the job is aborted (None or 0: never).
    """

    name = "base"

    def __init__(self, rank=0, size=1, timeout=None):
        self.rank = int(rank)
        self.size = int(size)
        self.timeout = default_timeout() if timeout is None else timeout

    @property
    def is_root(self):
        return self.rank == 0

    def _watch(self, what):
        """The watchdog around one wait of this communicator (``timeout`` seconds)."""
        return WATCHDOG.watch(f"{what} ({self.name})", self.timeout, self.rank, self.size)

    def allreduce_(self, buf, op="sum"):
        """Sum (or average) ``buf`` over all ranks, in place; return ``buf``."""
        raise NotImplementedError

    def allreduce_async_(self, buf, op="sum"):
        """Start :meth:`allreduce_` and return a :class:`Handle` at once.

        ``buf`` must not be read or written until ``handle.wait()`` returns. Every rank must
        launch its asynchronous operations in the same order.
        """
        raise NotImplementedError

    def allreduce_compressed_(self, buf, compressor, op="sum"):
        """Sum (or average) ``buf`` over all ranks through ``compressor`` (a
        :class:`~.compress.BucketCompressor`: fp16, Top-k or gTop-k, its residual updated),
        in place; return ``buf``. Every rank ends with the same bits."""
        raise CaffeError(f"communicator '{self.name}' has no compressed allreduce "
                         "(--comm_compress needs tree, ring, ps, mpi or hier)")

    def allreduce_compressed_async_(self, buf, compressor, op="sum"):
        """:meth:`allreduce_compressed_` started at once, queued behind the operations launched
        before it; returns a :class:`Handle`."""
        raise CaffeError(f"communicator '{self.name}' has no compressed allreduce "
                         "(--comm_compress needs tree, ring, ps, mpi or hier)")

    def bcast_(self, buf, root=0):
        """Overwrite ``buf`` on every rank with root's ``buf`` (any dtype, contiguous)."""
        raise NotImplementedError

    def barrier(self, timeout="default"):
        """Wait for every rank. ``timeout=None`` waits forever (no watchdog)."""
        raise NotImplementedError

    def allgather_object(self, obj):
        """List of every rank's picklable ``obj``, in rank order."""
        raise NotImplementedError

    def over(self, comm, members):
        """A communicator of this algorithm, with this one's options, over ``comm`` (an mpi4py
        communicator of the world ranks ``members``, this rank among them): what PCL-DNN's
        replica groups allreduce over (:mod:`.model_parallel`). Collective over ``comm``.

        Raises:
            CaffeError: an algorithm that cannot run over a sub-communicator.
        """
        raise CaffeError(f"communicator '{self.name}' cannot run over a sub-communicator")

    def close(self):
        """Release threads and duplicated MPI communicators (collective)."""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name} rank {self.rank} of {self.size}>"


class LocalCommunicator(Communicator):
    """The world of one process: every operation leaves the buffer as it is."""

    name = "local"

    def __init__(self, requested="local", **_opts):
        super().__init__(0, 1, timeout=0)
        self.requested = requested

    def allreduce_(self, buf, op="sum"):
        check_buffer(buf)
        _check_op(op)
        return buf  # sum and mean of one buffer are the buffer (x * float32(1) == x)

    def allreduce_async_(self, buf, op="sum"):
        self.allreduce_(buf, op)
        return _CompletedHandle(buf)

    def allreduce_compressed_(self, buf, compressor, op="sum"):
        # One rank: the compressor still selects (and keeps its residual); nothing is sent.
        return _run_compressed(None, None, 0, 1, buf, compressor, op)

    def allreduce_compressed_async_(self, buf, compressor, op="sum"):
        self.allreduce_compressed_(buf, compressor, op)
        return _CompletedHandle(buf)

    def bcast_(self, buf, root=0):
        if root != 0:
            raise CaffeError(f"bcast: root {root} out of range for 1 rank")
        return buf

    def barrier(self, timeout="default"):
        return None

    def allgather_object(self, obj):
        return [obj]


class MPICommunicator(Communicator):
    """Base of the algorithms that run over an mpi4py communicator.

    Subclasses implement ``_allreduce_sum(comm, flat, stage=NO_STAGE)`` — an in-place sum of a
    flat float32 NumPy array over ``comm`` (one of the two duplicates), identical bits on every
    rank — calling ``stage.ready(lo, hi)`` before they first read a range and
    ``stage.publish(lo, hi)`` once a range holds its final sum (:mod:`.pinned_mirror`). CuPy
    buffers are reduced in a pinned host mirror that way, copied in chunks that overlap the
    transfers (MPICH's wheel is not CUDA-aware); NumPy buffers are reduced where they are, with
    :data:`~.pinned_mirror.NO_STAGE` (unless ``CAFFE_COMM_STAGING=emulate``).
    ``_stage_order(count)`` gives the order in which the algorithm needs the ranges (None:
    ascending).

    Args:
        comm: an mpi4py communicator (default ``MPI.COMM_WORLD``); it is duplicated twice.
        timeout: see :class:`Communicator`.
    """

    def over(self, comm, members):
        """The same algorithm over ``comm``; algorithms with options override this to pass
        theirs on (see :meth:`Communicator.over`)."""
        return type(self)(comm, timeout=self.timeout)

    def __init__(self, comm=None, timeout=None):
        MPI = mpi_module()
        if MPI is None:
            raise CaffeError(f"communicator '{self.name}' needs mpi4py "
                             "(pip install mpich mpi4py)")
        self.MPI = MPI
        self.staging = pinned_mirror.Staging()  # CAFFE_COMM_STAGING, checked before MPI is touched
        comm = MPI.COMM_WORLD if comm is None else comm
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout)
        self.comm = comm.Dup()          # blocking operations, on the caller's thread
        self._async_comm = comm.Dup()   # operations of the progress thread
        self._progress = None
        self._scratch = {}

    # -- helpers for subclasses ------------------------------------------------------------
    def scratch(self, comm, count):
        """A float32 work array of at least ``count`` elements, one per duplicate comm."""
        key = id(comm)
        arr = self._scratch.get(key)
        if arr is None or arr.size < count:
            arr = numpy.empty(max(count, 1), numpy.float32)
            self._scratch[key] = arr
        return arr[:count]

    # -- the interface -----------------------------------------------------------------------
    def _run_allreduce(self, comm, buf, op, ready=None):
        """``buf`` summed (or averaged) over ``comm``; a device buffer through its stager.
        ``ready``: the compute stream's event after the gradients were written (CuPy)."""
        flat = check_buffer(buf)
        if self.size == 1 or flat.size == 0:
            return buf
        stager = self.staging.stager_for(id(comm), flat)
        if stager is not None:
            scale = numpy.float32(1.0 / self.size) if op == "mean" else None
            with self._watch(f"allreduce of {flat.size * 4} bytes"):
                with stager.begin(flat, ready, self._stage_order(flat.size)) as transfer:
                    self._allreduce_sum(comm, transfer.host, transfer)
                    transfer.finish(scale)
            return buf
        with self._watch(f"allreduce of {flat.size * 4} bytes"):
            self._allreduce_sum(comm, flat)
        if op == "mean":
            flat *= numpy.float32(1.0 / self.size)
        return buf

    def _stage_order(self, count):
        """The (lo, hi) ranges of a staged buffer in the order the algorithm first reads them
        (None: ascending)."""
        return None

    def allreduce_(self, buf, op="sum"):
        _check_op(op)
        return self._run_allreduce(self.comm, buf, op, pinned_mirror.compute_ready(buf))

    def allreduce_async_(self, buf, op="sum"):
        _check_op(op)
        check_buffer(buf)
        if self.size == 1:
            return _CompletedHandle(buf)
        if self._progress is None:
            self._progress = _ProgressThread(f"caffe-comm-{self.name}")
        handle = Handle(buf)
        ready = pinned_mirror.compute_ready(buf)    # on the caller's thread, at launch
        return self._progress.submit(
            lambda: self._run_allreduce(self._async_comm, buf, op, ready), handle)

    def _run_compressed(self, comm, buf, compressor, op):
        what = (f"compressed allreduce ({compressor.settings.method}) of "
                f"{compressor.count * 4} bytes")
        with self._watch(what):
            return _run_compressed(comm, self.MPI, self.rank, self.size, buf, compressor, op)

    def allreduce_compressed_(self, buf, compressor, op="sum"):
        _check_op(op)
        return self._run_compressed(self.comm, buf, compressor, op)

    def allreduce_compressed_async_(self, buf, compressor, op="sum"):
        _check_op(op)
        check_buffer(buf)
        if self._progress is None:
            self._progress = _ProgressThread(f"caffe-comm-{self.name}")
        handle = Handle(buf)
        return self._progress.submit(
            lambda: self._run_compressed(self._async_comm, buf, compressor, op), handle)

    def bcast_(self, buf, root=0):
        if not 0 <= root < self.size:
            raise CaffeError(f"bcast: root {root} out of range for {self.size} ranks")
        if self.size == 1:
            return buf
        if _is_cupy(buf):
            host = buf.get()
            self.bcast_(host, root)
            buf.set(host)
            return buf
        with self._watch(f"bcast of {buf.nbytes} bytes"):
            self.comm.Bcast(buf, root=root)
        return buf

    def barrier(self, timeout="default"):
        if timeout == "default":
            timeout = self.timeout
        with WATCHDOG.watch(f"barrier ({self.name})", timeout, self.rank, self.size):
            self.comm.Barrier()

    def allgather_object(self, obj):
        with self._watch("allgather"):
            return self.comm.allgather(obj)

    def close(self):
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        for c in (self.comm, self._async_comm):
            if c is not None and c != self.MPI.COMM_NULL:
                c.Free()
        self.comm = self._async_comm = None

    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        raise NotImplementedError


# --------------------------------------------------------------------------------------------
# Selection by name (the classes come from the registry; see :mod:`.registry`)
# --------------------------------------------------------------------------------------------
def get_communicator(name="tree", comm=None, **opts):
    """The communicator called ``name`` over ``comm`` (default ``MPI.COMM_WORLD``).

    Args:
        name: a spec (:func:`.registry.resolve`): one of ``ALGORITHMS`` or an alias, optionally
            ``:value`` for the algorithm's option. "tree" (FireCaffe's reduction tree; opts
            ``branching``=2, ``chunk_bytes``=4 MiB, ``window``, ``lag``), "ring", "ps"
            (parameter server on rank 0), "mpi" (``MPI_Allreduce``), "hier" (alias "hybrid":
            reduce within each node, allreduce among the node leaders, broadcast within the
            node; "hier:tree" / "hier:ring" or ``inter=`` picks the leaders' algorithm,
            ``nodes=`` overrides the node grouping), "nccl" (CuPy arrays on the GPU).
        comm: an mpi4py communicator. When None and the process was not started by an MPI
            launcher, MPI is not even initialised.
        **opts: passed to the algorithm's constructor (``timeout`` for all); they override the
            option a ``:value`` suffix sets.

    Returns:
        The algorithm's communicator, or a :class:`LocalCommunicator` when mpi4py is missing
        or the world has one process (for every name).

    Raises:
        CaffeError: unknown name (one line listing the known ones), a bad ``:value``, an
            unknown option.
    """
    cls, opts = registry.resolve(name, **opts)
    if comm is None:
        if not launched_under_mpi():
            return LocalCommunicator(name)
        MPI = mpi_module()
        if MPI is None:
            return LocalCommunicator(name)
        comm = MPI.COMM_WORLD
    if comm.Get_size() == 1:
        return LocalCommunicator(name)
    try:
        return cls(comm, **opts)
    except TypeError as exc:
        raise CaffeError(f"communicator '{cls.name}': {exc}") from None
