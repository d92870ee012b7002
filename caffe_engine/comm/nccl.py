"""NCCL allreduce of CuPy arrays on the GPU (interface; needs CuPy built with NCCL).

One process per GPU, started by ``mpiexec``; MPI only carries NCCL's unique id from rank 0 to
the others (Caffe's ``NCCL::InitSingleProcess`` / multi-process path does the same with its own
bootstrap). The buffers must be CuPy float32 arrays on the current device. Blocking calls run on
the current stream; asynchronous calls run on a dedicated stream and ``wait()`` synchronises
with an event recorded after the reduction (no host thread).

Raises:
    CaffeError: CuPy or its NCCL binding missing, no CUDA device, a host (NumPy) buffer.
"""
import numpy

from ..errors import CaffeError
from .communicator import Communicator, Handle, check_buffer, mpi_module
from .registry import register


def _load_nccl():
    try:
        import cupy
        from cupy.cuda import nccl
        cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, CUDARuntimeError
        raise CaffeError("communicator 'nccl' needs CuPy with NCCL and a CUDA device "
                         f"(pip install cupy-cuda12x); not available here: {exc}") from None
    if not getattr(nccl, "available", True):
        raise CaffeError("communicator 'nccl': this CuPy build has no NCCL support")
    return cupy, nccl


class _EventHandle(Handle):
    def __init__(self, buf, event):
        super().__init__(buf)
        self._cuda_event = event

    def done(self):
        return self._cuda_event.done

    def wait(self, timeout=None):
        self._cuda_event.synchronize()
        return self.buf


@register("nccl")
class NCCLCommunicator(Communicator):
    """Allreduce and broadcast of CuPy arrays by NCCL.

    Args:
        comm: mpi4py communicator used once to share NCCL's unique id (default COMM_WORLD).
        timeout: see :class:`~.communicator.Communicator` (applies to the MPI bootstrap).
    """

    name = "nccl"

    def __init__(self, comm=None, timeout=None):
        self.cupy, self.nccl = _load_nccl()
        MPI = mpi_module()
        if MPI is None:
            raise CaffeError("communicator 'nccl' needs mpi4py to start (pip install mpich mpi4py)")
        comm = MPI.COMM_WORLD if comm is None else comm
        super().__init__(comm.Get_rank(), comm.Get_size(), timeout)
        self.mpi_comm = comm
        uid = self.nccl.get_unique_id() if self.rank == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl_comm = self.nccl.NcclCommunicator(self.size, uid, self.rank)
        self._stream = self.cupy.cuda.Stream(non_blocking=True)

    def _device_buffer(self, buf, what):
        flat = check_buffer(buf, what)
        if not type(flat).__module__.startswith("cupy"):
            raise CaffeError(f"communicator 'nccl': {what} needs a CuPy array on the GPU, "
                             f"got {type(buf).__name__}")
        return flat

    def _launch(self, flat, op, stream):
        n = self.nccl
        self.nccl_comm.allReduce(flat.data.ptr, flat.data.ptr, flat.size, n.NCCL_FLOAT32,
                                 n.NCCL_SUM, stream.ptr)
        if op == "mean":
            with stream:
                flat *= numpy.float32(1.0 / self.size)

    def allreduce_(self, buf, op="sum"):
        if op not in ("sum", "mean"):
            raise CaffeError(f"allreduce: op must be 'sum' or 'mean', got {op!r}")
        flat = self._device_buffer(buf, "allreduce")
        if flat.size:
            stream = self.cupy.cuda.get_current_stream()
            self._launch(flat, op, stream)
            stream.synchronize()
        return buf

    def allreduce_async_(self, buf, op="sum"):
        if op not in ("sum", "mean"):
            raise CaffeError(f"allreduce: op must be 'sum' or 'mean', got {op!r}")
        flat = self._device_buffer(buf, "allreduce")
        # The reduction must see the gradients the compute stream has written so far.
        ready = self.cupy.cuda.get_current_stream().record()
        self._stream.wait_event(ready)
        if flat.size:
            self._launch(flat, op, self._stream)
        return _EventHandle(buf, self._stream.record())

    def bcast_(self, buf, root=0):
        flat = self._device_buffer(buf, "bcast")
        nbytes = flat.nbytes
        stream = self.cupy.cuda.get_current_stream()
        self.nccl_comm.bcast(flat.data.ptr, nbytes, self.nccl.NCCL_UINT8, root, stream.ptr)
        stream.synchronize()
        return buf

    def barrier(self, timeout="default"):
        self.mpi_comm.Barrier()

    def allgather_object(self, obj):
        return self.mpi_comm.allgather(obj)

    def close(self):
        self.nccl_comm.destroy()
