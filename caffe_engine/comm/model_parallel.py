"""Hybrid (PCL-DNN) parallelism's communicators: the model-parallel groups and their replicas.

PCL-DNN (Das et al., arXiv:1602.06709, section 3, "hybrid parallelism"): the P ranks of a
data-parallel run form P/G groups of G consecutive ranks (group g = world ranks g*G .. g*G+G-1,
so that a group sits on as few hosts as possible). Inside a group, a fully connected layer is
model parallel (:mod:`caffe_engine.layers.model_parallel`): group rank s holds slice s of its
output neurons, and the group exchanges activations and output gradients
(:class:`GroupCollectivesMPI`). The ranks that hold the same slice -- the P/G *replicas*, one per
group -- are data parallel with each other: their slice's gradients are summed over them
(:attr:`HybridGroups.replicas`, a communicator of the world's algorithm) and scaled by 1/P,
the world's mean (each rank's loss is normalised by its own batch).

Both come from ``MPI_Comm_split`` of the world's MPI communicator; every rank must build the
same :class:`HybridGroups` (same G), in the same order, as for any collective.
"""
import numpy

from ..errors import CaffeError
from ..layers.model_parallel import GroupCollectives, LocalGroup
from .communicator import WATCHDOG, LocalCommunicator, _is_cupy
from .launcher import mpi_module


def _host(a):
    """A C-contiguous NumPy float32 array of ``a``'s values (a copy only when needed)."""
    a = a.get() if _is_cupy(a) else a
    return numpy.ascontiguousarray(a, dtype=numpy.float32)


def _landing(out, shape):
    """The host array an MPI call writes into for ``out`` (itself when it is NumPy and
    C-contiguous), or a new one."""
    if out is not None and not _is_cupy(out) and out.flags.c_contiguous:
        return out
    return numpy.empty(shape, numpy.float32)


def _deliver(out, host):
    """``host`` copied into ``out`` (a CuPy or strided array) unless it is ``out``; the result."""
    if out is None or host is out:
        return host
    if _is_cupy(out):
        out.set(host.reshape(out.shape))
    else:
        out[...] = host.reshape(out.shape)
    return out


