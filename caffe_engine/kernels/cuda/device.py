"""Compile and launch the cuda kernel set's sources on a CUDA device through CuPy.

Sources are compiled with NVRTC the first time one of their kernels is launched (CuPy's
``RawModule``, which also caches the binary on disk), so importing the package, or making a
:class:`CupyDevice`, needs neither a GPU nor a compiler. :func:`compile_check` compiles every
source for a named architecture without a device (``sm_90``, the H100/H200), for the tests.
"""
import numpy

#: threads per block (Caffe's CAFFE_CUDA_NUM_THREADS)
THREADS = 512
#: blocks at most per launch; the grid-stride loops cover the rest
MAX_BLOCKS = 65535
#: NVRTC options of every source: no contraction of ``a * b + c`` into one FMA, so each
#: float32 operation rounds as it does in the reference set and in the emulator (g++
#: ``-ffp-contract=off``); the kernels are memory-bound, the FMA would buy nothing
OPTIONS = ("--std=c++14", "--fmad=false")
#: the kernels index with C ints: arrays of this many elements or more go to the reference set
INDEX_LIMIT = 2 ** 31


def operand(xp, array, shape, kernel, name):
    """``array`` as the kernels take it: float32 of ``shape``, C-contiguous (a copy only when
    it is not).

    Raises:
        ValueError: another shape ("<kernel>: <name> has shape ..."). TypeError: not float32.
    """
    if tuple(array.shape) != shape:
        raise ValueError(f"{kernel}: {name} has shape {tuple(array.shape)}, the plan was made "
                         f"for {shape}")
    if array.dtype != numpy.float32:
        raise TypeError(f"{kernel}: {name} must be float32, got {array.dtype}")
    return array if array.flags.c_contiguous else xp.ascontiguousarray(array)


class CupyDevice:
    """Launches kernels of :mod:`.source` on CuPy arrays of the current device.

    ``launch(source, kernel, n, *args)`` runs ``kernel`` of ``source`` (a :class:`.source.Source`)
    over ``n`` elements; ``args`` are C-contiguous CuPy arrays and NumPy scalars (``numpy.int32``
    for ``int``, ``numpy.float32`` for ``float``), in the kernel's parameter order.
    """

    name = "cupy"

    def __init__(self):
        import cupy
        self.xp = cupy
        self._modules = {}
        #: kernels launched so far (the benchmarks count launches per iteration)
        self.launches = 0

    def function(self, source, kernel):
        """The compiled ``kernel`` of ``source`` (compiled once per process and device)."""
        module = self._modules.get(source.name)
        if module is None:
            module = self.xp.RawModule(code=source.text(), options=OPTIONS)
            self._modules[source.name] = module
        return module.get_function(kernel)

    def launch(self, source, kernel, n, *args):
        if n <= 0:
            return
        if n >= 2 ** 31:
            raise ValueError(f"{kernel}: {n} elements exceed the kernels' int indices")
        blocks = min(MAX_BLOCKS, (n + THREADS - 1) // THREADS)
        self.function(source, kernel)((blocks,), (THREADS,), args)
        self.launches += 1


def compile_check(arch="sm_90", sources=None):
    """Compile every source (or ``sources``) with NVRTC for ``arch``, no device needed.

    Returns a list of ``(source name, cubin size in bytes)``.

    Raises:
        ImportError: CuPy (or its NVRTC library) is not installed.
        RuntimeError: a source failed to compile; the message holds NVRTC's log.
    """
    from cupy.cuda import nvrtc

    from .source import all_sources
    results = []
    for source in sources or all_sources():
        program = nvrtc.createProgram(source.text(), f"{source.name}.cu", [], [])
        try:
            nvrtc.compileProgram(program, [f"-arch={arch}", *OPTIONS])
        except nvrtc.NVRTCError as exc:
            raise RuntimeError(f"{source.name}.cu: {exc}\n{nvrtc.getProgramLog(program)}") \
                from None
        results.append((source.name, len(nvrtc.getCUBIN(program))))
    return results


def int32(value):
    """``value`` as a kernel's ``int`` argument."""
    return numpy.int32(value)


def float32(value):
    """``value`` as a kernel's ``float`` argument."""
    return numpy.float32(value)
