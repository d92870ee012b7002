"""Each allreduce algorithm as our code (or MPICH) runs it: stages of concurrent transfers.

A schedule is a list ``[(count, stage)]``: the allreduce takes ``sum(count * time(stage))``, a
stage being ``{"messages", "inter", "intra"}``: the alphas it costs in series, and the bytes
that the busiest host link (one direction) and the busiest intra-node path carry in it
(:meth:`.link_model.LinkModel.stage_time` times one). Ranks ``r // ranks_per_host`` share a host.
An item may also be ``(count, {"max": [schedule, schedule]})``: the slower of two schedules
that run side by side (the hierarchical allreduce).

The schedules are keyed by the names of :mod:`caffe_engine.comm.registry`:
:data:`FLAT_SCHEDULES` (one kind of link when every rank has a host of its own: what
:meth:`.link_model.LinkModel.fit` fits on), :data:`COMPOSED_SCHEDULES` (built from the flat ones
over the hosts), and :data:`NOT_MODELLED` with the reason (tests/perf/test_perf_registry.py checks
that every registered name is in one of them). docs/scaling.md, "The link model", has the
schedules and the fits.
"""
from ..comm import registry
from ..comm.tree import chunk_bounds, tree_children, tree_depth, tree_level
from ..errors import CaffeError

#: The tree communicator's defaults (tree.py): the schedule depends on them.
TREE_CHUNK_BYTES = 4 << 20


def _stage_loads(transfers, ranks_per_host):
    """(bytes on the busiest host link, bytes on the busiest intra-node path) of one stage.

    Ranks r // ranks_per_host share a host. Between hosts a transfer crosses the sender's link
    out and the receiver's link in (full duplex: the two directions are separate links; a switch
    port is the receiver's link in). Within a host it costs the two processes their copies
    (shared memory or a loopback socket: the sender's copy out, the receiver's copy in), so
    there each rank has a path out and a path in: a rank that receives from k others in one
    stage (a node leader) carries k transfers."""
    loads = {}
    for src, dst, nbytes in transfers:
        hs, hd = src // ranks_per_host, dst // ranks_per_host
        keys = ([("from", src), ("to", dst)] if hs == hd else [("out", hs), ("in", hd)])
        for key in keys:
            loads[key] = loads.get(key, 0.0) + float(nbytes)
    inter = max((v for k, v in loads.items() if k[0] in ("out", "in")), default=0.0)
    intra = max((v for k, v in loads.items() if k[0] in ("from", "to")), default=0.0)
    return inter, intra


def stage(transfers, ranks_per_host, messages=1):
    """One stage: concurrent ``transfers`` [(src rank, dst rank, bytes)], ``messages`` alphas in
    series; returns {"messages", "inter", "intra"} (see the module docstring)."""
    inter, intra = _stage_loads(transfers, ranks_per_host)
    return {"messages": float(messages), "inter": inter, "intra": intra}


def _ring_schedule(nbytes, p, rph, branching, chunk_bytes, lag):
    # 2 (P - 1) steps; in each every rank sends n/P to its right neighbour.
    step = stage([(r, (r + 1) % p, nbytes / p) for r in range(p)], rph)
    return [(2 * (p - 1), step)]


def _ps_schedule(nbytes, p, rph, branching, chunk_bytes, lag):
    # P - 1 receives at rank 0 one after the other, then P - 1 sends at once.
    return ([(1, stage([(src, 0, nbytes)], rph)) for src in range(1, p)]
            + [(1, stage([(0, dst, nbytes) for dst in range(1, p)], rph, p - 1))])


