"""The data layers' staging (caffe_engine/io/staging.py) on NumPy: the host staging, and the
device staging's buffer rotation and event order driven through a fake transfer that models an
asynchronous copy engine and a device stream and fails on every hazard: the producer writing a
pinned buffer a copy may still read, a copy overwriting a device buffer the consumer's queued
reads were not ordered before, the consumer reading a device buffer before waiting for its
copy. Then the Data layer's prefetch thread through that fake, against synchronous loading."""
import threading

import numpy
import pytest

from caffe_engine import rng
from caffe_engine.blob import Blob
from caffe_engine.data_transformer import DataTransformer
from caffe_engine.io import staging as staging_module
from caffe_engine.io.staging import ALIGN, DeviceStaging, HostStaging, staging_for
from caffe_engine.layers import prefetch as data_module
from caffe_engine.proto import caffe_pb2
from tiny_data import batches, data_layer, make_source

F32 = numpy.float32


# -- the fake device -----------------------------------------------------------------------------
class Hazard(AssertionError):
    pass


class _Guarded(numpy.ndarray):
    """A fake pinned or device buffer: reports writes (pinned) and view-taking reads (device)
    to its transfer."""

    def __array_finalize__(self, obj):
        self._transfer = getattr(obj, "_transfer", None)
        self._kind = getattr(obj, "_kind", None)

    def __setitem__(self, key, value):
        if self._kind == "pinned":
            self._transfer.host_write(self)
        super().__setitem__(key, value)

    def __getitem__(self, key):
        if self._kind == "device":
            self._transfer.device_read(self)
        return numpy.ndarray.__getitem__(self.view(numpy.ndarray), key)


class FakeEvent:
    def __init__(self, transfer):
        self.t = transfer
        self.copies = []      # copies queued on the copy stream before this event was recorded
        self.reads = []       # consumer reads queued before it was recorded (current stream)

    def synchronize(self):
        with self.t.lock:
            self.t.log.append(("sync", self))
            for copy in self.copies:
                copy["done"] = True


class FakeTransfer:
    """Copies move the bytes at once (so the data are checkable) but count as running until
    the host synchronises an event recorded after them; device reads count as pending until
    the copy stream waits for an event recorded after them."""

    def __init__(self):
        self.lock = threading.RLock()
        self.log = []
        self.copies = []                  # every copy, oldest first
        self.queued = []                  # copies not yet covered by a recorded event
        self.reads = []                   # consumer reads not yet covered by a recorded event
        self.pending_reads = {}           # id(device buffer) -> reads not ordered before copies
        self.visible = set()              # ids of copies the consumer's stream waited for
        self.last_copy = {}               # id(device buffer) -> its last copy

    def event(self):
        return FakeEvent(self)

    def pinned(self, nbytes):
        buf = numpy.zeros(nbytes, numpy.uint8).view(_Guarded)
        buf._transfer, buf._kind = self, "pinned"
        return buf

    def device_empty(self, nbytes):
        buf = numpy.zeros(nbytes, numpy.uint8).view(_Guarded)
        buf._transfer, buf._kind = self, "device"
        self.pending_reads[id(buf)] = set()
        return buf

    def host_write(self, host):
        with self.lock:
            for copy in self.copies:
                if copy["host"] is host and not copy["done"]:
                    raise Hazard("the pinned buffer was written while its copy may still read it")
            self.log.append(("write", id(host)))

    def copy(self, device, host, nbytes):
        with self.lock:
            if self.pending_reads[id(device)]:
                raise Hazard("a copy overwrites a device buffer before the consumer's reads of "
                             "it were ordered before the copy stream")
            copy = {"host": host, "device": id(device), "done": False, "n": len(self.copies)}
            self.copies.append(copy)
            self.queued.append(copy)
            self.last_copy[id(device)] = copy
            device.view(numpy.ndarray)[:nbytes] = host.view(numpy.ndarray)[:nbytes]
            self.log.append(("copy", id(device)))

    def record_on_copy_stream(self, event):
        with self.lock:
            event.copies, self.queued = self.queued, []
            self.log.append(("record_copied", event))

    def copy_stream_wait(self, event):
        with self.lock:
            for device_id, token in event.reads:
                self.pending_reads[device_id].discard(token)
            self.log.append(("copy_wait", event))

    def current_stream_wait(self, event):
        with self.lock:
            self.visible.update(c["n"] for c in event.copies)
            self.log.append(("wait_copied", event))

    def device_read(self, device):
        with self.lock:
            copy = self.last_copy.get(id(device))
            if copy is not None and copy["n"] not in self.visible and not copy["done"]:
                raise Hazard("the consumer read a device buffer before waiting for its copy")
            token = object()
            self.pending_reads[id(device)].add(token)
            self.reads.append((id(device), token))
            self.log.append(("read", id(device)))

    def record_on_current_stream(self, event):
        with self.lock:
            event.reads, self.reads = self.reads, []
            self.log.append(("record_consumed", event))


