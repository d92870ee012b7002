"""Scratch memory of the CPU kernels: flat float32 buffers by slot name, grown on demand.

One workspace serves every layer of a kernel set, as Caffe's convolutions share one column
buffer: a buffer is only valid until the next call that asks for the same slot.
"""
import numpy


class Workspace:
    """Named flat float32 scratch buffers."""

    def __init__(self):
        self._buffers = {}

    def get(self, slot, count):
        """A flat float32 array of at least ``count`` elements (contents undefined)."""
        count = max(int(count), 1)
        buf = self._buffers.get(slot)
        if buf is None or buf.size < count:
            buf = numpy.empty(count, numpy.float32)
            self._buffers[slot] = buf
        return buf

    def clear(self):
        """Free every buffer."""
        self._buffers.clear()

    @property
    def nbytes(self):
        """Bytes held."""
        return sum(b.nbytes for b in self._buffers.values())