def _tree_schedule(nbytes, p, rph, branching, chunk_bytes, lag):
    count = int(nbytes) // 4
    nchunks = len(chunk_bounds(count, max(1, int(chunk_bytes) // 4))) or 1
    c = float(nbytes) / nchunks
    d = tree_depth(p, branching)
    lag = 2 * d + 1 if lag is None else int(lag)
    edges = [(child, r) for r in range(p) for child in tree_children(r, p, branching)]
    up_hops = [stage([(ch, par, c) for ch, par in edges if tree_level(ch, branching) == lvl],
                     rph) for lvl in range(d, 0, -1)]
    down_hops = [stage([(par, ch, c) for ch, par in edges if tree_level(ch, branching) == lvl],
                       rph) for lvl in range(1, d + 1)]
    up_all = stage([(ch, par, c) for ch, par in edges], rph)
    down_all = stage([(par, ch, c) for ch, par in edges], rph)
    j = min(nchunks, lag + 1)
    trips = 1 + (nchunks - j)
    return ([(trips, s) for s in up_hops + down_hops]
            + [(j - 1, up_all), (j - 1, down_all)])


def _mpi_schedule(nbytes, p, rph, branching=2, chunk_bytes=TREE_CHUNK_BYTES, lag=None):
    # MPICH 5's MPIR_Allreduce_intra_reduce_scatter_allgather (its choice for sums of more than
    # 8 bytes, count >= P): the ranks beyond the largest power of two pof2 first hand their
    # buffer to a neighbour; recursive halving with distance 1, 2, .. pof2/2 (n/2, n/4, ..
    # n/pof2 bytes each way); recursive doubling back; the neighbours get the result.
    pof2 = 1
    while pof2 * 2 <= p:
        pof2 *= 2
    rem = p - pof2

    def real(newrank):
        return 2 * newrank + 1 if newrank < rem else newrank + rem

    stages = []
    if rem:
        stages.append((1, stage([(2 * i, 2 * i + 1, nbytes) for i in range(rem)], rph)))
    halving, mask, share = [], 1, float(nbytes)
    while mask < pof2:
        share /= 2
        halving.append(stage([(real(nr), real(nr ^ mask), share) for nr in range(pof2)], rph))
        mask *= 2
    stages += [(1, s) for s in halving] + [(1, s) for s in reversed(halving)]
    if rem:
        stages.append((1, stage([(2 * i + 1, 2 * i, nbytes) for i in range(rem)], rph)))
    return stages


def _hier_schedule(nbytes, p, rph, branching, chunk_bytes, options):
    # hier.py: nodes are the hosts (N of K = ranks_per_host ranks), L lanes (default K; 1: the
    # paper's single leader). Per chunk (4 MiB): every rank sends slice s (c/L bytes) to the
    # node's owner of slice s over the node's intra paths (reduce-scatter), the L lanes
    # allreduce their slices across the nodes side by side (ring or tree among N, one owner per
    # host; the host's link carries all L lanes' bytes), each owner sends its slice back to the
    # node (all-gather). Every rank sends all its pieces at once and the all-gather does not
    # wait, so one chunk's intra traffic overlaps the next chunk's lanes: fill (the first
    # chunk's reduce-scatter) + m x max(the lanes' allreduce of a chunk, the intra paths'
    # reduce-scatter + all-gather of a chunk) + drain (the last chunk's all-gather).
    inter = options.get("inter", "ring")
    if inter not in ("ring", "tree"):
        raise CaffeError(f"link model: hier's leaders use ring or tree, not '{inter}'")
    lanes = options.get("lanes")
    k = min(rph, p)
    n_nodes = -(-p // k)
    lanes = k if lanes is None else max(1, min(int(lanes), k))
    count = int(nbytes) // 4
    nchunks = len(chunk_bounds(count, max(1, int(chunk_bytes) // 4))) or 1
    c = float(nbytes) / nchunks
    piece = c / lanes
    scatter = [(j, s, piece) for j in range(k) for s in range(lanes) if s != j]
    gather = [(s, j, piece) for j, s, _ in scatter]
    fill = stage(scatter, rph) if k > 1 else None
    drain = stage(gather, rph) if k > 1 else None
    both = stage(scatter + gather, rph)
    lane = (link_schedule(inter, piece, n_nodes, 1, branching, chunk_bytes)
            if n_nodes > 1 else [])
    lanes_side_by_side = [(count_, dict(stage_, inter=stage_["inter"] * lanes))
                          for count_, stage_ in lane]
    sched = [(1, fill)] if fill else []
    sched.append((nchunks, {"max": [lanes_side_by_side, [(1, both)] if k > 1 else []]}))
    if drain:
        sched.append((1, drain))
    return sched


#: Schedules of one kind of link, keyed by registry name: function (nbytes, P, ranks_per_host,
#: branching, chunk_bytes, lag) -> schedule.
FLAT_SCHEDULES = {"tree": _tree_schedule, "ring": _ring_schedule, "ps": _ps_schedule,
                  "mpi": _mpi_schedule}
#: Schedules composed over the hosts, keyed by registry name: function (nbytes, P,
#: ranks_per_host, branching, chunk_bytes, options of :func:`parse_algorithm`) -> schedule.
COMPOSED_SCHEDULES = {"hier": _hier_schedule}
#: Registered algorithms with no schedule here, and why.
NOT_MODELLED = {"nccl": "NCCL chooses its own ring or tree and protocol per call; not modelled"}
#: The flat algorithms, in the registry's order (tree, ring, ps, mpi).
LINK_ALGORITHMS = tuple(name for name in registry.ALGORITHMS if name in FLAT_SCHEDULES)


def parse_algorithm(name):
    """(base, options) of an algorithm label: ``"hier:tree,lanes=1"`` -> ``("hier", {"inter":
    "tree", "lanes": 1})``. The part after ':' is hier's ``inter``; ``,key=value`` pairs (integer
    values) are constructor options as tools/bench_allreduce.py passes them.

    Raises:
        CaffeError: a pair without '=' or with a non-integer value.
    """
    head, *pairs = str(name).split(",")
    base, _, inter = head.partition(":")
    options = {"inter": inter} if inter else {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        try:
            if not eq:
                raise ValueError
            options[key.strip()] = int(value)
        except ValueError:
            raise CaffeError(f"algorithm '{name}': options are key=integer, got '{pair}'") \
                from None
    return base, options


def link_schedule(algorithm, nbytes, procs, ranks_per_host=1, branching=2,
                  chunk_bytes=TREE_CHUNK_BYTES, lag=None):
    """The stages of one allreduce of ``nbytes`` on ``procs`` ranks, as our code runs it.

    Returns [(count, stage)] (see the module docstring); [] for one rank or no bytes.

    * ``ring``: 2 (P - 1) steps; in each every rank sends n/P to its right neighbour.
    * ``ps``: P - 1 receives at rank 0 one after the other (n each through its link in), then
      P - 1 sends at once ((P - 1) n through its link out, P - 1 alphas at the server).
    * ``mpi``: MPICH's reduce-scatter + all-gather (Rabenseifner): 2 log2 P pairwise steps of
      n/2, n/4, .. n/P (see :func:`_mpi_schedule`).
    * ``tree``: tree.py's pipeline. A buffer is m chunks of c = n/m bytes (4 MiB chunks). Before
      step s >= lag (2 depth + 1) every rank blocks on the chunk s - lag coming down, which its
      parent sends only once the root has reduced chunk s: after the first lag + 1 chunks have
      streamed up, each further chunk costs a whole round trip (up every level, then down),
      unpipelined. With j = min(m, lag + 1): ``(1 + m - j) (U + D) + (j - 1) (K_up + K_down)``,
      U and D the hop-by-hop time of one chunk up and down the tree (a parent's link in carries
      its k children's chunks), K_up and K_down the time of one chunk on the busiest link when
      every level streams at once (a parent's link in carries its k children's chunks; up and
      down never stream at the same time in this schedule). Flat binary tree, n <= 4 MiB:
      ``2 (alpha + n beta)`` at P = 2, ``2 (alpha + n beta) + 2 (alpha + 2 n beta)`` at P = 4.
    * ``hier`` (``hier:ring``, ``hier:tree``; ``hier,lanes=1`` for the single leader per
      node): hier.py with the hosts as nodes, see :func:`_hier_schedule`; an item may then be
      ``(count, {"max": [schedule, schedule]})``, the slower of two schedules that run side by
      side.

    Raises:
        CaffeError: an algorithm without a schedule, or hier with leaders other than ring or
            tree, or a malformed option (:func:`parse_algorithm`).
    """
    p = int(procs)
    rph = max(1, int(ranks_per_host))
    nbytes = float(nbytes)
    if p <= 1 or nbytes <= 0:
        return []
    if algorithm in FLAT_SCHEDULES:
        return FLAT_SCHEDULES[algorithm](nbytes, p, rph, branching, chunk_bytes, lag)
    base, options = parse_algorithm(algorithm)
    if base in COMPOSED_SCHEDULES:
        return COMPOSED_SCHEDULES[base](nbytes, p, rph, branching, chunk_bytes, options)
    raise CaffeError(f"link model: unknown algorithm '{algorithm}'; known: "
                     f"{', '.join(LINK_ALGORITHMS + tuple(COMPOSED_SCHEDULES))}")


def linear_terms(schedule, key, algorithm):
    """(alphas, bytes) in series of a schedule on one kind of path (``key``: "inter" or
    "intra"); a "max" item counts when only one of its schedules is not empty.

    Raises:
        CaffeError: a "max" item with two busy schedules (``algorithm`` names it).
    """
    a = b = 0.0
    for count, stage_ in schedule:
        if "max" in stage_:
            busy = [sub for sub in stage_["max"] if sub]
            if len(busy) > 1:
                raise CaffeError(f"link model: '{algorithm}' is not linear in alpha and beta")
            sub = linear_terms(busy[0], key, algorithm) if busy else (0.0, 0.0)
            a, b = a + count * sub[0], b + count * sub[1]
        else:
            a += count * stage_["messages"]
            b += count * stage_[key]
    return a, b


def link_terms(algorithm, nbytes, procs, branching=2, chunk_bytes=TREE_CHUNK_BYTES, lag=None,
               one_host=False):
    """(A, B) with ``time = alpha * A + beta * B`` when every rank has a host of its own (one
    kind of link): A the alphas in series, B the bytes in series through the busiest links.
    ``one_host``: all ranks on one host instead (then alpha_intra and beta_intra)."""
    rph = int(procs) if one_host else 1
    return linear_terms(link_schedule(algorithm, nbytes, procs, rph, branching, chunk_bytes,
                                      lag), "intra" if one_host else "inter", algorithm)
