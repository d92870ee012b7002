"""The process's place in an MPI job as the launcher set it up, and aborting the whole job.

What ``mpiexec`` (MPICH, Open MPI, MVAPICH) put in the environment -- this rank and the world
size -- read without importing MPI; ``mpi4py.MPI`` when it is installed; and
:func:`abort_world`, the one way a rank ends every rank (Caffe: a failed ``CHECK`` under
``mpirun`` brings the job down through the launcher). The communicators, the peer watch and the
supervisor all stand on it, and it imports none of them: the peer watch registers what must
happen first with :func:`before_abort`.
"""
import os
import sys
import time

from .. import environment

_LAUNCHER_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK")
_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")

#: Called, in order, by :func:`abort_world` before it prints and aborts.
_BEFORE_ABORT = []


def _first_set(names, environ):
    """The value of the first of ``names`` that is set (an int), or None."""
    return next((environment.read(v, environ) for v in names
                 if environment.raw(v, environ) is not None), None)


def launcher_rank_size(environ=None):
    """(rank, size) that an MPI launcher (mpiexec of MPICH / Open MPI / MVAPICH) put in the
    environment, or (0, 1) when the process was not started by one. Does not import MPI."""
    rank = _first_set(_LAUNCHER_RANK_VARS, environ)
    size = _first_set(_LAUNCHER_SIZE_VARS, environ)
    if rank is None or size is None:
        return 0, 1
    return rank, size


def launched_under_mpi(environ=None):
    """Whether an MPI launcher started this process (its environment says so)."""
    return any(environment.raw(v, environ) is not None for v in _LAUNCHER_RANK_VARS)


def mpi_module():
    """``mpi4py.MPI`` (initialising MPI), or None when mpi4py is not installed."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    return MPI


def before_abort(hook):
    """Have :func:`abort_world` call ``hook()`` first (once per registration)."""
    _BEFORE_ABORT.append(hook)


#: Seconds between printing the abort message and MPI_Abort (see :func:`abort_world`).
ABORT_GRACE_S = 0.5


def abort_world(message, code=1):
    """Print ``message`` on stderr (nothing when empty) and abort every rank of ``COMM_WORLD``
    (or exit if no MPI). The :func:`before_abort` hooks run first (rank 0's peer watch is told,
    so it prints no second line)."""
    for hook in _BEFORE_ABORT:
        hook()
    try:
        if message:
            sys.stderr.write(message.rstrip("\n") + "\n")
            sys.stderr.flush()
    except Exception:  # stderr closed: abort all the same
        pass
    MPI = mpi_module() if "mpi4py.MPI" in sys.modules else None
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        if MPI.COMM_WORLD.Get_size() > 1:
            # The launcher forwards our stderr through a pipe; MPI_Abort tears the job down at
            # once and can drop what is still in it (seen: the message lost under load). A
            # moment's wait lets the line reach the user first.
            time.sleep(ABORT_GRACE_S)
        MPI.COMM_WORLD.Abort(code)
    os._exit(code)
