"""Scratch arrays that layers share: one flat float32 buffer per array module, thread and slot,
grown on demand, for work arrays whose contents do not outlive one ``forward`` or ``backward``
call.

Caffe gives such arrays to each layer (BatchNorm's ``temp_``, for instance), so a net holds one
per layer though only one layer computes at a time; a ResNet-50 at batch 32 keeps 1.3 GB of
BatchNorm work arrays that way. Nothing outside the layer can see them (they are not blobs), so
sharing them changes no result and nothing pycaffe observes. A buffer is valid until the next
:func:`get` of the same slot on the same thread; each thread (e.g. two nets run side by side)
has its own.
"""
import threading

import numpy

_local = threading.local()


def _device_key(xp):
    if xp.__name__ == "numpy":
        return "numpy"
    return (xp.__name__, int(xp.cuda.Device().id))


def get(xp, shape, slot="work"):
    """A float32 array of ``shape`` (contents undefined) viewing this thread's ``slot`` buffer
    for array module ``xp`` (NumPy or CuPy, on the current device)."""
    shape = tuple(int(d) for d in shape)
    count = 1
    for d in shape:
        count *= d
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    key = (_device_key(xp), slot)
    buf = buffers.get(key)
    if buf is None or buf.size < count:
        buf = buffers[key] = xp.empty(max(count, 1), numpy.float32)
    return buf[:count].reshape(shape)


def clear():
    """Free this thread's buffers."""
    getattr(_local, "buffers", {}).clear()
