"""Alpha-beta cost model of each allreduce algorithm, and predicted training speedup.

Communication (Hockney's alpha-beta model): sending n bytes costs ``alpha + n * beta`` (latency
alpha in seconds, inverse bandwidth beta in seconds per byte). Each algorithm's allreduce of n
bytes on P processes then costs ``alpha * A(P) + beta * n * B(P)``:

=========  ==================  ==================  =========================================
algorithm  A(P) (messages)     B(P) (volume)        why
=========  ==================  ==================  =========================================
tree       2 d                 2 d                  FireCaffe eq.: up and down d = ceil(log_k P)
                                                    levels, one buffer per level (unpipelined)
ring       2 (P - 1)           2 (P - 1) / P        reduce-scatter + all-gather
ps         2 (P - 1)           2 (P - 1)            the server's link carries every buffer twice
mpi        2 ceil(log2 P)      2 (P - 1) / P        MPICH's Rabenseifner for long messages
=========  ==================  ==================  =========================================

:meth:`AlphaBetaModel.fit` finds alpha and beta per algorithm by least squares (non-negative) on
the rows of ``tools/bench_allreduce.py``'s results.json.

:class:`LinkModel` is the model of a network instead (``tools/bench_allreduce.py --netlab``): one
alpha and one beta of the links for every algorithm, each algorithm a schedule of stages of
concurrent transfers as our code (or MPICH) runs it (:func:`link_schedule`), a stage costing its
messages' alphas plus the bytes of its busiest link times beta; ranks on one host reach each other
through their own copies instead (``alpha_intra``, ``beta_intra``). :meth:`LinkModel.fit` fits
the two on one-rank-per-host rows, :meth:`LinkModel.fit_intra` the intra-node pair on one-host
rows, :func:`link_report` prints measured against predicted; docs/scaling.md, "On an emulated
network", has the schedules and the fits. FireCaffe's own formulas (section 4 of
arXiv:1511.00175), with |W| the gradient bytes and BW the link bandwidth, are
:func:`firecaffe_comm_time`: parameter server ``|W| * P / BW``, reduction tree
``2 * |W| * log2(P) / BW``.

Iteration time (:func:`iteration_time`): forward + backward compute per worker (measured, e.g. by
``caffe time``: a mapping layer name -> (forward s, backward s) in layer order) plus the gradient
allreduce — after backward (no overlap: one allreduce of every gradient), or overlapped with
backward bucket by bucket (:mod:`.buckets`: a bucket is sent when backward has finished its
lowest layer; one bucket on the wire at a time). Speedup on P workers at a fixed per-worker batch
(weak scaling, the way FireCaffe and Caffe's multi-GPU count it, per epoch):
``S(P) = P * T(1) / T(P)`` with T(1) = compute alone.
"""
import json
import math

import numpy

from ..errors import CaffeError
from .buckets import plan_buckets
from .tree import ceil_log, chunk_bounds

ALGORITHMS = ("tree", "ring", "ps", "mpi")


def shape_terms(algorithm, procs, branching=2):
    """(A(P), B(P)) of the table in the module docstring (0, 0 for one process)."""
    p = int(procs)
    if p <= 1:
        return 0.0, 0.0
    if algorithm == "tree":
        d = ceil_log(p, branching)
        return 2.0 * d, 2.0 * d
    if algorithm == "ring":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if algorithm == "ps":
        return 2.0 * (p - 1), 2.0 * (p - 1)
    if algorithm == "mpi":
        return 2.0 * ceil_log(p, 2), 2.0 * (p - 1) / p
    raise CaffeError(f"cost model: unknown algorithm '{algorithm}'; known: {', '.join(ALGORITHMS)}")


def _nnls2(a, b):
    """Least squares ``a @ x ~ b`` with x >= 0 for two unknowns (tries the faces)."""
    best = None
    candidates = []
    x, *_ = numpy.linalg.lstsq(a, b, rcond=None)
    if (x >= 0).all():
        candidates.append(x)
    for j in range(a.shape[1]):
        col = a[:, j]
        denom = float(col @ col)
        if denom > 0:
            xj = max(0.0, float(col @ b) / denom)
            x1 = numpy.zeros(a.shape[1])
            x1[j] = xj
            candidates.append(x1)
    candidates.append(numpy.zeros(a.shape[1]))
    for x in candidates:
        r = float(numpy.sum((a @ x - b) ** 2))
        if best is None or r < best[0]:
            best = (r, x)
    return best[1]


