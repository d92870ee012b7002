"""Our emulated network (tools/netlab.py): the measured training runs against the DAG.

docs/scaling.md, "The DAG model against these runs" (``tools/dag_model.py --netlab``).
"""
import json
import os

from .dag import MODE_NAMES, iteration
from .link_model import LinkModel
from .profiles import ROOT, caffe_time_profile

NETLAB = os.path.join(ROOT, "docs", "bench", "netlab")
#: docs/bench/netlab/training/: the runs' results, and per-layer ``caffe time`` (1 BLAS thread)
NETLAB_RUNS = {
    "cifar10_quick": ("training/cifar10_quick_sweep/results.json", "cifar10_quick"),
    "nin_cifar10": ("training/nin_sweep/results.json", "nin_cifar10"),
}
LAYER_TIMES = "training/caffe_time_1thread.json"
CORES = 2


def _mode(run_row):
    """The DAG mode of one measured run: MG-WFBP for ``auto`` with overlap, else none."""
    if run_row["procs"] == 1:
        return "none"
    if run_row["overlap"] == "off" or run_row["bucket_mb"] != "auto":
        return "none"
    return "mgwfbp"


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
            terms = model.message_terms(algorithm, p)
            mode = _mode(r)
            f, b = prof.seconds(per_image, batch)
            it = iteration(f, b, prof.nbytes(), terms[0], terms[1], mode)
            rows.append({"net": net, "P": p, "bucket_mb": r["bucket_mb"] or "-",
                         "overlap": r["overlap"] or "-", "mode": mode,
                         "measured": r["median"], "low": r["low"], "high": r["high"],
                         "predicted": 1.0 / it["total"], "compute": f + sum(b),
                         "exposed": it["exposed"], "messages": it["messages"]})
    return rows


def netlab_table(**kw):
    """Markdown of :func:`netlab_rows` (keywords passed on)."""
    out = ["| net | P | --bucket_mb | overlap | DAG mode | measured it/s (min-max) | "
           "predicted it/s | compute + exposed comm (ms) | measured / predicted |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in netlab_rows(**kw):
        out.append(f"| {r['net']} | {r['P']} | {r['bucket_mb']} | {r['overlap']} | "
                   f"{MODE_NAMES[r['mode']].replace(' (messages)', '')} "
                   f"({r['messages']} msg) | {r['measured']:.3f} ({r['low']:.3f}-"
                   f"{r['high']:.3f}) | {r['predicted']:.3f} | {r['compute'] * 1e3:.0f} + "
                   f"{r['exposed'] * 1e3:.1f} | {r['measured'] / r['predicted']:.2f} |")
    return "\n".join(out)
