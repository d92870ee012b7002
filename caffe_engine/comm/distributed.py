"""Glue for data-parallel training over MPI: ranks, seeds, record dealing, checks, faults.

One process per worker, started by ``mpiexec -n P caffe train ...``. Caffe's multi-GPU scheme
(src/caffe/parallel.cpp, solver.cpp, layers/data_layer.cpp), process for process:

- rank and size come from the launcher (:func:`init`); rank 0 is the root solver: it alone logs,
  tests and snapshots;
- each solver seeds its streams with ``random_seed + rank`` (:func:`rank_seed`, Caffe's
  ``Solver::Init``), then the root's freshly filled weights are broadcast to all
  (:func:`broadcast_params`, Caffe's ``NCCL::Broadcast``), so every rank starts equal;
- the training records are dealt out: record i goes to rank i mod P (:func:`deal_records` sets the
  Data layers' ``solver_count`` / ``solver_rank``, which their ``Skip`` reads — TEST nets read
  everything);
- after backward the diffs are averaged (:class:`~.buckets.GradientSync`), so every rank applies
  the same update and the weights stay bitwise identical; ``--debug_sync`` checks that
  (:func:`check_params_in_sync`);
- at startup all ranks compare a digest of their solver and net parameters
  (:func:`check_same_config`): different prototxts on different ranks are a one-line error on
  every rank.

Faults: :func:`guard` (or :func:`install_excepthook`) turns an exception on one rank into a
one-line message and ``MPI_Abort``, which makes ``mpiexec`` end every rank with a non-zero status;
the communicators' watchdog aborts a wait that outlives its timeout (a rank that hangs or exits
without aborting); a killed rank is noticed within milliseconds by the peer watch
(:mod:`.peer_watch`: a TCP connection to rank 0 reads end-of-file), which names it in one line
and aborts the job, whether or not ``mpiexec`` cleans up by itself. No rank hangs.
"""
import contextlib
import hashlib
import logging
import sys

import numpy

from .. import backend, environment, kernels
from ..io import workers as data_workers
from ..layers.record_dealing import deal_records  # noqa: F401  (record i to rank i mod size)
from . import peer_watch
from ..errors import CaffeError, one_line
from .communicator import get_communicator, local_place
from .launcher import abort_world, launched_under_mpi, launcher_rank_size  # noqa: F401


