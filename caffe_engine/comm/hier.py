"""Hierarchical allreduce: reduce-scatter within each node, allreduce across nodes, all-gather.

Jia et al., "Highly scalable deep learning training system with mixed-precision: training
ImageNet in four minutes" (arXiv:1807.11205, 2018), the section on communication strategies
("hierarchical all-reduce"; its "hybrid all-reduce" switches between this and the flat ring by
message size, which is not done here: ``hybrid`` is only an alias of ``hier``). A flat ring over
P = N·K ranks (N nodes of K ranks) takes 2 (P - 1) dependent steps, each waiting on the
transfers that cross between nodes; grouping the ranks by node leaves 2 (N - 1) steps on the
network.

The paper's scheme reduces each node to one *leader*, allreduces among the N leaders and
broadcasts. Here a node's buffer is cut into L *slices* (L lanes, default: as many as the
smallest node has ranks) and each slice has its own leader, the node's rank of that local
index, so every rank of a node carries a share of the work and of the node's network traffic
(the reduce-scatter / all-gather form of the same hierarchy, as in NCCL's and Mikami et al.'s
2D schemes). ``lanes=1`` is exactly the paper's single leader. Per pipeline chunk:

1. **Intra-node reduce-scatter.** Every rank sends slice s of the chunk to the node's owner of
   slice s (its member of local index s, s < L), which adds the pieces to its own in rank order
   (own + the others by ascending rank).
2. **Inter-node allreduce** of each slice among the N owners of that slice (one per node: lane
   s), by the ring (default) or the FireCaffe tree (:mod:`.ring`, :mod:`.tree`), on a
   communicator of the lane only. The L lanes run side by side and share the node's link.
3. **Intra-node all-gather.** Each owner sends its slice's result to every other rank of its
   node.

Every lane ends with the same bits on every node (the ring's all-gather copies, the tree
broadcasts the root's sum) and every rank receives each slice from its owner, so all ranks end
bitwise identical; the topology and the summation order are fixed by the node grouping, the
lanes and ``chunk_bytes``.

Pipelining: a buffer larger than ``chunk_bytes`` goes through the three phases chunk by chunk.
Every rank sends all its pieces at once (non-blocking); an owner, for each chunk in turn, waits
for its pieces (receives posted ``window`` chunks ahead), adds them, allreduces its slice in its
lane and sends the result to the node without waiting, so one chunk's all-gather overlaps the
next chunk's reduce-scatter and inter-node allreduce.

Device (CuPy) buffers (:mod:`.pinned_mirror`): each chunk is waited for in the pinned host
mirror just before it is used (its pieces are sent as soon as their copies have landed, not all
at once), and each slice's result goes back to the device as soon as it is final.

Cost per allreduce of n bytes (alpha-beta: a message of b bytes costs alpha + b beta; _l within
a node, _g on a node's link), N nodes of K ranks, L lanes, one chunk:

- reduce-scatter: every rank sends and receives (L - 1) messages of n/L (an owner receives K - 1
  pieces; with L = 1 the leader receives (K - 1) n);
- inter-node: lane s allreduces n/L among N owners; the L lanes share the node's link, so the
  link carries what one leader's allreduce of n would (ring: 2 (N - 1)/N · n each way) in
  2 (N - 1) steps, but that work is spread over L processes;
- all-gather: as the reduce-scatter, reversed;
- T = 2 (K - 1)(alpha_l + n/L beta_l) + T_inter, T_inter(ring) = 2 (N - 1)(alpha_g +
  n/N beta_g); with m chunks the phases overlap and T approaches the slowest phase plus the
  pipeline's fill (``caffe_engine.perf.schedules.link_schedule("hier", ...)``).

Nodes: by default the ranks that share a machine (an ``MPI_COMM_TYPE_SHARED`` split); the
environment variable ``CAFFE_NODE`` (a node name per rank, set on every rank or on none; e.g.
tools/netlab.py sets ``CAFFE_NODE=h0``, ``h1``... in its emulated hosts) overrides that, and the
constructor option ``nodes`` (a node label per rank, e.g. ``[0, 0, 1, 1]``) overrides both.
Nodes are numbered in order of their lowest rank; nodes may differ in size (the lanes are then
the smallest node's size; a larger node's extra ranks only send and receive within the node).
With one node the algorithm is a reduce-scatter and all-gather inside it; with one rank per node
it is the inter-node algorithm alone. Lanes: the option ``lanes``, else the environment variable
``CAFFE_HIER_LANES`` (a positive integer), else every rank of the smallest node.
"""

