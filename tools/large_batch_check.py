#!/usr/bin/env python3
"""Large-batch LeNet with and without LARC + warm-up: train the solvers, plot accuracy vs epochs.

Runs ``caffe train --solver S`` (this engine, as a subprocess, from the repository root) for
each solver of ``models/lenet_large_batch/`` (by default the batch-64 baseline, batch 1,024
with plain SGD at the linearly scaled rate, and batch 1,024 with NVCaffe's LARC and warm-up),
reads the held-out accuracy of every ``Test net output`` line of its log, and writes

* ``--json`` (default ``docs/large_batch_lars.json``): per run, the solver, the training batch,
  the test points ``[iteration, epochs, accuracy, test loss]``, the last logged training loss
  and the epoch of the first non-finite test loss (``diverged_at_epoch``; Caffe's Accuracy layer
  scores NaN outputs as correct, so a diverged run's accuracy reads 1 and is not plotted);
* ``--png`` (default ``docs/large_batch_lars.png``): all the accuracy curves against epochs
  (passes over the training set), full range on the left and the top ten points on the right.

Exit status 1 when a run fails, or with ``--check``, when the last accuracy of the LARC run
(the solver whose file sets ``larc: true``) is more than one point below the baseline's (the
first solver). Epochs are ``iteration * batch / training digits``; the digits are counted in
the training LMDB the net reads.

Usage (after ``python tools/create_mnist.py``)::

    python tools/large_batch_check.py [--check] [--solvers S1 S2 ...] [--png P] [--json J]
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from caffe_engine.io import prototxt as pio  # noqa: E402
from caffe_engine.proto import caffe_pb2  # noqa: E402

FOLDER = os.path.join("models", "lenet_large_batch")
SOLVERS = [os.path.join(FOLDER, name) for name in
           ("solver_b64_sgd.prototxt", "solver_b1024_sgd.prototxt", "solver_b1024_larc.prototxt")]
TESTING = re.compile(r"Iteration (\d+), Testing net \(#0\)")
ACCURACY = re.compile(r"Test net output #\d+: accuracy = (\S+)")
TEST_LOSS = re.compile(r"Test net output #\d+: loss = (\S+)")
LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = (\S+)")


def train_data(solver):
    """(batch size, LMDB path) of the TRAIN Data layer of the solver's net."""
    param = pio.read_solver_param(solver)
    net = pio.read_net_param(param.net) if param.net else param.net_param
    for layer in net.layer:
        if layer.type == "Data" and any(r.phase == caffe_pb2.TRAIN for r in layer.include):
            return layer.data_param.batch_size, layer.data_param.source
    raise SystemExit(f"large_batch_check: {solver}: no TRAIN Data layer in its net")


def count_records(source):
    """Number of records of an LMDB."""
    import lmdb
    env = lmdb.open(source, readonly=True, lock=False)
    try:
        return env.stat()["entries"]
    finally:
        env.close()


def run(solver):
    """Train one solver; returns its record (see the module docstring)."""
    batch, source = train_data(solver)
    digits = count_records(source)
    env = dict(os.environ, GLOG_logtostderr="1")
    cmd = [sys.executable, "-m", "caffe_engine", "train", f"--solver={solver}"]
    print("large_batch_check:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        sys.stderr.write(log[-3000:])
        raise SystemExit(f"large_batch_check: {solver} failed (status {proc.returncode})")
    points, iteration, last_loss = [], None, None
    for line in log.splitlines():
        m = TESTING.search(line)
        if m:
            iteration = int(m.group(1))
            continue
        m = ACCURACY.search(line)
        if m and iteration is not None:
            points.append([iteration, iteration * batch / digits, float(m.group(1)), None])
            continue
        m = TEST_LOSS.search(line)
        if m and iteration is not None and points and points[-1][0] == iteration:
            points[-1][3] = float(m.group(1))
            iteration = None
            continue
        m = LOSS.search(line)
        if m:
            last_loss = float(m.group(2))
    diverged = next((p[1] for p in points if p[3] is not None and not math.isfinite(p[3])), None)
    return {"solver": solver, "batch": batch, "train_digits": digits,
            "larc": pio.read_solver_param(solver).larc, "points": points,
            "last_train_loss": last_loss, "diverged_at_epoch": diverged}


LABELS = {"solver_b64_sgd.prototxt": "batch 64, SGD (LeNet's recipe)",
          "solver_b1024_sgd.prototxt": "batch 1,024, SGD, lr x16",
          "solver_b1024_larc.prototxt": "batch 1,024, LARC + warm-up"}


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in runs:
        label = LABELS.get(os.path.basename(r["solver"]), os.path.basename(r["solver"]))
        good = [p for p in r["points"] if p[3] is None or math.isfinite(p[3])]
        if r["diverged_at_epoch"] is not None:
            label += f" (diverged: NaN loss from epoch {r['diverged_at_epoch']:.1f})"
        elif good:
            label += f" (last {good[-1][2]:.3f})"
        x = [p[1] for p in good]
        y = [p[2] for p in good]
        for ax in axes:
            line, = ax.plot(x, y, marker="o", markersize=3, label=label)
        if r["diverged_at_epoch"] is not None:
            axes[0].plot([r["diverged_at_epoch"]], [0.02], marker="X", markersize=10,
                         color=line.get_color())
    axes[0].set_ylim(0, 1.0)
    axes[1].set_ylim(0.9, 1.0)
    axes[0].set_title("held-out accuracy (1,000 digits); X: diverged")
    axes[1].set_title("the same, top 10 points")
    for ax in axes:
        ax.set_xlabel("epochs (passes over the 4,000 training digits)")
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle("LeNet on 4,000 MNIST digits: batch 64 vs 1,024, with and without LARC + warm-up")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solvers", nargs="+", default=SOLVERS)
    parser.add_argument("--png", default=os.path.join("docs", "large_batch_lars.png"))
    parser.add_argument("--json", default=os.path.join("docs", "large_batch_lars.json"))
    parser.add_argument("--check", action="store_true",
                        help="exit 1 unless the LARC run ends within 1 point of the first solver")
    args = parser.parse_args(argv)
    runs = [run(s) for s in args.solvers]
    for r in runs:
        last = r["points"][-1] if r["points"] else None
        print(f"{r['solver']}: batch {r['batch']}, "
              + (f"{last[1]:.2f} epochs, accuracy {last[2]:.4f}" if last else "no test output")
              + f", last train loss {r['last_train_loss']}"
              + (f", diverged at epoch {r['diverged_at_epoch']:.2f}"
                 if r["diverged_at_epoch"] is not None else ""))
    with open(os.path.join(ROOT, args.json), "w") as f:
        json.dump(runs, f, indent=1)
    plot(runs, os.path.join(ROOT, args.png))
    print(f"large_batch_check: wrote {args.json} and {args.png}")
    if args.check:
        base = runs[0]["points"][-1][2]
        larc_runs = [r for r in runs if r["larc"]]
        for r in larc_runs:
            if r["diverged_at_epoch"] is not None or r["points"][-1][2] < base - 0.01:
                print(f"large_batch_check: {r['solver']} ends at {r['points'][-1][2]:.4f}, more "
                      f"than 1 point below {base:.4f}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
