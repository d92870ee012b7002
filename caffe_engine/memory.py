"""glibc's malloc and the engine's big arrays: a fixed threshold from which each allocation is
its own mapping.

glibc maps an allocation of at least ``M_MMAP_THRESHOLD`` bytes on its own and unmaps it when
it is freed; below that it carves it from the heap, whose freed memory stays resident. The
threshold slides: every mapped block freed raises it to that block's size, up to 32 MiB. A net
allocates many arrays of a few to a few tens of MiB and frees some at once (a Split top's data
before it views its bottom's, every diff the train net's gradient arena replaces), so after
set-up arrays up to 32 MiB come from the heap, and what is freed there stays in the RSS:
ResNet-50's training at batch 32 peaked at 4451 MB, 4304 MB with the threshold held at 4 MiB,
the time per iteration the same (3.1-3.3 s either way, 2 cores). Holding the threshold
(``mallopt``) also stops the sliding.

The call is made once per process, when the first net is built (:func:`hold_mmap_threshold`),
and only where the C library is glibc; ``CAFFE_ENGINE_MMAP_THRESHOLD`` sets the bytes (0: leave
glibc's sliding default).
"""
import ctypes
import ctypes.util
import sys

from . import environment
from .process import state

#: mallopt's parameter number for the threshold (glibc's malloc.h ``M_MMAP_THRESHOLD``).
M_MMAP_THRESHOLD = -3
#: Bytes from which an allocation is mapped on its own, unless the variable says otherwise.
DEFAULT_THRESHOLD = 4 << 20


def hold_mmap_threshold():
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``CAFFE_ENGINE_MMAP_THRESHOLD`` bytes (default
    :data:`DEFAULT_THRESHOLD`; 0: leave it), the first time it is called in the process.

    Returns:
        int: the threshold held, or 0 when nothing was done (asked not to, not Linux, not
        glibc, or mallopt refused).
    """
    if state.mmap_threshold is not None:
        return state.mmap_threshold
    state.mmap_threshold = 0
    wanted = environment.read("CAFFE_ENGINE_MMAP_THRESHOLD")
    wanted = DEFAULT_THRESHOLD if wanted is None else wanted
    if wanted <= 0 or not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return 0                      # another C library (musl has no mallopt)
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, int(wanted)) == 1:
        state.mmap_threshold = int(wanted)
    return state.mmap_threshold
