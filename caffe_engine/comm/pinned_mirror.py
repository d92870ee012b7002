"""Staging of device (CuPy) gradient buckets through pinned host memory, chunk by chunk.

The MPI algorithms (tree, ring, ps, mpi, hier) add and send host (NumPy) float32 arrays; the
mpich wheel is not CUDA-aware, so a bucket that lives on the GPU must be copied to host memory,
reduced there and copied back. Copying the whole bucket first (``flat.get()``: a pageable,
synchronous copy) and back after (``flat.set()``) leaves the link idle during both copies. Here
the copies go through a *pinned* host mirror of the bucket on the communicator's own CUDA
streams, in chunks of ``chunk_bytes`` (default 1 MiB):

* :meth:`Transfer.ready` ``(lo, hi)``: the algorithm is about to read ``host[lo:hi]`` (add
  into it or send it); it blocks on the copy events of the chunks covering that range only.
  All device-to-host copies are enqueued at once when the transfer begins, in the order the
  algorithm will need the ranges (``order``: the tree's and hier's chunks ascending, the ring's
  segments from its own), so chunk k+1 is being copied while chunk k is on the wire.
* :meth:`Transfer.publish` ``(lo, hi)``: ``host[lo:hi]`` holds its final sum and will not be
  written again; its host-to-device copy is enqueued at once, on a second stream, so the result
  of chunk k goes back while chunk k+1 is still in flight.
* :meth:`Transfer.finish` ``(scale)``: the mean's ``* float32(1 / size)`` on the device (one
  float32 multiply per element: the same IEEE product as NumPy's on the host, so the bits equal
  the unstaged path's), then both streams synchronised; only then may the pinned mirror be
  reused (a :class:`Stager` serves one transfer at a time and refuses a second while one is
  open).

Rules every algorithm keeps (and the emulator checks, see below): a range is ``ready`` before
it is read; every element is published exactly once, after its last write; a published range
is never written again. With NumPy buffers there is no stager at all: the algorithms run on the
bucket itself with today's code (:data:`NO_STAGE`'s methods do nothing), so the CPU path is
unchanged.

Devices (``ops``): :class:`CupyOps` (two non-blocking CUDA streams on the buffer's device, a
blocking-sync event per chunk, ``cupy.cuda.alloc_pinned_memory``) and :class:`EmulatedOps`, a
NumPy array standing in for the device memory, whose streams run a copy as *late* as a GPU may
(device-to-host: only when its event is waited on or the stream synchronised) or as *early* as
it may (host-to-device: at enqueue), and which fills the pinned mirror with NaN at every new
transfer (stale bytes). A read before ``ready`` therefore sees NaN, a write after ``publish``
never reaches the "device": either shows up as a result that differs from the unstaged one.
``CAFFE_COMM_STAGING=emulate`` stages NumPy buckets through it (tests/parallel compares the
bits); ``auto`` (the default) stages CuPy buckets only.

Not done: a CUDA-aware MPI path (device pointers straight to MPI), so CuPy buckets are always
staged. Caffe itself never staged: its multi-GPU path was NCCL (src/caffe/parallel.cpp); the
chunked, double-streamed copy follows Horovod's and MPI libraries' pipelined host staging.
"""
import bisect

import numpy

from .. import environment
from ..errors import CaffeError

#: Environment variable choosing the staging mode: "auto" (default) or "emulate".
STAGING_VAR = "CAFFE_COMM_STAGING"
MODES = ("auto", "emulate")
#: Default size of one staged copy, in bytes.
DEFAULT_CHUNK_BYTES = 1 << 20


def is_cupy(a):
    """Whether ``a`` is a CuPy array (by its type's module; CuPy is not imported)."""
    return type(a).__module__.startswith("cupy")


def mode_from_env(environ=None):
    """``CAFFE_COMM_STAGING`` checked: "auto" when unset or empty.

    Raises:
        CaffeError: another value (one line).
    """
    value = environment.read(STAGING_VAR, environ)
    if value not in MODES:
        raise CaffeError(f"{STAGING_VAR} must be {' or '.join(MODES)}, got {value!r}")
    return value


def compute_ready(flat):
    """On the caller's thread: an event after the work queued so far on the current CUDA stream
    (the gradients written into ``flat``), for the staging stream to wait on; None for NumPy."""
    if not is_cupy(flat):
        return None
    import cupy
    return cupy.cuda.get_current_stream().record()


