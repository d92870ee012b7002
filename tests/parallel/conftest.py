"""Fixtures for the tests that run under ``mpiexec -n K python -m pytest tests/parallel``.

Every test must make the same collective calls in the same order on every rank (no rank-dependent
skips before a collective), and compare results only after the collectives. Under a plain
``python -m pytest`` (no launcher) the same tests run with one process: on MPI's world of one
when mpi4py is installed, else on the single-process communicator.
"""
import pytest

from caffe_engine.comm.communicator import get_communicator, mpi_module


def _world():
    """COMM_WORLD (a world of one under plain pytest), or None when mpi4py is missing."""
    MPI = mpi_module()
    return MPI.COMM_WORLD if MPI is not None else None


@pytest.fixture(scope="session")
def world():
    """mpi4py's COMM_WORLD, or None without mpi4py."""
    return _world()


def make_communicator(world, name, **opts):
    """The algorithm's own class over ``world`` even with one rank (so its code path runs),
    or the single-process communicator without mpi4py. ``name`` is a spec ("hier:tree")."""
    if world is None:
        return get_communicator(name, **opts)
    from caffe_engine.comm import registry
    cls, opts = registry.resolve(name, **opts)
    opts.setdefault("timeout", 120)
    return cls(world, **opts)


@pytest.fixture
def make(world):
    made = []

    def factory(name, **opts):
        comm = make_communicator(world, name, **opts)
        made.append(comm)
        return comm

    yield factory
    for comm in made:
        comm.close()