import numpy

from .. import environment
from ..errors import CaffeError
from .communicator import MPICommunicator
from .registry import register
from .ring import RingCommunicator, ring_segments
from .pinned_mirror import NO_STAGE
from .tree import TreeCommunicator, chunk_bounds

TAG_UP = 41
TAG_DOWN = 42

#: Environment variable naming this rank's node (overrides the shared-memory grouping).
NODE_VAR = "CAFFE_NODE"
#: Environment variable giving the number of lanes (slices per node) when ``lanes`` is not set.
LANES_VAR = "CAFFE_HIER_LANES"
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


def lane_count(node_of, lanes=None):
    """Number of slices per node: the smallest node's size, capped at ``lanes`` (None: no cap).

    Args:
        node_of: node index of every rank (:func:`group_nodes`).
        lanes: the requested number of lanes (>= 1), or None.
    """
    sizes = {}
    for n in node_of:
        sizes[n] = sizes.get(n, 0) + 1
    smallest = min(sizes.values())
    return smallest if lanes is None else max(1, min(int(lanes), smallest))


def lanes_from_env(environ=None):
    """``CAFFE_HIER_LANES`` as an int, or None when unset.

    Raises:
        CaffeError: not a positive integer (one line).
    """
    return environment.read(LANES_VAR, environ)


def slice_bounds(lo, hi, lanes):
    """[(lo, hi)] of the ``lanes`` slices of the chunk [lo, hi) (sizes differ by at most one)."""
    return [(lo + a, lo + b) for a, b in ring_segments(hi - lo, lanes)]