# -- a transform plan -----------------------------------------------------------------------------
def transformer_for(crop=3, mirror=True, seed=4, mean_value=(10.0, 20.0)):
    tp = caffe_pb2.TransformationParameter(crop_size=crop, mirror=mirror, scale=0.5)
    tp.mean_value.extend(mean_value)
    transformer = DataTransformer(tp, caffe_pb2.TRAIN)
    transformer.init_rand(rng.CaffeRNG(seed))
    return transformer


def plan_for(raw, seed=4):
    transformer = transformer_for(seed=seed)
    return transformer, transformer.plan(raw.shape)


def raw_batch(seed, n=3, shape=(2, 5, 6)):
    return numpy.random.RandomState(seed).randint(0, 256, (n,) + shape).astype(numpy.uint8)


# -- host staging ---------------------------------------------------------------------------------
def test_host_staging_transforms_when_staged_and_copies_when_delivered():
    raw = raw_batch(0)
    transformer, plan = plan_for(raw)
    want = numpy.empty(plan.out_shape, F32)
    plan.run(raw, want)
    staging = staging_for(numpy.zeros(1, F32))
    assert isinstance(staging, HostStaging) and not staging.on_device
    label = numpy.arange(3, dtype=F32)
    staged = staging.stage(raw, label, plan)
    assert staged.data.dtype == F32 and numpy.array_equal(staged.data, want)
    data_top, label_top = Blob(), Blob()
    staging.deliver(staged, data_top, label_top)
    assert data_top.shape == plan.out_shape and numpy.array_equal(data_top.data, want)
    assert numpy.array_equal(label_top.data, label)
    staged = staging.stage(want + 1)                      # no transform, no labels
    staging.deliver(staged, data_top, label_top)
    assert numpy.array_equal(data_top.data, want + 1) and numpy.array_equal(label_top.data, label)
    staging.discard(staged)


def test_transform_plan_equals_the_transformer():
    raw = raw_batch(1)
    a, plan = plan_for(raw, seed=9)
    b = transformer_for(seed=9)
    out = numpy.empty(plan.out_shape, F32)
    plan.run(raw, out)
    assert out.tobytes() == b.transform(raw).tobytes()
    assert numpy.array_equal(a.last_params, b.last_params)
    # The same params, already int32 as on the device, give the same result.
    again = numpy.empty(plan.out_shape, F32)
    plan.run(raw, again, plan.params.astype(numpy.int32))
    assert again.tobytes() == out.tobytes()


# -- device staging: the rotation -----------------------------------------------------------------
def stage_and_expect(staging, seed, with_transform=True):
    raw = raw_batch(seed, n=2 + seed % 3)                 # batches of varying size
    label = (numpy.arange(raw.shape[0]) + 100 * seed).astype(F32)
    if with_transform:
        _, plan = plan_for(raw, seed=seed)
        want = numpy.empty(plan.out_shape, F32)
        plan.run(raw, want)
        return staging.stage(raw, label, plan), want, label
    data = raw.astype(F32)
    return staging.stage(data, label), data, label