class Context:
    """This process's place in the data-parallel job.

    Attributes:
        rank, size: from the communicator (0, 1 without MPI).
        comm: the communicator (:func:`~.communicator.get_communicator`).
        is_root: rank == 0.
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size

    @property
    def is_root(self):
        return self.rank == 0

    def __repr__(self):
        return f"<distributed.Context rank {self.rank} of {self.size} ({self.comm.name})>"


def init(algorithm="tree", install_handlers=True, **opts):
    """Set up the job: the communicator named ``algorithm`` over COMM_WORLD.

    Without an MPI launcher (or without mpi4py) this is a one-process context and MPI is not
    initialised. With more than one rank, ``install_handlers`` makes an uncaught exception abort
    every rank (:func:`install_excepthook`).

    Args:
        algorithm: "tree" (default), "ring", "ps", "mpi", "hier" (or "hier:tree", "hier:ring";
            alias "hybrid") or "nccl": a spec of :func:`~.registry.resolve`.
        **opts: passed to the communicator (``timeout``, ``branching``, ``chunk_bytes``...).

    Raises:
        CaffeError: unknown algorithm or a bad option, unusable NCCL.
    """
    comm = get_communicator(algorithm, **opts)
    ctx = Context(comm)
    if ctx.size > 1:
        share_cores(comm)
        if install_handlers:
            install_excepthook(ctx.rank, ctx.size)
            if hasattr(comm, "comm"):
                peer_watch.start(comm.comm)
    return ctx


# Variables by which a user fixes the BLAS thread count; any of them set means "leave it".
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "BLIS_NUM_THREADS", "CAFFE_BLAS_THREADS")


def share_cores(comm):
    """Give each rank on a host an equal share of its cores for BLAS and the compiled kernels;
    returns the thread count.

    Several ranks on one machine, each with a BLAS pool as large as the machine, oversubscribe it:
    on 2 cores, 2 LeNet ranks with 2 OpenBLAS threads each ran at 4 it/s instead of 20, the
    spinning BLAS threads starving the rank that MPI is waiting on. So the ranks sharing a host
    (an ``MPI_COMM_TYPE_SHARED`` split; collective) each take ``cores // local ranks`` threads
    (at least 1), set through threadpoolctl and :func:`caffe_engine.kernels.set_threads`, and
    as many data threads (:mod:`caffe_engine.io.workers`; unless ``CAFFE_ENGINE_DATA_THREADS``
    is set).
    Nothing changes when the user has fixed a count with
    ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` (and the like) or ``CAFFE_BLAS_THREADS``, when
    threadpoolctl is missing, or for a one-process communicator.

    Args:
        comm: a communicator (:mod:`.communicator`); only MPI ones (``.comm``) are split.

    Returns:
        int or None: the threads per rank set, or None when nothing was changed.
    """
    mpi_comm = getattr(comm, "comm", None)
    if mpi_comm is None or comm.size == 1:
        return None
    MPI = comm.MPI
    _, local_size = local_place(mpi_comm, MPI)
    if any(environment.raw(v) for v in _THREAD_VARS):
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    threads = max(1, backend.cpu_cores() // local_size)
    # The limit holds for the process's lifetime (the object is not used as a context manager).
    threadpool_limits(limits=threads, user_api="blas")
    kernels.set_threads(threads)
    if not environment.raw("CAFFE_ENGINE_DATA_THREADS"):
        data_workers.set_threads(threads)
    logging.getLogger("caffe_engine").debug("%d ranks on this host: %d BLAS threads each",
                                            local_size, threads)
    return threads


# --------------------------------------------------------------------------------------------
# Seeds and data
# --------------------------------------------------------------------------------------------
def rank_seed(random_seed, rank):
    """Caffe's per-solver seed: ``random_seed + rank``; a negative seed (random) stays negative."""
    random_seed = int(random_seed)
    return random_seed + int(rank) if random_seed >= 0 else random_seed


def record_indices(num_records, rank, size):
    """Indices of the records rank ``rank`` reads in one pass: i with i % size == rank."""
    return range(int(rank), int(num_records), int(size))


# --------------------------------------------------------------------------------------------
# Consistency
# --------------------------------------------------------------------------------------------
def message_digest(message):
    """SHA-256 (hex) of a protobuf message's deterministic binary serialisation."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def check_same_config(comm, **messages):
    """Raise on every rank unless every rank holds the same ``messages`` (protobufs or strings).

    Call it at startup with e.g. ``solver=solver_param, net=net_param``. Collective.

    Raises:
        CaffeError: one line naming the first differing item and the ranks that disagree.
    """
    mine = {}
    for key, msg in messages.items():
        if isinstance(msg, (str, bytes)):
            data = msg.encode() if isinstance(msg, str) else msg
            mine[key] = hashlib.sha256(data).hexdigest()
        else:
            mine[key] = message_digest(msg)
    everyone = comm.allgather_object(mine)
    for key in messages:
        ref = everyone[0].get(key)
        differ = [r for r, d in enumerate(everyone) if d.get(key) != ref]
        if differ:
            raise CaffeError(
                f"the {key} parameters differ between ranks (rank 0 has {ref[:12]}, rank "
                f"{differ[0]} has {everyone[differ[0]].get(key, 'none')[:12]}); start every "
                "rank with the same prototxt files")


def broadcast_params(net, comm, root=0):
    """Overwrite every learnable param's data with ``root``'s (Caffe's ``NCCL::Broadcast``).

    The params are packed into one float32 buffer so that one broadcast carries them all.
    Collective; a no-op with one rank.
    """
    if comm.size == 1:
        return
    blobs = list(net.learnable_params)
    if not blobs:
        return
    xp = backend.get_array_module(blobs[0].data)
    flat = xp.concatenate([b.data.reshape(-1) for b in blobs])
    flat = xp.ascontiguousarray(flat, dtype=numpy.float32)
    comm.bcast_(flat, root)
    off = 0
    for b in blobs:
        b.data[...] = flat[off:off + b.count].reshape(b.data.shape)
        off += b.count


def param_digests(net, diff=False):
    """SHA-1 (16 hex digits) of each learnable param's data (or diff) bytes, in order."""
    out = []
    for b in net.learnable_params:
        arr = numpy.ascontiguousarray(backend.to_numpy(b.diff if diff else b.data))
        out.append(hashlib.sha1(arr.tobytes()).hexdigest()[:16])
    return out


def _param_label(net, k):
    """'layer[j]' naming the owner of learnable param k."""
    target = net.learnable_params[k]
    for name, layer in zip(net.layer_names, net.layers):
        for j, blob in enumerate(layer.blobs):
            if blob is target:
                return f"{name}[{j}]"
    return f"#{k}"


def check_params_in_sync(net, comm, iteration=None, diff=False):
    """``--debug_sync``: raise on every rank unless all ranks hold bitwise identical weights.

    Collective (one allgather of per-param digests).

    Raises:
        CaffeError: one line naming the first differing param and rank.
    """
    if comm.size == 1:
        return
    everyone = comm.allgather_object(param_digests(net, diff))
    ref = everyone[0]
    for rank, digests in enumerate(everyone):
        for k, (a, b) in enumerate(zip(ref, digests)):
            if a != b:
                when = f" after iteration {iteration}" if iteration is not None else ""
                what = "gradients" if diff else "weights"
                raise CaffeError(f"--debug_sync: {what} differ between ranks{when}: param "
                                 f"{_param_label(net, k)} on rank {rank} differs from rank 0")


# --------------------------------------------------------------------------------------------
# Faults
# --------------------------------------------------------------------------------------------
def _is_mpi_error(exc):
    """Whether ``exc`` is mpi4py's ``MPI.Exception`` (an MPI call that returned an error)."""
    return type(exc).__module__.startswith("mpi4py")


def _describe(exc):
    """One line for a rank's failure: a CaffeError's message; an MPI error stack condensed to
    its class and its innermost cause; else the exception's type and first line. Shortened in
    the middle past 300 characters."""
    if isinstance(exc, CaffeError):
        return one_line(exc)
    if _is_mpi_error(exc):
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        what = lines[0].replace(", error stack:", "") if lines else "MPI error"
        causes = [line.split(":", 1)[1].strip() for line in lines[1:]
                  if ":" in line and line.split(":", 1)[1].strip()]
        cause = f" ({causes[-1]})" if causes else ""
        return one_line(f"an MPI call failed: {what}{cause}; another rank has probably died")
    return one_line(f"{type(exc).__name__}: {exc}")


def _failure_line(rank, size, exc):
    """``caffe_engine: rank R of P failed: ...`` — or, for an MPI error (this rank saw another
    fail), ``caffe_engine: rank R of P: an MPI call failed ...``."""
    verb = ":" if _is_mpi_error(exc) else " failed:"
    return f"caffe_engine: rank {rank} of {size}{verb} {_describe(exc)}; aborting all ranks"


def install_excepthook(rank, size):
    """Make an uncaught exception print one line and abort every rank (not only this one)."""
    previous = sys.excepthook

    def hook(kind, value, tb):
        if not isinstance(value, CaffeError) and not _is_mpi_error(value):
            previous(kind, value, tb)
        abort_world(_failure_line(rank, size, value))

    sys.excepthook = hook
    return hook


@contextlib.contextmanager
def guard(ctx):
    """Run a block so that its failure on one rank ends every rank (non-zero, within seconds).

    An exception — a CaffeError, a bug, ``sys.exit(n)`` with n != 0, Ctrl-C — on any rank prints
    ``caffe_engine: rank R of P failed: <message>`` and calls ``MPI_Abort``; ``mpiexec`` then
    ends the others. With one rank the exception propagates unchanged.
    """
    if ctx.size == 1:
        yield ctx
        return
    try:
        yield ctx
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        abort_world(f"caffe_engine: rank {ctx.rank} of {ctx.size} exited with status "
                    f"{exc.code}; aborting all ranks", code=exc.code if isinstance(exc.code, int)
                    else 1)
    except BaseException as exc:  # noqa: B902 - every failure must end the job
        if not isinstance(exc, CaffeError) and not _is_mpi_error(exc):
            import traceback
            traceback.print_exc()       # a bug: its traceback is what its reader needs
        abort_world(_failure_line(ctx.rank, ctx.size, exc))
