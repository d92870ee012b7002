"""The engine's process-wide state, in one object: Caffe's ``Caffe::Get()``.

Caffe keeps what belongs to the process rather than to a net or a solver in one singleton
(``class Caffe`` in include/caffe/common.hpp, src/caffe/common.cpp): the mode, the solver count
and rank, the multiprocess flag, the random generator, the cuBLAS and cuRAND handles. Here that
is :data:`state`, one :class:`ProcessState`. The modules that own each piece keep the functions
over it, under pycaffe's and Caffe's names -- :mod:`caffe_engine.backend` (``set_mode_cpu``,
``set_device``, ``set_solver_count``, ``solver_rank``, the host reads and deferred checks),
:mod:`caffe_engine.kernels` (``use``, ``set_threads``, ``get``), :mod:`caffe_engine.rng`
(``set_random_seed``, ``set_exact_rng``) -- and no module keeps process-wide values of its own
beside it.

:func:`reset` puts the state back as a fresh process has it; the tests call it after every
test (tests/conftest.py). Unlike Caffe's, the state is not per thread: the engine's threads
(data prefetch, kernel teams) never change it.
"""
import numpy


class ProcessState:
    """The process-wide values of the engine (module docstring), as attributes.

    Mode and device (pycaffe's ``set_mode_cpu`` / ``set_mode_gpu`` / ``set_device``; Caffe's
    ``Caffe::mode()``, ``Caffe::SetDevice``):

    Attributes:
        xp: the array module new blobs are allocated with: ``numpy`` (CPU mode, the default)
            or ``cupy`` (GPU mode). Set by ``backend.set_mode_cpu`` / ``set_mode_gpu``.
        device: the CUDA device id GPU mode uses (0). Set by ``backend.set_device``.
        warned_no_gpu: whether ``set_mode_gpu`` has already logged that no GPU is usable (it
            warns once).
        solver_count: solvers training together (1; Caffe's ``Caffe::solver_count``). Set by
            ``backend.set_solver_count``; read by solvers and data layers when made.
        solver_rank: this process's solver among them (0; ``Caffe::solver_rank``). Set by
            ``backend.set_solver_rank``.
        multiprocess: pycaffe's ``set_multiprocess`` flag (False; ``Caffe::multiprocess``),
            recorded only.
        kernel_choice: the kernel set NumPy arrays use: None (not chosen yet:
            ``CAFFE_ENGINE_KERNELS``, else ``cpu``, is read at the next use), a set's name, or
            a kernel set object. Set by ``kernels.use`` and ``kernels.cpu_default``.
        kernel_threads: threads of the compiled CPU kernels when a share of the host's cores
            was set (``kernels.set_threads``, from ``comm.distributed.share_cores``); None: all
            the usable cores.
        kernel_sets: the kernel sets made so far by ``kernels.get``, by name (each is made
            once: the cpu set owns a thread team, the cuda set its compiled modules).
        mmap_threshold: the bytes glibc's malloc was told to map allocations from
            (``memory.hold_mmap_threshold``, once per process; 0: left as it was; None: not
            asked yet).
        rng: the global random stream (a :class:`caffe_engine.rng.CaffeRNG`; Caffe's
            ``Caffe::rng_stream()``), made on first use by ``rng.get_rng``, replaced by
            ``rng.set_random_seed``.
        exact_rng: the exact-RNG switch set by ``rng.set_exact_rng`` (None: the environment's
            ``CAFFE_ENGINE_EXACT_RNG`` decides).
        device_streams: the device random streams, by (array module, device id)
            (``rng.device_stream``; Caffe's ``curand_generator``), dropped on reseeding.
        host_reads: host reads of device arrays counted since the process started (or the
            last :func:`reset`): ``backend.to_numpy``, ``backend.host_scalar``.
        emulated_reads: how many ``backend.count_host_reads`` blocks are open (>0: NumPy
            arrays count as device arrays).
        deferred: the checks computed on the device and not read yet, by key
            (``backend.defer_check``; raised by ``backend.raise_deferred``).
    """

    def __init__(self):
        self.kernel_threads = None
        self.kernel_sets = {}
        self.mmap_threshold = None
        self.reset()

    def reset(self):
        """Put back what a fresh process has, except what is made once per process and costly
        to make again: the NumPy kernel sets (the cpu set's threads) and ``kernel_threads``,
        the share of the cores that holds for the process's life as the BLAS limit set with it.
        The cuda set is dropped: it belongs to the CuPy module and device it was made with (the
        tests swap CuPy for a fake)."""
        self.xp = numpy
        self.device = 0
        self.warned_no_gpu = False
        self.solver_count = 1
        self.solver_rank = 0
        self.multiprocess = False
        self.kernel_choice = None
        self.kernel_sets.pop("cuda", None)
        self.rng = None
        self.exact_rng = None
        self.device_streams = {}
        self.host_reads = 0
        self.emulated_reads = 0
        self.deferred = {}


#: The one process state.
state = ProcessState()


def reset():
    """Put the process state back as a fresh process has it (:meth:`ProcessState.reset`): CPU
    mode, device 0, one solver of rank 0, the kernel set and exact-RNG switch of the
    environment, a new global random stream (seeded from the clock until ``set_random_seed``),
    no device streams, no pending deferred checks, host reads counted from 0."""
    state.reset()


__all__ = ["ProcessState", "state", "reset"]
