"""The one array-module seam: every layer runs on NumPy (CPU) or CuPy (GPU) through ``xp``.

Layers never import numpy or cupy for array math directly; they call :func:`get_array_module`
on one of their blobs' arrays (Chainer's idiom), so one body serves both devices. Which module new
blobs are allocated with is the process-wide mode set by :func:`set_mode_cpu` / :func:`set_mode_gpu`
(pycaffe's names).
"""
import os

import numpy

_state = {"xp": numpy, "device": 0, "solver_count": 1, "solver_rank": 0, "multiprocess": False}


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
    """Allocate new blobs with CuPy on the current device (pycaffe's ``set_mode_gpu``).

    Without a usable GPU (CuPy missing, no CUDA device) it logs one warning, the first time,
    and keeps the CPU, as ``solver_mode: GPU`` does: scripts written for a GPU machine still
    run. Returns True when GPU mode is on.
    """
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        cupy.cuda.Device(_state["device"]).use()
    except Exception as exc:  # ImportError, CUDARuntimeError
        if not _state.get("warned_no_gpu"):
            from .log import logger
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning("set_mode_gpu: no usable GPU (%s); running on the CPU", reason)
            _state["warned_no_gpu"] = True
        return False
    _state["xp"] = cupy
    return True


def set_device(device_id):
    """Select the CUDA device used by GPU mode (pycaffe's ``set_device``)."""
    _state["device"] = int(device_id)
    if _state["xp"] is not numpy:
        _state["xp"].cuda.Device(_state["device"]).use()


def solver_count():
    """Solvers training together, as a pycaffe script set it (Caffe's ``Caffe::solver_count``;
    1 by default; ``mpiexec`` runs take theirs from the communicator instead)."""
    return _state["solver_count"]


def set_solver_count(count):
    """pycaffe's ``set_solver_count``: solvers made from now on read every ``count``-th record.

    Raises:
        ValueError: ``count`` < 1.
    """
    if int(count) < 1:
        raise ValueError(f"set_solver_count: count must be at least 1, got {count}")
    _state["solver_count"] = int(count)


def solver_rank():
    """This process's solver among :func:`solver_count` (Caffe's ``Caffe::solver_rank``; 0)."""
    return _state["solver_rank"]


def set_solver_rank(rank):
    """pycaffe's ``set_solver_rank``: the share of the records this process's solvers read;
    only rank 0 tests, logs the display lines and snapshots (Caffe's root solver).

    Raises:
        ValueError: ``rank`` < 0.
    """
    if int(rank) < 0:
        raise ValueError(f"set_solver_rank: rank must be non-negative, got {rank}")
    _state["solver_rank"] = int(rank)


def multiprocess():
    """Whether a pycaffe script declared one process per solver (``set_multiprocess``)."""
    return _state["multiprocess"]


def set_multiprocess(value):
    """pycaffe's ``set_multiprocess``: recorded; solvers here are always one per process."""
    _state["multiprocess"] = bool(value)


def to_numpy(array):
    """Return ``array`` as a NumPy array (a no-op for NumPy input, a device copy for CuPy)."""
    if type(array).__module__.startswith("cupy"):
        return array.get()
    return numpy.asarray(array)
