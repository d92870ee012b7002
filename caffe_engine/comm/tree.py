"""FireCaffe's reduction tree: sum up a k-ary tree to rank 0, then broadcast down it.

Iandola et al., "FireCaffe: near-linear acceleration of deep neural network training on compute
clusters" (arXiv:1511.00175), section 4: instead of every worker sending its gradients to one
parameter server (time growing linearly with the number of workers p), the workers form a
reduction tree; each sums its children's gradients into its own and passes the sum up, and the
root's total comes back down the same tree — O(log p) steps.

Topology (heap layout, fixed): rank 0 is the root; the parent of rank r > 0 is (r - 1) // k and
its children are k*r + 1 ... k*r + k (those < size). Depth is at most ceil(log_k size).

Pipelining: a buffer larger than ``chunk_bytes`` is cut into chunks, and the chunks flow through
the tree one after the other, so that different levels work on different chunks at once. At step
s a rank (a) waits for its children's chunk s (receives posted ``window`` chunks ahead), adds
them to its own chunk in child order, and sends the partial sum to its parent without waiting;
then (b) receives the final chunk s - ``lag`` from its parent and forwards it to its children.
The blocking receive in (b) never deadlocks: the parent sends that chunk once it has reduced chunk
s, which needs only what this rank already sent in (a).

Summation order: own + child_1 + child_2 + ... per rank, leaves first — the same on every run.
Only the root's sum travels down, so every rank ends with the root's bits.

Device (CuPy) buffers (:mod:`.pinned_mirror`): chunk c's copy to the pinned host mirror is waited
for in (a), just before it is first read, and its final sum goes back to the device in (b),
while the later chunks are still in the tree.

All transfers are MPI point-to-point (Isend / Irecv / Recv) on the communicator's own duplicate;
messages between two ranks on one tag never overtake each other (MPI's ordering rule), so one tag
per direction is enough.
"""
import numpy

from .communicator import MPICommunicator
from .registry import register
from .pinned_mirror import NO_STAGE

TAG_UP = 11
TAG_DOWN = 12


# --------------------------------------------------------------------------------------------
# Pure topology helpers (unit-tested without MPI)
# --------------------------------------------------------------------------------------------
def tree_parent(rank, branching=2):
    """Parent of ``rank`` in the k-ary heap tree (None for the root)."""
    return None if rank == 0 else (rank - 1) // branching


def tree_children(rank, size, branching=2):
    """Children of ``rank``, in summation order."""
    first = branching * rank + 1
    return [c for c in range(first, first + branching) if c < size]


def tree_level(rank, branching=2):
    """Number of hops from ``rank`` to the root."""
    level = 0
    while rank:
        rank = (rank - 1) // branching
        level += 1
    return level


def tree_depth(size, branching=2):
    """Largest level of any rank (0 for one rank)."""
    return tree_level(size - 1, branching) if size > 0 else 0


def ceil_log(size, base):
    """ceil(log_base(size)) in exact integer arithmetic (0 for size <= 1)."""
    steps, reach = 0, 1
    while reach < size:
        reach *= base
        steps += 1
    return steps


def chunk_bounds(count, chunk_elems):
    """[(lo, hi), ...] cutting ``count`` elements into chunks of ``chunk_elems`` (last shorter)."""
    chunk_elems = max(1, int(chunk_elems))
    return [(lo, min(lo + chunk_elems, count)) for lo in range(0, count, chunk_elems)]


