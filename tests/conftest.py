"""Shared test set-up.

* Layout: the test folders mirror the package (``layers/``, ``kernels/``, ``solvers/``, ``io/``,
  ``comm/``, ``net/``, ``tools/``); whole-engine tests (the CLI, training runs, the model zoo,
  pycaffe) sit here at the root, and ``parallel/`` runs under mpiexec (``parallel/run_all.sh``).
  No folder is a package: pytest imports every test module by its file name, so test module
  names are unique across all folders.
* The test helpers at this folder's root (``golden``, ``gradient_check``, ``paths``,
  ``tiny_train``) are importable by name from every test folder; a test module never imports
  another test module.
* Every test starts and ends with a fresh process state (``caffe_engine.process.reset``: CPU
  mode, one solver, the environment's kernel set, a new global random stream, no deferred
  checks); a test that changes it needs no clean-up of its own.
* Tests may reconfigure the engine's logger (the CLI and tools call setup_logging); it is
  restored after each test so that caplog-based tests see records whatever the order.
* The engine's commands write glog's log files (``caffe_engine.log``) into ``$TMPDIR`` or
  ``/tmp`` as Caffe does; the suite runs hundreds of them, so ``GLOG_logtostderr=1`` (unless set
  already) keeps their log on stderr only, here and in every subprocess. Tests of the log files
  (``test_glog_env.py``) set their own ``GLOG_*`` variables.
* ``kernel_set``: runs a test once per kernel set (:mod:`caffe_engine.kernels`): ``reference``;
  ``cpu`` (Numba) with the engine's tuning; ``cpu-blocks``, the Numba kernels cut into the
  smallest blocks and slices on three threads (every edge of the blocking); ``cuda-emulated``,
  the cuda set's CUDA sources compiled by ``g++`` and run serially on NumPy arrays
  (:mod:`caffe_engine.kernels.cuda.emulator`); ``cuda``, the cuda set on a GPU: the test runs
  in GPU mode (blobs on CuPy), skipped with the reason where CuPy or a device is missing.
  Layers built inside the test plan on it.
* ``gpu_mode``: runs a test in GPU mode (``set_mode_gpu``), skipped with the reason where CuPy
  or a device is missing; restores CPU mode after.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("GLOG_logtostderr", "1")

from caffe_engine import kernels, process  # noqa: E402
from cuda_env import cuda_missing  # noqa: E402
from caffe_engine.log import logger  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_process_state():
    process.reset()
    yield
    process.reset()


@pytest.fixture(autouse=True)
def _restore_engine_logger():
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


CUDA_MISSING = cuda_missing()


def _emulator_missing():
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    return compiler_missing()


def _kernel_set_params():
    numba_missing = "cpu" not in kernels.available()
    cpu_skip = [pytest.mark.skip(reason="Numba is not installed")] if numba_missing else []
    emulator_reason = _emulator_missing()
    emulator_skip = [pytest.mark.skip(reason=emulator_reason)] if emulator_reason else []
    cuda_marks = [pytest.mark.gpu]
    if CUDA_MISSING:
        cuda_marks.append(pytest.mark.skip(reason=CUDA_MISSING))
    return [pytest.param("reference", id="reference"),
            pytest.param("cpu", id="cpu", marks=cpu_skip),
            pytest.param("cpu-blocks", id="cpu-blocks", marks=cpu_skip),
            pytest.param("cuda-emulated", id="cuda-emulated", marks=emulator_skip),
            pytest.param("cuda", id="cuda", marks=cuda_marks)]


KERNEL_SETS = _kernel_set_params()


@pytest.fixture
def gpu_mode():
    """Run the test with new blobs on CuPy (GPU mode); CPU mode again after."""
    if CUDA_MISSING:
        pytest.skip(CUDA_MISSING)
    from caffe_engine import backend
    assert backend.set_mode_gpu()
    try:
        yield
    finally:
        backend.set_mode_cpu()


def kernel_set_object(name):
    """The kernel set a ``kernel_set`` parameter stands for."""
    if name == "cuda-emulated":
        from caffe_engine.kernels.cuda import CudaKernels
        from caffe_engine.kernels.cuda.emulator import EmulatedDevice
        return CudaKernels(EmulatedDevice())
    if name == "cpu-blocks":
        from caffe_engine.kernels.cpu import CpuKernels
        from caffe_engine.kernels.cpu.tuning import CpuTuning
        return CpuKernels(CpuTuning(threads=3, block_columns=1, kc=6, skew=3,
                                    images_per_chunk=2))
    return kernels.get(name)


@pytest.fixture(params=KERNEL_SETS)
def kernel_set(request):
    """Run the test on one kernel set (see the module docstring); yields the set. ``cuda``
    runs the test in GPU mode: its blobs are CuPy arrays, which use the cuda set."""
    if request.param == "cuda":
        request.getfixturevalue("gpu_mode")
        yield kernels.get("cuda")
        return
    chosen = kernel_set_object(request.param)
    previous = kernels.use(chosen)
    try:
        yield chosen
    finally:
        kernels.use(previous)