def chunk_ranges(order, count, chunk_elems):
    """The copy chunks: each (lo, hi) of ``order`` cut into pieces of at most ``chunk_elems``.

    Args:
        order: (lo, hi) ranges that together cover [0, count) once, in the order the algorithm
            needs them (None: [(0, count)]).
        count: the bucket's element count.
        chunk_elems: the largest chunk, in elements (>= 1).

    Returns:
        list of (lo, hi) in copy order.

    Raises:
        CaffeError: ranges that overlap, leave a gap or leave [0, count).
    """
    order = [(0, count)] if order is None else [(int(lo), int(hi)) for lo, hi in order]
    covered = 0
    for lo, hi in sorted(order):
        if lo != covered or hi < lo:
            raise CaffeError(f"staging: the copy order {order} does not cover [0, {count}) once")
        covered = hi
    if covered != count:
        raise CaffeError(f"staging: the copy order {order} does not cover [0, {count}) once")
    step = max(1, int(chunk_elems))
    return [(a, min(a + step, hi)) for lo, hi in order for a in range(lo, hi, step)]


# --------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------
class CupyOps:
    """The staging copies of one :class:`Stager` on a GPU: a pinned host mirror, one stream for
    device-to-host copies and one for host-to-device copies and the scale (both
    ``non_blocking``: they never wait on the legacy default stream, only on the events given).

    Args:
        device_id: the CUDA device of the buffers.
    """

    def __init__(self, device_id):
        import cupy
        self.cupy = cupy
        self.device = cupy.cuda.Device(device_id)
        with self.device:
            self.d2h = cupy.cuda.Stream(non_blocking=True)
            self.h2d = cupy.cuda.Stream(non_blocking=True)

    def alloc_host(self, count):
        """A float32 NumPy array of ``count`` elements in page-locked memory."""
        mem = self.cupy.cuda.alloc_pinned_memory(max(count, 1) * 4)
        return numpy.frombuffer(mem, numpy.float32, count)   # keeps ``mem`` alive

    def wait_for(self, event):
        self.d2h.wait_event(event)

    def copy_to_host(self, dev, host, lo, hi):
        """Enqueue host[lo:hi] = dev[lo:hi] on the d2h stream; return an event after it."""
        with self.device:
            dev[lo:hi].get(stream=self.d2h, out=host[lo:hi], blocking=False)
            event = self.cupy.cuda.Event(block=True, disable_timing=True)
            event.record(self.d2h)
        return event

    def copy_to_device(self, host, dev, lo, hi):
        """Enqueue dev[lo:hi] = host[lo:hi] on the h2d stream."""
        with self.device:
            dev[lo:hi].set(host[lo:hi], stream=self.h2d)

    def scale(self, dev, factor):
        """Enqueue dev *= factor (float32) on the h2d stream, after the copies back."""
        with self.device, self.h2d:
            dev *= factor

    def synchronize(self):
        self.d2h.synchronize()
        self.h2d.synchronize()


class _EmulatedEvent:
    def __init__(self, stream, index):
        self._stream, self._index = stream, index

    @property
    def done(self):
        return self._stream.executed > self._index

    def synchronize(self):
        self._stream.run_until(self._index + 1)


class _EmulatedStream:
    """A FIFO of enqueued operations that run only when forced (``eager``: at once)."""

    def __init__(self, name, eager, log):
        self.name, self.eager, self.log = name, eager, log
        self.ops = []
        self.executed = 0

    def enqueue(self, what, fn):
        self.ops.append((what, fn))
        self.log.append(("enqueue", self.name) + what)
        if self.eager:
            self.run_until(len(self.ops))
        return _EmulatedEvent(self, len(self.ops) - 1)

    def run_until(self, n):
        while self.executed < n:
            what, fn = self.ops[self.executed]
            fn()
            self.executed += 1
            self.log.append(("run", self.name) + what)

    @property
    def pending(self):
        return len(self.ops) - self.executed


