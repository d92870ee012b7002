"""The MPI library's own ``MPI_Allreduce`` (``MPI.IN_PLACE``, ``MPI.SUM`` on float32).

The reference point for the hand-written algorithms: MPICH picks recursive doubling for short
buffers and Rabenseifner's reduce-scatter + all-gather for long ones. The MPI standard advises
(but does not require) that every rank gets the same bits; MPICH's built-in algorithms for
commutative operations do, and tests/parallel checks it.

Device (CuPy) buffers (:mod:`.pinned_mirror`) go whole: staged in chunks, then one ``MPI_Allreduce``
(cutting it per chunk could change MPICH's algorithm, and so the bits), then copied back.
"""
from .communicator import MPICommunicator
from .registry import register
from .pinned_mirror import NO_STAGE


@register("mpi")
class MPIAllreduceCommunicator(MPICommunicator):
    """Allreduce by ``MPI_Allreduce``.

    Args:
        comm: mpi4py communicator (default COMM_WORLD).
        timeout: see :class:`~.communicator.Communicator`.
    """

    name = "mpi"

    def __init__(self, comm=None, timeout=None):
        super().__init__(comm, timeout)

    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        MPI = self.MPI
        stage.ready(0, flat.size)
        comm.Allreduce(MPI.IN_PLACE, [flat, MPI.FLOAT], op=MPI.SUM)
        stage.publish(0, flat.size)
