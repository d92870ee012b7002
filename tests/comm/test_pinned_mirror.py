"""The staging of device buckets through pinned host memory (caffe_engine/comm/pinned_mirror.py),
without a GPU: the emulated device (copies to the host run as late as a GPU may, copies back as
early or as late as it may, the mirror filled with NaN) and a fake CuPy module for the few
CuPy-only lines.

What is proved: every D2H copy is enqueued before the first chunk is used (chunk k+1 copies
while chunk k is on the wire); a chunk is never read (sent) before its copy event was waited
on; each published chunk's copy back is enqueued before the next chunk is sent; the pinned
mirror is never reused while a transfer's copies are pending; the device ends with the exact
bits of the host computation; a missing ``ready`` or ``publish`` is caught.
"""
import inspect
import sys
import types

import numpy
import pytest

from caffe_engine.comm import pinned_mirror
from caffe_engine.comm.pinned_mirror import (NO_STAGE, CupyOps, EmulatedOps, Stager, Staging,
                                             chunk_ranges, mode_from_env)
from caffe_engine.errors import CaffeError
from cuda_env import cuda_missing


def data(n, seed=0):
    return numpy.random.default_rng(seed).standard_normal(n).astype(numpy.float32)


def run_pipeline(stager, dev, order=None, ready=None, scale=None, sends=None, skip_ready=(),
                 chunk=None):
    """A stand-in for a pipelined algorithm: for each range of ``order`` (default: chunks of
    ``chunk`` elements ascending) wait for it, "send" it (log and keep a copy), reduce it
    (x * 2 + 1), publish it."""
    n = dev.size
    if order is None:
        step = chunk or n
        order = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    sends = [] if sends is None else sends
    with stager.begin(dev, ready, order) as t:
        for lo, hi in order:
            if (lo, hi) not in skip_ready:
                t.ready(lo, hi)
            stager.ops.log.append(("send", lo, hi))
            sends.append(t.host[lo:hi].copy())
            t.host[lo:hi] = t.host[lo:hi] * numpy.float32(2) + numpy.float32(1)
            t.publish(lo, hi)
        t.finish(scale)
    return sends


def index(log, entry):
    return log.index(entry)