# --------------------------------------------------------------------------------------------
@register("tree")
class TreeCommunicator(MPICommunicator):
    """Allreduce by FireCaffe's reduction tree (reduce up, broadcast down), pipelined in chunks.

    Args:
        comm: mpi4py communicator (default COMM_WORLD).
        branching: children per node, k >= 2 (default 2: a binary tree as in FireCaffe).
        chunk_bytes: pipeline chunk size in bytes (default 4 MiB); buffers up to this size go in
            one piece. On this 2-core test machine, with more processes than cores, 4-8 MiB was
            fastest (smaller chunks couple the ranks more tightly and every blocking wait costs
            a context switch); on a real network smaller chunks shorten the pipeline fill.
        window: chunks whose receives from the children are posted ahead (default 2).
        lag: steps by which the broadcast of a chunk trails its reduction (default
            2 * depth + 1: enough to keep every level busy).
        timeout: see :class:`~.communicator.Communicator`.

    Raises:
        CaffeError: branching < 2, chunk_bytes < 4, window < 1, lag < 0.
    """

    name = "tree"

    def __init__(self, comm=None, branching=2, chunk_bytes=4 << 20, window=2, lag=None,
                 timeout=None):
        from ..errors import CaffeError
        if int(branching) < 2:
            raise CaffeError(f"tree communicator: branching must be >= 2, got {branching}")
        if int(chunk_bytes) < 4:
            raise CaffeError(f"tree communicator: chunk_bytes must be >= 4, got {chunk_bytes}")
        if int(window) < 1:
            raise CaffeError(f"tree communicator: window must be >= 1, got {window}")
        if lag is not None and int(lag) < 0:
            raise CaffeError(f"tree communicator: lag must be >= 0, got {lag}")
        super().__init__(comm, timeout)
        self.branching = int(branching)
        self.chunk_elems = int(chunk_bytes) // 4
        self.window = int(window)
        self.parent = tree_parent(self.rank, self.branching)
        self.children = tree_children(self.rank, self.size, self.branching)
        self.depth = tree_depth(self.size, self.branching)
        self.lag = 2 * self.depth + 1 if lag is None else int(lag)

    def over(self, comm, members):
        """The tree over ``comm`` with this one's branching, chunk and window; ``lag`` takes
        its default for the sub-communicator's depth."""
        return TreeCommunicator(comm, branching=self.branching, chunk_bytes=self.chunk_elems * 4,
                                window=self.window, timeout=self.timeout)

    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        MPI = self.MPI
        F = MPI.FLOAT
        bounds = chunk_bounds(flat.size, self.chunk_elems)
        nchunks = len(bounds)
        children, parent = self.children, self.parent
        window = min(self.window, nchunks)
        width = bounds[0][1] - bounds[0][0]
        scratch = self.scratch(comm, len(children) * window * width)
        scratch = scratch.reshape(len(children), window, width) if children else scratch
        pending = {}

        def post(c):
            lo, hi = bounds[c]
            pending[c] = [comm.Irecv([scratch[j, c % window, :hi - lo], F], source=child,
                                     tag=TAG_UP)
                          for j, child in enumerate(children)]

        if children:
            for c in range(window):
                post(c)
        up = [None] * nchunks
        down = []
        lag = self.lag
        for step in range(nchunks + lag):
            c = step
            if c < nchunks:                               # (a) reduce chunk c
                lo, hi = bounds[c]
                seg = flat[lo:hi]
                stage.ready(lo, hi)                       # a device chunk: its copy is done
                if children:
                    for j, req in enumerate(pending.pop(c)):
                        req.Wait()
                        numpy.add(seg, scratch[j, c % window, :hi - lo], out=seg)
                    if c + window < nchunks:
                        post(c + window)
                if parent is not None:
                    up[c] = comm.Isend([seg, F], dest=parent, tag=TAG_UP)
            b = step - lag
            if 0 <= b < nchunks:                          # (b) broadcast chunk b
                lo, hi = bounds[b]
                seg = flat[lo:hi]
                if parent is not None:
                    up[b].Wait()                          # seg is about to be overwritten
                    up[b] = None
                    comm.Recv([seg, F], source=parent, tag=TAG_DOWN)
                for child in children:
                    down.append(comm.Isend([seg, F], dest=child, tag=TAG_DOWN))
                stage.publish(lo, hi)                     # final: back to the device
                if len(down) > 64:                        # keep the request list short
                    MPI.Request.Waitall(down[:32])
                    del down[:32]
        MPI.Request.Waitall(down)
