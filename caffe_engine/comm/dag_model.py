"""Shi et al.'s DAG view of one synchronous-SGD iteration: WFBP, MG-WFBP, no overlap, buckets.

Shi, Wang, Chu and Li, "A DAG model of synchronous stochastic gradient descent in distributed
deep learning" (arXiv:1805.03812), and Shi, Chu and Li, "MG-WFBP: efficient data communication
for distributed synchronous SGD algorithms" (arXiv:1811.11141; its problem formulation, read
here from the abstract and introduction only, section numbers not checked): an iteration is a
DAG of tasks. Forward runs first (one task); then the per-layer backward tasks run in sequence,
last layer first; the communication task of a layer (or of a merged group of layers) starts when
the backward task of its lowest layer has ended *and* the previous communication task has ended
(one message on the wire at a time); the update waits for the last one. So

    iteration time = forward + max(end of backward, end of the last communication)

and the schedules differ only in how the layers are grouped into messages:

* ``none``     no overlap: one message of every gradient after the whole backward (FireCaffe,
               Caffe's P2PSync);
* ``wfbp``     wait-free backpropagation: one message per layer with params (Poseidon's WFBP,
               the baseline MG-WFBP compares against);
* ``mgwfbp``   merged-gradient WFBP: the grouping whose last message ends first, solved exactly
               (:func:`.bucket_plan.optimal_groups`; the paper's theorem-based merge rule is
               ``mgwfbp_rule``, :func:`.bucket_plan.merge_rule_groups`);
* ``bucketsX`` fixed-size buckets of X MiB (what ``--bucket_mb X`` does,
               :func:`.bucket_plan.size_groups`).

The timing of a grouping is :func:`.bucket_plan.simulate`; this module only supplies its inputs:

* per-layer backward seconds: FLOP shares of the layers read from the shapes real BVLC Caffe
  built for the net (``shared/realworld/reference/shapes``; a convolution's forward costs
  2 x weights x output pixels multiply-adds per image, an inner product 2 x weights; backward
  twice that, once for the weight gradient and once for the bottom gradient, except the bottom
  gradient of the first layer, which Caffe skips), scaled to a per-image compute time taken
  from a paper; or measured per layer by ``caffe time`` (:func:`caffe_time_profile`).
  Param-less layers (ReLU, pooling, LRN) cost nothing in the FLOP view (FireCaffe section 8:
  over 90 % of the FLOPs are in convolutions); measured, their time is added to the next layer
  with params, as :func:`.bucket_plan.backward_profile` does;
* per-message cost ``alpha_eff + beta_eff * bytes`` (:func:`allreduce_terms`): Hockney's model
  with each algorithm's A(P), B(P) from :func:`.cost_model.shape_terms` (tree, ring, ps, mpi,
  any P), the hierarchical allreduce below, or the link model's schedules fitted on the emulated
  network (:func:`link_terms`, one message up to the tree's 4 MiB chunk).

``python -m caffe_engine.comm.dag_model --firecaffe | --four-minutes | --netlab`` prints the
tables of docs/scaling.md.
"""
import json
import math
import os

import numpy

from .bucket_plan import backward_profile, merge_rule_groups, optimal_groups, simulate, \
    size_groups
from .cost_model import IMAGENET_TRAIN_IMAGES, LinkModel, link_terms as _link_terms, shape_terms

MODES = ("none", "wfbp", "mgwfbp", "mgwfbp_rule", "buckets25")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = os.path.join(os.path.dirname(ROOT), "shared", "realworld", "reference", "shapes")
NETLAB = os.path.join(ROOT, "docs", "bench", "netlab")


