"""Run the cuda kernel set's CUDA sources on the CPU, serially, for tests without a GPU.

The sources of :mod:`.source` are grid-stride loops, so a launch with one block of one thread
visits every element in order: compiled as C++ by the host compiler (``g++``), with a shim that
makes ``__global__`` a plain function, ``blockIdx``/``threadIdx`` 0, ``blockDim``/``gridDim`` 1
and ``atomicAdd`` a plain add, each kernel runs as-is on NumPy arrays through ``ctypes``.
:class:`EmulatedDevice` has :class:`.device.CupyDevice`'s ``launch``, so a
:class:`caffe_engine.kernels.cuda.CudaKernels` built on it runs its plans -- the kernels' index
arithmetic, the plans' launches and buffers -- on NumPy arrays, and the tests hold them to the
reference set and to Caffe's fixtures. What it cannot show: races between threads, the
device's float contraction (FMA), launch limits; those need the GPU (``tools/gpu_check.sh``).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

import numpy

from .source import all_sources

SHIM = r"""
#include <math.h>
#include <stdint.h>
#include <algorithm>
using std::min;
using std::max;
#define __global__
#define __device__ static inline
#define __forceinline__
struct ce_dim3 { unsigned int x, y, z; };
static const ce_dim3 blockIdx = {0, 0, 0}, threadIdx = {0, 0, 0};
static const ce_dim3 blockDim = {1, 1, 1}, gridDim = {1, 1, 1};
static inline float atomicAdd(float* address, float value) {
  float old = *address; *address = old + value; return old;
}
"""


def compiler_missing():
    """Why the emulator cannot be built here (None when ``g++`` is on the PATH)."""
    return None if shutil.which("g++") else "g++ is not on the PATH"


def build_library(code, folder_name="caffe_engine_cuda_emulator"):
    """Compile CUDA ``code`` (kernels as :mod:`.source` writes them, prelude included) with
    :data:`SHIM` into a shared library, once per text (cached by its hash in the temporary
    directory, written atomically); returns the library's path.

    Raises:
        RuntimeError: ``g++`` failed (its message included).
    """
    text = SHIM + code
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), folder_name)
    os.makedirs(folder, exist_ok=True)
    library = os.path.join(folder, f"kernels_{digest}.so")
    if not os.path.exists(library):
        source_path = os.path.join(folder, f"kernels_{digest}.{os.getpid()}.cpp")
        with open(source_path, "w") as f:
            f.write(text)
        partial = f"{library}.{os.getpid()}.tmp"
        run = subprocess.run(["g++", "-O2", "-std=c++14", "-shared", "-fPIC",
                              "-ffp-contract=off", "-o", partial, source_path],
                             capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"g++ failed on the cuda sources:\n{run.stderr}")
        os.replace(partial, library)
    return library


class EmulatedDevice:
    """:class:`.device.CupyDevice`'s interface on NumPy arrays, every kernel run serially on
    the CPU (see the module docstring). The library is built once per source text, in the
    temporary directory.

    Raises:
        RuntimeError: ``g++`` failed (its message included).
    """

    name = "emulated"
    xp = numpy

    def __init__(self, sources=None):
        self.sources = sources or all_sources()
        names = [k for s in self.sources for k in s.kernels]
        if len(names) != len(set(names)):
            raise ValueError("kernel names must be unique across the cuda sources")
        text = "".join(f'\n// ---- {s.name}.cu\n' + s.text() for s in self.sources)
        library = build_library(text)
        self._library = ctypes.CDLL(library)
        self.launches = 0

    def launch(self, source, kernel, n, *args):
        if n <= 0:
            return
        function = getattr(self._library, kernel)
        function.restype = None
        function(*[_c_argument(kernel, a) for a in args])
        self.launches += 1


def _c_argument(kernel, value):
    if isinstance(value, numpy.ndarray):
        if not value.flags.c_contiguous:
            raise ValueError(f"{kernel}: arrays handed to a kernel must be C-contiguous")
        return ctypes.c_void_p(value.ctypes.data)
    if isinstance(value, numpy.int32):
        return ctypes.c_int(int(value))
    if isinstance(value, numpy.float32):
        return ctypes.c_float(float(value))
    if isinstance(value, numpy.uint32):
        return ctypes.c_uint(int(value))
    raise TypeError(f"{kernel}: kernel arguments are arrays, numpy.int32, numpy.float32 "
                    f"or numpy.uint32, got {type(value).__name__}")
