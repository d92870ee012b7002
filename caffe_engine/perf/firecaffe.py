"""FireCaffe's setting (Iandola et al., arXiv:1511.00175): its formulas, its nets, our predictions.

Two studies of docs/scaling.md:

* "FireCaffe's numbers" (``tools/cost_model.py --firecaffe``, :func:`formula_table`): the
  paper's section-4 formulas (:func:`firecaffe_comm_time`), with |W| the gradient bytes and BW
  the link bandwidth: parameter server ``|W| * P / BW``, reduction tree ``2 * |W| * log2(P) /
  BW``; compute per GPU from the single-GPU baselines, spread evenly over 20 layers for the
  overlapped variant (:func:`.iteration.iteration_time`).
* "The DAG model at 32, 64 and 128 GPUs" (``tools/dag_model.py --firecaffe``,
  :func:`firecaffe_table`): Shi et al.'s DAG (:mod:`.dag`) on the per-layer FLOP profiles of
  the nets as BVLC Caffe builds them (:func:`.profiles.shapes_profile`).
"""
import math
import os

from ..errors import CaffeError
from .dag import MODE_NAMES, MODES, speedup
from .iteration import iteration_time, uniform_layers
from .message_cost import DEFAULT_ALPHA, allreduce_terms
from .profiles import IMAGENET_TRAIN_IMAGES, SHAPES, shapes_profile


def firecaffe_comm_time(algorithm, nbytes, procs, bandwidth):
    """FireCaffe's section-4 formulas: ps ``|W| P / BW``, tree ``2 |W| log2(P) / BW`` (s).

    Raises:
        CaffeError: an algorithm other than ps and tree.
    """
    if procs <= 1:
        return 0.0
    if algorithm == "ps":
        return nbytes * procs / bandwidth
    if algorithm == "tree":
        return 2.0 * nbytes * math.log2(procs) / bandwidth
    raise CaffeError(f"FireCaffe's model covers 'ps' and 'tree', not '{algorithm}'")


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
    speedup_ = procs * compute / it["total"]
    target = spec["paper_speedup_128"]
    # procs * compute / (compute + c) = target  ->  c = compute * (procs / target - 1)
    needed_comm = compute * (procs / target - 1)
    implied = firecaffe_comm_time(algorithm, nbytes, procs, 1.0) / needed_comm
    return {"compute_s": compute, "comm_s": comm, "speedup": speedup_,
            "implied_bandwidth": implied}


def formula_table(bandwidths=(1e9, 2.5e9, 6e9, 10e9)):
    """Markdown: :func:`firecaffe_prediction` per net and bandwidth (bytes/s) for ps, tree and
    tree with overlap, against the paper; then the bandwidth the paper's speedup implies."""
    lines = ["| net | BW (GB/s) | compute/iter (ms) | ps: comm ms, speedup | "
             "tree: comm ms, speedup | tree + overlap: speedup | paper |",
             "|---|---|---|---|---|---|---|"]
    for net, spec in FIRECAFFE_NETS.items():
        for bw in bandwidths:
            ps = firecaffe_prediction(net, bandwidth=bw, algorithm="ps")
            tr = firecaffe_prediction(net, bandwidth=bw, algorithm="tree")
            ov = firecaffe_prediction(net, bandwidth=bw, algorithm="tree", overlap=True)
            lines.append(f"| {net} | {bw / 1e9:g} | {tr['compute_s'] * 1e3:.0f} | "
                         f"{ps['comm_s'] * 1e3:.0f}, {ps['speedup']:.1f}x | "
                         f"{tr['comm_s'] * 1e3:.0f}, {tr['speedup']:.1f}x | "
                         f"{ov['speedup']:.1f}x | {spec['paper_speedup_128']:g}x |")
        tr = firecaffe_prediction(net, algorithm="tree")
        lines.append(f"| {net} | implied by the paper: {tr['implied_bandwidth'] / 1e9:.2f} GB/s "
                     f"| | | | | |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The DAG at 32, 64, 128 K20x GPUs on Titan
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


def _messages(row, mode):
    return f" ({row[mode + '_messages']})" if mode == "mgwfbp" else ""


def firecaffe_table(**kw):
    """Markdown of :func:`firecaffe_rows` (keywords passed on)."""
    rows = firecaffe_rows(**kw)
    modes = [m for m in MODES if m in rows[0]]
    out = ["| net | P | batch/GPU | BW (GB/s) | algorithm | compute/iter (ms) | "
           + " | ".join(MODE_NAMES[m] for m in modes) + " | published |",
           "|---|---|---|---|---|---|" + "---|" * len(modes) + "---|"]
    for r in rows:
        cells = " | ".join(f"{r[m]:.1f}x" + _messages(r, m) for m in modes)
        out.append(f"| {r['net']} | {r['P']} | {r['batch']} | {r['bandwidth'] / 1e9:g} | "
                   f"{r['alg']} | {r['compute'] * 1e3:.0f} | {cells} | {r['published']} |")
    return "\n".join(out)
