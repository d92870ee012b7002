"""One scratch buffer shared by every plan of a cuda kernel set, as Caffe's convolutions share
one column buffer: layers run one after another on one stream, so a plan's view of it is valid
until the next plan's call. Per-plan buffers would hold up to 256 MiB for each convolution
(GoogLeNet has 57) where one suffices.
"""
import numpy


class DeviceWorkspace:
    """A flat float32 buffer on the array module of the caller, grown on demand."""

    def __init__(self):
        self._buffer = None

    def get(self, xp, count):
        """A flat float32 ``xp`` array of at least ``count`` elements (contents undefined)."""
        count = max(int(count), 1)
        buf = self._buffer
        if buf is None or buf.size < count or type(buf) is not xp.ndarray:
            self._buffer = None          # free the old one before the larger allocation
            buf = self._buffer = xp.empty(count, numpy.float32)
        return buf

    @property
    def nbytes(self):
        """Bytes held."""
        return 0 if self._buffer is None else self._buffer.nbytes
