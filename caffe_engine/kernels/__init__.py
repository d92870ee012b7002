"""The hot loops behind one small interface: a *kernel set* per kind of array.

A layer asks once, in ``reshape``, for the kernel set of its bottom's array
(:func:`for_array`) and keeps what it plans there; it never branches on the device itself.
Every kernel set offers the same methods (see :class:`.reference.ReferenceKernels`):

* ``conv(ConvGeometry)`` -> a plan with ``forward(x, w, bias, y)``, ``backward_data(dy, w, dx)``,
  ``weight_grad(x, dy, dw)`` (accumulates) and ``bias_grad(dy, db)`` (accumulates);
* ``pooling(PoolGeometry)`` -> a plan with ``forward(x, y, mask)`` and ``backward(dy, dx)``
  (MAX keeps Caffe's argmax between the two);
* ``lrn(LRNGeometry)`` -> a plan with ``forward(x, y)`` and ``backward(x, y, dy, dx)``;
* ``matmul(a, b, c, accumulate, trans_a, trans_b)`` (InnerProduct's products);
* ``relu_forward(x, y, slope)`` / ``relu_backward(x, dy, dx, slope)``;
* ``channel_sum(a, alpha)``, ``batch_norm_stats(x, inv)``, ``batch_norm_forward(...)``,
  ``batch_norm_stats_forward(...)`` (the two before with batch statistics, std between) and
  ``batch_norm_backward(...)`` (BatchNorm, with an in-place Scale and ReLU after it taken into
  the same passes), ``scale_shift`` / ``scale_grad`` (Scale), see :mod:`.reference.channelwise`;
* ``im2col(...)`` / ``col2im(...)`` (the Im2col layer's);
* ``update(rule)`` -> the fused solver step of one learnable param for one of Caffe's six
  update rules (normalise, regularise, the rule, ``data -= diff``);
* ``param_norms(data, diff)`` -> ``(||data||, ||diff||)`` of one learnable param (float32
  scalars; LARC's per-param rates, ``caffe_engine/solvers/larc.py``);
* ``transform(...)`` -> the Data layer's crop, mirror, mean and scale of a uint8 batch;
* ``softmax_forward(x, y, scale)`` (Softmax over axis 1 of (outer, C, inner) views),
  ``softmax_loss_forward(...)`` and ``softmax_loss_backward(...)`` (SoftmaxWithLoss: its loss,
  label check and normalizer; the gradient), see :mod:`.reference.softmax`;
* ``dropout_forward(x, mask, threshold, scale, y)`` and ``dropout_backward(dy, mask,
  threshold, scale, dx)`` (the mask is the streams' choice: :func:`caffe_engine.rng.
  dropout_mask`).

The sets:

* ``reference``: readable NumPy/CuPy bodies (``xp``), Caffe's arithmetic order; the oracle of
  the tests;
* ``cpu``: compiled Numba kernels for NumPy arrays (``caffe_engine/kernels/cpu``), the default
  when Numba can be imported (else the reference set, with one warning line);
* ``cuda``: CUDA C kernels compiled by NVRTC for CuPy arrays (``caffe_engine/kernels/cuda``),
  what every CuPy array uses; the same sources run serially on the CPU through
  :class:`.cuda.emulator.EmulatedDevice` in the tests, and as the ``cuda-emulated`` set for
  NumPy arrays (``CAFFE_ENGINE_KERNELS=cuda-emulated``: a whole run through the CUDA sources on
  the CPU, serially -- a check, about 10 times slower than ``cpu``).

``CAFFE_ENGINE_KERNELS=reference`` (or ``cuda-emulated``, or :func:`use`) makes NumPy arrays use
that set. The choice, the threads and the sets made are fields of
:data:`caffe_engine.process.state` (``kernel_choice``, ``kernel_threads``, ``kernel_sets``).
"""
import dataclasses
import logging
import threading

from .. import environment
from ..backend import get_array_module
from ..process import state
from .numba_import import import_numba

logger = logging.getLogger("caffe_engine")

def _numba_available():
    try:
        import_numba()
    except ImportError as exc:
        return exc
    return None


#: Serialises the making of a kernel set: a Data layer's prefetch thread asks for the cpu set
#: while the main thread sets up the next layers, and two sets made at once left the layers
#: planned on the first one re-planning at the first forward (fresh plans and scratch memory, a
#: pooling argmax outside the gradient arena: VGG-16's peak RSS 100 MB higher in two runs of
#: three).
_making = threading.RLock()


def get(name):
    """The kernel set called ``name`` ("reference", "cpu" or "cuda"), made once per process.

    Raises:
        ValueError: an unknown name, "cpu" without Numba, or "cuda" without CuPy.
    """
    sets = state.kernel_sets
    if name in sets:
        return sets[name]
    with _making:
        if name not in sets:
            _make(name, sets)
    return sets[name]


def _make(name, sets):
    """Make the kernel set ``name`` into ``sets`` (see :func:`get`)."""
    if name == "reference":
        from .reference import ReferenceKernels
        sets[name] = ReferenceKernels()
    elif name == "cpu":
        missing = _numba_available()
        if missing is not None:
            raise ValueError(f"the cpu kernel set needs Numba: {missing}")
        from .cpu import CpuKernels
        from .cpu.tuning import CpuTuning
        tuning = CpuTuning.from_environment()
        if state.kernel_threads:
            tuning = dataclasses.replace(tuning, threads=state.kernel_threads)
        sets[name] = CpuKernels(tuning)
    elif name == "cuda":
        from .cuda import CudaKernels
        try:
            sets[name] = CudaKernels()
        except ImportError as exc:
            raise ValueError(f"the cuda kernel set needs CuPy: {exc}") from None
    elif name == "cuda-emulated":
        from .cuda import CudaKernels
        from .cuda.emulator import EmulatedDevice, compiler_missing
        if compiler_missing():
            raise ValueError(f"the cuda-emulated kernel set needs g++: {compiler_missing()}")
        sets[name] = CudaKernels(EmulatedDevice())
    else:
        raise ValueError(f"unknown kernel set {name!r} (known: reference, cpu, cuda, "
                         "cuda-emulated)")


