"""CUDA C sources of the cuda kernel set, and the one prelude every source is compiled with.

Every kernel is an ``extern "C" __global__`` function written as a grid-stride loop
(``CE_KERNEL_LOOP``, Caffe's ``CUDA_KERNEL_LOOP``): one thread per output element, no shared
memory, no warp intrinsics, atomics only through ``atomicAdd``. That keeps each kernel
launchable with any grid (:mod:`.device` caps it) and lets :mod:`.emulator` run the very same
text on the CPU, serially, so the kernels are checked against the reference set on machines
without a GPU.

A source module (``conv``, ``pooling``, ...) registers one :class:`Source`; :func:`all_sources`
lists them for the NVRTC compile check (``tests/kernels/test_cuda_compile.py``) and the
emulator.
"""
import dataclasses
import importlib

PRELUDE = r"""
#define CE_KERNEL_LOOP(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += blockDim.x * gridDim.x)
#define CE_FLT_MAX 3.402823466e+38f
"""

#: modules of this package that register a Source, in compile order
MODULES = ("neuron", "conv", "pooling", "lrn", "solver", "transform", "softmax")


@dataclasses.dataclass(frozen=True)
class Source:
    """One compilation unit: ``name`` (unique), ``code`` (CUDA C, without the prelude) and
    ``kernels``, the ``extern "C"`` function names it defines."""

    name: str
    code: str
    kernels: tuple

    def text(self):
        """The full text handed to the compiler: :data:`PRELUDE` then ``code``."""
        return PRELUDE + self.code


def all_sources():
    """Every registered :class:`Source`, one per module of :data:`MODULES`, in that order."""
    return [importlib.import_module(f"{__package__}.{name}").SOURCE for name in MODULES]