def deliver_and_check(staging, staged, want, label):
    data_top, label_top = Blob(), Blob()
    staging.deliver(staged, data_top, label_top)
    assert data_top.data.tobytes() == want.tobytes()
    assert numpy.array_equal(label_top.data, label)


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("with_transform", [True, False])
def test_device_staging_in_flight_up_to_the_slots(slots, with_transform):
    fake = FakeTransfer()
    staging = DeviceStaging(fake, slots)
    assert staging.on_device and staging.slots == slots
    in_flight = []
    seed = 0
    for round_ in range(4):
        for _ in range(slots):                 # fill every slot, then deliver them all
            seed += 1
            in_flight.append(stage_and_expect(staging, seed, with_transform))
        if round_ % 2:
            with pytest.raises(RuntimeError, match="more batches in flight than slots"):
                staging.stage(raw_batch(0).astype(F32))
        while in_flight:
            deliver_and_check(staging, *in_flight.pop(0))
    # One copy per batch, from one pinned buffer per slot, labels in the same transfer.
    assert sum(1 for op in fake.log if op[0] == "copy") == seed


def test_device_staging_one_transfer_aligned_layout():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 2)
    staged, _, _ = stage_and_expect(staging, 2)
    offsets = [offset for offset, _, _ in staged.layout]
    assert offsets[0] == 0 and all(o % ALIGN == 0 for o in offsets)
    assert [numpy.dtype(d) for _, _, d in staged.layout] == [numpy.uint8, numpy.int32, F32]
    assert sum(1 for op in fake.log if op[0] == "copy") == 1


def test_device_staging_event_order_per_slot():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 2)
    batches = [stage_and_expect(staging, s) for s in (1, 2)]
    deliver_and_check(staging, *batches[0])
    batches.append(stage_and_expect(staging, 3))          # slot 0 again
    slot = staging._slots[0]
    log = fake.log
    # Producer: host-wait for the slot's last copy, then write; copy stream waits for the
    # slot's consumer before copying; the copy's event is recorded after the copy.
    second_use = max(i for i, op in enumerate(log) if op == ("sync", slot.copied))
    assert log[second_use + 1][0] == "write"
    wait = log.index(("copy_wait", slot.consumed), second_use)
    copy = next(i for i, op in enumerate(log) if i > wait and op[0] == "copy")
    assert log[copy + 1] == ("record_copied", slot.copied)
    # Consumer: waits for the copy before its reads, records consumed after them.
    first_wait = log.index(("wait_copied", slot.copied))
    reads = [i for i, op in enumerate(log) if op[0] == "read" and i < second_use]
    assert reads and min(reads) > first_wait
    assert log.index(("record_consumed", slot.consumed)) > max(reads)
    for batch in batches[1:]:
        deliver_and_check(staging, *batch)


def test_fake_catches_a_producer_that_does_not_wait_for_the_copy():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 1)
    staged, want, label = stage_and_expect(staging, 1)
    deliver_and_check(staging, staged, want, label)
    staging._slots[0].copied.synchronize = lambda: None   # a producer that skips the host wait
    with pytest.raises(Hazard, match="pinned buffer was written"):
        stage_and_expect(staging, 2)


def test_fake_catches_a_copy_not_ordered_after_the_consumer():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 1)
    deliver_and_check(staging, *stage_and_expect(staging, 1))
    fake.copy_stream_wait = lambda event: None            # a copy stream that does not wait
    with pytest.raises(Hazard, match="overwrites a device buffer"):
        stage_and_expect(staging, 2)


def test_fake_catches_a_consumer_that_does_not_wait_for_the_copy():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 1)
    staged, _, _ = stage_and_expect(staging, 1)
    fake.current_stream_wait = lambda event: None
    with pytest.raises(Hazard, match="before waiting for its copy"):
        staging.deliver(staged, Blob(), Blob())
    assert not staging._slots[0].busy                     # freed even when delivery fails


