"""The one array-module seam: every layer runs on NumPy (CPU) or CuPy (GPU) through ``xp``.

Layers never import numpy or cupy for array math directly; they call :func:`get_array_module`
on one of their blobs' arrays (Chainer's idiom), so one body serves both devices. Which module new
blobs are allocated with is the process-wide mode set by :func:`set_mode_cpu` / :func:`set_mode_gpu`
(pycaffe's names).
"""
import os

import numpy

_state = {"xp": numpy, "device": 0}


def get_array_module(*arrays):
    """Return ``cupy`` if any of ``arrays`` is a CuPy array, else ``numpy``."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy
            return cupy
    return numpy


def cpu_cores():
    """CPU cores this process may run on (its affinity mask where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (not Linux)
        return os.cpu_count() or 1


def xp():
    """The array module that new blobs are allocated with in the current mode."""
    return _state["xp"]


def set_mode_cpu():
    """Allocate new blobs with NumPy (the default)."""
    _state["xp"] = numpy


def set_mode_gpu():
    """Allocate new blobs with CuPy on the current device.

    Raises:
        CaffeError: CuPy is not installed or no CUDA device is visible.
    """
    from .errors import CaffeError
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, CUDARuntimeError
        raise CaffeError(f"GPU mode requested but CuPy/CUDA is not available: {exc}") from None
    cupy.cuda.Device(_state["device"]).use()
    _state["xp"] = cupy


def set_device(device_id):
    """Select the CUDA device used by GPU mode (pycaffe's ``set_device``)."""
    _state["device"] = int(device_id)
    if _state["xp"] is not numpy:
        _state["xp"].cuda.Device(_state["device"]).use()


def to_numpy(array):
    """Return ``array`` as a NumPy array (a no-op for NumPy input, a device copy for CuPy)."""
    if type(array).__module__.startswith("cupy"):
        return array.get()
    return numpy.asarray(array)
