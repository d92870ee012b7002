"""Ring allreduce: reduce-scatter around a ring, then all-gather around it.

Baidu's ring allreduce (as in Horovod and NCCL's ring). The buffer is cut into ``size`` nearly
equal segments (:func:`ring_segments`). Rank r sends to r + 1 and receives from r - 1.

1. Reduce-scatter, steps s = 0 .. size-2: send segment (r - s) mod size, receive segment
   (r - s - 1) mod size and add it into the own copy. Afterwards rank r holds the complete sum of
   segment (r + 1) mod size. Each segment is summed in a fixed ring order (starting at the rank of
   the same index), the same on every run.
2. All-gather, steps s = 0 .. size-2: send segment (r + 1 - s) mod size, receive segment
   (r - s) mod size straight into the buffer. Only copies: every rank ends with the very bits the
   owning rank computed, so all ranks hold identical buffers.

Device (CuPy) buffers (:mod:`.pinned_mirror`): the segments are copied to the pinned host mirror in
the order the reduce-scatter reads them (r, r - 1, ...), each waited for just before its step,
and each final segment goes back to the device as soon as it is final (this rank's own after
the reduce-scatter, the others as the all-gather delivers them).

Each rank sends and receives 2 (size - 1) / size of the buffer: bandwidth-optimal.
"""
import numpy

from .communicator import MPICommunicator
from .registry import register
from .pinned_mirror import NO_STAGE

TAG_RS = 21
TAG_AG = 22


def ring_segments(count, size):
    """[(lo, hi)] for ``size`` segments of ``count`` elements; sizes differ by at most one."""
    return [(j * count // size, (j + 1) * count // size) for j in range(size)]


@register("ring")
class RingCommunicator(MPICommunicator):
    """Allreduce by reduce-scatter + all-gather around a ring.

    Args:
        comm: mpi4py communicator (default COMM_WORLD).
        timeout: see :class:`~.communicator.Communicator`.
    """

    name = "ring"

    def __init__(self, comm=None, timeout=None):
        super().__init__(comm, timeout)

    def _stage_order(self, count):
        """Segments in the order the reduce-scatter first reads them: r, r - 1, ..., r + 1."""
        seg = ring_segments(count, self.size)
        return [seg[(self.rank - s) % self.size] for s in range(self.size)]

    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        MPI = self.MPI
        F = MPI.FLOAT
        size, rank = self.size, self.rank
        seg = ring_segments(flat.size, size)
        right, left = (rank + 1) % size, (rank - 1) % size
        tmp = self.scratch(comm, max(hi - lo for lo, hi in seg))
        stage.ready(*seg[rank])
        for s in range(size - 1):
            send_lo, send_hi = seg[(rank - s) % size]
            recv_lo, recv_hi = seg[(rank - s - 1) % size]
            n = recv_hi - recv_lo
            rreq = comm.Irecv([tmp[:n], F], source=left, tag=TAG_RS)
            sreq = comm.Isend([flat[send_lo:send_hi], F], dest=right, tag=TAG_RS)
            stage.ready(recv_lo, recv_hi)        # its device copy overlaps this step's transfer
            rreq.Wait()
            part = flat[recv_lo:recv_hi]
            numpy.add(part, tmp[:n], out=part)
            sreq.Wait()
        stage.publish(*seg[(rank + 1) % size])   # the segment this rank reduced is final
        for s in range(size - 1):
            send_lo, send_hi = seg[(rank + 1 - s) % size]
            recv_lo, recv_hi = seg[(rank - s) % size]
            rreq = comm.Irecv([flat[recv_lo:recv_hi], F], source=left, tag=TAG_AG)
            sreq = comm.Isend([flat[send_lo:send_hi], F], dest=right, tag=TAG_AG)
            MPI.Request.Waitall([rreq, sreq])
            stage.publish(recv_lo, recv_hi)