# --------------------------------------------------------------------------------------------
def test_chunk_ranges_cut_each_range_in_order():
    assert chunk_ranges(None, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_ranges([(6, 10), (0, 6)], 10, 4) == [(6, 10), (0, 4), (4, 6)]
    assert chunk_ranges([(0, 0), (0, 3)], 3, 8) == [(0, 3)]
    for bad in ([(0, 4)], [(0, 6), (4, 10)], [(0, 4), (5, 10)], [(0, 11)]):
        with pytest.raises(CaffeError, match="does not cover"):
            chunk_ranges(bad, 10, 4)


def test_mode_from_env():
    assert mode_from_env({}) == "auto"
    assert mode_from_env({"CAFFE_COMM_STAGING": ""}) == "auto"
    assert mode_from_env({"CAFFE_COMM_STAGING": "Emulate"}) == "emulate"
    with pytest.raises(CaffeError) as e:
        mode_from_env({"CAFFE_COMM_STAGING": "gpu"})
    assert str(e.value) == "CAFFE_COMM_STAGING must be auto or emulate, got 'gpu'"
    with pytest.raises(CaffeError, match="chunk_bytes must be >= 4"):
        Staging("auto", chunk_bytes=2)


def test_numpy_buffers_are_not_staged_in_auto_mode():
    buf = data(8)
    assert Staging("auto").stager_for(1, buf) is None
    assert pinned_mirror.compute_ready(buf) is None
    assert NO_STAGE.poll(0, 8) and not NO_STAGE.staged
    assert NO_STAGE.ready(0, 8) is None and NO_STAGE.publish(0, 8) is None
    emu = Staging("emulate", chunk_bytes=16)
    s1 = emu.stager_for(1, buf)
    assert isinstance(s1, Stager) and isinstance(s1.ops, EmulatedOps)
    assert emu.stager_for(1, buf) is s1 and emu.stager_for(2, buf) is not s1
    assert emu.stagers == [s1, emu.stager_for(2, buf)]


@pytest.mark.parametrize("lazy_h2d", [False, True])
def test_pipeline_order_and_bits(lazy_h2d):
    ops = EmulatedOps(lazy_h2d=lazy_h2d)
    stager = Stager(ops, chunk_bytes=16)                     # 4 floats a copy
    dev = data(22)
    orig = dev.copy()
    sends = run_pipeline(stager, dev, ready="compute-event", scale=0.25, chunk=8)
    log = ops.log
    # The compute stream's event comes first, then every D2H copy, before anything waits.
    assert log[0] == ("wait_for", "compute-event")
    d2h = [e for e in log if e[:2] == ("enqueue", "d2h")]
    assert [e[3:] for e in d2h] == chunk_ranges(None, 22, 4)
    first_wait = next(i for i, e in enumerate(log) if e[0] == "wait")
    assert all(index(log, e) < first_wait for e in d2h)
    # A range is sent only after every chunk covering it was copied (run) and waited on.
    for lo, hi in [(0, 8), (8, 16), (16, 22)]:
        sent = index(log, ("send", lo, hi))
        for clo, chi in chunk_ranges(None, 22, 4):
            if clo < hi and chi > lo:
                assert index(log, ("run", "d2h", "d2h", clo, chi)) < sent
                assert index(log, ("wait", clo, chi)) < sent
    # Each result's copy back is enqueued before the next range goes out.
    assert index(log, ("enqueue", "h2d", "h2d", 0, 8)) < index(log, ("send", 8, 16))
    assert index(log, ("enqueue", "h2d", "h2d", 8, 16)) < index(log, ("send", 16, 22))
    # What was sent is the device's data (no NaN from the stale mirror); the device ends with
    # the host's bits: (x * 2 + 1) * float32(0.25), the scale after every copy back.
    numpy.testing.assert_array_equal(numpy.concatenate(sends), orig)
    want = (orig * numpy.float32(2) + numpy.float32(1)) * numpy.float32(0.25)
    assert dev.tobytes() == want.tobytes()
    scale_at = index(log, ("enqueue", "h2d", "scale", 0, 22))
    assert all(index(log, e) < scale_at for e in log if e[:3] == ("enqueue", "h2d", "h2d"))
    assert ("sync",) in log
    assert ops.d2h.pending == 0 and ops.h2d.pending == 0 and not stager.busy


def test_order_of_the_algorithm_is_the_copy_order():
    ops = EmulatedOps()
    stager = Stager(ops, chunk_bytes=16)
    dev = data(12)
    orig = dev.copy()
    order = [(8, 12), (4, 8), (0, 4)]                        # as the ring's rank 2 of 3
    sends = run_pipeline(stager, dev, order=order)
    assert [e[3:] for e in ops.log if e[:2] == ("enqueue", "d2h")] == order
    numpy.testing.assert_array_equal(numpy.concatenate(sends), orig[[*range(8, 12),
                                                                    *range(4, 8),
                                                                    *range(0, 4)]])
    assert dev.tobytes() == (orig * numpy.float32(2) + numpy.float32(1)).tobytes()


def test_ready_waits_only_for_the_covering_chunks_and_poll_never_blocks():
    ops = EmulatedOps()
    stager = Stager(ops, chunk_bytes=16)
    dev = data(16)
    with stager.begin(dev) as t:
        assert not t.poll(0, 4)                              # not copied yet (emulated: late)
        t.ready(5, 7)                                        # inside chunk (4, 8)
        assert ops.d2h.executed == 2                         # the stream runs in order
        assert [e for e in ops.log if e[0] == "wait"] == [("wait", 4, 8)]
        assert t.poll(0, 8) and not t.poll(0, 9)
        t.ready(0, 16)
        t.publish(0, 16)
        t.finish()
    assert dev.tobytes() == data(16).tobytes()


def test_pinned_mirror_is_never_reused_while_in_use():
    ops = EmulatedOps(lazy_h2d=True)                         # copies back run at the sync only
    stager = Stager(ops, chunk_bytes=16)
    a, b = data(12, 1), data(12, 2)
    want_a = (a * numpy.float32(2) + numpy.float32(1)).tobytes()
    t = stager.begin(a)
    with pytest.raises(CaffeError, match="still in use"):
        stager.begin(b)
    t.ready(0, 12)
    t.host[:] = t.host * numpy.float32(2) + numpy.float32(1)
    t.publish(0, 12)
    t.finish()
    run_pipeline(stager, b, chunk=4)
    # One mirror for both; every copy back of the first transfer ran before the second's first
    # copy into the mirror.
    assert ops.allocations == 1
    last_h2d_a = index(ops.log, ("run", "h2d", "h2d", 0, 12))
    first_d2h_b = [i for i, e in enumerate(ops.log) if e[:3] == ("run", "d2h", "d2h")][3]
    assert last_h2d_a < first_d2h_b
    assert a.tobytes() == want_a
    assert b.tobytes() == (data(12, 2) * numpy.float32(2) + numpy.float32(1)).tobytes()
    big = data(40, 3)                                        # a larger bucket: a new mirror
    run_pipeline(stager, big, chunk=8)
    assert ops.allocations == 2


def test_a_missing_ready_is_caught():
    ops = EmulatedOps()
    stager = Stager(ops, chunk_bytes=16)
    dev = data(8)
    with pytest.raises(CaffeError, match="1 of 2 chunks waited for"):
        sends = []
        run_pipeline(stager, dev, sends=sends, chunk=4, skip_ready={(4, 8)})
    assert numpy.isnan(sends[1]).all()                       # it read the stale mirror
    assert not stager.busy and ops.d2h.pending == 0


def test_a_missing_publish_is_caught_and_an_error_releases_the_stager():
    ops = EmulatedOps()
    stager = Stager(ops, chunk_bytes=16)
    dev = data(8)
    t = stager.begin(dev)
    t.ready(0, 8)
    t.publish(0, 4)
    with pytest.raises(CaffeError, match="4 of 8 floats were copied back"):
        t.finish()
    assert not stager.busy
    with pytest.raises(ZeroDivisionError):
        with stager.begin(dev) as t:
            1 / 0
    assert not stager.busy and ops.d2h.pending == 0


# --------------------------------------------------------------------------------------------
# The CuPy-only lines, on a fake CuPy module (the real API is checked below where CuPy imports)
# --------------------------------------------------------------------------------------------
class _FakeStream:
    def __init__(self, log, non_blocking=False):
        assert non_blocking
        self.log, self.name = log, f"stream{len([e for e in log if e[0] == 'stream'])}"
        log.append(("stream", self.name))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event))

    def synchronize(self):
        self.log.append(("synchronize", self.name))

    def __enter__(self):
        self.log.append(("use", self.name))

    def __exit__(self, *exc):
        self.log.append(("unuse", self.name))


