"""Batches from the host to the blobs' device: the data layers' one staging seam.

A data layer loads a batch on the host (on its prefetch thread, or in ``forward``), hands it to
the staging and later, in ``forward``, has :meth:`deliver` put it into its tops. A batch of
records is staged record by record, from the data threads: ``target = staging.batch(plan,
first)``, ``target.put(i, record)`` for each record (any order, any thread), then
``staging.finish(target, labels)``; a batch already made (WindowData, MemoryData) goes through
:meth:`stage`. What happens in between depends on where the tops live, and only here:

* :class:`HostStaging` (NumPy tops): the batch stays on the host. ``put`` transforms each record
  (crop, mirror, mean, scale) straight into one of the staging's own float32 buffers, on the
  data thread; ``deliver`` makes that buffer the top's data (no copy: Caffe's
  ``top[0]->set_cpu_data(batch->data_)``), and the buffer is not reused before the next
  forward starts (:meth:`HostStaging.recycle`). A batch given to :meth:`stage` is copied into the top, as it may be the caller's.
* :class:`DeviceStaging` (CuPy tops): ``put`` gathers the *raw* records (uint8: a quarter of the
  float32 bytes; each one's crop window when records of several sizes are cropped) and
  ``finish`` packs them, the transform's per-image ``[mirror, h_off, w_off]`` and the labels
  into one pinned host buffer, copies it to a device buffer asynchronously on a dedicated
  non-blocking stream and records an event; ``deliver`` makes the training (current) stream
  wait for that event -- on the device, the host does not wait -- then runs the transform on
  the device straight into the top (the kernel set's ``transform``) and copies the labels
  device to device. No synchronous host-to-device copy is made on the training stream.

The device side rotates through ``slots`` buffer pairs (pinned host + device), each with two
events:

* ``copied``, recorded on the copy stream after the slot's copy: the producer waits for it on
  the host before writing the slot's pinned buffer again (the copy engine may still be reading
  it), and the consumer's stream waits for it before reading the device buffer;
* ``consumed``, recorded on the consumer's stream after ``deliver`` queued its reads: the copy
  stream waits for it before overwriting the slot's device buffer.

A slot is *busy* from ``stage`` until ``deliver`` or :meth:`discard` (on the host: until the
next forward starts, as the top holds the buffer until then); staging into a busy slot raises
(more batches in flight than slots). A prefetch queue of depth ``D`` has at most ``D`` batches
queued, one being loaded and one delivered, so ``D + 2`` slots always suffice (see
:mod:`caffe_engine.layers.prefetch`).

The CuPy calls are all in :class:`CupyTransfer`; :class:`DeviceStaging` is plain logic over a
*transfer* object, so the tests run it on NumPy with a fake one that checks the event order.
"""
import threading

import numpy

from ..backend import get_array_module
from ..blob import SLACK

#: Byte alignment of each array inside a slot's buffer (any dtype's, and the device's loads).
ALIGN = 256


class Staged:
    """One staged batch (what :meth:`stage` returns and :meth:`deliver` takes).

    Attributes:
        data: the host result (HostStaging) or None (DeviceStaging: in the slot).
        label: the host labels (HostStaging) or None.
        transform: the transform still to run (DeviceStaging) or None.
        slot: the slot index (DeviceStaging) or None.
        layout: ``[(offset, shape, dtype), ...]`` of the arrays in the slot (DeviceStaging).
    """

    __slots__ = ("data", "label", "transform", "slot", "layout")

    def __init__(self, data=None, label=None, transform=None, slot=None, layout=None):
        self.data, self.label, self.transform = data, label, transform
        self.slot, self.layout = slot, layout


def _assign(blob, array):
    blob.reshape(array.shape)
    xp = get_array_module(blob.data)
    blob.data[...] = xp.asarray(array)


class _Ring:
    """``slots`` indices handed out in turn, skipping busy ones, each busy until released
    (thread-safe)."""

    def __init__(self, slots):
        self.busy = [False] * max(1, int(slots))
        self._next = 0
        self._lock = threading.Lock()

    def take(self):
        """The next free index after the last one taken."""
        with self._lock:
            count = len(self.busy)
            for step in range(count):
                index = (self._next + step) % count
                if not self.busy[index]:
                    self.busy[index] = True
                    self._next = (index + 1) % count
                    return index
            raise RuntimeError(f"all {count} staging slots hold batches not delivered: more "
                               "batches in flight than slots")

    def release(self, index):
        if index is not None:
            self.busy[index] = False


class _HostRecords:
    """A host batch being filled: record i transformed into ``out[i]`` by :meth:`put`."""

    def __init__(self, plan, out, slot):
        self.plan, self.out, self.slot = plan, out, slot

    def put(self, i, record):
        self.plan.transform(i, record, self.out)


