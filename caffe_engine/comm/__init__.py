"""Data parallelism between solver steps: communicators, gradient buckets.

See :mod:`.communicator` for the interface (``allreduce_``, ``allreduce_async_``, ``bcast_``,
``barrier``), :mod:`.registry` for selection by name, :mod:`.tree` for FireCaffe's reduction
tree, :mod:`.hier` for the hierarchical (node-aware) allreduce, :mod:`.buckets` for overlapping
the gradient allreduce with the backward pass, :mod:`.data_parallel` for the solver callback
that makes a solver one rank of a data-parallel run (not imported here; it imports no solver
module: the solver is handed to it), :mod:`.distributed` for its pieces (ranks, seeds, record
dealing, consistency checks, fault handling), :mod:`.allreduce_cost` for each algorithm's
alpha-beta cost as ``--bucket_mb auto`` reads it. The offline performance models of these
algorithms (fitting the alpha-beta model, link model, DAG) are :mod:`caffe_engine.perf`, which
builds on this package and is never imported by it. Nothing here imports MPI until it is asked
for.

The algorithm modules are imported here, in this order, so that they register themselves
(:func:`.registry.register`); the order is that of ``ALGORITHMS`` and of the known names in
error messages.
"""
from .buckets import GradientSync  # noqa: F401
from .communicator import (ALGORITHMS, Communicator, Handle, LocalCommunicator,  # noqa: F401
                           get_communicator)
from .launcher import launched_under_mpi, launcher_rank_size  # noqa: F401
from . import tree, ring, ps, mpi, hier, nccl  # noqa: F401,E402  (they register themselves)
