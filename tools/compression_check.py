#!/usr/bin/env python3
"""LeNet on 4 ranks with gradient compression: train each variant, plot accuracy vs iterations.

Runs ``mpiexec -n 4 caffe train --solver S`` (this engine, ``python -m caffe_engine``, from the
repository root) for each solver of ``models/lenet_compressed/``: the main job's LeNet recipe
(``models/lenet/lenet_solver.prototxt``: batch 64 per rank, 1,000 iterations, seed 1701, tested
by rank 0 on the 1,000 held-out digits) with a test every 100 iterations and its solver's
``comm_param`` block:

* ``dense``       no compression (the dense tree allreduce, ``--comm`` default);
* ``fp16``        ``compress: "fp16"``;
* ``topk``        ``compress: "topk" density: 0.001`` (error feedback on);
* ``gtopk``       ``compress: "gtopk" density: 0.001`` (error feedback on);
* ``gtopk_noef``  ``compress: "gtopk" density: 0.001 error_feedback: false``.

Each run's log (stdout + stderr, ``GLOG_logtostderr=1``) is kept in ``--logs`` (default
``data/compression_check/<variant>.log``, git-ignored); ``--reuse`` reads a variant's log from
there instead of training again when that log ends with a finished run. From each log it reads
(``caffe_engine.tools.parse_log``, as Caffe's script reads Caffe's logs) every test's accuracy
and loss, the last displayed training loss, the ``Data parallel`` start line's compression and
the ``gradient traffic`` lines (bytes sent per iteration by the busiest rank, the mean over the
ranks, what a dense ring allreduce of the same buckets sends; the dense path logs no such line).
It writes

* ``--json`` (default ``docs/compression_lenet.json``): per variant, its solver, command,
  compression, test points ``[iteration, accuracy, test loss]``, last training loss and traffic;
* ``--png`` (default ``docs/compression_lenet.png``): accuracy against iterations for every
  variant, full range on the left, zoomed near the top on the right.

Exit status 1 when a run fails, or with ``--check`` when a must-show of issue 17 fails (final
accuracies, same iteration): ``gtopk`` within 1 point of ``dense`` (|difference| <= 0.01),
``fp16`` within 0.5 point of ``dense`` (<= 0.005), and ``gtopk_noef`` visibly below ``gtopk``
(by more than ``--visible_gap``, default 0.01: ten digits of the 1,000). Variants not run are
not checked.

Usage (after ``python tools/create_mnist.py``; five runs of about 3 minutes on 2 cores)::

    python tools/compression_check.py [--check] [--variants dense fp16 ...] [--reuse]
        [--procs 4] [--png P] [--json J] [--logs DIR]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from caffe_engine.tools import parse_log as caffe_parse_log  # noqa: E402

FOLDER = os.path.join("models", "lenet_compressed")
VARIANTS = ["dense", "fp16", "topk", "gtopk", "gtopk_noef"]
LABELS = {"dense": "dense (float32 tree allreduce)",
          "fp16": "fp16",
          "topk": "Top-k, density 0.001, error feedback",
          "gtopk": "gTop-k, density 0.001, error feedback",
          "gtopk_noef": "gTop-k, density 0.001, NO error feedback"}
STYLES = {"dense": dict(color="black", linewidth=2.2),
          "fp16": dict(color="tab:blue", linestyle="--"),
          "topk": dict(color="tab:green"),
          "gtopk": dict(color="tab:orange"),
          "gtopk_noef": dict(color="tab:red")}
RE_COMPRESSED = re.compile(r"gradients compressed: ([^\n]*?)\s*$", re.MULTILINE)
RE_TRAFFIC = re.compile(
    r"Iteration (\d+), gradient traffic \((\w+)\): (\d+) bytes sent per iteration by the busiest "
    r"rank \(this rank (\d+), mean (\d+) over (\d+) ranks\); a dense ring allreduce sends (\d+)")
FINISHED = "Optimization Done."


def solver_path(variant):
    return os.path.join(FOLDER, f"solver_{variant}.prototxt")


def command(variant, procs, mpiexec="mpiexec", python=sys.executable):
    return [mpiexec, "-n", str(procs), python, "-m", "caffe_engine", "train",
            f"--solver={solver_path(variant)}"]


def parse_run(text):
    """What one run's log says: test points, last training loss, compression and traffic."""
    parsed = caffe_parse_log.parse_lines(text.splitlines(keepends=True))
    points = [[int(row["NumIters"]), row.get("accuracy"), row.get("loss")] for row in parsed.test]
    traffic = [{"iteration": int(m.group(1)), "method": m.group(2), "busiest": int(m.group(3)),
                "mean": float(m.group(5)), "ranks": int(m.group(6)), "dense_ring": int(m.group(7))}
               for m in RE_TRAFFIC.finditer(text)]
    compressed = RE_COMPRESSED.search(text)
    return {"compression": compressed.group(1) if compressed else "none",
            "points": points,
            "last_train_loss": parsed.display_loss[-1][2] if parsed.display_loss else None,
            "traffic": traffic,
            "finished": FINISHED in text}


def accuracy_at(record, iteration):
    """The test accuracy logged at ``iteration``, or None."""
    return next((p[1] for p in record["points"] if p[0] == iteration), None)


def bytes_per_iteration(record):
    """(busiest rank, mean over ranks, dense ring) bytes per iteration, over the whole run:
    the traffic lines' per-interval figures averaged (they cover equal intervals); None if the
    log has no traffic line (the dense path)."""
    lines = record["traffic"]
    if not lines:
        return None
    n = len(lines)
    return (sum(t["busiest"] for t in lines) / n, sum(t["mean"] for t in lines) / n,
            lines[-1]["dense_ring"])