# --------------------------------------------------------------------------------------------
# Per-message cost of one allreduce
# --------------------------------------------------------------------------------------------
def allreduce_terms(algorithm, procs, alpha, beta, gpus_per_node=1, alpha_intra=None,
                    beta_intra=0.0, intra="chain", branching=2):
    """(alpha_eff s, beta_eff s/byte): one allreduce of n bytes on ``procs`` ranks costs
    ``alpha_eff + beta_eff * n``.

    ``tree``, ``ring``, ``ps``, ``mpi``: ``alpha * A(P)``, ``beta * B(P)`` of
    :func:`.cost_model.shape_terms` (the tree is FireCaffe's section-4 formula, 2 ceil(log_k P)
    unpipelined hops; the ring 2 (P - 1) steps of n/P).

    ``hier`` (Jia et al. 2018, "hierarchical all-reduce"; docs/scaling.md, "Hierarchical
    allreduce"): N = ceil(P / K) nodes of K = ``gpus_per_node`` ranks; reduce within each node to
    its leader, ring allreduce among the N leaders (2 (N - 1) steps of n/N over the network,
    ``alpha``/``beta``), broadcast within the node (``alpha_intra``/``beta_intra``, default
    ``alpha`` and free). The two intra-node phases cost, each:

    * ``intra="chain"``: a pipelined chain (NCCL's reduce and broadcast), (K - 1) alpha_intra +
      n beta_intra;
    * ``intra="lanes"``: our hier.py's default for one chunk, a reduce-scatter (and an
      all-gather) in which every rank sends and receives K - 1 slices of n/K at once,
      alpha_intra + (K - 1)/K n beta_intra;
    * ``intra="leader"``: the leader receives the K - 1 buffers one after another (hier.py with
      ``lanes=1``, the paper's single leader, for one chunk), (K - 1)(alpha_intra + n
      beta_intra).

    Returns (0, 0) for one rank.
    """
    p = int(procs)
    if p <= 1:
        return 0.0, 0.0
    if algorithm != "hier":
        a, b = shape_terms(algorithm, p, branching)
        return alpha * a, beta * b
    k = max(1, min(int(gpus_per_node), p))
    n = -(-p // k)
    a_l = alpha if alpha_intra is None else alpha_intra
    if k == 1:
        intra_a = intra_b = 0.0
    elif intra == "chain":
        intra_a, intra_b = 2 * (k - 1) * a_l, 2 * beta_intra
    elif intra == "lanes":
        intra_a, intra_b = 2 * a_l, 2 * (k - 1) / k * beta_intra
    elif intra == "leader":
        intra_a, intra_b = 2 * (k - 1) * a_l, 2 * (k - 1) * beta_intra
    else:
        raise ValueError(f"intra must be 'chain', 'lanes' or 'leader', not {intra!r}")
    ring_a, ring_b = (2 * (n - 1) * alpha, 2 * (n - 1) / n * beta) if n > 1 else (0.0, 0.0)
    return intra_a + ring_a, intra_b + ring_b


def link_terms(model, algorithm, procs, nbytes=1 << 20):
    """(alpha_eff, beta_eff) of ``algorithm`` on a fitted :class:`.cost_model.LinkModel`, one
    rank per host: the schedule's alphas and bytes in series at ``nbytes`` (linear in n while a
    message is one tree chunk, 4 MiB; every message of the nets measured here is smaller)."""
    if procs <= 1:
        return 0.0, 0.0
    a, b = _link_terms(algorithm, nbytes, procs, model.branching, model.chunk_bytes, model.lag)
    return model.alpha * a, model.beta * b / nbytes


# --------------------------------------------------------------------------------------------
# The DAG
# --------------------------------------------------------------------------------------------
def groups_for(mode, backward_s, nbytes, alpha, beta):
    """The messages of ``mode`` (see the module docstring): lists of positions in backward
    order, via :mod:`.bucket_plan`."""
    n = len(backward_s)
    if mode == "none":
        return [list(range(n))] if n else []
    if mode == "wfbp":
        return [[k] for k in range(n)]
    if mode == "mgwfbp":
        return optimal_groups(backward_s, nbytes, alpha, beta)
    if mode == "mgwfbp_rule":
        return merge_rule_groups(backward_s, nbytes, alpha, beta)
    if mode.startswith("buckets"):
        return size_groups(nbytes, int(float(mode[len("buckets"):]) * (1 << 20)))
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


def iteration(forward_s, backward_s, nbytes, alpha, beta, mode="mgwfbp"):
    """One iteration on the DAG (MG-WFBP's model): forward, then backward layer by layer with
    each message starting when its lowest layer's backward and the previous message have ended.

    Args:
        forward_s: seconds of the whole forward pass.
        backward_s: seconds of backward of each layer with params, in backward order (last
            layer first).
        nbytes: gradient bytes of each of those layers.
        alpha, beta: per-message seconds and per-byte seconds of one allreduce (alpha_eff and
            beta_eff of :func:`allreduce_terms`).
        mode: "none", "wfbp", "mgwfbp", "mgwfbp_rule" or "bucketsX" (X MiB).

    Returns:
        dict: forward, backward, comm_end (from the start of backward), messages, exposed
        (communication not hidden behind backward), total (seconds).
    """
    groups = groups_for(mode, backward_s, nbytes, alpha, beta)
    bwd, comm_end = simulate(groups, backward_s, nbytes, alpha, beta)
    end = max(bwd, comm_end)
    return {"forward": float(forward_s), "backward": bwd, "comm_end": comm_end,
            "messages": len(groups), "exposed": end - bwd, "total": float(forward_s) + end}


# --------------------------------------------------------------------------------------------
# Per-layer profiles
# --------------------------------------------------------------------------------------------
class Profile:
    """A net's layers with params in backward order: names, backward shares (summing to the
    backward share of the compute), gradient elements; plus the forward share.

    ``seconds(per_image_s, batch)`` gives (forward_s, [backward_s per layer]) for a per-image
    training compute time (forward + backward) and a per-GPU batch.
    """

    def __init__(self, names, bwd_weights, fwd_weight, elements, source=""):
        total = float(sum(bwd_weights)) + float(fwd_weight)
        self.names = list(names)
        self.bwd_share = [w / total for w in bwd_weights]
        self.fwd_share = float(fwd_weight) / total
        self.elements = [int(e) for e in elements]
        self.source = source

    def seconds(self, per_image_s, batch):
        t = per_image_s * batch
        return t * self.fwd_share, [t * s for s in self.bwd_share]

    def nbytes(self, bytes_per_element=4):
        return [e * bytes_per_element for e in self.elements]

    @property
    def params(self):
        return sum(self.elements)


def _classes(shape, layer_type, classes):
    if classes and layer_type == "InnerProduct" and shape and shape[0] == classes[0]:
        return [classes[1]] + list(shape[1:])
    if classes and layer_type == "InnerProduct" and len(shape) == 1 and shape[0] == classes[0]:
        return [classes[1]]
    return list(shape)


def shapes_profile(path, classes=None):
    """:class:`Profile` from a BVLC Caffe shape report (``shared/realworld/reference/shapes``).

    Per image: a Convolution's forward is 2 * prod(weight shape) * output pixels FLOPs, an
    InnerProduct's 2 * prod(weight shape); backward twice the forward (weight and bottom
    gradients), the bottom gradient skipped where the bottom is the net's input. Learnable
    elements: every param blob except BatchNorm's statistics. ``classes=(old, new)`` re-sizes the
    InnerProduct classifiers with ``old`` outputs to ``new`` (Places205's 205 -> ImageNet's 1000).
    """
    with open(path) as f:
        d = json.load(f)
    blobs = {b["name"]: b["shape"] for b in d["blobs"]}
    inputs = set(d.get("inputs") or [])
    for layer in d["layers"]:
        if layer["type"] in ("Input", "Data"):
            inputs.update(layer["tops"])
    batch = blobs[d["layers"][0]["tops"][0]][0] if d["layers"][0]["tops"] else 1
    names, fwd, bwd, elems = [], [], [], []
    for layer in d["layers"]:
        params = layer.get("params") or []
        if not params or layer["type"] == "BatchNorm":
            continue
        shapes = [_classes(s, layer["type"], classes) for s in params]
        weights = int(numpy.prod(shapes[0]))
        if layer["type"] in ("Convolution", "Deconvolution"):
            top = blobs[layer["tops"][0]]
            flops = 2.0 * weights * int(numpy.prod(top[2:]))
        elif layer["type"] == "InnerProduct":
            flops = 2.0 * weights
        else:                                  # Scale, PReLU ...: elementwise, per output
            top = blobs[layer["tops"][0]]
            flops = 2.0 * int(numpy.prod(top)) / batch
        first = all(b in inputs for b in layer["bottoms"])
        names.append(layer["name"])
        fwd.append(flops)
        bwd.append(flops * (1 if first else 2))
        elems.append(sum(int(numpy.prod(s)) for s in shapes))
    rev = slice(None, None, -1)
    return Profile(names[rev], bwd[rev], sum(fwd), elems[rev],
                   source=os.path.basename(path))


def caffe_time_profile(layer_ms, param_counts):
    """:class:`Profile` from measured per-layer times (``caffe time``).

    Args:
        layer_ms: [(layer name, forward ms, backward ms)] in layer order.
        param_counts: {layer name: learnable elements} (layers with params only).

    The backward of param-less layers is added to the next layer with params in backward order
    (:func:`.bucket_plan.backward_profile`).
    """
    names = [n for n, _, _ in layer_ms]
    ready, counts = [], []
    for i, name in enumerate(names):
        if param_counts.get(name):
            ready.append(i)
            counts.append(param_counts[name])
    layer_seconds = {i: b / 1e3 for i, (_, _, b) in enumerate(layer_ms)}
    _, grad_layers, backward_s, nbytes = backward_profile(ready, counts, layer_seconds,
                                                          len(names))
    fwd = sum(f for _, f, _ in layer_ms) / 1e3
    return Profile([names[i] for i in grad_layers], backward_s, fwd,
                   [n // 4 for n in nbytes], source="caffe time")


def speedup(profile, per_image_s, batch, procs, terms, mode, bytes_per_element=4):
    """Weak-scaling speedup ``P * T(1) / T(P)`` (T(1): compute alone) and the iteration."""
    f, b = profile.seconds(per_image_s, batch)
    it = iteration(f, b, profile.nbytes(bytes_per_element), terms[0], terms[1], mode)
    return procs * (f + sum(b)) / it["total"], it


# --------------------------------------------------------------------------------------------
# FireCaffe (arXiv:1511.00175) at 32, 64, 128 K20x GPUs on Titan
# --------------------------------------------------------------------------------------------
#: Inputs, each with its source. Per-image compute: the single-GPU Caffe baselines as
#: docs/scaling.md reads them (not re-checked: only the paper's first page and the stored
#: summary were readable). Published speedups: abstract (128 GPUs); NiN at 32 GPUs: section 7
#: ("Midsized deep models") as the stored summary shared/papers/firecaffe_1511.00175.txt gives it.
FIRECAFFE = {
    "GoogLeNet": {"shapes": "natanielruiz__net-archive__places205-googlenet__"
                            "train_val_googlenet_places205.prototxt.TRAIN.json",
                  "classes": (205, 1000), "baseline_days": 21.0, "epochs": 64,
                  "published": {128: "47x (abstract)"}},
    "NiN": {"shapes": "natanielruiz__net-archive__nin_imagenet__train_val.prototxt.TRAIN.json",
            "classes": None, "baseline_days": 5.8, "epochs": 47,
            "published": {128: "39x (abstract)",
                          32: "23x (sec. 7, batch 1024; summary)"}},
}
#: Global batch of the published runs (section 7: 1024 for the 39x / 47x).
FIRECAFFE_BATCH = 1024
#: Seconds per message: our tree's fitted alpha on shared memory (docs/bench_allreduce_model.json,
#: docs/scaling.md "Cost model"), i.e. our software's cost per message on a fast link.
DEFAULT_ALPHA = 20.7e-6


def firecaffe_rows(procs=(32, 64, 128), bandwidths=(2.5e9, 6e9), alpha=DEFAULT_ALPHA,
                   algorithms=("tree", "ring"), modes=("none", "buckets25", "wfbp", "mgwfbp")):
    """Rows (dicts) of the FireCaffe table: speedup per net, P, bandwidth, algorithm, mode."""
    rows = []
    for net, spec in FIRECAFFE.items():
        prof = shapes_profile(os.path.join(SHAPES, spec["shapes"]), spec["classes"])
        per_image = spec["baseline_days"] * 86400 / (spec["epochs"] * IMAGENET_TRAIN_IMAGES)
        for bw in bandwidths:
            for p in procs:
                batch = FIRECAFFE_BATCH // p
                for alg in algorithms:
                    terms = allreduce_terms(alg, p, alpha, 1.0 / bw)
                    row = {"net": net, "P": p, "batch": batch, "bandwidth": bw, "alg": alg,
                           "published": spec["published"].get(p, ""),
                           "params": prof.params, "compute": per_image * batch}
                    for mode in modes:
                        s, it = speedup(prof, per_image, batch, p, terms, mode)
                        row[mode] = s
                        row[mode + "_messages"] = it["messages"]
                    rows.append(row)
    return rows


def firecaffe_table(**kw):
    rows = firecaffe_rows(**kw)
    modes = [m for m in MODES if m in rows[0]]
    out = ["| net | P | batch/GPU | BW (GB/s) | algorithm | compute/iter (ms) | "
           + " | ".join(_MODE_NAMES[m] for m in modes) + " | published |",
           "|---|---|---|---|---|---|" + "---|" * len(modes) + "---|"]
    for r in rows:
        cells = " | ".join(f"{r[m]:.1f}x" + _messages(r, m) for m in modes)
        out.append(f"| {r['net']} | {r['P']} | {r['batch']} | {r['bandwidth'] / 1e9:g} | "
                   f"{r['alg']} | {r['compute'] * 1e3:.0f} | {cells} | {r['published']} |")
    return "\n".join(out)


def _messages(row, mode):
    return f" ({row[mode + '_messages']})" if mode == "mgwfbp" else ""


_MODE_NAMES = {"none": "no overlap", "buckets25": "25 MiB buckets", "wfbp": "WFBP",
               "mgwfbp": "MG-WFBP (messages)", "mgwfbp_rule": "MG-WFBP merge rule"}


# --------------------------------------------------------------------------------------------
# Jia et al. 2018 (arXiv:1807.11205), "ImageNet in four minutes", at 1024 and 2048 P40 GPUs
# --------------------------------------------------------------------------------------------
#: Published, as far as reachable here (the full text was not; see docs/scaling.md):
#: ResNet-50, 90 epochs in 6.6 min on 2048 P40 (abstract); AlexNet, 95 epochs in 4 min (abstract)
#: on 1024 P40 (the authors' GTC 2019 talk S9146 abstract). Throughput derived:
#: epochs * 1,281,167 / seconds (an end-to-end average, so a lower bound on the training rate).
#: Global batch 64K: the abstract's "up to 64k", assumed for both runs.
FOUR_MINUTES = {
    "ResNet-50": {"shapes": "KaimingHe__deep-residual-networks__prototxt__ResNet-50-deploy"
                            ".prototxt.TEST.json", "procs": 2048, "epochs": 90, "minutes": 6.6},
    "AlexNet": {"shapes": "cvjena__cnn-models__AlexNet_cvgj__deploy.prototxt.TEST.json",
                "procs": 1024, "epochs": 95, "minutes": 4.0},
}
FOUR_MINUTES_BATCH = 65536
#: Assumed (not verified from the text): 8 P40 per node on PCIe, PCIe 3.0 x16 at ~12 GB/s inside
#: a node, InfiniBand between nodes.
GPUS_PER_NODE = 8
PCIE_BYTES_S = 12e9


def published_throughput(net):
    spec = FOUR_MINUTES[net]
    return spec["epochs"] * IMAGENET_TRAIN_IMAGES / (spec["minutes"] * 60)


def implied_rate(profile, procs, batch, terms, mode, target, bytes_per_element=2):
    """Per-GPU images/s S at which the DAG gives ``target`` images/s on ``procs`` GPUs, and the
    scaling efficiency there; (None, ceiling) when even infinitely fast GPUs (compute -> 0) stay
    below ``target`` (ceiling: that limit, images/s). Bisection on S (throughput grows with S)."""
    def throughput(s):
        per_image = 1.0 / s
        _, it = speedup(profile, per_image, batch, procs, terms, mode, bytes_per_element)
        return procs * batch / it["total"], per_image * batch / it["total"]
    f0, b0 = profile.seconds(0.0, batch)
    ceiling = procs * batch / iteration(f0, b0, profile.nbytes(bytes_per_element), terms[0],
                                        terms[1], mode)["total"] if terms != (0.0, 0.0) else \
        math.inf
    if target >= ceiling:
        return None, ceiling
    lo, hi = 1e-3, 1e7
    for _ in range(48):
        mid = math.sqrt(lo * hi)
        if throughput(mid)[0] < target:
            lo = mid
        else:
            hi = mid
    s = math.sqrt(lo * hi)
    return s, throughput(s)[1]


def four_minutes_rows(link_gbit=(100.0,), alpha=DEFAULT_ALPHA,
                      algorithms=("ring", "hier", "tree"), modes=("none", "wfbp", "mgwfbp"),
                      bytes_per_element=(2,)):
    """Rows of the four-minute table: per net, published P, bandwidth, algorithm, mode, gradient
    precision: the implied per-GPU rate, the efficiency there, and the efficiency the same
    per-GPU rate gives at the other P (1024 <-> 2048)."""
    rows = []
    for net, spec in FOUR_MINUTES.items():
        prof = shapes_profile(os.path.join(SHAPES, spec["shapes"]))
        target = published_throughput(net)
        p = spec["procs"]
        other = 1024 if p == 2048 else 2048
        for gbit in link_gbit:
            beta = 8.0 / (gbit * 1e9)
            for alg in algorithms:
                for bpe in bytes_per_element:
                    for mode in modes:
                        terms = allreduce_terms(alg, p, alpha, beta, GPUS_PER_NODE, alpha,
                                                1.0 / PCIE_BYTES_S)
                        batch = FOUR_MINUTES_BATCH // p
                        s, e = implied_rate(prof, p, batch, terms, mode, target, bpe)
                        row = {"net": net, "P": p, "batch": batch, "gbit": gbit, "alg": alg,
                               "mode": mode, "bpe": bpe, "target": target,
                               "grad_mb": prof.params * bpe / 1e6, "S": s,
                               "e": e if s else None, "ceiling": None if s else e}
                        if s:
                            t2 = allreduce_terms(alg, other, alpha, beta, GPUS_PER_NODE, alpha,
                                                 1.0 / PCIE_BYTES_S)
                            b2 = FOUR_MINUTES_BATCH // other
                            sp, _ = speedup(prof, 1.0 / s, b2, other, t2, mode, bpe)
                            row.update(other=other, other_e=sp / other,
                                       other_rate=sp * s)
                        rows.append(row)
    return rows


def four_minutes_table(**kw):
    out = ["| net | P | batch/GPU | IB (Gbit/s) | algorithm | mode | gradients (MB) | "
           "published (derived) img/s | implied per-GPU img/s | predicted efficiency | "
           "same GPUs at the other P: efficiency, img/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in four_minutes_rows(**kw):
        head = (f"| {r['net']} | {r['P']} | {r['batch']} | {r['gbit']:g} | {r['alg']} | "
                f"{_MODE_NAMES[r['mode']].replace(' (messages)', '')} | {r['grad_mb']:.1f} | "
                f"{r['target']:,.0f} | ")
        if r["S"] is None:
            out.append(head + f"unreachable (ceiling {r['ceiling']:,.0f} img/s) | - | - |")
        else:
            out.append(head + f"{r['S']:.0f} | {r['e'] * 100:.1f} % | P = {r['other']}: "
                       f"{r['other_e'] * 100:.1f} %, {r['other_rate']:,.0f} |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Our emulated network: measured against the DAG
# --------------------------------------------------------------------------------------------
#: docs/bench/netlab/training/: the runs' results, and per-layer ``caffe time`` (1 BLAS thread)
NETLAB_RUNS = {
    "cifar10_quick": ("training/cifar10_quick_sweep/results.json", "cifar10_quick"),
    "nin_cifar10": ("training/nin_sweep/results.json", "nin_cifar10"),
}
LAYER_TIMES = "training/caffe_time_1thread.json"
CORES = 2


def netlab_rows(netlab=NETLAB, algorithm="tree", calibrate=True):
    """Measured iterations/s of the emulated-network runs against the DAG's prediction.

    Compute: the per-layer shares of ``caffe time`` at one BLAS thread (``LAYER_TIMES``),
    scaled to the measured P = 1 iteration of the same sweep (``calibrate``; ``caffe time``
    itself reads 1.5-1.9x slower than training here), and by P / 2 where P ranks share the 2
    cores (as tools/scaling_check.py does); ``calibrate=False`` takes ``caffe time``'s absolute
    times. Communication: the link model fitted at 1 Gbit/s (``1gbit/links_model.json``), the
    tree's schedule. Modes: 25 MiB (one bucket: the whole gradient after backward's lowest
    layer, i.e. no overlap), ``auto`` with overlap (MG-WFBP), ``--overlap off`` (no overlap
    whatever the buckets).
    """
    model = LinkModel.load(os.path.join(netlab, "1gbit", "links_model.json"))
    with open(os.path.join(netlab, LAYER_TIMES)) as f:
        layer_times = json.load(f)
    rows = []
    for net, (results, key) in NETLAB_RUNS.items():
        lt = layer_times[key]
        prof = caffe_time_profile(lt["layers"], lt["param_counts"])
        with open(os.path.join(netlab, results)) as f:
            runs = json.load(f)
        batch = runs["batch"]
        one = [r["median"] for r in runs["rows"] if r["procs"] == 1]
        t1 = 1.0 / one[0] if calibrate and one else sum(f + b for _, f, b in lt["layers"]) / 1e3
        for r in runs["rows"]:
            p = r["procs"]
            per_image = max(1.0, p / CORES) * t1 / batch
            terms = link_terms(model, algorithm, p)
            if p == 1:
                mode = "none"
            elif r["overlap"] == "off" or r["bucket_mb"] != "auto":
                mode = "none"
            else:
                mode = "mgwfbp"
            f, b = prof.seconds(per_image, batch)
            it = iteration(f, b, prof.nbytes(), terms[0], terms[1], mode)
            rows.append({"net": net, "P": p, "bucket_mb": r["bucket_mb"] or "-",
                         "overlap": r["overlap"] or "-", "mode": mode,
                         "measured": r["median"], "low": r["low"], "high": r["high"],
                         "predicted": 1.0 / it["total"], "compute": f + sum(b),
                         "exposed": it["exposed"], "messages": it["messages"]})
    return rows


def netlab_table(**kw):
    out = ["| net | P | --bucket_mb | overlap | DAG mode | measured it/s (min-max) | "
           "predicted it/s | compute + exposed comm (ms) | measured / predicted |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in netlab_rows(**kw):
        out.append(f"| {r['net']} | {r['P']} | {r['bucket_mb']} | {r['overlap']} | "
                   f"{_MODE_NAMES[r['mode']].replace(' (messages)', '')} "
                   f"({r['messages']} msg) | {r['measured']:.3f} ({r['low']:.3f}-"
                   f"{r['high']:.3f}) | {r['predicted']:.3f} | {r['compute'] * 1e3:.0f} + "
                   f"{r['exposed'] * 1e3:.1f} | {r['measured'] / r['predicted']:.2f} |")
    return "\n".join(out)


def _main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="Shi et al.'s DAG model: WFBP, MG-WFBP, no "
                                             "overlap; predicted against published/measured.")
    ap.add_argument("--firecaffe", action="store_true",
                    help="FireCaffe's setting at 32, 64, 128 GPUs against its published speedups")
    ap.add_argument("--four-minutes", action="store_true",
                    help="Jia et al.'s setting at 1024 and 2048 GPUs against its published "
                         "throughput")
    ap.add_argument("--netlab", action="store_true",
                    help="measured iterations/s on the emulated network against the DAG")
    ap.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                    help="seconds per message for --firecaffe/--four-minutes")
    ap.add_argument("--link-gbit", type=float, nargs="+", default=[100.0],
                    help="--four-minutes: inter-node link rates, Gbit/s")
    ap.add_argument("--bytes-per-element", type=int, nargs="+", default=[2],
                    help="--four-minutes: gradient bytes per element (2: fp16, 4: fp32)")
    ap.add_argument("--bandwidths", type=float, nargs="+", default=[2.5e9, 6e9],
                    help="--firecaffe: link bandwidths, bytes/s")
    args = ap.parse_args(argv)
    if not (args.firecaffe or args.four_minutes or args.netlab):
        ap.error("give --firecaffe, --four-minutes or --netlab")
    if args.firecaffe:
        print(firecaffe_table(alpha=args.alpha, bandwidths=args.bandwidths))
        print()
    if args.four_minutes:
        print(four_minutes_table(alpha=args.alpha, link_gbit=args.link_gbit,
                                 bytes_per_element=args.bytes_per_element))
        print()
    if args.netlab:
        print(netlab_table())


if __name__ == "__main__":
    _main()