def set_threads(threads):
    """Threads for the compiled kernels of this process (data-parallel ranks sharing a host
    take a share of its cores); plans made after this call use them."""
    state.kernel_threads = max(1, int(threads))
    if "cpu" in state.kernel_sets:
        cpu = state.kernel_sets["cpu"]
        cpu.retune(dataclasses.replace(cpu.tuning, threads=state.kernel_threads))


def available():
    """Names of the kernel sets for NumPy arrays that this process can use."""
    return ["reference"] + (["cpu"] if _numba_available() is None else [])


def cpu_default():
    """The name of the set NumPy arrays use: :func:`use`'s choice, else
    ``CAFFE_ENGINE_KERNELS``, else "cpu" when Numba imports (else "reference", warned once)."""
    if state.kernel_choice is None:  # the first call (or after use(None))
        name = environment.read("CAFFE_ENGINE_KERNELS")
        if name is None:
            missing = _numba_available()
            if missing is None:
                name = "cpu"
            else:
                logger.warning("Numba is not available (%s): running the reference kernels "
                               "(pip install numba for the compiled ones)", missing)
                name = "reference"
        if name not in ("reference", "cpu", "cuda-emulated"):
            raise ValueError(f"CAFFE_ENGINE_KERNELS={name!r}: known kernel sets are "
                             "reference, cpu and cuda-emulated")
        state.kernel_choice = name
    return state.kernel_choice


def describe_cpu():
    """One phrase for the start-up INFO line: the kernel set NumPy arrays use and the BLAS
    behind NumPy, so a machine running below its instruction set shows at once, e.g.
    ``cpu (Numba 0.68.1, 2 threads, AVX-512: 16 floats a vector); NumPy's BLAS: openblas
    0.3.31 (kernel SkylakeX, 1 thread)``."""
    choice = cpu_default()
    kernel_set = get(choice) if isinstance(choice, str) else choice
    return f"{kernel_set.describe()}; NumPy's BLAS: {blas_description()}"


#: OpenBLAS kernels below AVX-512 (its ``architecture`` names; a CPU with AVX-512 runs SkylakeX,
#: Cooperlake or SapphireRapids unless ``OPENBLAS_CORETYPE`` forces another).
_BELOW_AVX512 = {"haswell", "zen", "sandybridge", "nehalem", "core2", "barcelona", "prescott",
                 "atom", "penryn", "dunnington", "bulldozer", "piledriver", "steamroller",
                 "excavator", "opteron", "generic"}


def _host_has_avx512():
    try:
        from llvmlite import binding
    except ImportError:
        return False
    return bool(binding.get_host_cpu_features().get("avx512f", False))


def blas_description():
    """NumPy's BLAS as one phrase, e.g. ``openblas 0.3.31 (kernel SkylakeX, 1 thread)``, from
    threadpoolctl ("unknown" without it), noting ``below this CPU's AVX-512`` (and the
    ``OPENBLAS_CORETYPE`` that forced it) when the host has AVX-512 and the library runs an
    older kernel."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl is not installed)"
    infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    infos = [i for i in infos if "numpy" in i.get("filepath", "")] or infos
    if not infos:
        return "none found"
    phrases = []
    for info in infos:
        arch, threads = info.get("architecture"), info.get("num_threads")
        phrase = (f"{info.get('internal_api')} {info.get('version')} (kernel {arch or '?'}, "
                  f"{threads} thread{'s' if threads != 1 else ''}")
        if arch and arch.lower() in _BELOW_AVX512 and _host_has_avx512():
            forced = environment.raw("OPENBLAS_CORETYPE")
            phrase += ", below this CPU's AVX-512" + (f": OPENBLAS_CORETYPE={forced} is set"
                                                      if forced else "")
        phrases.append(phrase + ")")
    return "; ".join(phrases)


def gpu_default():
    """The name of the set CuPy arrays use: ``CAFFE_ENGINE_GPU_KERNELS`` ("cuda" or
    "reference", to compare the two on a GPU), else "cuda".

    Raises:
        ValueError: another name.
    """
    name = environment.read("CAFFE_ENGINE_GPU_KERNELS") or "cuda"
    if name not in ("cuda", "reference"):
        raise ValueError(f"CAFFE_ENGINE_GPU_KERNELS={name!r}: the kernel sets for CuPy arrays "
                         "are cuda and reference")
    return name


def use(choice):
    """Make NumPy arrays use a kernel set from now on: a name ("reference", "cpu"), a kernel
    set object (e.g. ``CpuKernels(CpuTuning(threads=1))``, as the tests make), or None (back to
    :func:`cpu_default`'s choice). Returns the previous choice.

    Layers pick their plans in ``reshape``: reshape a net (or build it) after switching.

    Raises:
        ValueError: an unknown name, or "cpu" without Numba.
    """
    previous = state.kernel_choice
    if isinstance(choice, str):
        get(choice)
    state.kernel_choice = choice
    return previous


def for_array(array):
    """The kernel set for ``array``'s device: the NumPy default (:func:`cpu_default`) for NumPy
    arrays, :func:`gpu_default`'s (the cuda set) for CuPy arrays."""
    if get_array_module(array).__name__ == "cupy":
        return get(gpu_default())
    choice = cpu_default()
    return get(choice) if isinstance(choice, str) else choice
