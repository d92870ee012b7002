"""Why the CUDA parts of the suite cannot run here: one answer for every test module.

``cuda_missing()`` is None when CuPy imports and sees a CUDA device (the ``cuda`` kernel set,
``gpu_mode``, CuPy buckets, NCCL can run), else the reason a skip gives; ``nvrtc_missing()``
likewise for CuPy's NVRTC binding and library, which compile the CUDA sources without a device
(CI installs them: the ``cuda-compile`` extra).
"""
from functools import lru_cache


@lru_cache(maxsize=None)
def cuda_missing():
    """None with CuPy and a usable CUDA device, else why not (one line: the engine's own
    ``backend.gpu_missing``)."""
    from caffe_engine.backend import gpu_missing
    return gpu_missing()


@lru_cache(maxsize=None)
def nvrtc_missing():
    """None when CuPy's NVRTC compiles here (no device needed), else why not."""
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as exc:  # ImportError, a missing libnvrtc (RuntimeError, OSError)
        return f"CuPy's NVRTC cannot be loaded here ({type(exc).__name__}: {exc})"
    return None