class HostStaging:
    """The NumPy staging: records transformed into the staging's buffers on the loading
    threads, the buffer handed to the top in ``deliver`` (see the module docstring).

    ``batch(plan, first)`` -> a target whose ``put(i, record)`` transforms record i (a (C, H, W)
    host array) under ``plan`` (:class:`caffe_engine.data_transformer.BatchPlan`);
    ``finish(target, label)`` -> the staged batch. ``stage(data, label, transform)``: ``data``
    the raw records (N, C, H, W) when ``transform`` (a
    :class:`~caffe_engine.data_transformer.TransformPlan`) is given, else the float32 batch
    itself (copied into the top on delivery); ``label`` a host array or None.

    Args:
        slots: buffers to rotate through (>= 1; a prefetch queue of depth D needs D + 2).
    """

    on_device = False

    def __init__(self, slots=2):
        self._ring = _Ring(slots)
        self._buffers = [None] * len(self._ring.busy)
        self._current = None

    @property
    def slots(self):
        return len(self._buffers)

    def batch(self, plan, first=None):
        slot = self._ring.take()
        shape = tuple(plan.out_shape)
        count = int(numpy.prod(shape, dtype=numpy.int64))
        buffer = self._buffers[slot]
        if buffer is None or buffer.size < count + SLACK:
            # Zeroed once (and SLACK floats longer, as a Blob's array: the compiled kernels may
            # read a vector past the end); reused for every later batch of the slot.
            buffer = self._buffers[slot] = numpy.zeros(count + SLACK, numpy.float32)
        return _HostRecords(plan, buffer[:count].reshape(shape), slot)

    def finish(self, target, label=None):
        return Staged(data=target.out, label=label, slot=target.slot)

    def stage(self, data, label=None, transform=None):
        if transform is not None:
            out = numpy.empty(transform.out_shape, numpy.float32)
            transform.run(data, out, transform.params)
            data = out
        return Staged(data=data, label=label)

    def deliver(self, staged, data_top, label_top=None):
        """Put the batch into blob ``data_top`` (reshaped to it) -- the staging's buffer
        itself, or a copy of a batch given to :meth:`stage` -- and copy the labels into blob
        ``label_top`` (when both are there)."""
        self.recycle()
        if staged.slot is None:
            _assign(data_top, staged.data)
        else:
            data_top.reshape(staged.data.shape)
            data_top.data = staged.data
        self._current = staged.slot
        if label_top is not None and staged.label is not None:
            _assign(label_top, staged.label)

    def recycle(self):
        """Free the buffer the top holds since the last :meth:`deliver` (called as a forward
        starts, before it waits for the next batch, as Caffe's
        ``prefetch_free_.push(prefetch_current_)``)."""
        self._ring.release(self._current)
        self._current = None

    def discard(self, staged):
        """Drop a staged batch that will not be delivered: its buffer is free again."""
        if staged.slot != self._current:
            self._ring.release(staged.slot)


class _DeviceRecords:
    """A device batch being gathered on the host: record i's pixels (or crop window) into
    ``raw[i]``, its transform parameters into ``params[i]``."""

    def __init__(self, plan, first):
        self.plan = plan
        n, c, out_h, out_w = plan.out_shape
        shape = (c, out_h, out_w) if plan.windows else tuple(first.shape)
        self.raw = numpy.empty((n,) + shape, first.dtype)
        self.params = numpy.zeros((n, 3), numpy.int64)

    def put(self, i, record):
        pixels, self.params[i] = self.plan.place(i, record)
        self.raw[i] = pixels


class _Slot:
    __slots__ = ("host", "device", "copied", "consumed", "busy")

    def __init__(self, copied, consumed):
        self.host = self.device = None
        self.copied, self.consumed = copied, consumed
        self.busy = False


