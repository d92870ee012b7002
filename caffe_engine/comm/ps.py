"""Parameter-server baseline: rank 0 receives every worker's buffer, sums, sends the sum back.

The scheme FireCaffe (arXiv:1511.00175, section 4 and figure 4) compares the reduction tree
against: all traffic goes through one server, whose link carries 2 (p - 1) buffers per
iteration, so the time grows linearly with the number of workers p. Here rank 0 is both the
server and a worker (no extra process).

Device (CuPy) buffers (:mod:`.pinned_mirror`): one message each way carries the whole buffer, so a
worker waits for its whole staged copy before sending (the chunked copies overlap each other
only); the server's own copy overlaps its first receive.

Summation order: rank 0's own buffer, then ranks 1, 2, ... in rank order (a fixed order; the
server receives in that order). Every rank ends with the server's bits.
"""
import numpy

from .communicator import MPICommunicator
from .registry import register
from .pinned_mirror import NO_STAGE

TAG_PUSH = 31
TAG_PULL = 32


@register("ps")
class ParameterServerCommunicator(MPICommunicator):
    """Allreduce through a parameter server on rank 0.

    Args:
        comm: mpi4py communicator (default COMM_WORLD).
        timeout: see :class:`~.communicator.Communicator`.
    """

    name = "ps"

    def __init__(self, comm=None, timeout=None):
        super().__init__(comm, timeout)

    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        MPI = self.MPI
        F = MPI.FLOAT
        n = flat.size
        if self.rank == 0:
            tmp = self.scratch(comm, n)
            for src in range(1, self.size):
                comm.Recv([tmp, F], source=src, tag=TAG_PUSH)
                if src == 1:
                    stage.ready(0, n)            # the own copy overlapped the first receive
                numpy.add(flat, tmp, out=flat)
            sends = [comm.Isend([flat, F], dest=dst, tag=TAG_PULL) for dst in range(1, self.size)]
            stage.publish(0, n)
            MPI.Request.Waitall(sends)
        else:
            stage.ready(0, n)
            comm.Send([flat, F], dest=0, tag=TAG_PUSH)
            comm.Recv([flat, F], source=0, tag=TAG_PULL)
            stage.publish(0, n)
