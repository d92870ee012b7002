"""NCCL allreduce of CuPy arrays on the GPU (``--comm nccl``; needs CuPy with NCCL).

One process per GPU, started by ``mpiexec``; MPI only carries NCCL's unique id from rank 0 to
the others (Caffe's multi-process NCCL path, src/caffe/parallel.cpp ``NCCL::NCCL`` with
``ncclGetUniqueId`` / ``ncclCommInitRank``, does the same with its own bootstrap), and then
NCCL moves the gradients between the GPUs itself (NVLink, PCIe or the network), with no copy
through host memory.

Device: each rank uses one GPU, chosen at construction: the ``device`` option, else the
environment variable ``CAFFE_NCCL_DEVICE`` (this rank's device id), else its *local rank*
(its index among the ranks on its machine, from an ``MPI_COMM_TYPE_SHARED`` split) — so
``mpiexec -n 4`` on a machine of 4 GPUs puts rank r on GPU r, and 2 machines of 4 GPUs each
put ranks 4..7 on GPUs 0..3 of the second. The device is made current
(``cupy.cuda.Device(d).use()``); the buffers must live on it. NCCL allows one rank per GPU:
more ranks on a machine than it has GPUs is an error.

Operations (float32 buffers, C-contiguous, any shape, treated as flat):

* ``allreduce_(buf, op)``: ``ncclAllReduce`` in place (send and receive pointers equal) on the
  current stream, then for ``op="mean"`` ``buf *= float32(1 / size)`` on that stream (Caffe's
  ``caffe_gpu_scal(size, 1 / Caffe::solver_count(), diff)``); returns once the stream is done.
* ``allreduce_async_(buf, op)``: the same on the communicator's own non-blocking stream, after
  an event of the current (compute) stream so the reduction sees the finished gradients;
  returns a handle whose ``wait()`` waits for an event recorded after the reduction (no host
  thread). Every rank must launch in the same order (NCCL matches the calls by order).
* ``bcast_(buf, root)``: ``ncclBcast`` of the raw bytes (any dtype).

Every wait on the device runs under the communicators' watchdog (``timeout``), so a rank that
died mid-reduction aborts the job instead of hanging it.

Errors (:class:`~caffe_engine.errors.CaffeError`, one line, the same on every rank since the
checks are gathered before NCCL starts): mpi4py missing; CuPy, its NCCL binding or a CUDA
device missing (``communicator 'nccl' needs CuPy with NCCL and a CUDA device ...``); more
ranks on a machine than GPUs; a bad ``device``/``CAFFE_NCCL_DEVICE``; and, per call, a host
(NumPy) buffer or one on another GPU. There is no compressed allreduce on NCCL.
"""
import time
import warnings

import numpy

from .. import environment
from ..errors import CaffeError
from .communicator import WATCHDOG, Communicator, Handle, _check_op, check_buffer, local_place
from .launcher import mpi_module
from .registry import register

#: Environment variable naming this rank's CUDA device (overrides the local rank).
DEVICE_VAR = "CAFFE_NCCL_DEVICE"