def _layout(arrays):
    """``([(offset, shape, dtype), ...], total bytes)`` of ``arrays`` packed at ALIGN."""
    layout, offset = [], 0
    for a in arrays:
        layout.append((offset, a.shape, a.dtype))
        offset += -(-a.nbytes // ALIGN) * ALIGN
    return layout, offset


class DeviceStaging:
    """The device staging: pinned buffers, one copy per batch on its own stream, events (see
    the module docstring). Same ``stage``/``deliver``/``discard`` as :class:`HostStaging`.

    Args:
        transfer: the device operations (:class:`CupyTransfer`, or a test's fake).
        slots: buffer pairs to rotate through (>= 1).
    """

    on_device = True

    def __init__(self, transfer, slots=2):
        self.transfer = transfer
        self._slots = [_Slot(transfer.event(), transfer.event()) for _ in range(max(1, slots))]
        self._next = 0
        self._lock = threading.Lock()

    @property
    def slots(self):
        return len(self._slots)

    def batch(self, plan, first):
        return _DeviceRecords(plan, first)

    def finish(self, target, label=None):
        return self.stage(target.raw, label, target.plan.transform_plan(target.params))

    def stage(self, data, label=None, transform=None):
        """Pack ``data`` (+ the transform's params as int32 (N, 3)) (+ ``label``) into the next
        slot's pinned buffer and start its copy to the device (called on the loading thread).

        Raises:
            RuntimeError: the next slot still holds a batch not delivered nor discarded.
        """
        arrays = [numpy.ascontiguousarray(data)]
        if transform is not None:
            arrays.append(numpy.ascontiguousarray(transform.params, dtype=numpy.int32))
        if label is not None:
            arrays.append(numpy.ascontiguousarray(label))
        layout, nbytes = _layout(arrays)
        with self._lock:
            index = self._next
            slot = self._slots[index]
            if slot.busy:
                raise RuntimeError(f"staging slot {index} of {len(self._slots)} still holds a "
                                   "batch that was not delivered: more batches in flight than "
                                   "slots")
            self._next = (index + 1) % len(self._slots)
        t = self.transfer
        slot.copied.synchronize()            # the copy engine is done reading slot.host
        if slot.host is None or slot.host.size < nbytes:
            slot.host = t.pinned(nbytes)
        for (offset, _, _), a in zip(layout, arrays):
            slot.host[offset:offset + a.nbytes] = a.reshape(-1).view(numpy.uint8)
        t.copy_stream_wait(slot.consumed)    # the device is done reading slot.device
        if slot.device is None or slot.device.size < nbytes:
            slot.device = t.device_empty(nbytes)
        t.copy(slot.device, slot.host, nbytes)
        t.record_on_copy_stream(slot.copied)
        slot.busy = True
        return Staged(transform=transform, slot=index, layout=layout)

    def _views(self, slot, layout):
        out = []
        for offset, shape, dtype in layout:
            size = int(numpy.prod(shape, dtype=numpy.int64)) * numpy.dtype(dtype).itemsize
            out.append(slot.device[offset:offset + size].view(dtype).reshape(shape))
        return out

    def deliver(self, staged, data_top, label_top=None):
        """On the current (training) stream: wait for the slot's copy, transform into blob
        ``data_top`` (or copy the batch as is), copy the labels into ``label_top``; then free
        the slot. The host does not wait for the device."""
        slot = self._slots[staged.slot]
        t = self.transfer
        try:
            t.current_stream_wait(slot.copied)
            views = self._views(slot, staged.layout)
            data = views[0]
            if staged.transform is not None:
                data_top.reshape(staged.transform.out_shape)
                staged.transform.run(data, data_top.data, views[1])
            else:
                data_top.reshape(data.shape)
                data_top.data[...] = data
            has_label = len(views) > (2 if staged.transform is not None else 1)
            if label_top is not None and has_label:
                label_top.reshape(views[-1].shape)
                label_top.data[...] = views[-1]
        finally:
            t.record_on_current_stream(slot.consumed)
            slot.busy = False

    def recycle(self):
        """Nothing to do: a slot is free once :meth:`deliver` has queued its reads."""

    def discard(self, staged):
        """Drop a staged batch that will not be delivered: its slot is free again (a copy still
        running is waited for by the next :meth:`stage` into the slot)."""
        self._slots[staged.slot].busy = False


class CupyTransfer:
    """The CuPy operations of :class:`DeviceStaging`, on the device current at construction:
    pinned host buffers, device buffers, one non-blocking copy stream, events.

    Raises:
        ImportError: CuPy is not installed.
    """

    def __init__(self):
        import cupy
        self._cupy = cupy
        self._device = cupy.cuda.Device()
        with self._device:
            self.stream = cupy.cuda.Stream(non_blocking=True)

    def event(self):
        with self._device:
            return self._cupy.cuda.Event(disable_timing=True)

    def pinned(self, nbytes):
        """A uint8 NumPy array of ``nbytes`` over page-locked memory (kept alive by it)."""
        memory = self._cupy.cuda.alloc_pinned_memory(nbytes)
        return numpy.frombuffer(memory, numpy.uint8, nbytes)

    def device_empty(self, nbytes):
        with self._device:
            return self._cupy.empty(nbytes, numpy.uint8)

    def copy(self, device, host, nbytes):
        """Start copying ``host[:nbytes]`` to ``device[:nbytes]`` on the copy stream."""
        with self._device:
            device[:nbytes].set(host[:nbytes], stream=self.stream)

    def copy_stream_wait(self, event):
        self.stream.wait_event(event)

    def record_on_copy_stream(self, event):
        event.record(self.stream)

    def current_stream_wait(self, event):
        self._cupy.cuda.get_current_stream().wait_event(event)

    def record_on_current_stream(self, event):
        event.record(self._cupy.cuda.get_current_stream())


def staging_for(array, slots=2):
    """The staging for tops like ``array``: :class:`DeviceStaging` over a :class:`CupyTransfer`
    for a CuPy array, else :class:`HostStaging`."""
    if get_array_module(array).__name__ == "cupy":
        return DeviceStaging(CupyTransfer(), slots)
    return HostStaging(slots)