class _FakeEvent:
    def __init__(self, log, block=False, disable_timing=False):
        self.log, self.flags = log, (block, disable_timing)
        self.done = False

    def record(self, stream):
        self.stream = stream.name
        self.log.append(("record", stream.name))

    def synchronize(self):
        self.done = True
        self.log.append(("event_sync", self.stream))


class _FakeDeviceArray:
    """A NumPy array posing as a CuPy one: get/set copy at once and log the stream."""

    def __init__(self, arr, log):
        self.arr, self.log = arr, log

    size = property(lambda self: self.arr.size)

    def __getitem__(self, key):
        return _FakeDeviceArray(self.arr[key], self.log)

    def get(self, stream=None, out=None, blocking=True):
        assert not blocking and out.flags.c_contiguous and out.shape == self.arr.shape
        out[...] = self.arr
        self.log.append(("get", stream.name, out.size))

    def set(self, arr, stream=None):
        assert arr.shape == self.arr.shape
        self.arr[...] = arr
        self.log.append(("set", stream.name, arr.size))

    def __imul__(self, factor):
        assert isinstance(factor, numpy.float32)
        self.arr *= factor
        self.log.append(("scale", factor))
        return self


def _fake_cupy(log):
    cuda = types.SimpleNamespace()

    class Device:
        def __init__(self, i):
            self.id = i

        def __enter__(self):
            log.append(("device", self.id))

        def __exit__(self, *exc):
            pass

    cuda.Device = Device
    cuda.Stream = lambda non_blocking=False: _FakeStream(log, non_blocking)
    cuda.Event = lambda block=False, disable_timing=False: _FakeEvent(log, block, disable_timing)
    cuda.alloc_pinned_memory = lambda nbytes: (log.append(("pinned", nbytes)),
                                               bytearray(nbytes))[1]
    return types.SimpleNamespace(cuda=cuda)