# --------------------------------------------------------------------------------------------
@register("hier", aliases=("hybrid",), option="inter")
class HierarchicalCommunicator(MPICommunicator):
    """Allreduce by intra-node reduce-scatter, inter-node allreduce per slice, intra-node
    all-gather.

    See the module docstring for the algorithm, its cost, the lanes and the node grouping (Jia et
    al. 2018, hierarchical all-reduce). Command line: ``--comm hier`` (ring across nodes),
    ``--comm hier:tree`` or ``--comm hier:ring``; ``hybrid`` is an alias of ``hier``.

    Args:
        comm: mpi4py communicator (default COMM_WORLD); construction is collective.
        inter: "ring" (default) or "tree": each lane's allreduce across the nodes.
        nodes: one node label per rank (any hashable values; equal labels share a node), or
            None to use ``CAFFE_NODE`` or else the launcher's hosts. Must be the same on every
            rank.
        lanes: slices per node (>= 1; 1 is the paper's single leader per node), or None for
            ``CAFFE_HIER_LANES`` or else the smallest node's size. Must be the same on every
            rank.
        chunk_bytes: pipeline chunk size in bytes (default 4 MiB, as the tree's).
        window: chunks whose receives an owner posts ahead (default 2).
        timeout: see :class:`~.communicator.Communicator`.

    Attributes:
        node_of: node index of every rank; ``node`` this rank's; ``members`` the ranks of this
            node (ascending); ``leader`` (its lowest rank), ``is_leader``; ``leaders`` every
            node's lowest rank;
        lanes: the number of slices per node; ``lane`` this rank's slice (its local index), or
            None for a rank beyond the smallest node's size; ``owners`` the ranks of this node
            that own slices 0 .. lanes - 1;
        node_source: where the grouping came from: "nodes", "CAFFE_NODE" or "host".

    Raises:
        CaffeError: a bad ``inter``, ``chunk_bytes`` < 4, ``window`` < 1, ``lanes`` < 1,
            ``nodes`` or ``lanes`` of the wrong length or different on different ranks,
            ``CAFFE_NODE`` set on some ranks only (the same one line on every rank).
    """

    name = "hier"

    @staticmethod
    def validate_options(inter="ring", chunk_bytes=4 << 20, window=2, lanes=None, **_others):
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
        if lanes is not None and int(lanes) < 1:
            raise CaffeError(f"communicator 'hier': lanes must be >= 1, got {lanes}")

    def __init__(self, comm=None, inter="ring", nodes=None, lanes=None, chunk_bytes=4 << 20,
                 window=2, timeout=None):
        if lanes is None:
            lanes = lanes_from_env()
        self.validate_options(inter=inter, chunk_bytes=chunk_bytes, window=window, lanes=lanes)
        super().__init__(comm, timeout)
        self.inter = inter
        self.chunk_bytes = int(chunk_bytes)
        self.chunk_elems = self.chunk_bytes // 4
        self.window = int(window)
        self._inner = None
        try:
            with self._watch("node discovery"):
                labels, self.node_source = self._discover(nodes, lanes)
                self.node_of = group_nodes(labels)
                self.node = self.node_of[self.rank]
                self.members = node_members(self.node_of, self.rank)
                self.leader = self.members[0]
                self.is_leader = self.leader == self.rank
                self.leaders = node_leaders(self.node_of)
                self.lanes = lane_count(self.node_of, lanes)
                local = self.members.index(self.rank)
                self.lane = local if local < self.lanes else None
                self.owners = self.members[:self.lanes]
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

    def _discover(self, nodes, lanes):
        mine = (environment.read(NODE_VAR), self._shared_id(),
                None if nodes is None else list(nodes), lanes)
        everyone = self.comm.allgather(mine)
        if any(e[2] != everyone[0][2] for e in everyone):
            raise CaffeError("communicator 'hier': the nodes option differs between ranks")
        if any(e[3] != everyone[0][3] for e in everyone):
            raise CaffeError(f"communicator 'hier': lanes differ between ranks "
                             f"({', '.join(str(e[3]) for e in everyone[:8])}); set "
                             f"{LANES_VAR} on every rank alike")
        return choose_labels(self.size, nodes=everyone[0][2],
                             env_names=[e[0] for e in everyone],
                             shared_ids=[e[1] for e in everyone])

    def _make_inner(self):
        """This rank's lane across the nodes (the owners of its slice, one per node, on their
        own duplicates), or None for a rank without a lane or a single node. Collective."""
        MPI = self.MPI
        color = self.lane if self.lane is not None else MPI.UNDEFINED
        lane = self.comm.Split(color, key=self.rank)
        if lane == MPI.COMM_NULL:
            return None
        try:
            if lane.Get_size() == 1:
                return None
            opts = {"chunk_bytes": self.chunk_bytes} if self.inter == "tree" else {}
            return INTER[self.inter](lane, timeout=self.timeout, **opts)
        finally:
            lane.Free()

    def over(self, comm, members):
        """The same hierarchy over ``comm``: each member keeps its node (``node_of`` of the
        world ranks ``members``), the inter-node algorithm, chunk and window; ``lanes`` takes
        its default for the sub-communicator."""
        return HierarchicalCommunicator(comm, inter=self.inter,
                                        nodes=[self.node_of[r] for r in members],
                                        chunk_bytes=self.chunk_bytes, window=self.window,
                                        timeout=self.timeout)

    def close(self):
        if self._inner is not None:
            self._inner.close()
            self._inner = None
        super().close()

    # -- the algorithm -----------------------------------------------------------------------
    def _allreduce_sum(self, comm, flat, stage=NO_STAGE):
        MPI = self.MPI
        F = MPI.FLOAT
        chunks = [slice_bounds(lo, hi, self.lanes)
                  for lo, hi in chunk_bounds(flat.size, self.chunk_elems)]
        mine, owners = self.lane, self.owners
        others = [m for m in self.members if m != self.rank]
        up = []

        def send_up(c):                 # (1) chunk c's pieces that another rank owns
            up.append({s: comm.Isend([flat[lo:hi], F], dest=owners[s], tag=TAG_UP)
                       for s, (lo, hi) in enumerate(chunks[c]) if s != mine})

        def span(c):
            return chunks[c][0][0], chunks[c][-1][1]

        # (1) every piece that is on the host goes out at once (a host buffer: all of them), in
        # chunk order per owner; a staged device buffer's later chunks as their copies land
        while len(up) < len(chunks) and stage.poll(*span(len(up))):
            send_up(len(up))
        landing = []                    # staged: (request, lo, hi) of the results to receive
        inner_comm = None
        if self._inner is not None:     # the lane's duplicate that matches ``comm``'s stream
            inner_comm = self._inner.comm if comm is self.comm else self._inner._async_comm
        nchunks = len(chunks)
        window = min(self.window, nchunks)
        pending, scratch = {}, None
        if mine is not None and others:
            width = max(hi - lo for sl in chunks for lo, hi in sl[mine:mine + 1])
            scratch = self.scratch(comm, len(others) * window * width)
            scratch = scratch.reshape(len(others), window, width)

        def post(c):
            lo, hi = chunks[c][mine]
            pending[c] = [comm.Irecv([scratch[j, c % window, :hi - lo], F], source=m,
                                     tag=TAG_UP) for j, m in enumerate(others)]

        if scratch is not None:
            for c in range(window):
                post(c)
        down = []
        for c, sl in enumerate(chunks):
            if stage.staged:
                stage.ready(*span(c))
                while len(up) <= c or (len(up) < nchunks and stage.poll(*span(len(up)))):
                    send_up(len(up))
            if mine is not None:
                lo, hi = sl[mine]
                seg = flat[lo:hi]
                if scratch is not None:                   # (1) add the node's pieces
                    reqs = pending.pop(c)
                    MPI.Request.Waitall(reqs)
                    for j in range(len(others)):
                        numpy.add(seg, scratch[j, c % window, :hi - lo], out=seg)
                    if c + window < nchunks:
                        post(c + window)
                if inner_comm is not None and hi > lo:    # (2) across the nodes, in the lane
                    self._inner._allreduce_sum(inner_comm, seg)
                for m in others:                          # (3) to the rest of the node
                    down.append(comm.Isend([seg, F], dest=m, tag=TAG_DOWN))
                stage.publish(lo, hi)                     # final: back to the device
            for s, req in up[c].items():                  # (3) the other slices' results
                req.Wait()                                # the piece is about to be overwritten
                lo, hi = sl[s]
                down.append(comm.Irecv([flat[lo:hi], F], source=owners[s], tag=TAG_DOWN))
                if stage.staged:
                    landing.append((down[-1], lo, hi))
            while landing and landing[0][0].Test():       # staged: results that have landed
                stage.publish(*landing.pop(0)[1:])
            if len(down) > 64:                            # keep the request list short
                MPI.Request.Waitall(down[:32])
                del down[:32]
        MPI.Request.Waitall(down)
        for _, lo, hi in landing:
            stage.publish(lo, hi)

    def __repr__(self):
        return (f"<{type(self).__name__} hier:{self.inter} rank {self.rank} of {self.size}, "
                f"node {self.node} of {len(self.leaders)}, {self.lanes} lane(s) "
                f"({self.node_source})>")