def test_discarded_batches_free_their_slots():
    fake = FakeTransfer()
    staging = DeviceStaging(fake, 2)
    for seed in (1, 2):
        staging.discard(stage_and_expect(staging, seed)[0])
    for seed in (3, 4):
        deliver_and_check(staging, *stage_and_expect(staging, seed))


# -- the Data layer's prefetch thread through the fake device ------------------------------------
MEAN_TRANSFORM = "mirror: true crop_size: 4 scale: 0.5 mean_value: 3 mean_value: 5 mean_value: 7"


@pytest.fixture
def fake_device(monkeypatch):
    made = []

    def fake_staging_for(array, slots=2):
        made.append(DeviceStaging(FakeTransfer(), slots))
        return made[-1]
    monkeypatch.setattr(data_module, "staging_for", fake_staging_for)
    return made


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_data_layer_through_the_device_staging_gives_the_host_batches(tmp_path, fake_device,
                                                                      prefetch):
    source = make_source(tmp_path, 13)
    # The host staging (the real one, made before the fake is in place for this layer).
    sync, sync_top = data_layer(source, 0, MEAN_TRANSFORM)
    sync._staging = HostStaging()
    want = batches(sync, sync_top, 10)
    layer, top = data_layer(source, prefetch, MEAN_TRANSFORM)
    got = batches(layer, top, 10)
    staging = fake_device[-1]
    # prefetch buffers in all as Caffe's from 3 on (the queue, the one loaded, the top's)
    assert staging.slots == {0: 2, 1: 3, 4: 4}[prefetch]
    copies = [op for op in staging.transfer.log if op[0] == "copy"]
    assert len(copies) >= 10                               # one transfer per batch
    for (a, la), (b, lb) in zip(got, want):
        assert a.tobytes() == b.tobytes() and numpy.array_equal(la, lb)
    # Reading the cursor stops the thread, discards what it staged ahead, and rewinds.
    assert layer.cursor.offset == sync.cursor.offset
    assert not any(slot.busy for slot in staging._slots)
    for (a, la), (b, lb) in zip(batches(layer, top, 5), batches(sync, sync_top, 5)):
        assert a.tobytes() == b.tobytes() and numpy.array_equal(la, lb)
    layer.close()
    sync.close()


def test_staging_for_cupy_arrays_needs_the_device(monkeypatch):
    """staging_for picks the device staging for CuPy arrays (here a stand-in type, the
    CuPy transfer itself needing a GPU)."""
    made = []
    monkeypatch.setattr(staging_module, "CupyTransfer", lambda: made.append(1) or FakeTransfer())

    pytest.importorskip("cupy")

    class FakeCupyArray:      # get_array_module goes by the type's module
        __module__ = "cupy._core.core"
    staging = staging_for(FakeCupyArray(), slots=5)
    assert isinstance(staging, DeviceStaging) and staging.slots == 5 and made == [1]


# -- on a GPU (skipped without one) ---------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", [0, 4])
def test_data_layer_on_the_gpu_gives_the_host_batches(tmp_path, gpu_mode, prefetch):
    import cupy
    source = make_source(tmp_path, 13)
    layer, top = data_layer(source, prefetch, MEAN_TRANSFORM)  # GPU blobs: the CuPy staging
    got = [(a.get(), b.get()) for a, b in batches(layer, top, 7)]
    assert isinstance(layer._staging, DeviceStaging)
    cupy.cuda.get_current_stream().synchronize()
    from caffe_engine import backend
    backend.set_mode_cpu()
    try:
        sync, sync_top = data_layer(source, 0, MEAN_TRANSFORM)
        want = batches(sync, sync_top, 7)
    finally:
        backend.set_mode_gpu()
    for (a, la), (b, lb) in zip(got, want):
        assert a.tobytes() == b.tobytes() and numpy.array_equal(la, lb)
    layer.close()
    sync.close()
