"""Hierarchical allreduce: reduce within each node, allreduce among the node leaders, broadcast.

Jia et al., "Highly scalable deep learning training system with mixed-precision: training
ImageNet in four minutes" (arXiv:1807.11205, 2018), the section on communication strategies
("hierarchical all-reduce"; its "hybrid all-reduce" switches between this and the flat ring by
message size, which is not done here: ``hybrid`` is only an alias of ``hier``). A flat ring over
P = N·K ranks (N nodes of K ranks) takes 2 (P - 1) dependent steps, each waiting on the
transfers that cross between nodes; grouping the ranks by node leaves 2 (N - 1) steps on the
network:

1. **Intra-node reduce.** Each node's leader (its lowest rank) receives every other member's
   buffer and adds them to its own, in member (rank) order: own + m_1 + m_2 + ...
2. **Inter-node allreduce** among the N leaders (one per node) by the ring (default) or the
   FireCaffe tree (:mod:`.ring`, :mod:`.tree`) over a communicator of the leaders only.
3. **Intra-node broadcast.** Each leader sends the result to its members.

Every leader ends with the same bits (the ring's all-gather copies, the tree broadcasts the
root's sum) and every member receives its leader's bits, so all ranks end bitwise identical; the
topology and the summation order are fixed by the node grouping and ``chunk_bytes``.

Pipelining: a buffer larger than ``chunk_bytes`` goes through the three phases chunk by chunk.
The members send all their chunks at once (non-blocking) and then receive the results chunk by
chunk; a leader, for each chunk in turn, waits for its members' pieces (receives posted
``window`` chunks ahead), adds them, allreduces the chunk with the other leaders, and sends it to
its members without waiting, so the broadcast of one chunk overlaps the next chunk's reduce and
inter-node allreduce.

Cost per allreduce of n bytes, N nodes, K ranks on the largest node, m = ceil(n / chunk_bytes)
chunks (alpha-beta: a message of b bytes costs alpha + b beta; _l within a node, _g between
nodes):

- a member sends m messages (n bytes) to its leader and receives m (n bytes);
- a leader receives (K - 1) m messages ((K - 1) n bytes) from its members and sends as many, plus
  the inter-node allreduce among N leaders: ring 2 (N - 1) m messages each way, 2 (N - 1)/N · n
  bytes; tree (binary) at most 3 m messages and 3 n bytes each way;
- time, one chunk: T = 2 (K - 1)(alpha_l + n beta_l) + T_inter, T_inter(ring) =
  2 (N - 1)(alpha_g + n/N beta_g), T_inter(tree) = 2 ceil(log2 N)(alpha_g + n beta_g); with m
  chunks the phases overlap and T approaches the slowest phase plus the pipeline's fill.

Nodes: by default the ranks that share a machine (an ``MPI_COMM_TYPE_SHARED`` split); the
environment variable ``CAFFE_NODE`` (a node name per rank, set on every rank or on none; e.g.
tools/netlab.py sets ``CAFFE_NODE=h0``, ``h1``... in its emulated hosts) overrides that, and the
constructor option ``nodes`` (a node label per rank, e.g. ``[0, 0, 1, 1]``) overrides both.
Nodes are numbered in order of their lowest rank. With one node the algorithm is a reduce to
rank 0 and a broadcast; with one rank per node it is the inter-node algorithm alone.
"""
import os

import numpy

from ..errors import CaffeError
from .communicator import MPICommunicator
from .registry import register
from .ring import RingCommunicator
from .tree import TreeCommunicator, chunk_bounds

TAG_UP = 41
TAG_DOWN = 42

#: Environment variable naming this rank's node (overrides the shared-memory grouping).
NODE_VAR = "CAFFE_NODE"
#: The algorithms the node leaders can allreduce with (``inter``), by name.
INTER = {"ring": RingCommunicator, "tree": TreeCommunicator}


# --------------------------------------------------------------------------------------------
# Node grouping (pure; unit-tested without MPI)
# --------------------------------------------------------------------------------------------
def group_nodes(labels):
    """Node index of each rank: ranks with equal labels share a node; nodes are numbered in
    order of their lowest rank (rank 0's node is 0).

    Args:
        labels: one hashable label per rank (a node name, a host's id, an int).

    Returns:
        list of int, one per rank.
    """
    index = {}
    return [index.setdefault(label, len(index)) for label in labels]


def node_members(node_of, rank):
    """Ranks on ``rank``'s node, ascending; the first is the node's leader."""
    return [r for r, n in enumerate(node_of) if n == node_of[rank]]


