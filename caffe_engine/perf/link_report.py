"""Measured against predicted: a :class:`.link_model.LinkModel` on benchmark rows (Markdown).

``tools/bench_allreduce.py`` writes it as model.md beside each run's results.json;
``tools/cost_model.py --fit-links / --report`` prints it.
"""
import numpy

from ..errors import CaffeError
from .link_model import human_bytes
from .schedules import LINK_ALGORITHMS


def _header(model):
    """The report's first line: the model's parameters and what they were fitted on."""
    return (f"Link model: alpha = {model.alpha * 1e6:.1f} us, beta = {model.beta * 1e9:.3f} "
            f"ns/byte (1/beta = {8 / model.beta / 1e6 if model.beta else float('inf'):.0f} "
            f"Mbit/s)" + (f"; intra-node alpha = {model.alpha_intra * 1e6:.1f} us, beta = "
                          f"{model.beta_intra * 1e9:.3f} ns/byte" if model.beta_intra else "")
            + (f"; fitted on {model.source}" if model.source else ""))


def link_report(model, rows, stat="seconds", sizes=None):
    """Markdown: the model's parameters, then measured against predicted for every row (one
    with a ``"netlab"`` setting is predicted on its own hosts: its ranks_per_host).

    Args:
        model: a :class:`.link_model.LinkModel`.
        rows: results.json "rows" of tools/bench_allreduce.py.
        stat: the row's time: "seconds" (median) or "min_seconds".
        sizes: report only the rows of these byte counts (default: all).

    Rows of an algorithm the model has no schedule for are left out; MPICH's allreduce over
    several hosts of several shared-memory ranks shows its measured time only.
    """
    lines = [_header(model), "",
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


def loopback_rate(results):
    """Median of the loopback streams (bits/s) a results.json's labs measured, or None."""
    runs = results.get("runs") or [] if isinstance(results, dict) else []
    rates = [lab["stream_loopback_bits_per_s"] for run in runs for lab in run.get("labs", [])
             if lab.get("stream_loopback_bits_per_s")]
    return float(numpy.median(rates)) if rates else None
