"""Blob: an N-D float32 array of values (``data``) and of gradients (``diff``), as in Caffe.

Caffe: include/caffe/blob.hpp. Shapes are tuples of ints, outermost first, e.g. (N, C, H, W).
Reshaping to a new shape reallocates (zeroed) arrays; reshaping to the same shape keeps them, so
layers may call ``reshape`` on every pass without cost. ``share_data`` makes two blobs view the
same arrays (in-place layers, shared params). Each array is a view of a buffer :data:`SLACK`
floats longer (see :func:`caffe_engine.kernels.cpu.conv_plan.slack_after`).
"""
import numpy

from . import backend
from .errors import AxisError, CaffeError

DTYPE = numpy.float32
#: Floats allocated past the end of every data and diff array (not part of the blob): compiled
#: kernels may read a vector beyond a blob's last element without a copy of the blob.
SLACK = 64


#: Caffe's limit on a blob's element count (Blob::Reshape: "blob size exceeds INT_MAX").
INT_MAX = 2 ** 31 - 1


def available_bytes():
    """Memory this process could still get, in bytes: Linux's MemAvailable, else physical memory
    (None when neither is known)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_shape(shape):
    """The element count of ``shape``, after Caffe's checks (Blob::Reshape, blob.cpp) and one of
    ours: every dim non-negative, the count at most INT_MAX, and its data and diff (8 bytes an
    element) within the memory available, so that no allocation fails half-way.

    Raises:
        CaffeError: naming the shape and, for memory, the bytes needed and available.
    """
    count = 1
    for d in shape:
        if d < 0:
            raise CaffeError(f"blob dimensions must be non-negative, got shape {shape}")
        count *= d
    if count > INT_MAX:
        raise CaffeError(f"blob size exceeds INT_MAX: shape {shape} has {count} elements")
    needed = 2 * 4 * count
    if needed > 1 << 28:                       # only large blobs are worth reading /proc for
        free = available_bytes()
        if free is not None and needed > free:
            raise CaffeError(f"a blob of shape {shape} needs {needed} bytes (data and diff), "
                             f"more than the {free} bytes of memory available")
    return count


class Blob:
    """A pair of equally shaped float32 arrays, ``data`` and ``diff``.

    Args:
        shape: iterable of non-negative ints, e.g. (N, C, H, W); () for a scalar blob.
        xp: array module to allocate with (default: the current mode's, see ``backend``).

    Raises:
        CaffeError: a shape Caffe refuses or this machine cannot hold (:func:`check_shape`).
    """

    __slots__ = ("_shape", "data", "diff", "_xp")

    def __init__(self, shape=(), xp=None):
        self._xp = xp or backend.xp()
        self._shape = None
        self.data = None
        self.diff = None
        self.reshape(shape)

    def reshape(self, *shape):
        """Set the shape (ints or one tuple); arrays are reallocated only if it changes."""
        if len(shape) == 1 and not isinstance(shape[0], (int, numpy.integer)):
            shape = shape[0]
        shape = tuple(int(d) for d in shape)
        if shape == self._shape:
            return
        count = check_shape(shape)
        try:
            data = self._xp.zeros(count + SLACK, DTYPE)[:count].reshape(shape)
            diff = self._xp.zeros(count + SLACK, DTYPE)[:count].reshape(shape)
        except MemoryError:
            raise CaffeError(f"a blob of shape {shape} needs {2 * 4 * count} bytes (data and "
                             f"diff), more than this machine can allocate") from None
        self._shape, self.data, self.diff = shape, data, diff

    def reshape_like(self, other):
        """Reshape to ``other``'s shape."""
        self.reshape(other.shape)

    @property
    def shape(self):
        """The shape as a tuple of ints."""
        return self._shape

    @property
    def count(self):
        """Number of elements (1 for a 0-d blob)."""
        n = 1
        for d in self._shape:
            n *= d
        return n

    @property
    def num_axes(self):
        return len(self._shape)

    def legacy_shape(self, index):
        """Caffe's LegacyShape: dim ``index`` (-4..3) of the shape padded to 4 axes with 1s."""
        if len(self._shape) > 4:
            raise ValueError(f"legacy accessors need a blob of at most 4 axes, not {self._shape}")
        if index >= len(self._shape) or index < -len(self._shape):
            return 1
        return self._shape[index]

    @property
    def num(self):
        """Legacy N (pycaffe's ``blob.num``)."""
        return self.legacy_shape(0)

    @property
    def channels(self):
        return self.legacy_shape(1)

    @property
    def height(self):
        return self.legacy_shape(2)

    @property
    def width(self):
        return self.legacy_shape(3)

    def count_range(self, start, end=None):
        """Product of dims ``start`` .. ``end - 1`` (Caffe's ``count(start, end)``)."""
        n = 1
        for d in self._shape[start:end]:
            n *= d
        return n

    def canonical_axis(self, axis):
        """Map a possibly negative axis index into [0, num_axes) (Caffe's CanonicalAxisIndex).

        Raises:
            AxisError: axis out of range (a CaffeError and an IndexError).
        """
        n = len(self._shape)
        if not -n <= axis < max(n, 1):
            raise AxisError(f"axis {axis} out of range for a {n}-axis blob {self._shape}")
        return axis + n if axis < 0 else axis

    def share_data(self, other):
        """Make this blob's ``data`` the very array of ``other`` (shapes must match in count)."""
        self._shape = other.shape
        self.data = other.data

    def share_diff(self, other):
        """Make this blob's ``diff`` the very array of ``other``."""
        self.diff = other.diff

    def __repr__(self):
        return f"Blob{self._shape}"
