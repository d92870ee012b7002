#!/usr/bin/env python
"""Check the scaling model against measured data-parallel training on this machine.

For each P in ``--procs``:

1. **Predicted.** Per-layer forward/backward times come from ``caffe time`` on the solver's train
   net, run with the BLAS threads each of P ranks gets (``cores // P``, at least 1, as
   :func:`caffe_engine.comm.distributed.share_cores` sets them), and scaled by ``P / cores`` when
   P ranks share fewer cores (oversubscription). The per-layer gradient sizes come from the net;
   the allreduce time from the alpha-beta model fitted on ``tools/bench_allreduce.py``
   (``--cost_model``, default ``docs/bench_allreduce_model.json``).
   :func:`caffe_engine.comm.cost_model.iteration_time` adds them up, with the bucketed
   overlap the engine uses.
2. **Measured.** ``mpiexec -n P caffe train`` (``caffe train`` for P = 1) on a copy of the
   solver with ``max_iter = --iters``, no testing and no snapshots; the iteration rate is the
   median of the ``iter/s`` figures Caffe's log prints every ``display`` iterations (the first
   one, which includes start-up, dropped).

Prints a markdown table: P, predicted and measured ms per iteration, images/s, and the
weak-scaling speedup (P x batch images per iteration; speedup = P * T(1) / T(P)).

    python tools/scaling_check.py --solver models/lenet/lenet_solver.prototxt --procs 1 2 4

Run from the repository root (the LeNet solver's paths are relative to it). The caller needs
mpi4py and the ``mpich`` wheel's ``mpiexec`` for P > 1.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from caffe_engine.backend import cpu_cores  # noqa: E402
from caffe_engine.comm import cost_model  # noqa: E402
from caffe_engine.io import prototxt  # noqa: E402
from caffe_engine.proto import caffe_pb2  # noqa: E402

_LAYER_LINE = re.compile(r"\]\s+(\S+)\s+(forward|backward): ([0-9.e+-]+) ms\.")
_RATE_LINE = re.compile(r"Iteration (\d+) \(([0-9.e+-]+) iter/s")


def caffe_cmd():
    return [sys.executable, "-m", "caffe_engine"]


def layer_times(net_path, threads, iterations):
    """{layer: (forward s, backward s)} from ``caffe time`` with ``threads`` BLAS threads."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(caffe_cmd() + ["time", f"--model={net_path}",
                                        f"--iterations={iterations}"],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"scaling_check: caffe time failed: {out.stderr.strip().splitlines()[-1:]}")
    times = {}
    for name, kind, ms in _LAYER_LINE.findall(out.stderr + out.stdout):
        f, b = times.get(name, (0.0, 0.0))
        times[name] = (float(ms) / 1e3, b) if kind == "forward" else (f, float(ms) / 1e3)
    return times


def param_bytes(net_path):
    """{layer: bytes of its learnable params} of the TRAIN net."""
    from caffe_engine.net import Net
    net = Net(net_path, caffe_pb2.TRAIN)
    return {name: 4 * sum(b.count for b in layer.blobs)
            for name, layer in zip(net.layer_names, net.layers) if layer.blobs}


def measured_rate(solver, procs, iters, comm, workdir):
    """Median training iterations/s of ``caffe train`` on ``procs`` ranks."""
    param = caffe_pb2.SolverParameter()
    prototxt.read_text(solver, param, "solver")
    param.net = os.path.abspath(os.path.join(ROOT, param.net))
    param.max_iter = iters
    param.display = max(1, iters // 8)
    param.test_interval = iters + 1
    param.test_initialization = False
    param.ClearField("test_iter")
    param.snapshot = 0
    param.snapshot_after_train = False
    path = os.path.join(workdir, f"solver_P{procs}.prototxt")
    prototxt.write_text(path, param)
    cmd = caffe_cmd() + ["train", f"--solver={path}", f"--comm={comm}"]
    if procs > 1:
        cmd = ["mpiexec", "-n", str(procs)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"scaling_check: training on {procs} ranks failed (exit {out.returncode}): "
                 f"{(out.stderr.strip().splitlines() or [''])[-1]}")
    rates = [float(r) for _, r in _RATE_LINE.findall(out.stderr + out.stdout)]
    if len(rates) < 2:
        sys.exit(f"scaling_check: no iteration rates in the log of the {procs}-rank run")
    return statistics.median(rates[1:])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solver", default="models/lenet/lenet_solver.prototxt")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--iters", type=int, default=400, help="training iterations per run")
    ap.add_argument("--time_iterations", type=int, default=50, help="caffe time --iterations")
    ap.add_argument("--comm", default="tree")
    ap.add_argument("--cost_model", default="docs/bench_allreduce_model.json")
    args = ap.parse_args(argv)

    os.chdir(ROOT)
    param = caffe_pb2.SolverParameter()
    prototxt.read_text(args.solver, param, "solver")
    net_path = param.net
    batch = _train_batch(net_path)
    model = cost_model.AlphaBetaModel.load(args.cost_model)
    grads = param_bytes(net_path)
    n_cores = cpu_cores()
    rows = []
    workdir = tempfile.mkdtemp(prefix="scaling_check_")
    try:
        for p in args.procs:
            threads = max(1, n_cores // p)
            share = max(1.0, p / n_cores)
            times = {k: (f * share, b * share)
                     for k, (f, b) in layer_times(net_path, threads, args.time_iterations).items()}
            comm = (lambda n: 0.0) if p == 1 else (lambda n, p=p: model.predict(args.comm, n, p))
            it = cost_model.iteration_time(times, grads, comm, overlap=True)
            rate = measured_rate(args.solver, p, args.iters, args.comm, workdir)
            rows.append((p, threads, it, 1.0 / rate))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    t1_pred, t1_meas = rows[0][2]["total"], rows[0][3]
    print(f"{args.solver}: batch {batch} per rank, {n_cores} cores, --comm {args.comm}, "
          f"cost model {args.cost_model}")
    print()
    print("| P | BLAS threads/rank | predicted ms/iter (compute + exposed comm) | measured ms/iter "
          "| predicted img/s | measured img/s | predicted speedup | measured speedup |")
    print("|---|---|---|---|---|---|---|---|")
    for p, threads, it, t_meas in rows:
        t_pred = it["total"]
        compute = it["forward"] + it["backward"]
        print(f"| {p} | {threads} | {t_pred * 1e3:.1f} ({compute * 1e3:.1f} + "
              f"{it['exposed'] * 1e3:.2f}) | {t_meas * 1e3:.1f} | {p * batch / t_pred:.0f} | "
              f"{p * batch / t_meas:.0f} | {p * t1_pred / t_pred:.2f} | "
              f"{p * t1_meas / t_meas:.2f} |")
    return 0


def _train_batch(net_path):
    from caffe_engine.net import Net
    net = Net(net_path, caffe_pb2.TRAIN)
    return net.blobs[net.blob_names[0]].shape[0]


if __name__ == "__main__":
    sys.exit(main())