def node_leaders(node_of):
    """The leader (lowest rank) of each node, in node order (hence ascending)."""
    leaders = {}
    for r, n in enumerate(node_of):
        leaders.setdefault(n, r)
    return [leaders[n] for n in sorted(leaders)]


def _ranks_text(ranks, limit=8):
    shown = ", ".join(str(r) for r in ranks[:limit])
    return shown + (f" (and {len(ranks) - limit} more)" if len(ranks) > limit else "")


def choose_labels(size, nodes=None, env_names=None, shared_ids=None):
    """Each rank's node label, from the highest-priority source that is given.

    Args:
        size: number of ranks.
        nodes: the constructor option, one label per rank, or None.
        env_names: every rank's ``CAFFE_NODE`` (None or "" where unset), or None.
        shared_ids: every rank's shared-memory group id (the launcher's hosts).

    Returns:
        (labels, source): the labels and "nodes", "CAFFE_NODE" or "host".

    Raises:
        CaffeError: ``nodes`` of the wrong length, or ``CAFFE_NODE`` set on some ranks only.
    """
    if nodes is not None:
        nodes = list(nodes)
        if len(nodes) != size:
            raise CaffeError(f"communicator 'hier': nodes has {len(nodes)} entries for "
                             f"{size} ranks")
        return nodes, "nodes"
    env_names = [e or None for e in (env_names or [None] * size)]
    unset = [r for r, e in enumerate(env_names) if e is None]
    if len(unset) == size:
        return list(shared_ids if shared_ids is not None else [0] * size), "host"
    if unset:
        named = [r for r, e in enumerate(env_names) if e is not None]
        raise CaffeError(f"{NODE_VAR} is set on rank(s) {_ranks_text(named)} but not on rank(s) "
                         f"{_ranks_text(unset)}; set it on every rank or on none")
    return env_names, "CAFFE_NODE"


