"""Shared test set-up.

* Layout: the test folders mirror the package (``layers/``, ``kernels/``, ``solvers/``, ``io/``,
  ``comm/``, ``net/``, ``tools/``); whole-engine tests (the CLI, training runs, the model zoo,
  pycaffe) sit here at the root, and ``parallel/`` runs under mpiexec (``parallel/run_all.sh``).
  No folder is a package: pytest imports every test module by its file name, so test module
  names are unique across all folders.
* The test helpers at this folder's root (``golden``, ``gradient_check``, ``paths``,
  ``tiny_train``) are importable by name from every test folder; a test module never imports
  another test module.
* Tests may reconfigure the engine's logger (the CLI and tools call setup_logging); it is
  restored after each test so that caplog-based tests see records whatever the order.
* The engine's commands write glog's log files (``caffe_engine.log``) into ``$TMPDIR`` or
  ``/tmp`` as Caffe does; the suite runs hundreds of them, so ``GLOG_logtostderr=1`` (unless set
  already) keeps their log on stderr only, here and in every subprocess. Tests of the log files
  (``test_glog_env.py``) set their own ``GLOG_*`` variables.
* ``kernel_set``: runs a test once per kernel set (:mod:`caffe_engine.kernels`): ``reference``;
  ``cpu`` (Numba) with the engine's tuning; ``cpu-blocks``, the Numba kernels cut into the
  smallest blocks and slices on three threads (every edge of the blocking); ``cuda``, skipped
  with the reason where CuPy or a device is missing. Layers built inside the test plan on it.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("GLOG_logtostderr", "1")

from caffe_engine import kernels  # noqa: E402
from caffe_engine.log import logger  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_engine_logger():
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


def _cuda_missing():
    """Why the cuda kernel set cannot run here (None when it could)."""
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # CUDARuntimeError and the like
        return f"no usable CUDA device ({exc})"
    return "the cuda kernel set is not built yet (the GPU issue); CuPy arrays run the reference set"


def _kernel_set_params():
    numba_missing = "cpu" not in kernels.available()
    cpu_skip = [pytest.mark.skip(reason="Numba is not installed")] if numba_missing else []
    cuda_reason = _cuda_missing()
    return [pytest.param("reference", id="reference"),
            pytest.param("cpu", id="cpu", marks=cpu_skip),
            pytest.param("cpu-blocks", id="cpu-blocks", marks=cpu_skip),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.skip(reason=cuda_reason)])]


KERNEL_SETS = _kernel_set_params()


def kernel_set_object(name):
    """The kernel set a ``kernel_set`` parameter stands for."""
    if name == "cpu-blocks":
        from caffe_engine.kernels.cpu import CpuKernels
        from caffe_engine.kernels.cpu.tuning import CpuTuning
        return CpuKernels(CpuTuning(threads=3, block_columns=1, kc=6, skew=3,
                                    images_per_chunk=2))
    return kernels.get(name)


@pytest.fixture(params=KERNEL_SETS)
def kernel_set(request):
    """Run the test on one kernel set (see the module docstring); yields the set."""
    chosen = kernel_set_object(request.param)
    previous = kernels.use(chosen)
    try:
        yield chosen
    finally:
        kernels.use(previous)
