"""The one array-module seam: every layer runs on NumPy (CPU) or CuPy (GPU) through ``xp``.

Layers never import numpy or cupy for array math directly; they call :func:`get_array_module`
on one of their blobs' arrays (Chainer's idiom), so one body serves both devices. Which module new
blobs are allocated with is the process-wide mode set by :func:`set_mode_cpu` / :func:`set_mode_gpu`
(pycaffe's names). The mode, the device, the solver count and rank, the host-read counters and
the deferred checks are fields of :data:`caffe_engine.process.state`; the functions here are
pycaffe's and the engine's names for reading and setting them.
"""
import contextlib
import os

import numpy

from .process import state


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
    return state.xp


def set_mode_cpu():
    """Allocate new blobs with NumPy (the default)."""
    state.xp = numpy


def _cuda_version(number):
    return f"{number // 1000}.{number % 1000 // 10}"


def gpu_missing():
    """Why GPU mode cannot run here, in one line, or None when CuPy imports and sees a device.

    The reasons: CuPy is not installed; CuPy is but no NVIDIA driver is (``libcuda`` missing:
    CuPy reports that as an "insufficient driver", which would send a user to upgrade one); the
    driver's CUDA version is older than CuPy's runtime (the CuPy wheel for an older CUDA is
    needed); no CUDA device; else CuPy's own error.
    """
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); pip install -e '.[gpu]' (docs/gpu.md)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError and what a broken install raises
        try:
            driver = cupy.cuda.runtime.driverGetVersion()
            runtime = cupy.cuda.runtime.runtimeGetVersion()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            driver = runtime = None
        if driver == 0:
            return "no NVIDIA driver found (CuPy is installed, the driver's libcuda is not)"
        if driver is not None and runtime is not None and driver < runtime:
            return (f"the NVIDIA driver supports CUDA {_cuda_version(driver)}, older than the "
                    f"CUDA {_cuda_version(runtime)} of this CuPy: install the CuPy wheel for "
                    f"CUDA {driver // 1000} (docs/gpu.md)")
        reason = str(exc).splitlines()[0] if str(exc) else ""
        return f"no usable CUDA device ({type(exc).__name__}: {reason})"
    return None if count > 0 else "no CUDA device"


def set_mode_gpu():
    """Allocate new blobs with CuPy on the current device (pycaffe's ``set_mode_gpu``).

    Without a usable GPU (CuPy missing, no CUDA device) it logs one warning, the first time,
    and keeps the CPU, as ``solver_mode: GPU`` does: scripts written for a GPU machine still
    run. Returns True when GPU mode is on.
    """
    reason = gpu_missing()
    if reason is None:
        try:
            import cupy
            cupy.cuda.Device(state.device).use()
        except Exception as exc:  # CUDARuntimeError: a device id beyond those present
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if reason is not None:
        if not state.warned_no_gpu:
            from .log import logger
            logger.warning("set_mode_gpu: no usable GPU (%s); running on the CPU", reason)
            state.warned_no_gpu = True
        return False
    import cupy
    state.xp = cupy
    return True


def set_device(device_id):
    """Select the CUDA device used by GPU mode (pycaffe's ``set_device``)."""
    state.device = int(device_id)
    if state.xp is not numpy:
        state.xp.cuda.Device(state.device).use()


def solver_count():
    """Solvers training together, as a pycaffe script set it (Caffe's ``Caffe::solver_count``;
    1 by default; ``mpiexec`` runs take theirs from the communicator instead)."""
    return state.solver_count


def set_solver_count(count):
    """pycaffe's ``set_solver_count``: solvers made from now on read every ``count``-th record.

    Raises:
        ValueError: ``count`` < 1.
    """
    if int(count) < 1:
        raise ValueError(f"set_solver_count: count must be at least 1, got {count}")
    state.solver_count = int(count)


def solver_rank():
    """This process's solver among :func:`solver_count` (Caffe's ``Caffe::solver_rank``; 0)."""
    return state.solver_rank


def set_solver_rank(rank):
    """pycaffe's ``set_solver_rank``: the share of the records this process's solvers read;
    only rank 0 tests, logs the display lines and snapshots (Caffe's root solver).

    Raises:
        ValueError: ``rank`` < 0.
    """
    if int(rank) < 0:
        raise ValueError(f"set_solver_rank: rank must be non-negative, got {rank}")
    state.solver_rank = int(rank)


def multiprocess():
    """Whether a pycaffe script declared one process per solver (``set_multiprocess``)."""
    return state.multiprocess


def set_multiprocess(value):
    """pycaffe's ``set_multiprocess``: recorded; solvers here are always one per process."""
    state.multiprocess = bool(value)


# ------------------------------------------------------------------------------------------------
# Host reads: the one way values of an array reach Python
# ------------------------------------------------------------------------------------------------
# On the GPU every read of a device value into Python (``float(a)``, ``a.item()``, ``a.get()``,
# ``if a.any():``) waits for the device to finish all the work queued before it: one such read
# per layer or per iteration serialises the host and the device. The training loop therefore
# keeps losses, clipping norms and label checks on the device and reads them through the two
# helpers below, at display time (see caffe_engine/solvers/solver.py). They count the reads of
# device arrays, so that tests can bound them; :func:`count_host_reads` also makes NumPy
# arrays count as device arrays, which is how the CPU-only tests run the device path.
# (The counters are ``state.host_reads`` and ``state.emulated_reads``.)


def _is_cupy(array):
    return type(array).__module__.startswith("cupy")