class EmulatedOps:
    """NumPy arrays standing in for device memory, for the tests and ``CAFFE_COMM_STAGING=
    emulate``: device-to-host copies run as late as a GPU may (when their event is waited on or
    the stream synchronised), host-to-device copies and the scale as early as it may (at enqueue,
    ``lazy_h2d=False``) or as late (``lazy_h2d=True``). ``log`` records every enqueue, run and
    wait: ``("enqueue"|"run", stream, kind, lo, hi)``, ``("wait", lo, hi)``, ``("sync",)``.
    ``alloc_host`` counts its calls (``allocations``)."""

    def __init__(self, lazy_h2d=False):
        self.log = []
        self.d2h = _EmulatedStream("d2h", False, self.log)
        self.h2d = _EmulatedStream("h2d", not lazy_h2d, self.log)
        self.allocations = 0

    def alloc_host(self, count):
        self.allocations += 1
        return numpy.full(count, numpy.nan, numpy.float32)

    def poison(self, host):
        """Fill the mirror with NaN at the start of a transfer (what an earlier transfer left)."""
        host[...] = numpy.nan

    def wait_for(self, event):
        self.log.append(("wait_for", event))

    def copy_to_host(self, dev, host, lo, hi):
        def run():
            host[lo:hi] = dev[lo:hi]
        event = self.d2h.enqueue(("d2h", lo, hi), run)
        return _LoggedEvent(event, self.log, lo, hi)

    def copy_to_device(self, host, dev, lo, hi):
        def run():
            dev[lo:hi] = host[lo:hi]
        self.h2d.enqueue(("h2d", lo, hi), run)

    def scale(self, dev, factor):
        def run():
            numpy.multiply(dev, factor, out=dev)
        self.h2d.enqueue(("scale", 0, dev.size), run)

    def synchronize(self):
        self.log.append(("sync",))
        self.d2h.run_until(len(self.d2h.ops))
        self.h2d.run_until(len(self.h2d.ops))


class _LoggedEvent:
    def __init__(self, event, log, lo, hi):
        self._event, self._log, self.lo, self.hi = event, log, lo, hi

    @property
    def done(self):
        return self._event.done

    def synchronize(self):
        self._log.append(("wait", self.lo, self.hi))
        self._event.synchronize()


# --------------------------------------------------------------------------------------------
# Transfers
# --------------------------------------------------------------------------------------------
class _NoStage:
    """The stage of an unstaged (host) buffer: every method does nothing."""

    staged = False

    def ready(self, lo, hi):
        pass

    def poll(self, lo, hi):
        return True

    def publish(self, lo, hi):
        pass


#: The stage the algorithms get for a host buffer (and when called without one).
NO_STAGE = _NoStage()