def _one_line(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _load_nccl():
    """(cupy, cupy.cuda.nccl, device count).

    Raises:
        CaffeError: CuPy, NCCL or a CUDA device missing (one line).
    """
    need = "communicator 'nccl' needs CuPy with NCCL and a CUDA device"
    try:
        import cupy
        with warnings.catch_warnings():   # CuPy warns over several lines when NCCL is missing
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
    except Exception as exc:  # ImportError and what a broken install raises
        raise CaffeError(f"{need} (pip install -e '.[gpu]'); not available here: "
                         f"{_one_line(exc)}") from None
    from ..backend import gpu_missing
    reason = gpu_missing()
    if reason is not None:
        raise CaffeError(f"{need}; not here: {reason}")
    count = cupy.cuda.runtime.getDeviceCount()
    if not getattr(nccl, "available", True) or not hasattr(nccl, "NcclCommunicator"):
        raise CaffeError(f"{need}; this CuPy cannot load NCCL (pip install nvidia-nccl-cu12, "
                         "or the nvidia-nccl package matching your CUDA)")
    return cupy, nccl, count


def choose_device(local_rank, local_size, device_count, device=None, environ=None):
    """This rank's CUDA device id.

    Args:
        local_rank, local_size: this rank's index among the ranks of its machine, and their
            number.
        device_count: CUDA devices visible to this process.
        device: the constructor option (None: not given).
        environ: the environment to read (default: this process's), for ``CAFFE_NCCL_DEVICE``.

    Returns:
        ``device`` if given, else ``CAFFE_NCCL_DEVICE`` if set, else ``local_rank``.

    Raises:
        CaffeError: a device id that is not an integer in [0, device_count); no explicit
            device and more ranks on the machine than devices (NCCL: one rank per GPU).
    """
    source, value = "device", device
    chosen = environment.read(DEVICE_VAR, environ)     # None when unset or empty
    if value is None and chosen is not None:
        source, value = DEVICE_VAR, chosen
    if value is None:
        if local_size > device_count:
            raise CaffeError(f"communicator 'nccl': {local_size} ranks on this machine but "
                             f"{device_count} GPU(s); NCCL needs one GPU per rank")
        return int(local_rank)
    try:
        dev = int(value)
    except (TypeError, ValueError):
        dev = -1
    if not 0 <= dev < device_count:
        raise CaffeError(f"communicator 'nccl': {source} must be a device id in "
                         f"0..{device_count - 1}, got {value!r}")
    return dev


class _EventHandle(Handle):
    """The pending result of an NCCL ``allreduce_async_``: an event after the reduction."""

    def __init__(self, buf, event, watch):
        """``watch``: a callable returning the watchdog's context manager for the wait."""
        super().__init__(buf)
        self._cuda_event = event
        self._watch = watch

    def done(self):
        return self._cuda_event.done

    def wait(self, timeout=None):
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while not self._cuda_event.done:
                if time.monotonic() > deadline:
                    raise CaffeError(f"allreduce did not finish within {timeout:g} s")
                time.sleep(1e-4)
        with self._watch():
            self._cuda_event.synchronize()
        return self.buf


@register("nccl")
class NCCLCommunicator(Communicator):
    """Allreduce and broadcast of CuPy arrays by NCCL (see the module docstring).

    Args:
        comm: mpi4py communicator used to share NCCL's unique id and to find the local rank
            (default COMM_WORLD); construction is collective.
        device: this rank's CUDA device id (None: ``CAFFE_NCCL_DEVICE``, else the local rank).
        timeout: see :class:`~.communicator.Communicator` (the NCCL start and every wait).

    Attributes:
        device: the CUDA device id; ``local_rank``, ``local_size``: this rank's place on its
            machine.

    Raises:
        CaffeError: see the module docstring (one line, on every rank).
    """

    name = "nccl"

    def __init__(self, comm=None, device=None, timeout=None):
        MPI = mpi_module()
        if MPI is None:
            raise CaffeError("communicator 'nccl' needs mpi4py to start (pip install mpich mpi4py)")
        comm = MPI.COMM_WORLD if comm is None else comm
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout)
        self.mpi_comm = comm
        self.nccl_comm = None
        with self._watch("NCCL start"):
            self.local_rank, self.local_size = local_place(comm, MPI, self.rank)
            error = None
            try:
                self.cupy, self.nccl, count = _load_nccl()
                self.device = choose_device(self.local_rank, self.local_size, count, device)
            except CaffeError as exc:
                error = str(exc)
            errors = comm.allgather(error)
            first = next((r for r, e in enumerate(errors) if e is not None), None)
            if first is not None:     # the same line on every rank
                same = all(e == errors[first] for e in errors)
                raise CaffeError(errors[first] if same else
                                 f"rank {first} of {self.size}: {errors[first]}")
            cupy, nccl = self.cupy, self.nccl
            cupy.cuda.Device(self.device).use()
            uid = comm.bcast(nccl.get_unique_id() if self.rank == 0 else None, root=0)
            self.nccl_comm = nccl.NcclCommunicator(self.size, uid, self.rank)
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def over(self, comm, members):
        """NCCL over ``comm`` on this rank's device (the communicator keeps ``comm``: the
        caller frees it after :meth:`close`)."""
        return NCCLCommunicator(comm, device=self.device, timeout=self.timeout)

    def _device_buffer(self, buf, what, any_dtype=False):
        if not type(buf).__module__.startswith("cupy"):
            raise CaffeError(f"communicator 'nccl': {what} needs a CuPy array on the GPU, "
                             f"got {type(buf).__name__} (train with --gpu, one GPU per rank)")
        if any_dtype:
            if not buf.flags.c_contiguous:
                raise CaffeError(f"{what}: the buffer must be C-contiguous")
            flat = buf.reshape(-1)
        else:
            flat = check_buffer(buf, what)
        if flat.device.id != self.device:
            raise CaffeError(f"communicator 'nccl': the {what} buffer is on GPU "
                             f"{flat.device.id}, this rank's NCCL communicator on GPU "
                             f"{self.device}")
        return flat

    def _launch(self, flat, op, stream):
        n = self.nccl
        self.nccl_comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, n.NCCL_FLOAT32,
                                 n.NCCL_SUM, stream.ptr)
        if op == "mean":
            with stream:
                flat *= numpy.float32(1.0 / self.size)

    def allreduce_(self, buf, op="sum"):
        _check_op(op)
        flat = self._device_buffer(buf, "allreduce")
        if flat.size:
            stream = self.cupy.cuda.get_current_stream()
            self._launch(flat, op, stream)
            with self._watch(f"allreduce of {flat.nbytes} bytes"):
                stream.synchronize()
        return buf

    def allreduce_async_(self, buf, op="sum"):
        _check_op(op)
        flat = self._device_buffer(buf, "allreduce")
        # The reduction must see the gradients the compute stream has written so far.
        self._stream.wait_event(self.cupy.cuda.get_current_stream().record())
        if flat.size:
            self._launch(flat, op, self._stream)
        what = f"allreduce of {flat.nbytes} bytes"
        return _EventHandle(buf, self._stream.record(), lambda: self._watch(what))

    def bcast_(self, buf, root=0):
        if not 0 <= root < self.size:
            raise CaffeError(f"bcast: root {root} out of range for {self.size} ranks")
        flat = self._device_buffer(buf, "bcast", any_dtype=True)
        if flat.nbytes:
            stream = self.cupy.cuda.get_current_stream()
            self.nccl_comm.bcast(flat.data.ptr, flat.nbytes, self.nccl.NCCL_UINT8, root,
                                 stream.ptr)
            with self._watch(f"bcast of {flat.nbytes} bytes"):
                stream.synchronize()
        return buf

    def barrier(self, timeout="default"):
        if timeout == "default":
            timeout = self.timeout
        with WATCHDOG.watch(f"barrier ({self.name})", timeout, self.rank, self.size):
            self.mpi_comm.Barrier()

    def allgather_object(self, obj):
        with self._watch("allgather"):
            return self.mpi_comm.allgather(obj)

    def close(self):
        if self.nccl_comm is not None:
            self._stream.synchronize()
            self.nccl_comm.destroy()
            self.nccl_comm = None