def test_cupy_ops_on_a_fake_cupy(monkeypatch):
    log = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(log))
    ops = CupyOps(3)
    assert ("device", 3) in log and ops.d2h is not ops.h2d
    stager = Stager(ops, chunk_bytes=16)
    orig = data(10)
    dev = _FakeDeviceArray(orig.copy(), log)
    t = stager.begin(dev, ready="compute-event")
    assert ("pinned", 40) in log and isinstance(t.host, numpy.ndarray)
    assert log[log.index(("pinned", 40)) + 1] == ("wait_event", "stream0", "compute-event")
    assert [e for e in log if e[0] == "get"] == [("get", "stream0", 4), ("get", "stream0", 4),
                                                 ("get", "stream0", 2)]
    assert [e for e in log if e[0] == "record"] == [("record", "stream0")] * 3
    assert all(ev.flags == (True, True) for ev in t._events)   # blocking sync, no timing
    t.ready(0, 10)
    t.host *= numpy.float32(3)
    t.publish(0, 6)
    t.publish(6, 10)
    t.finish(numpy.float32(0.5))
    assert [e for e in log if e[0] == "set"] == [("set", "stream1", 6), ("set", "stream1", 4)]
    at = log.index(("scale", numpy.float32(0.5)))
    assert log[at - 1] == ("use", "stream1")                 # the scale on the h2d stream
    assert log[-2:] == [("synchronize", "stream0"), ("synchronize", "stream1")]
    assert dev.arr.tobytes() == (orig * numpy.float32(3) * numpy.float32(0.5)).tobytes()


def test_the_installed_cupy_has_the_api_staging_uses():
    cupy = pytest.importorskip("cupy")

    def params(f):
        try:
            return set(inspect.signature(f).parameters)
        except (TypeError, ValueError):                       # Cython: the docstring's first line
            head = (f.__doc__ or "").splitlines()[0]
            return {p.split("=")[0].strip() for p in head[head.index("(") + 1:
                                                          head.index(")")].split(",")}
    assert {"stream", "out", "blocking"} <= params(cupy.ndarray.get)
    assert {"arr", "stream"} <= params(cupy.ndarray.set)
    assert "non_blocking" in params(cupy.cuda.Stream.__init__)
    assert {"block", "disable_timing"} <= params(cupy.cuda.Event.__init__)
    assert "stream" in params(cupy.cuda.Event.record)
    assert "event" in params(cupy.cuda.Stream.wait_event)
    assert callable(cupy.cuda.alloc_pinned_memory)
    assert hasattr(cupy.cuda.Device, "__enter__") and hasattr(cupy.cuda.Stream, "__enter__")


# --------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_cupy_transfer_on_a_gpu():
    missing = cuda_missing()
    if missing:
        pytest.skip(missing)
    import cupy
    stager = Stager(CupyOps(cupy.cuda.Device().id), chunk_bytes=4096)
    orig = data(100_003)
    dev = cupy.asarray(orig)
    ready = pinned_mirror.compute_ready(dev)
    with stager.begin(dev, ready) as t:
        for lo in range(0, dev.size, 30_000):
            hi = min(lo + 30_000, dev.size)
            t.ready(lo, hi)
            numpy.testing.assert_array_equal(t.host[lo:hi], orig[lo:hi])
            t.host[lo:hi] += numpy.float32(1)
            t.publish(lo, hi)
        t.finish(numpy.float32(0.5))
    want = (orig + numpy.float32(1)) * numpy.float32(0.5)
    assert dev.get().tobytes() == want.tobytes()