# --------------------------------------------------------------------------------------------
@register("hier", aliases=("hybrid",), option="inter")
class HierarchicalCommunicator(MPICommunicator):
    """Allreduce by intra-node reduce, inter-node allreduce among leaders, intra-node broadcast.

    See the module docstring for the algorithm, its cost and the node grouping (Jia et al. 2018,
    hierarchical all-reduce). Command line: ``--comm hier`` (ring among the leaders),
    ``--comm hier:tree`` or ``--comm hier:ring``; ``hybrid`` is an alias of ``hier``.

    Args:
        comm: mpi4py communicator (default COMM_WORLD); construction is collective.
        inter: "ring" (default) or "tree": the leaders' allreduce.
        nodes: one node label per rank (any hashable values; equal labels share a node), or
            None to use ``CAFFE_NODE`` or else the launcher's hosts. Must be the same on every
            rank.
        chunk_bytes: pipeline chunk size in bytes (default 4 MiB, as the tree's).
        window: chunks whose receives from the members a leader posts ahead (default 2).
        timeout: see :class:`~.communicator.Communicator`.

    Attributes:
        node_of: node index of every rank; ``node`` this rank's; ``members`` the ranks of this
            node (leader first); ``leader``, ``is_leader``; ``leaders`` every node's leader;
        node_source: where the grouping came from: "nodes", "CAFFE_NODE" or "host".

    Raises:
        CaffeError: a bad ``inter``, ``chunk_bytes`` < 4, ``window`` < 1, ``nodes`` of the wrong
            length or different on different ranks, ``CAFFE_NODE`` set on some ranks only (the
            same one line on every rank).
    """

    name = "hier"

    @staticmethod
    def validate_options(inter="ring", chunk_bytes=4 << 20, window=2, **_others):
        """Check the option values (before MPI is touched; the CLI calls it for ``--comm``).

        Raises:
            CaffeError: one line naming the bad value.
        """
        if inter not in INTER:
            raise CaffeError(f"communicator 'hier': the leaders' algorithm must be "
                             f"{' or '.join(INTER)}, got '{inter}' (--comm hier:ring or "
                             "hier:tree)")
        if int(chunk_bytes) < 4:
            raise CaffeError(f"communicator 'hier': chunk_bytes must be >= 4, got {chunk_bytes}")
        if int(window) < 1:
            raise CaffeError(f"communicator 'hier': window must be >= 1, got {window}")

    def __init__(self, comm=None, inter="ring", nodes=None, chunk_bytes=4 << 20, window=2,
                 timeout=None):
        self.validate_options(inter=inter, chunk_bytes=chunk_bytes, window=window)
        super().__init__(comm, timeout)
        self.inter = inter
        self.chunk_bytes = int(chunk_bytes)
        self.chunk_elems = self.chunk_bytes // 4
        self.window = int(window)
        self._inner = None
        try:
            with self._watch("node discovery"):
                labels, self.node_source = self._discover(nodes)
                self.node_of = group_nodes(labels)
                self.node = self.node_of[self.rank]
                self.members = node_members(self.node_of, self.rank)
                self.leader = self.members[0]
                self.is_leader = self.leader == self.rank
                self.leaders = node_leaders(self.node_of)
                self._inner = self._make_inner()
        except CaffeError:              # raised on every rank alike: free the duplicates
            self.close()
            raise

    # -- setup (collective) ------------------------------------------------------------------
    def _shared_id(self):
        """The lowest rank of this rank's shared-memory group (its machine). Collective."""
        local = self.comm.Split_type(self.MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            return local.bcast(self.rank, root=0)
        finally:
            local.Free()

    def _discover(self, nodes):
        mine = (os.environ.get(NODE_VAR) or None, self._shared_id(),
                None if nodes is None else list(nodes))
        everyone = self.comm.allgather(mine)
        if any(e[2] != everyone[0][2] for e in everyone):
            raise CaffeError("communicator 'hier': the nodes option differs between ranks")
        return choose_labels(self.size, nodes=everyone[0][2],
                             env_names=[e[0] for e in everyone],
                             shared_ids=[e[1] for e in everyone])

    def _make_inner(self):
        """The leaders' communicator (their own duplicates), or None for a member or for a
        single node. Collective over this communicator."""
        MPI = self.MPI
        color = 0 if self.is_leader else MPI.UNDEFINED
        leaders = self.comm.Split(color, key=self.rank)
        if leaders == MPI.COMM_NULL:
            return None
        try:
            if leaders.Get_size() == 1:
                return None
            opts = {"chunk_bytes": self.chunk_bytes} if self.inter == "tree" else {}
            return INTER[self.inter](leaders, timeout=self.timeout, **opts)
        finally:
            leaders.Free()

    def close(self):
        if self._inner is not None:
            self._inner.close()
            self._inner = None
        super().close()

    # -- the algorithm -----------------------------------------------------------------------
    def _allreduce_sum(self, comm, flat):
        bounds = chunk_bounds(flat.size, self.chunk_elems)
        if not self.is_leader:
            self._member(comm, flat, bounds)
            return
        inner_comm = None
        if self._inner is not None:     # the leaders' duplicate that matches ``comm``'s stream
            inner_comm = self._inner.comm if comm is self.comm else self._inner._async_comm
        self._leader(comm, inner_comm, flat, bounds)

    def _member(self, comm, flat, bounds):
        """Send every chunk to the leader, then receive the results chunk by chunk."""
        F = self.MPI.FLOAT
        up = [comm.Isend([flat[lo:hi], F], dest=self.leader, tag=TAG_UP) for lo, hi in bounds]
        for (lo, hi), req in zip(bounds, up):
            req.Wait()                                    # the chunk is about to be overwritten
            comm.Recv([flat[lo:hi], F], source=self.leader, tag=TAG_DOWN)

    def _leader(self, comm, inner_comm, flat, bounds):
        """Per chunk: add the members' pieces in rank order, allreduce among the leaders, send
        the result to the members."""
        MPI = self.MPI
        F = MPI.FLOAT
        others = self.members[1:]
        nchunks = len(bounds)
        window = min(self.window, nchunks)
        width = bounds[0][1] - bounds[0][0]
        scratch = self.scratch(comm, len(others) * window * width)
        scratch = scratch.reshape(len(others), window, width) if others else scratch
        pending = {}

        def post(c):
            lo, hi = bounds[c]
            pending[c] = [comm.Irecv([scratch[j, c % window, :hi - lo], F], source=m, tag=TAG_UP)
                          for j, m in enumerate(others)]

        if others:
            for c in range(window):
                post(c)
        down = []
        for c, (lo, hi) in enumerate(bounds):
            seg = flat[lo:hi]
            if others:                                    # (1) intra-node reduce
                for j, req in enumerate(pending.pop(c)):
                    req.Wait()
                    numpy.add(seg, scratch[j, c % window, :hi - lo], out=seg)
                if c + window < nchunks:
                    post(c + window)
            if inner_comm is not None:                    # (2) among the leaders
                self._inner._allreduce_sum(inner_comm, seg)
            for m in others:                              # (3) intra-node broadcast
                down.append(comm.Isend([seg, F], dest=m, tag=TAG_DOWN))
            if len(down) > 64:                            # keep the request list short
                MPI.Request.Waitall(down[:32])
                del down[:32]
        MPI.Request.Waitall(down)

    def __repr__(self):
        return (f"<{type(self).__name__} hier:{self.inter} rank {self.rank} of {self.size}, "
                f"node {self.node} of {len(self.leaders)} ({self.node_source})>")