class GroupCollectivesMPI(GroupCollectives):
    """:class:`~caffe_engine.layers.model_parallel.GroupCollectives` over an mpi4py
    communicator (the group's G ranks): blocking ``MPI_Allgather``, point-to-point all-to-all,
    ``MPI_Reduce_scatter_block``, ``MPI_Allgatherv``. float32 buffers; CuPy arrays are staged
    through host memory. Every wait runs under the communicators' watchdog.

    Args:
        comm: the group's mpi4py communicator (this object owns it and frees it in ``close``).
        MPI: the mpi4py ``MPI`` module.
        timeout: seconds a collective may wait before the job is aborted (None or 0: never).
        world_rank, world_size: for the watchdog's message.
    """

    def __init__(self, comm, MPI, timeout=None, world_rank=0, world_size=1):
        self.comm, self.MPI = comm, MPI
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.timeout = timeout
        self._where = (world_rank, world_size)

    def _watch(self, what, nbytes):
        return WATCHDOG.watch(f"model-parallel {what} of {nbytes} bytes", self.timeout,
                              *self._where)

    def allgather_rows(self, x, out=None):
        F = self.MPI.FLOAT
        host = _host(x)
        got = _landing(out, (self.size * host.shape[0],) + host.shape[1:])
        with self._watch("allgather", got.nbytes):
            self.comm.Allgather([host, F], [got, F])
        return _deliver(out, got)

    def alltoall_rows(self, blocks, out=None):
        if len(blocks) != self.size:
            raise CaffeError(f"alltoall_rows: {len(blocks)} blocks for a group of {self.size}")
        sent = [_host(b) for b in blocks]
        shapes = (self.comm.alltoall([b.shape for b in sent]) if out is None
                  else [o.shape for o in out])
        got = [_landing(None if out is None else out[j], shapes[j]) for j in range(self.size)]
        F, me = self.MPI.FLOAT, self.rank
        got[me][...] = sent[me].reshape(got[me].shape)
        with self._watch("all-to-all", sum(g.nbytes for g in got)):
            requests = [self.comm.Irecv([got[j], F], source=j, tag=0)
                        for j in range(self.size) if j != me]
            requests += [self.comm.Isend([sent[j], F], dest=j, tag=0)
                         for j in range(self.size) if j != me]
            self.MPI.Request.Waitall(requests)
        if out is None:
            return got
        return [_deliver(o, g) for o, g in zip(out, got)]

    def reduce_scatter_rows(self, x, out=None):
        F = self.MPI.FLOAT
        host = _host(x)
        if host.shape[0] % self.size:
            raise CaffeError(f"reduce_scatter_rows: {host.shape[0]} rows for a group of "
                             f"{self.size}")
        got = _landing(out, (host.shape[0] // self.size,) + host.shape[1:])
        with self._watch("reduce-scatter", host.nbytes):
            self.comm.Reduce_scatter_block([host, F], [got, F], op=self.MPI.SUM)
        return _deliver(out, got)

    def allgather_arrays(self, x, axis):
        F = self.MPI.FLOAT
        front = _host(numpy.moveaxis(x.get() if _is_cupy(x) else x, axis, 0))
        with self._watch("allgather of slices", front.nbytes * self.size):
            lengths = self.comm.allgather(front.shape[0])
            inner = int(numpy.prod(front.shape[1:], dtype=numpy.int64))
            counts = [n * inner for n in lengths]
            displs = [int(d) for d in numpy.cumsum([0] + counts[:-1])]
            got = numpy.empty((sum(lengths),) + front.shape[1:], numpy.float32)
            self.comm.Allgatherv([front, F], [got, (counts, displs), F])
        full = numpy.ascontiguousarray(numpy.moveaxis(got, 0, axis))
        if _is_cupy(x):
            import cupy
            return cupy.asarray(full)
        return full

    def close(self):
        """Free the group's MPI communicator (collective over the group)."""
        if self.comm is not None and self.comm != self.MPI.COMM_NULL:
            self.comm.Free()
        self.comm = None


def _mpi_comm_of(world):
    """The mpi4py communicator under a world :class:`~.communicator.Communicator`."""
    comm = getattr(world, "comm", None) or getattr(world, "mpi_comm", None)
    if comm is None:
        raise CaffeError(f"hybrid parallelism: communicator '{world.name}' has no MPI "
                         "communicator to split")
    return comm


def replica_communicator(world, comm, members):
    """A communicator of ``world``'s algorithm (and options) over ``comm``, the mpi4py
    communicator of the world ranks ``members``; the single-process one when it has one rank.
    Each algorithm makes itself over a sub-communicator (:meth:`Communicator.over`): every
    one registered today (tree, ring, ps, mpi, hier, nccl) does; ``tree``'s ``lag`` and
    ``hier``'s ``lanes`` take their defaults for the sub-communicator's size (collective over
    ``comm``)."""
    if comm.Get_size() == 1:
        return LocalCommunicator(world.name)
    return world.over(comm, members)


class HybridGroups:
    """The model-parallel group and the replica communicator of this rank, for group size G.

    Args:
        world: the run's :class:`~.communicator.Communicator` (P = ``world.size`` ranks).
        group_size: G, dividing P.
        what: the setting named in the error message (e.g. "layer 'fc6': parallel").

    Attributes:
        size: G. group_index: this rank's group, ``rank // G``. group_rank: its place in the
            group, ``rank % G`` (the slice it holds). num_groups: P / G.
        members: the world ranks of this rank's group; replica_members: those of its replicas.
        collectives: a GroupCollectives over the group (:class:`GroupCollectivesMPI`, or
            :class:`~caffe_engine.layers.model_parallel.LocalGroup` when G = 1).
        replicas: a Communicator of the world's algorithm over the P/G replicas (the world
            itself when G = 1; the single-process one when G = P). Sum the sliced params'
            diffs over it with ``op="sum"`` and scale by ``float32(1 / P)``: its ``"mean"``
            would divide by P/G.

    Raises:
        CaffeError: one line, G < 1 or G not dividing P.

    Collective over the world (two ``MPI_Comm_split``); ``close()`` frees what it made.
    """

    def __init__(self, world, group_size, what="--fc_parallel"):
        size, world_size = int(group_size), world.size
        if size < 1 or world_size % size:
            raise CaffeError(f"{what}: a model-parallel group of {group_size} ranks does not "
                             f"divide the {world_size} ranks of the run")
        self.world, self.size = world, size
        self.group_index, self.group_rank = divmod(world.rank, size)
        self.num_groups = world_size // size
        self.members = [self.group_index * size + j for j in range(size)]
        self.replica_members = [g * size + self.group_rank for g in range(self.num_groups)]
        self.collectives, self.replicas, self._replica_comm = LocalGroup(), world, None
        if size == 1:
            return
        comm = _mpi_comm_of(world)
        group = comm.Split(self.group_index, key=world.rank)
        self.collectives = GroupCollectivesMPI(group, mpi_module(), world.timeout, world.rank,
                                               world_size)
        # nccl keeps the communicator it is given (the MPI algorithms duplicate it): freed last
        self._replica_comm = comm.Split(self.group_rank, key=world.rank)
        self.replicas = replica_communicator(world, self._replica_comm, self.replica_members)

    def close(self):
        """Free the group's communicator and the replicas' (collective over the world)."""
        if isinstance(self.collectives, GroupCollectivesMPI):
            self.collectives.close()
        if self.replicas is not self.world:
            self.replicas.close()
        if self._replica_comm is not None:
            self._replica_comm.Free()
        self.collectives, self.replicas, self._replica_comm = LocalGroup(), self.world, None

    def __repr__(self):
        return (f"<HybridGroups G={self.size} group {self.group_index} of {self.num_groups}, "
                f"slice {self.group_rank}>")
