"""Fixtures for the tests that run under ``mpiexec -n K python -m pytest tests/parallel``.

Every test must make the same collective calls in the same order on every rank (no rank-dependent
skips before a collective), and compare results only after the collectives. Under a plain
``python -m pytest`` (no launcher) the same tests run with one process: on MPI's world of one
when mpi4py is installed, else on the single-process communicator.
"""
import shutil
import tempfile

import numpy
import pytest

from caffe_engine.comm.communicator import get_communicator
from caffe_engine.comm.launcher import mpi_module


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


@pytest.fixture
def tiny_lmdb(world):
    """Factory ``tiny_lmdb(seed, num_records=60)``: the path of an LMDB of Datum records (1x4x4
    bytes, labels 0..2, pixels around 60 + 60 * label) that rank 0 writes in a folder every rank
    sees (the ranks' prototxts must be identical, source path included); removed after the
    test, once every rank is done with it."""
    from caffe_engine.io.lmdb_source import write_lmdb
    from caffe_engine.proto import caffe_pb2
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    folders = []

    def make(seed, num_records=60):
        folder = tempfile.mkdtemp(prefix="caffe_parallel_") if rank == 0 else None
        if size > 1:
            folder = world.bcast(folder, root=0)
        folders.append(folder)
        path = f"{folder}/train_lmdb"
        if rank == 0:
            r = numpy.random.default_rng(seed)
            items = []
            for i in range(num_records):
                label = int(r.integers(0, 3))
                pixels = numpy.clip(r.normal(60 + 60 * label, 40, (1, 4, 4)), 0, 255)
                datum = caffe_pb2.Datum(channels=1, height=4, width=4,
                                        data=pixels.astype(numpy.uint8).tobytes(), label=label)
                items.append((b"%08d" % i, datum.SerializeToString()))
            write_lmdb(path, items)
        if size > 1:
            world.Barrier()
        return path

    yield make
    if size > 1 and folders:
        world.Barrier()
    if rank == 0:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