class Transfer:
    """One staged allreduce of a device bucket (made by :meth:`Stager.begin`).

    Attributes:
        host: the pinned float32 mirror, shape (count,); the algorithm reduces it in place.
        dev: the device bucket, flat float32 (count,).
        chunks: the (lo, hi) copy chunks in copy order.
    """

    staged = True

    def __init__(self, stager, dev, host, chunks, events):
        self.stager, self.dev, self.host, self.chunks = stager, dev, host, chunks
        by_lo = sorted(range(len(chunks)), key=lambda i: chunks[i][0])
        self._los = [chunks[i][0] for i in by_lo]
        self._his = [chunks[i][1] for i in by_lo]
        self._events = [events[i] for i in by_lo]
        self._ready = [False] * len(chunks)
        self._published = 0
        self._open = True

    def _covering(self, lo, hi):
        if hi <= lo:
            return
        k = bisect.bisect_right(self._los, lo) - 1
        k = max(k, 0)
        while k < len(self._los) and self._los[k] < hi:
            if self._his[k] > lo:
                yield k
            k += 1

    def ready(self, lo, hi):
        """Block until host[lo:hi] holds the device's values (the chunks covering it copied)."""
        for k in self._covering(lo, hi):
            if not self._ready[k]:
                self._events[k].synchronize()
                self._ready[k] = True

    def poll(self, lo, hi):
        """Whether host[lo:hi] is already copied (never blocks)."""
        for k in self._covering(lo, hi):
            if not self._ready[k]:
                if not self._events[k].done:
                    return False
                self._ready[k] = True
        return True

    def publish(self, lo, hi):
        """host[lo:hi] is final: start its copy back to the device. The range must not be
        written again (it is read by the copy until :meth:`finish`)."""
        if hi > lo:
            self.stager.ops.copy_to_device(self.host, self.dev, lo, hi)
            self._published += hi - lo

    def finish(self, scale=None):
        """Scale the device bucket by ``scale`` (float32; None: no scale) after the copies back,
        wait for every copy, and release the stager.

        Raises:
            CaffeError: the algorithm published more or less than the whole bucket (a bug).
        """
        if self._published != self.host.size or not all(self._ready):
            self.close()
            raise CaffeError(f"staging: {self._published} of {self.host.size} floats were "
                             f"copied back, {sum(self._ready)} of {len(self._ready)} chunks "
                             "waited for (an algorithm missed a ready or a publish)")
        if scale is not None:
            self.stager.ops.scale(self.dev, numpy.float32(scale))
        self.close()

    def close(self):
        """Wait for every enqueued copy and release the stager (also after an error)."""
        if self._open:
            self._open = False
            try:
                self.stager.ops.synchronize()
            finally:
                self.stager.busy = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Stager:
    """The pinned mirror and streams of one communicator duplicate (one transfer at a time).

    Args:
        ops: :class:`CupyOps` or :class:`EmulatedOps`.
        chunk_bytes: the largest copy, in bytes (>= 4).
    """

    def __init__(self, ops, chunk_bytes=DEFAULT_CHUNK_BYTES):
        self.ops = ops
        self.chunk_bytes = int(chunk_bytes)
        self.busy = False
        self._host = None

    def begin(self, dev, ready=None, order=None):
        """Start a staged allreduce of ``dev`` (flat float32, on the device): the device-to-host
        copies of every chunk are enqueued now, after ``ready`` (an event of the compute
        stream, or None), in ``order`` (see :func:`chunk_ranges`).

        Returns:
            a :class:`Transfer` (a context manager that closes it).

        Raises:
            CaffeError: a transfer of this stager is still open (its pinned mirror is in use).
        """
        if self.busy:
            raise CaffeError("staging: the pinned buffer is still in use by another transfer")
        count = dev.size
        chunks = chunk_ranges(order, count, self.chunk_bytes // 4)
        if self._host is None or self._host.size < count:
            self._host = self.ops.alloc_host(count)
        host = self._host[:count]
        poison = getattr(self.ops, "poison", None)
        if poison is not None:                          # the emulator: stale bytes
            poison(host)
        self.busy = True
        try:
            if ready is not None:
                self.ops.wait_for(ready)
            events = [self.ops.copy_to_host(dev, host, lo, hi) for lo, hi in chunks]
        except BaseException:
            self.busy = False
            raise
        return Transfer(self, dev, host, chunks, events)


class Staging:
    """Chooses and keeps the stagers of one communicator (one per duplicate and device).

    Args:
        mode: "auto" (CuPy buckets staged, NumPy ones not) or "emulate" (NumPy buckets staged
            through :class:`EmulatedOps` too); None: ``CAFFE_COMM_STAGING``.
        chunk_bytes: the copy size of new stagers.
        emulator: what makes the ops of an emulated stager (default :class:`EmulatedOps`;
            the tests pass ``lambda: EmulatedOps(lazy_h2d=True)``).

    Raises:
        CaffeError: an unknown mode, chunk_bytes < 4 (one line).
    """

    def __init__(self, mode=None, chunk_bytes=DEFAULT_CHUNK_BYTES, emulator=None):
        self.mode = mode_from_env() if mode is None else mode
        if self.mode not in MODES:
            raise CaffeError(f"staging mode must be {' or '.join(MODES)}, got {self.mode!r}")
        self.chunk_bytes = int(chunk_bytes)
        if self.chunk_bytes < 4:
            raise CaffeError(f"staging: chunk_bytes must be >= 4, got {chunk_bytes}")
        self.emulator = EmulatedOps if emulator is None else emulator
        self._stagers = {}

    @property
    def stagers(self):
        """The stagers made so far (a list, in order of creation)."""
        return list(self._stagers.values())

    def stager_for(self, key, flat):
        """The :class:`Stager` for buffers like ``flat`` on duplicate ``key``, or None when
        ``flat`` is reduced where it is (NumPy in "auto" mode)."""
        if is_cupy(flat):
            device = flat.device.id
            ident = (key, "cupy", device)
            make = lambda: CupyOps(device)   # noqa: E731
        elif self.mode == "emulate":
            ident = (key, "emulate")
            make = self.emulator
        else:
            return None
        stager = self._stagers.get(ident)
        if stager is None:
            stager = self._stagers[ident] = Stager(make(), self.chunk_bytes)
        return stager