def on_device(array):
    """Whether reading ``array`` on the host is a device round trip: True for CuPy arrays, and
    for anything else inside :func:`count_host_reads` (the tests' emulation of the device path
    on NumPy). Code that has a cheaper host-only path (an immediate check instead of a deferred
    one, a log line every iteration) takes it only when this is False."""
    return state.emulated_reads > 0 or _is_cupy(array)


def _counted(array):
    if on_device(array):
        state.host_reads += 1


def to_numpy(array):
    """Return ``array`` as a NumPy array (a no-op for NumPy input, a device copy for CuPy);
    one counted host read when :func:`on_device`."""
    _counted(array)
    if _is_cupy(array):
        return array.get()
    return numpy.asarray(array)


def host_scalar(array):
    """The value of a one-element array or scalar as a NumPy scalar of its dtype (a
    ``numpy.float32`` for a float32 loss; never a Python float, so float32 arithmetic stays
    float32); one counted host read when :func:`on_device`.

    Raises:
        ValueError: ``array`` has more than one element.
    """
    value = to_numpy(array)
    if value.size != 1:
        raise ValueError(f"host_scalar: expected one value, got shape {value.shape}")
    return value.reshape(())[()]


def host_reads():
    """Host reads of device arrays (:func:`on_device`) counted since the process started (or
    the last :func:`caffe_engine.process.reset`)."""
    return state.host_reads


class HostReadCounter:
    """What :func:`count_host_reads` yields: ``count``, the reads since the block started."""

    def __init__(self):
        self._start = state.host_reads

    @property
    def count(self):
        return state.host_reads - self._start


@contextlib.contextmanager
def count_host_reads():
    """Count host reads inside the block, NumPy arrays included, and run the device path
    there: inside the block :func:`on_device` is True for every array, so the code takes the
    branches it takes on a GPU (deferred checks, no per-iteration log reads) on NumPy. The
    values computed are the same on both paths; only when they are read differs. Yields a
    :class:`HostReadCounter`. Blocks may nest."""
    state.emulated_reads += 1
    try:
        yield HostReadCounter()
    finally:
        state.emulated_reads -= 1


# ------------------------------------------------------------------------------------------------
# Deferred checks: errors found on the device, raised when the host next reads anyway
# ------------------------------------------------------------------------------------------------
# ``state.deferred``: key -> [bad (0-d bool), payload (0-d), make_error]


def defer_check(key, bad, payload, make_error):
    """Record a check computed on the device without reading it.

    Args:
        key: what the check belongs to (e.g. the layer); checks of one key merge, keeping the
            payload of the first failure.
        bad: 0-d bool array (or NumPy bool), True when the check failed.
        payload: 0-d array with the value the message names (e.g. the first bad label).
        make_error: callable ``payload value (NumPy scalar) -> exception`` to raise.

    :func:`raise_deferred` reads them back. Off the device (:func:`on_device` False) callers
    check at once instead; this is the device path.
    """
    entry = state.deferred.get(key)
    if entry is None:
        state.deferred[key] = [bad, payload, make_error]
        return
    xp = get_array_module(bad, entry[0])
    entry[1] = xp.where(entry[0], entry[1], payload)
    entry[0] = xp.logical_or(entry[0], bad)
    entry[2] = make_error


def check_flag(key, flag, payload, make_error):
    """Raise ``make_error(payload)`` when ``flag`` (a 0-d bool array) is set: at once off the
    device, deferred under ``key`` on it (:func:`defer_check`; nothing is read)."""
    if on_device(flag):
        defer_check(key, flag, payload, make_error)
    elif bool(flag):
        raise make_error(payload[()])


def check_values(key, bad, values, make_error):
    """Raise ``make_error(v)`` for the first ``values`` element ``v`` (C order) where ``bad``.

    Off the device (:func:`on_device` False: NumPy) the check is immediate, as Caffe's CPU
    ``CHECK``s. On the device nothing is read: the flag and the first bad value are computed
    there and handed to :func:`defer_check` under ``key``, to be raised at the next display,
    test or pycaffe forward (:func:`raise_deferred`); Caffe's GPU kernels do not check at all.

    Args:
        key: the deferred check's key (the layer, or (layer, what) for a second check).
        bad: bool array; values: array of the same size; make_error: value -> CaffeError.
    """
    if bad.size == 0:
        return
    if not on_device(bad):
        if bad.any():
            raise make_error(values[bad.reshape(values.shape)].ravel()[0])
        return
    xp = get_array_module(bad)
    flat = bad.ravel()
    first = xp.take(values.ravel(), xp.argmax(flat.astype(xp.int8)))
    defer_check(key, flat.any(), first, make_error)


def pending_checks():
    """Number of deferred checks not yet read back."""
    return len(state.deferred)


def raise_deferred():
    """Read back every deferred check (:func:`defer_check`) and forget them: one counted host
    read for all the flags together, one more for the payload of the first failure, which is
    raised (in the order the checks were first recorded). Nothing to do without pending checks.

    Raises:
        whatever the failing check's ``make_error`` builds (a CaffeError naming the layer).
    """
    if not state.deferred:
        return
    entries = list(state.deferred.values())
    state.deferred.clear()
    xp = get_array_module(*(e[0] for e in entries))
    flags = to_numpy(xp.stack([xp.asarray(e[0]).reshape(()) for e in entries]))
    for (bad, payload, make_error), failed in zip(entries, flags):
        if failed:
            raise make_error(host_scalar(payload))


def discard_deferred():
    """Forget every pending deferred check unread (a net or test being thrown away)."""
    state.deferred.clear()
