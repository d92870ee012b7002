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
the rows of ``tools/bench_allreduce.py``'s results.json. FireCaffe's own formulas (section 4 of
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
from .tree import ceil_log

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
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1, sort_keys=True)

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


def _main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Fit the alpha-beta model; FireCaffe predictions.")
    ap.add_argument("--fit", help="results.json of tools/bench_allreduce.py")
    ap.add_argument("--save", help="write the fitted model here (JSON)")
    ap.add_argument("--stat", default="seconds", choices=["seconds", "min_seconds"],
                    help="fit the median (default) or the fastest repetition")
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