def _save_json(obj, path):
    """Write a model's parameters as indented, key-sorted JSON (the files this module loads)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)


class AlphaBetaModel:
    """Per-algorithm alpha (s) and beta (s/byte).

    Args:
        params: {algorithm: {"alpha": seconds, "beta": seconds per byte}}.
        branching: the tree's k.
    """

    def __init__(self, params=None, branching=2):
        self.params = {k: dict(v) for k, v in (params or {}).items()}
        self.branching = branching

    @classmethod
    def fit(cls, rows, branching=2, relative=True, stat="seconds"):
        """Fit alpha, beta per algorithm on benchmark rows.

        Args:
            rows: iterable of {"algorithm", "procs", "bytes", "seconds"} (results.json "rows").
            relative: weight each row by 1 / seconds (fits relative error, so the 4 KiB rows
                count as much as the 64 MiB ones).
            stat: the row's time to fit: "seconds" (median) or "min_seconds" (fastest
                repetition, steadier on a shared machine).

        Returns:
            AlphaBetaModel. Rows with procs <= 1 are ignored.
        """
        by_alg = {}
        for r in rows:
            if int(r["procs"]) > 1:
                by_alg.setdefault(r["algorithm"], []).append(r)
        params = {}
        for alg, rs in by_alg.items():
            terms = [shape_terms(alg, r["procs"], branching) for r in rs]
            a = numpy.array([[A, B * r["bytes"]] for (A, B), r in zip(terms, rs)], float)
            t = numpy.array([r.get(stat, r["seconds"]) for r in rs], float)
            w = 1.0 / numpy.maximum(t, 1e-9) if relative else numpy.ones_like(t)
            alpha, beta = _nnls2(a * w[:, None], t * w)
            params[alg] = {"alpha": float(alpha), "beta": float(beta)}
        return cls(params, branching)

    def predict(self, algorithm, nbytes, procs):
        """Seconds for one allreduce of ``nbytes`` on ``procs`` processes."""
        if algorithm not in self.params:
            raise CaffeError(f"cost model: no parameters for '{algorithm}' "
                             f"(fitted: {', '.join(sorted(self.params)) or 'none'})")
        A, B = shape_terms(algorithm, procs, self.branching)
        p = self.params[algorithm]
        return p["alpha"] * A + p["beta"] * float(nbytes) * B

    def to_dict(self):
        return {"branching": self.branching, "algorithms": self.params}

    def save(self, path):
        _save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save`.

        Raises:
            CaffeError: unreadable or malformed file.
        """
        try:
            with open(path) as f:
                d = json.load(f)
            return cls(d["algorithms"], d.get("branching", 2))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CaffeError(f"cost model '{path}': cannot read it ({exc})") from None


def fit_alpha_beta(results_json, branching=2, stat="seconds"):
    """:meth:`AlphaBetaModel.fit` on a ``tools/bench_allreduce.py`` results.json path."""
    with open(results_json) as f:
        d = json.load(f)
    return AlphaBetaModel.fit(d["rows"] if isinstance(d, dict) else d, branching, stat=stat)


def firecaffe_comm_time(algorithm, nbytes, procs, bandwidth):
    """FireCaffe's section-4 formulas: ps ``|W| P / BW``, tree ``2 |W| log2(P) / BW`` (s)."""
    if procs <= 1:
        return 0.0
    if algorithm == "ps":
        return nbytes * procs / bandwidth
    if algorithm == "tree":
        return 2.0 * nbytes * math.log2(procs) / bandwidth
    raise CaffeError(f"FireCaffe's model covers 'ps' and 'tree', not '{algorithm}'")


# --------------------------------------------------------------------------------------------
# Link model: alpha and beta of the links, each algorithm's schedule as our code runs it
# --------------------------------------------------------------------------------------------
#: Algorithms :func:`link_schedule` knows.
LINK_ALGORITHMS = ("tree", "ring", "ps", "mpi")
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


def _stage(transfers, ranks_per_host, messages=1):
    """One stage: concurrent ``transfers`` [(src, dst, bytes)], ``messages`` alphas in series."""
    inter, intra = _stage_loads(transfers, ranks_per_host)
    return {"messages": float(messages), "inter": inter, "intra": intra}


