"""Jia et al. 2018 (arXiv:1807.11205), "ImageNet in four minutes", at 1024 and 2048 P40 GPUs.

docs/scaling.md, "Four minutes": the per-GPU rate the DAG (:mod:`.dag`) needs to give the
published throughput, and the efficiency there (``tools/dag_model.py --four-minutes``).
"""
import math
import os

from .dag import MODE_NAMES, iteration, speedup
from .message_cost import DEFAULT_ALPHA, allreduce_terms
from .profiles import IMAGENET_TRAIN_IMAGES, SHAPES, shapes_profile

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
    """Images/s of the published run of ``net`` (epochs * ImageNet's images / seconds)."""
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


def _row(net, prof, p, gbit, alg, mode, bpe, alpha):
    """One row of :func:`four_minutes_rows`."""
    beta = 8.0 / (gbit * 1e9)
    target = published_throughput(net)
    other = 1024 if p == 2048 else 2048
    terms = allreduce_terms(alg, p, alpha, beta, GPUS_PER_NODE, alpha, 1.0 / PCIE_BYTES_S)
    batch = FOUR_MINUTES_BATCH // p
    s, e = implied_rate(prof, p, batch, terms, mode, target, bpe)
    row = {"net": net, "P": p, "batch": batch, "gbit": gbit, "alg": alg,
           "mode": mode, "bpe": bpe, "target": target,
           "grad_mb": prof.params * bpe / 1e6, "S": s,
           "e": e if s else None, "ceiling": None if s else e}
    if s:
        t2 = allreduce_terms(alg, other, alpha, beta, GPUS_PER_NODE, alpha, 1.0 / PCIE_BYTES_S)
        b2 = FOUR_MINUTES_BATCH // other
        sp, _ = speedup(prof, 1.0 / s, b2, other, t2, mode, bpe)
        row.update(other=other, other_e=sp / other, other_rate=sp * s)
    return row


def four_minutes_rows(link_gbit=(100.0,), alpha=DEFAULT_ALPHA,
                      algorithms=("ring", "hier", "tree"), modes=("none", "wfbp", "mgwfbp"),
                      bytes_per_element=(2,)):
    """Rows of the four-minute table: per net, published P, bandwidth, algorithm, mode, gradient
    precision: the implied per-GPU rate, the efficiency there, and the efficiency the same
    per-GPU rate gives at the other P (1024 <-> 2048)."""
    rows = []
    for net, spec in FOUR_MINUTES.items():
        prof = shapes_profile(os.path.join(SHAPES, spec["shapes"]))
        for gbit in link_gbit:
            for alg in algorithms:
                for bpe in bytes_per_element:
                    for mode in modes:
                        rows.append(_row(net, prof, spec["procs"], gbit, alg, mode, bpe, alpha))
    return rows


def four_minutes_table(**kw):
    """Markdown of :func:`four_minutes_rows` (keywords passed on)."""
    out = ["| net | P | batch/GPU | IB (Gbit/s) | algorithm | mode | gradients (MB) | "
           "published (derived) img/s | implied per-GPU img/s | predicted efficiency | "
           "same GPUs at the other P: efficiency, img/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in four_minutes_rows(**kw):
        head = (f"| {r['net']} | {r['P']} | {r['batch']} | {r['gbit']:g} | {r['alg']} | "
                f"{MODE_NAMES[r['mode']].replace(' (messages)', '')} | {r['grad_mb']:.1f} | "
                f"{r['target']:,.0f} | ")
        if r["S"] is None:
            out.append(head + f"unreachable (ceiling {r['ceiling']:,.0f} img/s) | - | - |")
        else:
            out.append(head + f"{r['S']:.0f} | {r['e'] * 100:.1f} % | P = {r['other']}: "
                       f"{r['other_e'] * 100:.1f} %, {r['other_rate']:,.0f} |")
    return "\n".join(out)