EPS = 1e-9     # accuracies are k/1000 read back from text: compare differences with a margin


def check(runs, visible_gap=0.01):
    """The must-shows that fail, as messages (empty: all hold). ``runs``: variant -> record."""
    failures = []
    last = {}
    for variant, record in runs.items():
        if not record["points"]:
            failures.append(f"{variant}: no test output")
            continue
        last[variant] = record["points"][-1]
    iterations = {p[0] for p in last.values()}
    if len(iterations) > 1:
        failures.append(f"the runs end at different iterations: {sorted(iterations)}")
    if "dense" in last:
        dense = last["dense"][1]
        for variant, within in (("gtopk", 0.01), ("fp16", 0.005)):
            if variant in last and abs(last[variant][1] - dense) > within + EPS:
                failures.append(f"{variant} ends at {last[variant][1]:.4f}, not within "
                                f"{within * 100:g} point of dense {dense:.4f}")
    if "gtopk" in last and "gtopk_noef" in last:
        ef, noef = last["gtopk"][1], last["gtopk_noef"][1]
        if not noef < ef - visible_gap - EPS:
            failures.append(f"gtopk_noef ends at {noef:.4f}, not visibly (by more than "
                            f"{visible_gap:g}) below gtopk with error feedback {ef:.4f}")
    return failures


def run(variant, procs, log_dir, reuse=False):
    """Train one variant (or, with ``reuse``, read its finished log); returns its record."""
    log_path = os.path.join(log_dir, f"{variant}.log")
    mpiexec = shutil.which("mpiexec") or os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = command(variant, procs, mpiexec)
    text = None
    if reuse and os.path.exists(log_path):
        with open(log_path, errors="replace") as f:
            text = f.read()
        if FINISHED in text:
            print(f"compression_check: {variant}: reusing {log_path}", flush=True)
        else:
            text = None
    if text is None:
        print("compression_check:", " ".join(cmd), flush=True)
        env = dict(os.environ, GLOG_logtostderr="1")
        with open(log_path, "w") as f:     # written as it runs: tail -f it
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        with open(log_path, errors="replace") as f:
            text = f.read()
        if proc.returncode != 0:
            sys.stderr.write(text[-3000:])
            raise SystemExit(f"compression_check: {variant} failed (status {proc.returncode}); "
                             f"log {log_path}")
    record = parse_run(text)
    record.update(variant=variant, solver=solver_path(variant), procs=procs,
                  command=f"mpiexec -n {procs} caffe train --solver={solver_path(variant)}",
                  log=os.path.relpath(log_path, ROOT))
    return record


def plot(runs, path, zoom_low=0.86):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    for variant, r in runs.items():
        x = [p[0] for p in r["points"]]
        y = [p[1] for p in r["points"]]
        label = LABELS.get(variant, variant)
        if r["points"]:
            label += f" (at {x[-1]}: {y[-1]:.3f})"
        for ax in axes:
            ax.plot(x, y, marker="o", markersize=3.5, label=label, **STYLES.get(variant, {}))
    axes[0].set_ylim(0, 1.0)
    axes[1].set_ylim(zoom_low, 1.0)
    axes[1].set_xlim(180, 1020)
    axes[0].set_title("held-out accuracy (1,000 digits, tested every 100 iterations)")
    axes[1].set_title(f"the same, zoomed: accuracy {zoom_low:g} to 1.0, from iteration 200")
    for ax in axes:
        ax.set_xlabel("iteration (4 ranks x 64 digits each)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("LeNet on 4 ranks (the main job's recipe, 1,000 iterations): "
                 "gradient compression against dense")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--procs", type=int, default=4)
    parser.add_argument("--png", default=os.path.join("docs", "compression_lenet.png"))
    parser.add_argument("--json", default=os.path.join("docs", "compression_lenet.json"))
    parser.add_argument("--logs", default=os.path.join("data", "compression_check"))
    parser.add_argument("--reuse", action="store_true",
                        help="read a variant's finished log from --logs instead of training")
    parser.add_argument("--zoom_low", type=float, default=0.86)
    parser.add_argument("--visible_gap", type=float, default=0.01)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the must-shows hold (see the module docstring)")
    args = parser.parse_args(argv)
    log_dir = os.path.join(ROOT, args.logs)
    os.makedirs(log_dir, exist_ok=True)
    runs = {v: run(v, args.procs, log_dir, args.reuse) for v in args.variants}
    for v, r in runs.items():
        traffic = bytes_per_iteration(r)
        print(f"{v}: accuracy at 500 {accuracy_at(r, 500)}, at "
              f"{r['points'][-1][0] if r['points'] else '-'} "
              f"{r['points'][-1][1] if r['points'] else '-'}; last train loss "
              f"{r['last_train_loss']}; bytes/iteration (busiest, mean, dense ring) {traffic}")
    with open(os.path.join(ROOT, args.json), "w") as f:
        json.dump(list(runs.values()), f, indent=1)
    plot(runs, os.path.join(ROOT, args.png), args.zoom_low)
    print(f"compression_check: wrote {args.json} and {args.png}")
    if args.check:
        failures = check(runs, args.visible_gap)
        for msg in failures:
            print(f"compression_check: FAIL: {msg}", file=sys.stderr)
        if failures:
            return 1
        print("compression_check: all must-shows hold")
    return 0


if __name__ == "__main__":
    sys.exit(main())