def _tree_schedule(nbytes, p, rph, branching, chunk_bytes, lag):
    from .tree import tree_children, tree_depth, tree_level
    count = int(nbytes) // 4
    nchunks = len(chunk_bounds(count, max(1, int(chunk_bytes) // 4))) or 1
    c = float(nbytes) / nchunks
    d = tree_depth(p, branching)
    lag = 2 * d + 1 if lag is None else int(lag)
    edges = [(child, r) for r in range(p) for child in tree_children(r, p, branching)]
    up_hops = [_stage([(ch, par, c) for ch, par in edges if tree_level(ch, branching) == lvl],
                      rph) for lvl in range(d, 0, -1)]
    down_hops = [_stage([(par, ch, c) for ch, par in edges if tree_level(ch, branching) == lvl],
                        rph) for lvl in range(1, d + 1)]
    up_all = _stage([(ch, par, c) for ch, par in edges], rph)
    down_all = _stage([(par, ch, c) for ch, par in edges], rph)
    j = min(nchunks, lag + 1)
    trips = 1 + (nchunks - j)
    return ([(trips, s) for s in up_hops + down_hops]
            + [(j - 1, up_all), (j - 1, down_all)])


def _mpi_schedule(nbytes, p, rph):
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
        stages.append((1, _stage([(2 * i, 2 * i + 1, nbytes) for i in range(rem)], rph)))
    halving, mask, share = [], 1, float(nbytes)
    while mask < pof2:
        share /= 2
        halving.append(_stage([(real(nr), real(nr ^ mask), share) for nr in range(pof2)], rph))
        mask *= 2
    stages += [(1, s) for s in halving] + [(1, s) for s in reversed(halving)]
    if rem:
        stages.append((1, _stage([(2 * i + 1, 2 * i, nbytes) for i in range(rem)], rph)))
    return stages


def _hier_schedule(nbytes, p, rph, inter, chunk_bytes, branching, lanes=None):
    # hier.py: nodes are the hosts (N of K = ranks_per_host ranks), L lanes (default K; 1: the
    # paper's single leader). Per chunk (4 MiB): every rank sends slice s (c/L bytes) to the
    # node's owner of slice s over the node's intra paths (reduce-scatter), the L lanes
    # allreduce their slices across the nodes side by side (ring or tree among N, one owner per
    # host; the host's link carries all L lanes' bytes), each owner sends its slice back to the
    # node (all-gather). Every rank sends all its pieces at once and the all-gather does not
    # wait, so one chunk's intra traffic overlaps the next chunk's lanes: fill (the first
    # chunk's reduce-scatter) + m x max(the lanes' allreduce of a chunk, the intra paths'
    # reduce-scatter + all-gather of a chunk) + drain (the last chunk's all-gather).
    k = min(rph, p)
    n_nodes = -(-p // k)
    lanes = k if lanes is None else max(1, min(int(lanes), k))
    count = int(nbytes) // 4
    nchunks = len(chunk_bounds(count, max(1, int(chunk_bytes) // 4))) or 1
    c = float(nbytes) / nchunks
    piece = c / lanes
    scatter = [(j, s, piece) for j in range(k) for s in range(lanes) if s != j]
    gather = [(s, j, piece) for j, s, _ in scatter]
    fill = _stage(scatter, rph) if k > 1 else None
    drain = _stage(gather, rph) if k > 1 else None
    both = _stage(scatter + gather, rph)
    lane = (link_schedule(inter, piece, n_nodes, 1, branching, chunk_bytes)
            if n_nodes > 1 else [])
    lanes_side_by_side = [(count_, dict(stage, inter=stage["inter"] * lanes))
                          for count_, stage in lane]
    sched = [(1, fill)] if fill else []
    sched.append((nchunks, {"max": [lanes_side_by_side, [(1, both)] if k > 1 else []]}))
    if drain:
        sched.append((1, drain))
    return sched


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

    Returns [(count, stage)]: the allreduce takes ``sum(count * time(stage))``, a stage being
    {"messages", "inter", "intra"}: the alphas it costs in series, and the bytes that the
    busiest host link (one direction) and the busiest intra-node link carry in it
    (:meth:`LinkModel.stage_time`). Ranks r // ranks_per_host share a host.

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
    """
    p = int(procs)
    rph = max(1, int(ranks_per_host))
    nbytes = float(nbytes)
    if p <= 1 or nbytes <= 0:
        return []
    if algorithm == "ring":
        step = _stage([(r, (r + 1) % p, nbytes / p) for r in range(p)], rph)
        return [(2 * (p - 1), step)]
    if algorithm == "ps":
        return ([(1, _stage([(src, 0, nbytes)], rph)) for src in range(1, p)]
                + [(1, _stage([(0, dst, nbytes) for dst in range(1, p)], rph, p - 1))])
    if algorithm == "mpi":
        return _mpi_schedule(nbytes, p, rph)
    if algorithm == "tree":
        return _tree_schedule(nbytes, p, rph, branching, chunk_bytes, lag)
    base, options = parse_algorithm(algorithm)
    if base == "hier":
        inter = options.get("inter", "ring")
        if inter not in ("ring", "tree"):
            raise CaffeError(f"link model: hier's leaders use ring or tree, not '{inter}'")
        return _hier_schedule(nbytes, p, rph, inter, chunk_bytes, branching,
                              options.get("lanes"))
    raise CaffeError(f"link model: unknown algorithm '{algorithm}'; known: "
                     f"{', '.join(LINK_ALGORITHMS + ('hier',))}")


def _linear_terms(schedule, key, algorithm):
    """(alphas, bytes) in series of a schedule on one kind of path (``key``: "inter" or
    "intra"); a "max" item counts when only one of its schedules is not empty."""
    a = b = 0.0
    for count, stage in schedule:
        if "max" in stage:
            busy = [sub for sub in stage["max"] if sub]
            if len(busy) > 1:
                raise CaffeError(f"link model: '{algorithm}' is not linear in alpha and beta")
            sub = _linear_terms(busy[0], key, algorithm) if busy else (0.0, 0.0)
            a, b = a + count * sub[0], b + count * sub[1]
        else:
            a += count * stage["messages"]
            b += count * stage[key]
    return a, b


def link_terms(algorithm, nbytes, procs, branching=2, chunk_bytes=TREE_CHUNK_BYTES, lag=None,
               one_host=False):
    """(A, B) with ``time = alpha * A + beta * B`` when every rank has a host of its own (one
    kind of link): A the alphas in series, B the bytes in series through the busiest links.
    ``one_host``: all ranks on one host instead (then alpha_intra and beta_intra)."""
    rph = int(procs) if one_host else 1
    return _linear_terms(link_schedule(algorithm, nbytes, procs, rph, branching, chunk_bytes,
                                       lag), "intra" if one_host else "inter", algorithm)


class LinkModel:
    """One alpha and one beta for the links, the same for every algorithm; the algorithms
    differ only in their schedules (:func:`link_schedule`).

    Args:
        alpha: seconds per message (latency and per-message software cost) between hosts.
        beta: seconds per byte on a host link, one direction (8 / bits per s of payload).
        alpha_intra, beta_intra: the same within a host (the nodes topology's loopback, or
            shared memory); default: alpha and 0 (free).
        ranks_per_host: ranks r // ranks_per_host share a host (when predict is not told).
        branching, chunk_bytes, lag: the tree communicator's options.
        source: free text saying what the parameters were fitted on.
    """

    def __init__(self, alpha, beta, alpha_intra=None, beta_intra=0.0, ranks_per_host=1,
                 branching=2, chunk_bytes=TREE_CHUNK_BYTES, lag=None, source=""):
        self.alpha, self.beta = float(alpha), float(beta)
        self.alpha_intra = self.alpha if alpha_intra is None else float(alpha_intra)
        self.beta_intra = float(beta_intra)
        self.ranks_per_host = int(ranks_per_host)
        self.branching, self.chunk_bytes, self.lag = int(branching), int(chunk_bytes), lag
        self.source = source

    def stage_time(self, stage):
        """``messages * alpha + max(inter * beta, intra * beta_intra)`` (alpha_intra for a stage
        that stays within the hosts)."""
        alpha = self.alpha if stage["inter"] > 0 or stage["intra"] <= 0 else self.alpha_intra
        return (stage["messages"] * alpha
                + max(stage["inter"] * self.beta, stage["intra"] * self.beta_intra))

    def schedule(self, algorithm, nbytes, procs, ranks_per_host=None):
        rph = self.ranks_per_host if ranks_per_host is None else ranks_per_host
        return link_schedule(algorithm, nbytes, procs, rph, self.branching, self.chunk_bytes,
                             self.lag)

    def schedule_time(self, schedule):
        """Seconds of a :func:`link_schedule` list."""
        total = 0.0
        for count, stage in schedule:
            if "max" in stage:
                total += count * max([self.schedule_time(s) for s in stage["max"]] or [0.0])
            else:
                total += count * self.stage_time(stage)
        return total

    def predict(self, algorithm, nbytes, procs, ranks_per_host=None):
        """Seconds for one allreduce of ``nbytes`` on ``procs`` ranks (ranks r //
        ranks_per_host share a host; default: the model's)."""
        return self.schedule_time(self.schedule(algorithm, nbytes, procs, ranks_per_host))

    @classmethod
    def fit(cls, rows, procs=None, algorithms=None, min_bytes=0, stat="seconds", relative=True,
            **options):
        """Least squares (non-negative; relative error by default) of one alpha and one beta
        on benchmark rows of one-rank-per-host labs with one link rate.

        Args:
            rows: results.json "rows" (with ``"netlab"`` settings, or plain).
            procs, algorithms: use only the rows of these P / algorithms (default: all).
            min_bytes: use only the rows of at least this many bytes (on netlab's links a
                message below ~1 MiB partly rides the token bucket's burst, and with more
                ranks than cores a small one waits for the scheduler, not for the link).
            stat: "seconds" (median of the repetitions) or "min_seconds".
            **options: ``branching``, ``chunk_bytes``, ``lag`` of the tree (and the model).

        Raises:
            CaffeError: no usable row, or rows of several link rates.
        """
        use = []
        for r in rows:
            lab = r.get("netlab") or {}
            if int(r["procs"]) <= 1 or int(lab.get("ranks_per_host", 1)) != 1:
                continue
            if procs is not None and int(r["procs"]) not in set(procs):
                continue
            if algorithms is not None and r["algorithm"] not in set(algorithms):
                continue
            if r["bytes"] < min_bytes or r["algorithm"] not in LINK_ALGORITHMS:
                continue
            use.append(r)
        if not use:
            raise CaffeError("link model: no rows to fit (one rank per host, P > 1, "
                             f"algorithms {', '.join(LINK_ALGORITHMS)}, at least {min_bytes} "
                             "bytes)")
        rates = {(r.get("netlab") or {}).get("link") for r in use}
        if len(rates) > 1:
            raise CaffeError(f"link model: rows of several link rates {sorted(map(str, rates))};"
                             " fit each on its own")
        keys = ("branching", "chunk_bytes", "lag")
        sched = {k: options[k] for k in keys if k in options}
        terms = numpy.array([link_terms(r["algorithm"], r["bytes"], r["procs"], **sched)
                             for r in use], float)
        t = numpy.array([r.get(stat, r["seconds"]) for r in use], float)
        w = 1.0 / numpy.maximum(t, 1e-9) if relative else numpy.ones_like(t)
        alpha, beta = _nnls2(terms * w[:, None], t * w)
        source = (f"{len(use)} rows: {', '.join(sorted({r['algorithm'] for r in use}))} at P = "
                  f"{', '.join(str(p) for p in sorted({int(r['procs']) for r in use}))}, "
                  f"{human_bytes(min(r['bytes'] for r in use))}.."
                  f"{human_bytes(max(r['bytes'] for r in use))} ({stat})")
        return cls(alpha, beta, source=source, **options)

    def fit_intra(self, rows, algorithms=None, min_bytes=0, stat="seconds", relative=True):
        """Fit ``alpha_intra`` and ``beta_intra`` (in place; returns self) on the rows of runs
        with every rank on one host (``"netlab"``: hosts 1), e.g. tools/bench_allreduce.py
        --netlab --procs 4 --ranks-per-host 4: the intra-node paths alone, as the machine runs
        them (on 2 cores, 4 ranks share them).

        Raises:
            CaffeError: no such row.
        """
        use = [r for r in rows
               if int(r["procs"]) > 1 and int((r.get("netlab") or {}).get("hosts", 0)) == 1
               and r["bytes"] >= min_bytes
               and parse_algorithm(r["algorithm"])[0] in LINK_ALGORITHMS + ("hier",)
               and (algorithms is None or r["algorithm"] in set(algorithms))]
        if not use:
            raise CaffeError("link model: no one-host rows to fit the intra-node paths on")
        terms = [_linear_terms(self.schedule(r["algorithm"], r["bytes"], r["procs"],
                                             r["procs"]), "intra", r["algorithm"])
                 for r in use]
        terms = numpy.array(terms, float)
        t = numpy.array([r.get(stat, r["seconds"]) for r in use], float)
        w = 1.0 / numpy.maximum(t, 1e-9) if relative else numpy.ones_like(t)
        self.alpha_intra, self.beta_intra = (float(v) for v in _nnls2(terms * w[:, None], t * w))
        self.source += ("; " if self.source else "") + (
            f"intra-node: {len(use)} one-host rows ("
            f"{', '.join(sorted({r['algorithm'] for r in use}))} at P = "
            f"{', '.join(str(p) for p in sorted({int(r['procs']) for r in use}))})")
        return self

    def to_dict(self):
        return {"alpha": self.alpha, "beta": self.beta, "alpha_intra": self.alpha_intra,
                "beta_intra": self.beta_intra, "ranks_per_host": self.ranks_per_host,
                "branching": self.branching, "chunk_bytes": self.chunk_bytes, "lag": self.lag,
                "source": self.source}

    def save(self, path):
        _save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save` (CaffeError when unreadable)."""
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError) as exc:
            raise CaffeError(f"link model '{path}': cannot read it ({exc})") from None


def compressed_schedule(method, nbytes, procs, density=0.001, branching=2, algorithm="tree",
                        **options):
    """The :func:`link_schedule` of one bucket's sum of ``nbytes`` (float32 gradients) under
    ``--comm_compress method`` (caffe_engine/comm/compress.py), one rank per host.

    - ``none``: the dense allreduce ``algorithm``'s own schedule (default tree).
    - ``fp16``: the binary heap tree, whole bucket per message (no chunk pipelining): up, level
      by level from the deepest, each parent receiving its children's n/2 bytes at once through
      its link in; then down, each parent sending to its children at once through its link out.
      2 depth stages.
    - ``gtopk``: the same tree with a sparse set of 8 k bytes per message (k = ceil(density *
      n/4), ``compress.k_for``): 2 depth stages of alpha + (children) 8 k beta. (Shi et al.'s
      form 2 log2(P) (alpha + 8 k beta) counts one message per step.)
    - ``topk``: one all-to-all stage: every rank sends its 8 k bytes to the P - 1 others and
      receives theirs; (P - 1) 8 k bytes through every link each way, P - 1 alphas.

    The selection's CPU time is not in it (see tools/scaling_check.py --link_model)."""
    from .compress import ENTRY_BYTES, METHODS, k_for
    from .tree import tree_children, tree_depth, tree_level
    if method not in METHODS:
        raise CaffeError(f"compressed schedule: method must be one of {', '.join(METHODS)}, "
                         f"got '{method}'")
    p = int(procs)
    if p <= 1:
        return []
    if method == "none":
        return link_schedule(algorithm, nbytes, p, 1, branching, **options)
    count = int(nbytes) // 4
    if method == "topk":
        m = ENTRY_BYTES * k_for(count, density)
        return [(1, _stage([(s, d, m) for s in range(p) for d in range(p) if s != d], 1,
                           messages=p - 1))]
    m = float(nbytes) / 2 if method == "fp16" else ENTRY_BYTES * k_for(count, density)
    edges = [(child, r) for r in range(p) for child in tree_children(r, p, branching)]
    d = tree_depth(p, branching)
    up = [_stage([(ch, par, m) for ch, par in edges if tree_level(ch, branching) == lvl], 1)
          for lvl in range(d, 0, -1)]
    down = [_stage([(par, ch, m) for ch, par in edges if tree_level(ch, branching) == lvl], 1)
            for lvl in range(1, d + 1)]
    return [(1, s) for s in up + down]


def compressed_allreduce_time(method, nbytes, procs, model, density=0.001, algorithm="tree"):
    """Seconds for one bucket's sum of ``nbytes`` on ``procs`` ranks, one per host, under
    ``--comm_compress method`` with the links of ``model`` (a :class:`LinkModel`):
    :func:`compressed_schedule` timed by :meth:`LinkModel.schedule_time`. ``none`` is
    ``model.predict(algorithm, nbytes, procs, 1)``. Communication only: no selection CPU time,
    no overlap with backward."""
    if method == "none":
        return model.predict(algorithm, nbytes, procs, 1) if int(procs) > 1 else 0.0
    return model.schedule_time(compressed_schedule(method, nbytes, procs, density,
                                                   model.branching))


def human_bytes(nbytes):
    """``33554432`` -> ``"32 MiB"``."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{int(nbytes)} B"


def link_report(model, rows, stat="seconds", sizes=None):
    """Markdown: the model's parameters, then measured against predicted for every row (one
    with a ``"netlab"`` setting is predicted on its own hosts: its ranks_per_host)."""
    lines = [f"Link model: alpha = {model.alpha * 1e6:.1f} us, beta = {model.beta * 1e9:.3f} "
             f"ns/byte (1/beta = {8 / model.beta / 1e6 if model.beta else float('inf'):.0f} "
             f"Mbit/s)" + (f"; intra-node alpha = {model.alpha_intra * 1e6:.1f} us, beta = "
                           f"{model.beta_intra * 1e9:.3f} ns/byte" if model.beta_intra else "")
             + (f"; fitted on {model.source}" if model.source else ""), "",
             "| algorithm | P | hosts x ranks | size | measured ms | predicted ms | "
             "measured / predicted |", "|---|---|---|---|---|---|---|"]
    order = {a: i for i, a in enumerate(LINK_ALGORITHMS)}
    key = (lambda r: (order.get(r["algorithm"], 99), r["algorithm"], r["procs"], r["bytes"]))
    for r in sorted(rows, key=key):
        if sizes is not None and r["bytes"] not in sizes:
            continue
        lab = r.get("netlab") or {}
        rph = int(lab.get("ranks_per_host", model.ranks_per_host))
        t = r.get(stat, r["seconds"])
        if (r["algorithm"] == "mpi" and rph > 1 and lab.get("intra") == "shm"
                and r["procs"] > rph):
            # MPICH sees the hosts as nodes and composes its allreduce node by node
            # (MPIDI_Allreduce_intra_composition_alpha): not modelled.
            lines.append(f"| mpi | {r['procs']} | {r['procs'] // rph} x {rph} | "
                         f"{human_bytes(r['bytes'])} | {t * 1e3:.2f} | - | - |")
            continue
        try:
            pred = model.predict(r["algorithm"], r["bytes"], r["procs"], rph)
        except CaffeError:
            continue
        ratio = f"{t / pred:.2f}" if pred > 0 else "-"
        lines.append(f"| {r['algorithm']} | {r['procs']} | {r['procs'] // rph} x {rph} | "
                     f"{human_bytes(r['bytes'])} | {t * 1e3:.2f} | {pred * 1e3:.2f} | {ratio} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Iteration time and speedup
# --------------------------------------------------------------------------------------------
def _layers(layer_times):
    items = list(layer_times.items()) if hasattr(layer_times, "items") else list(layer_times)
    return [(name, float(t[0]), float(t[1])) for name, t in items]


def iteration_time(layer_times, param_bytes, comm_time, overlap=False, bucket_mb=25.0):
    """Seconds of one training iteration on one worker of P.

    Args:
        layer_times: {layer name: (forward s, backward s)} in layer order (or a list of pairs).
        param_bytes: {layer name: bytes of that layer's param gradients} (missing: 0).
        comm_time: function bytes -> seconds of one allreduce at this P (0 for P = 1).
        overlap: reduce buckets during backward (True) or everything after it (False).
        bucket_mb: bucket cap for the overlapped schedule (as :class:`~.buckets.GradientSync`).

    Returns:
        dict: forward, backward, comm (the allreduce time in total), exposed (the part of it not
        hidden behind backward), total.
    """
    layers = _layers(layer_times)
    fwd = sum(f for _, f, _ in layers)
    bwd = sum(b for _, _, b in layers)
    total_bytes = sum(float(param_bytes.get(n, 0)) for n, _, _ in layers)
    if not overlap:
        comm = comm_time(total_bytes) if total_bytes else 0.0
        return {"forward": fwd, "backward": bwd, "comm": comm, "exposed": comm,
                "total": fwd + bwd + comm}
    # Backward runs the layers last to first; layer i's gradients are final when it is done.
    done_at, t = {}, 0.0
    for i in range(len(layers) - 1, -1, -1):
        t += layers[i][2]
        done_at[i] = t
    counts = [float(param_bytes.get(n, 0)) / 4 for n, _, _ in layers]
    with_params = [i for i in range(len(layers)) if counts[i] > 0]
    groups = plan_buckets([counts[i] for i in with_params], with_params,
                          int(float(bucket_mb) * (1 << 20)))
    wire_free, comm_sum = 0.0, 0.0
    for group in groups:
        layer_ids = [with_params[k] for k in group]
        ready = done_at[min(layer_ids)]
        nbytes = 4 * sum(counts[i] for i in layer_ids)
        c = comm_time(nbytes)
        comm_sum += c
        wire_free = max(wire_free, ready) + c
    end = max(bwd, wire_free)
    return {"forward": fwd, "backward": bwd, "comm": comm_sum, "exposed": end - bwd,
            "total": fwd + end}


def predict_speedup(layer_times, param_bytes, comm_time_at, procs, overlap=False, bucket_mb=25.0):
    """Weak-scaling speedup ``P * T(1) / T(P)`` for each P in ``procs``.

    Args:
        comm_time_at: function (bytes, P) -> seconds, e.g.
            ``lambda n, p: model.predict("tree", n, p)``.

    Returns:
        {P: speedup}
    """
    layers = _layers(layer_times)
    t1 = sum(f + b for _, f, b in layers)
    out = {}
    for p in procs:
        it = iteration_time(layer_times, param_bytes, lambda n, p=p: comm_time_at(n, p),
                            overlap=overlap, bucket_mb=bucket_mb)
        out[p] = p * t1 / it["total"] if it["total"] > 0 else float(p)
    return out


def uniform_layers(total_compute_s, gradient_bytes, num_layers=20, backward_share=2 / 3):
    """A synthetic net for what-if studies: ``num_layers`` layers of equal compute and equal
    gradient size, backward taking ``backward_share`` of the compute (about 2/3 in CNNs).

    Returns:
        (layer_times, param_bytes) for :func:`iteration_time`.
    """
    f = total_compute_s * (1 - backward_share) / num_layers
    b = total_compute_s * backward_share / num_layers
    names = [f"layer{i}" for i in range(num_layers)]
    return ({n: (f, b) for n in names}, {n: gradient_bytes / num_layers for n in names})


# --------------------------------------------------------------------------------------------
# FireCaffe's setting (docs/scaling.md)
# --------------------------------------------------------------------------------------------
IMAGENET_TRAIN_IMAGES = 1281167

# Inputs as used in docs/scaling.md. The gradient sizes (GoogLeNet 53 MB with its auxiliary
# heads, NiN 30 MB) agree with the param counts real Caffe reports for these nets
# (shared/realworld/reference/shapes); the 47x / 39x speedups are the paper's abstract; the
# single-GPU baselines (K20, Caffe) are the paper's tables as we read them, not re-checked here.
# Per-GPU batch: 1024 images over 128 GPUs = 8.
FIRECAFFE_NETS = {
    "GoogLeNet": {"gradient_bytes": 53e6, "baseline_days": 21.0, "epochs": 64,
                  "paper_speedup_128": 47.0},
    "NiN": {"gradient_bytes": 30e6, "baseline_days": 5.8, "epochs": 47,
            "paper_speedup_128": 39.0},
}


def firecaffe_prediction(net, procs=128, global_batch=1024, bandwidth=6e9, algorithm="tree",
                         overlap=False, num_layers=20):
    """Predicted speedup of FireCaffe's run of ``net`` ("GoogLeNet" or "NiN") on ``procs`` GPUs.

    Compute per image comes from the single-GPU baseline (days / (epochs * images)); each GPU
    processes ``global_batch / procs`` images per iteration; communication follows FireCaffe's
    formula for ``algorithm`` at ``bandwidth`` bytes/s; with ``overlap`` the gradients are
    spread evenly over ``num_layers`` layers and reduced in buckets during backward.

    Returns:
        dict: compute_s, comm_s, speedup, and implied_bandwidth (the bandwidth at which the
        non-overlapped model gives the paper's speedup).
    """
    spec = FIRECAFFE_NETS[net]
    per_image = spec["baseline_days"] * 86400 / (spec["epochs"] * IMAGENET_TRAIN_IMAGES)
    compute = per_image * global_batch / procs
    nbytes = spec["gradient_bytes"]
    comm = firecaffe_comm_time(algorithm, nbytes, procs, bandwidth)
    layers, grads = uniform_layers(compute, nbytes, num_layers)
    it = iteration_time(layers, grads, lambda n: firecaffe_comm_time(algorithm, n, procs,
                                                                      bandwidth),
                        overlap=overlap, bucket_mb=25.0)
    speedup = procs * compute / it["total"]
    target = spec["paper_speedup_128"]
    # procs * compute / (compute + c) = target  ->  c = compute * (procs / target - 1)
    needed_comm = compute * (procs / target - 1)
    implied = firecaffe_comm_time(algorithm, nbytes, procs, 1.0) / needed_comm
    return {"compute_s": compute, "comm_s": comm, "speedup": speedup,
            "implied_bandwidth": implied}


def _loopback_rate(results):
    """Median of the loopback streams (bits/s) a results.json's labs measured, or None."""
    runs = results.get("runs") or [] if isinstance(results, dict) else []
    rates = [lab["stream_loopback_bits_per_s"] for run in runs for lab in run.get("labs", [])
             if lab.get("stream_loopback_bits_per_s")]
    return float(numpy.median(rates)) if rates else None


def _main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Fit the alpha-beta model; FireCaffe predictions.")
    ap.add_argument("--fit", help="results.json of tools/bench_allreduce.py")
    ap.add_argument("--save", help="write the fitted model here (JSON)")
    ap.add_argument("--stat", default="seconds", choices=["seconds", "min_seconds"],
                    help="fit the median (default) or the fastest repetition")
    ap.add_argument("--fit-links", metavar="RESULTS",
                    help="fit the link model (one alpha, one beta) on a results.json of "
                         "tools/bench_allreduce.py --netlab and print measured against predicted")
    ap.add_argument("--fit-procs", type=int, nargs="+", help="fit on the rows of these P only")
    ap.add_argument("--fit-min-bytes", type=int, default=0,
                    help="fit on the rows of at least this many bytes only")
    ap.add_argument("--links-model", metavar="JSON",
                    help="with --report: a saved link model instead of fitting")
    ap.add_argument("--report", metavar="RESULTS",
                    help="measured against --links-model's predictions for these rows")
    ap.add_argument("--intra-bandwidth", type=float,
                    help="bits/s within a host for the link model (default: the loopback "
                         "stream the results measured; shared memory: free)")
    ap.add_argument("--save-links", help="write the fitted link model here (JSON)")
    ap.add_argument("--firecaffe", action="store_true", help="print FireCaffe predictions")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[1e9, 2.5e9, 6e9, 10e9])
    args = ap.parse_args(argv)
    if args.fit:
        model = fit_alpha_beta(args.fit, stat=args.stat)
        print("| algorithm | alpha (us) | beta (ns/byte) | 1/beta (GB/s) |")
        print("|---|---|---|---|")
        for alg, p in sorted(model.params.items()):
            bw = 1 / p["beta"] / 1e9 if p["beta"] > 0 else float("inf")
            print(f"| {alg} | {p['alpha'] * 1e6:.1f} | {p['beta'] * 1e9:.3f} | {bw:.2f} |")
        if args.save:
            model.save(args.save)
    if args.fit_links or args.report:
        path = args.fit_links or args.report
        with open(path) as f:
            d = json.load(f)
        rows = d["rows"] if isinstance(d, dict) else d
        if args.fit_links:
            model = LinkModel.fit(rows, procs=args.fit_procs, min_bytes=args.fit_min_bytes,
                                  stat=args.stat)
        elif args.links_model:
            model = LinkModel.load(args.links_model)
        else:
            raise CaffeError("--report needs --links-model (or use --fit-links)")
        intra = args.intra_bandwidth or _loopback_rate(d)
        if intra:
            model.beta_intra = 8.0 / intra
        if args.save_links:
            model.save(args.save_links)
        print(link_report(model, rows, stat=args.stat))
    if args.firecaffe:
        print("| net | BW (GB/s) | compute/iter (ms) | ps: comm ms, speedup | "
              "tree: comm ms, speedup | tree + overlap: speedup | paper |")
        print("|---|---|---|---|---|---|---|")
        for net, spec in FIRECAFFE_NETS.items():
            for bw in args.bandwidths:
                ps = firecaffe_prediction(net, bandwidth=bw, algorithm="ps")
                tr = firecaffe_prediction(net, bandwidth=bw, algorithm="tree")
                ov = firecaffe_prediction(net, bandwidth=bw, algorithm="tree", overlap=True)
                print(f"| {net} | {bw / 1e9:g} | {tr['compute_s'] * 1e3:.0f} | "
                      f"{ps['comm_s'] * 1e3:.0f}, {ps['speedup']:.1f}x | "
                      f"{tr['comm_s'] * 1e3:.0f}, {tr['speedup']:.1f}x | {ov['speedup']:.1f}x | "
                      f"{spec['paper_speedup_128']:g}x |")
            tr = firecaffe_prediction(net, algorithm="tree")
            print(f"| {net} | implied by the paper: {tr['implied_bandwidth'] / 1e9:.2f} GB/s | | | "
                  f"| | |")


if __name__ == "__main__":
    _main()
