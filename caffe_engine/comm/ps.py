"""Parameter-server baseline: rank 0 receives every worker's buffer, sums, sends the sum back.

The scheme FireCaffe (arXiv:1511.00175, section 4 and figure 4) compares the reduction tree
against: all traffic goes through one server, whose link carries 2 (p - 1) buffers per
iteration, so the time grows linearly with the number of workers p. Here rank 0 is both the
server and a worker (no extra process).

Summation order: rank 0's own buffer, then ranks 1, 2, ... in rank order (a fixed order; the
server receives in that order). Every rank ends with the server's bits.
"""
import numpy

from .communicator import MPICommunicator
from .registry import register

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

    def _allreduce_sum(self, comm, flat):
        MPI = self.MPI
        F = MPI.FLOAT
        if self.rank == 0:
            tmp = self.scratch(comm, flat.size)
            for src in range(1, self.size):
                comm.Recv([tmp, F], source=src, tag=TAG_PUSH)
                numpy.add(flat, tmp, out=flat)
            MPI.Request.Waitall([comm.Isend([flat, F], dest=dst, tag=TAG_PULL)
                                 for dst in range(1, self.size)])
        else:
            comm.Send([flat, F], dest=0, tag=TAG_PUSH)
            comm.Recv([flat, F], source=0, tag=TAG_PULL)
