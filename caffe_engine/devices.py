"""Which device a command runs on: ``--gpu`` ids, the solver's ``solver_mode``, one GPU per rank.

Caffe: tools/caffe.cpp (``get_gpus``, the device choice of ``train``, ``test`` and ``time``).
The choice ends in :mod:`caffe_engine.backend` (``set_device``, ``set_mode_gpu`` /
``set_mode_cpu``); under ``mpiexec`` each rank takes one GPU of its machine
(:func:`rank_gpu`), where Caffe's tool ran one thread per ``--gpu`` id instead.
"""
import numpy

from . import backend, kernels
from .errors import CaffeError
from .flags import UsageError
from .log import logger


def gpu_ids(spec, what=None):
    """Device ids from a ``--gpu`` value (Caffe's get_gpus): ``all`` or ``0,1,...``.

    ``what`` names the request in the error for a missing GPU (default ``--gpu=<spec>``).

    Raises:
        UsageError: an id is not an integer, or is negative.
        CaffeError: CuPy or a CUDA device is missing, or an id is beyond the devices present.
    """
    if not spec:
        return []
    ids = None
    if spec != "all":
        try:
            ids = [int(x) for x in spec.split(",")]
        except ValueError:
            raise UsageError(f"--gpu: expected 'all' or device ids separated by ',', got "
                             f"'{spec}'") from None
        if any(i < 0 for i in ids):
            raise UsageError(f"--gpu: device ids are 0 or more, got '{spec}'")
    reason = backend.gpu_missing()
    if reason is not None:
        raise CaffeError(f"{what or '--gpu=' + spec}: GPU mode needs CuPy and a CUDA device: "
                         f"{reason}")
    import cupy
    count = cupy.cuda.runtime.getDeviceCount()
    if ids is None:
        return list(range(count))
    for i in ids:
        if not 0 <= i < count:
            raise CaffeError(f"--gpu: no CUDA device {i} ({count} available)")
    return ids


def rank_gpu(ctx, gpus):
    """The device of this rank among ``gpus``, one per rank: the NCCL communicator's own choice
    (``comm.nccl.choose_device``: ``CAFFE_NCCL_DEVICE`` or the rank's place on its machine),
    else round robin by the rank's place on its machine (an ``MPI_COMM_TYPE_SHARED`` split), so
    ranks 4..7 of a second 4-GPU machine take its GPUs 0..3.

    Args:
        ctx: the data-parallel run (``comm.distributed.init``): ``rank`` and ``comm``.
        gpus: the ``--gpu`` device ids (ints).

    Raises:
        CaffeError: the NCCL communicator's device is not among ``gpus``.
    """
    chosen = getattr(ctx.comm, "device", None)
    if chosen is not None:
        if chosen not in gpus:
            raise CaffeError(f"--gpu={','.join(map(str, gpus))}: the NCCL communicator of rank "
                             f"{ctx.rank} uses GPU {chosen}, not one of these")
        return chosen
    mpi_comm = getattr(ctx.comm, "comm", None)
    local_rank = ctx.rank
    if mpi_comm is not None:
        from .comm.communicator import local_place
        local_rank, _ = local_place(mpi_comm, ctx.comm.MPI, ctx.rank)
    return gpus[local_rank % len(gpus)]


def use_gpu(device):
    """GPU mode on CUDA device ``device`` (Caffe's ``Caffe::SetDevice`` then ``set_mode(GPU)``)."""
    backend.set_device(device)
    backend.set_mode_gpu()


def use_cpu():
    """CPU mode, with the INFO line naming the kernel set and NumPy's BLAS (kernel, threads),
    so a machine running below its instruction set shows at once."""
    backend.set_mode_cpu()
    logger.info("CPU kernels: %s", kernels.describe_cpu())


def select_device(gpu):
    """``test`` / ``time``: the first device of ``--gpu`` (``gpu``), else the CPU.

    Raises:
        UsageError, CaffeError: as :func:`gpu_ids`.
    """
    gpus = gpu_ids(gpu)
    if gpus:
        logger.info("Use GPU with device ID %d", gpus[0])
        use_gpu(gpus[0])
    else:
        logger.info("Use CPU.")
        use_cpu()


def select_train_device(gpu, param, ctx=None):
    """``train``: the device of this process, from ``--gpu`` (``gpu``), else the solver's
    ``solver_mode: GPU`` and ``device_id``; one GPU per rank under ``mpiexec`` (``ctx``).

    ``param.device_id`` (a caffe_pb2.SolverParameter) becomes the GPU chosen. ``solver_mode:
    GPU`` without a usable GPU trains on the CPU with a WARNING, as Caffe's CPU-only builds do;
    a ``device_id`` with CPU training is named in a WARNING.

    Raises:
        UsageError, CaffeError: a bad or missing ``--gpu`` device (:func:`gpu_ids`); several
            GPUs for one process.
    """
    from .proto import caffe_pb2
    spec = gpu
    if not spec and param.HasField("solver_mode") and \
            param.solver_mode == caffe_pb2.SolverParameter.GPU:
        spec = str(param.device_id)
    try:
        gpus = gpu_ids(spec)
    except CaffeError:
        if gpu:
            raise
        # solver_mode: GPU without a GPU: Caffe's CPU-only builds train on the CPU too.
        logger.warning("solver_mode is GPU but CuPy/CUDA is not available; using the CPU")
        gpus = []
    if not gpus:
        logger.info("Use CPU.")
        if param.device_id:
            logger.warning("solver device_id %d is ignored: training runs on the CPU",
                           param.device_id)
        use_cpu()
        return
    if ctx is not None and ctx.size > 1:
        gpus = [rank_gpu(ctx, gpus)]
    if len(gpus) > 1:
        raise CaffeError(f"--gpu={spec}: several GPUs in one process are not supported; "
                         "run one process per GPU under mpiexec")
    logger.info("Using GPUs %s", ", ".join(str(i) for i in gpus))
    import cupy
    for i in gpus:
        name = cupy.cuda.runtime.getDeviceProperties(i)["name"]
        logger.info("GPU %d: %s", i, name.decode() if isinstance(name, bytes) else name)
    param.device_id = gpus[0]
    use_gpu(gpus[0])


def device_sync():
    """A function that waits for queued GPU work (a no-op on the CPU), so timings are real."""
    if backend.xp() is numpy:
        return lambda: None
    import cupy
    return cupy.cuda.Device().synchronize
