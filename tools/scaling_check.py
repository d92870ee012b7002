#!/usr/bin/env python
"""Check the scaling model against measured data-parallel training on this machine.

For each P in ``--procs``:

1. **Predicted** (local mode; ``--no_predict`` skips it). Per-layer forward/backward times come
   from ``caffe time`` on the solver's train net, run with the BLAS threads each of P ranks gets
   (``cores // P``, at least 1, as :func:`caffe_engine.comm.distributed.share_cores` sets them),
   and scaled by ``P / cores`` when P ranks share fewer cores (oversubscription). The per-layer
   gradient sizes come from the net; the allreduce time from the alpha-beta model fitted on
   ``tools/bench_allreduce.py`` (``--cost_model``, default ``docs/bench_allreduce_model.json``).
   :func:`caffe_engine.perf.iteration.iteration_time` adds them up, with the bucketed
   overlap the engine uses.
2. **Measured.** ``mpiexec -n P caffe train`` (``caffe train`` for P = 1) on a copy of the
   solver with ``max_iter = --iters``, no testing and no snapshots; the iteration rate of a run
   is the median of the ``iter/s`` figures Caffe's log prints every ``display`` iterations (the
   first one, logged at iteration 0, dropped; ``--skip_iters K`` also drops those logged at
   iterations <= K, e.g. past ``--bucket_mb auto``'s measuring and planning).

Prints a markdown table: P, predicted and measured ms per iteration, images/s, and the
weak-scaling speedup (P x batch images per iteration; speedup = P * T(1) / T(P)); then the
table of every measured setting (below).

    python tools/scaling_check.py --solver models/lenet/lenet_solver.prototxt --procs 1 2 4

**Settings and repeats.** ``--bucket_mb`` takes a list (``25``, ``0.25``, ``auto`` ...; each
value its own run, passed to ``caffe train --bucket_mb``), ``--overlap on off`` runs each with
and without overlapping the gradient allreduce with backward (``off`` sets
``CAFFE_GRAD_OVERLAP=0``: :class:`caffe_engine.comm.buckets.GradientSync` then reduces every
bucket after backward), and ``--repeats R`` runs the whole list R times, in the same order each
time (A B C, A B C, ...), so that a machine's slow spell spreads over the settings. P = 1 is run
once per repeat (there is nothing to reduce). The settings table gives per (P, bucket, overlap)
the median over the repeats of the runs' iterations/s, their spread (min-max, and
(max - min) / median), images/s (P x batch x it/s), the speedup over the P = 1 median, and
for ``auto`` the plan each run logged (``Buckets (--bucket_mb auto, MG-WFBP): ...``).
``--out DIR`` writes it as ``DIR/table.md`` and every run (rates, plan, load average, seconds)
as ``DIR/results.json``.

**On an emulated network** (``--netlab``; root, see ``tools/netlab.py``): each run with P > 1
gets a fresh lab of P hosts, one rank per host, host links shaped to ``--bandwidth`` (default
1gbit), MPICH over TCP with the ``--netmod`` network module (default ofi: UCX's doubles two-way
exchanges when ranks outnumber cores, see tools/bench_allreduce.py); P = 1 runs plain. Every
rank gets ``--threads`` BLAS threads (default 1 with ``--netlab``: the hosts share this
machine's cores) and no prediction is made. ``--data DIR`` points the net's Data layers at
``DIR/train_lmdb``, ``DIR/test_lmdb`` (or the LMDBs named ``*train*lmdb``, ``*test*lmdb``,
as in ``../shared/data/mnist_5k``) and ``DIR/mean.binaryproto`` (the layout of
``../shared/data/synthetic_cifar``) in the solver's copy.

    python tools/scaling_check.py --netlab --bandwidth 1gbit \
        --solver models/cifar10_quick/cifar10_quick_solver.prototxt \
        --data ../shared/data/synthetic_cifar --procs 4 --bucket_mb 0.001 0.05 0.25 25 auto \
        --repeats 3 --iters 60 --display 5 --skip_iters 10 --out docs/bench/netlab/training

**Gradient compression** (``--compress none fp16 topk gtopk``, ``--density 0.001 0.01``): each
method is its own run, passed as ``caffe train --comm_compress M`` (and ``--comm_density D``
for ``topk`` and ``gtopk``, one run per density; ``none`` and ``fp16`` ignore the densities;
``--no_error_feedback`` adds ``--nocomm_error_feedback``). P = 1 runs uncompressed (nothing is
sent). The settings table then has the columns compress, density and bytes/iter: the busiest
rank's bytes sent per iteration from the log's ``gradient traffic (...)`` lines (the median of
those logged at iterations > ``--skip_iters``; dense runs log none: "-"). Without
``--compress`` no flag is passed and the table is as before. ``--link_model JSON`` (a
:class:`caffe_engine.perf.link_model.LinkModel`, e.g. docs/bench/netlab/1gbit/links_model.json)
adds a predicted column per setting: the P = 1 median's time per iteration, times P / cores when
the P ranks share fewer cores (each rank one BLAS thread), plus, for topk/gtopk, the measured
CPU time of the selection (``topk_indices`` on each bucket, same scaling), plus the sum's time
after backward (:func:`caffe_engine.perf.compressed.compressed_allreduce_time` per bucket of the
``--bucket_mb`` plan, no overlap).

    python tools/scaling_check.py --netlab --bandwidth 100mbit \
        --solver models/mlp_wide/mlp_wide_solver.prototxt --data ../shared/data/mnist_5k \
        --procs 1 8 --compress none gtopk --density 0.001 --iters 14 --display 2 \
        --skip_iters 4 --repeats 3 --link_model docs/bench/netlab/100mbit/links_model.json

Run from the repository root (the solvers' paths are relative to it). The caller needs
mpi4py and the ``mpich`` wheel's ``mpiexec`` for P > 1.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _launch  # noqa: E402  (tools/_launch.py: loads netlab.py beside this script)
import bench_train  # noqa: E402  (BLAS_OVERRIDES: the variables a user's machine lacks)

from caffe_engine.backend import cpu_cores  # noqa: E402
from caffe_engine.perf import alpha_beta, compressed, iteration, link_model  # noqa: E402
from caffe_engine.comm.compress import METHODS as COMPRESS_METHODS  # noqa: E402 (--compress)
from caffe_engine.errors import CaffeError  # noqa: E402
from caffe_engine.io import prototxt  # noqa: E402
from caffe_engine.proto import caffe_pb2  # noqa: E402

_LAYER_LINE = re.compile(r"\]\s+(\S+)\s+(forward|backward): ([0-9.e+-]+) ms\.")
_RATE_LINE = re.compile(r"Iteration (\d+) \(([0-9.e+-]+) iter/s")
_PLAN_LINE = re.compile(r"(Buckets \(--bucket_mb auto(?:, MG-WFBP)?\): .*)")
_TRAFFIC_LINE = re.compile(r"Iteration (\d+), gradient traffic \((\w+)\): ([0-9.e+-]+) bytes "
                           r"sent per iteration by the busiest rank")
#: What --overlap's words set CAFFE_GRAD_OVERLAP to.
OVERLAP_ENV = {"on": "1", "off": "0"}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


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


# -- settings ------------------------------------------------------------------------------------
def bucket_value(text):
    """``--bucket_mb``'s values: ``auto`` or a positive size in MiB, kept as written."""
    if text == "auto":
        return text
    try:
        size = float(text)
    except ValueError:
        size = None
    if size is None or not 0 < size < float("inf"):
        raise argparse.ArgumentTypeError(f"want a positive size in MiB or auto, got {text!r}")
    return text


def settings(procs, buckets, overlaps):
    """The runs of one repeat, in order: (P, bucket, overlap); P = 1 once, as (1, None, None)."""
    out = []
    for p in procs:
        if p == 1:
            out.append((1, None, None))
        else:
            out += [(p, b, o) for b in buckets for o in overlaps]
    return out


def compress_settings(methods, densities):
    """The compression settings of one P, in order: (method, density); density None for
    ``none`` and ``fp16``, one entry per density for ``topk`` and ``gtopk``; [(None, None)]
    (no flag passed) without methods."""
    if not methods:
        return [(None, None)]
    out = []
    for m in methods:
        out += [(m, d) for d in densities] if m in ("topk", "gtopk") else [(m, None)]
    return out


def traffic_bytes(text, skip_iters=0):
    """(method, median bytes sent per iteration by the busiest rank) from a log's ``gradient
    traffic`` lines logged at iterations > skip_iters (all of them when none is); (None, None)
    without such lines."""
    found = [(int(it), m, float(b)) for it, m, b in _TRAFFIC_LINE.findall(text)]
    if not found:
        return None, None
    late = [f for f in found if f[0] > max(0, skip_iters)] or found
    return late[-1][1], statistics.median(f[2] for f in late)


def run_rate(text, skip_iters=0):
    """(rates, median) of one run's log: the ``iter/s`` figures logged at iterations > skip_iters
    (the one at iteration 0, which covers no iteration, always dropped), and their median;
    (rates, None) when none is left."""
    rates = [float(r) for it, r in _RATE_LINE.findall(text) if int(it) > max(0, skip_iters)]
    return rates, (statistics.median(rates) if rates else None)


def plan_line(text):
    """The ``Buckets (--bucket_mb auto...): ...`` lines of a log (the plan, the trials and the
    buckets kept) joined by `` / ``, or None."""
    found = _PLAN_LINE.findall(text)
    return " / ".join(line.strip() for line in found) if found else None


def _fmt_bucket(bucket):
    return "-" if bucket is None else str(bucket)


def summarize(runs, batch):
    """Group runs by (P, bucket, overlap), in first-seen order.

    Returns:
        list of dicts: procs, bucket_mb, overlap, rates (each run's median it/s), median,
        low, high, spread (max - min over median), images_s, speedup (over the P = 1 median;
        None without a P = 1 run), plans (the auto plan lines, one per run).
    """
    groups = {}
    for r in runs:
        key = (r["procs"], r["bucket_mb"], r["overlap"], r.get("compress"), r.get("density"))
        groups.setdefault(key, []).append(r)
    rows = []
    for (p, bucket, overlap, method, density), rs in groups.items():
        rates = [r["median"] for r in rs if r.get("median")]
        if not rates:
            continue
        med = statistics.median(rates)
        row = {"procs": p, "bucket_mb": bucket, "overlap": overlap, "rates": rates,
               "median": med, "low": min(rates), "high": max(rates),
               "spread": (max(rates) - min(rates)) / med,
               "images_s": p * batch * med,
               "plans": [r["plan"] for r in rs if r.get("plan")]}
        if any("compress" in r for r in rs):
            sent = [r["bytes_iter"] for r in rs if r.get("bytes_iter") is not None]
            row.update({"compress": method, "density": density,
                        "bytes_iter": statistics.median(sent) if sent else None})
        rows.append(row)
    base = next((r["median"] for r in rows if r["procs"] == 1), None)
    for row in rows:
        row["speedup"] = row["procs"] * row["median"] / base if base else None
    return rows


def settings_table(rows):
    """Markdown table of :func:`summarize`'s rows, then the auto plans (with compress, density
    and bytes/iter columns when a row has them; with predicted ms/iter and measured/predicted
    when a row has ``predicted_s``)."""
    if any("compress" in r for r in rows):
        return _compress_table(rows)
    lines = ["| P | --bucket_mb | overlap | iterations/s, median (runs' min-max) | spread "
             "| images/s | speedup | runs |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}"
        lines.append(f"| {r['procs']} | {_fmt_bucket(r['bucket_mb'])} | "
                     f"{r['overlap'] or '-'} | {r['median']:.3f} ({r['low']:.3f}-{r['high']:.3f}) "
                     f"| {100 * r['spread']:.0f} % | {r['images_s']:.0f} | {speedup} | "
                     f"{len(r['rates'])} |")
    plans = [(r, plan) for r in rows for plan in r["plans"]]
    if plans:
        lines += ["", "Auto plans (one line per run):", ""]
        lines += [f"- P = {r['procs']}, overlap {r['overlap']}: `{plan}`" for r, plan in plans]
    return "\n".join(lines)


def _compress_table(rows):
    pred = any(r.get("predicted_s") for r in rows)
    lines = ["| P | compress | density | --bucket_mb | overlap | iterations/s, median (runs' "
             "min-max) | spread | ms/iter | bytes/iter (busiest rank) | images/s | speedup | "
             "runs |" + (" predicted ms/iter (compute + select + comm) | measured/predicted |"
                         if pred else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if pred else "")]
    for r in rows:
        speedup = "" if r["speedup"] is None else f"{r['speedup']:.2f}"
        sent = "-" if r.get("bytes_iter") is None else f"{r['bytes_iter']:.0f}"
        line = (f"| {r['procs']} | {r.get('compress') or '-'} | "
                f"{'-' if r.get('density') is None else format(r['density'], 'g')} | "
                f"{_fmt_bucket(r['bucket_mb'])} | {r['overlap'] or '-'} | "
                f"{r['median']:.3f} ({r['low']:.3f}-{r['high']:.3f}) | "
                f"{100 * r['spread']:.0f} % | {1e3 / r['median']:.0f} | {sent} | "
                f"{r['images_s']:.0f} | {speedup} | {len(r['rates'])} |")
        if pred:
            p = r.get("predicted_s")
            if p:
                parts = r["predicted_parts"]
                line += (f" {p * 1e3:.0f} ({parts['compute'] * 1e3:.0f} + "
                         f"{parts['select'] * 1e3:.0f} + {parts['comm'] * 1e3:.0f}) | "
                         f"{(1.0 / r['median']) / p:.2f} |")
            else:
                line += " | |"
        lines.append(line)
    plans = [(r, plan) for r in rows for plan in r["plans"]]
    if plans:
        lines += ["", "Auto plans (one line per run):", ""]
        lines += [f"- P = {r['procs']}, overlap {r['overlap']}: `{plan}`" for r, plan in plans]
    return "\n".join(lines)


def bucket_counts(grads, bucket_mb):
    """Float counts of the gradient buckets of ``grads`` ({layer: bytes}, in forward order) cut
    in backward order at ``bucket_mb`` MiB, as GradientSync fills them (a layer larger than the
    cap is a bucket of its own)."""
    cap = float(bucket_mb) * (1 << 20)
    out, cur = [], 0
    for nbytes in reversed(list(grads.values())):
        if cur and cur + nbytes > cap:
            out.append(cur // 4)
            cur = 0
        cur += nbytes
    if cur:
        out.append(cur // 4)
    return out


def select_seconds(counts, density, reps=5):
    """Median CPU seconds of the Top-k selection (``compress.topk_indices``) on buckets of
    ``counts`` floats at ``density``, one thread, summed over the buckets."""
    import numpy
    from caffe_engine.comm import compress
    rng = numpy.random.default_rng(0)
    total = 0.0
    for n in counts:
        values = rng.standard_normal(int(n)).astype(numpy.float32)
        k = compress.k_for(int(n), density)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            compress.topk_indices(values, k)
            times.append(time.perf_counter() - t0)
        total += statistics.median(times)
    return total


def add_predictions(rows, model, counts, cores, select_s):
    """Add ``predicted_s`` and ``predicted_parts`` ({compute, select, comm} seconds) to the
    rows with P > 1 and a compress setting, in place: the P = 1 row's time per iteration times
    max(1, P / cores), ``select_s[density]`` (topk/gtopk) times the same factor, and the sum of
    :func:`compressed.compressed_allreduce_time` over the buckets of ``counts`` floats."""
    base = next((r for r in rows if r["procs"] == 1), None)
    if base is None:
        return rows
    t1 = 1.0 / base["median"]
    for r in rows:
        if r["procs"] == 1 or "compress" not in r:
            continue
        share = max(1.0, r["procs"] / cores)
        method = r.get("compress") or "none"
        sel = select_s.get(r.get("density"), 0.0) if method in ("topk", "gtopk") else 0.0
        comm = sum(compressed.compressed_allreduce_time(method, 4 * n, r["procs"], model,
                                                        r.get("density") or 0.001)
                   for n in counts)
        r["predicted_parts"] = {"compute": t1 * share, "select": sel * share, "comm": comm}
        r["predicted_s"] = t1 * share + sel * share + comm
    return rows


# -- running -------------------------------------------------------------------------------------
def data_sources(data):
    """(train LMDB, test LMDB) in folder ``data``: ``train_lmdb`` and ``test_lmdb``, or else the
    first entries (sorted) whose names hold ``train`` / ``test`` and end in ``lmdb`` (as
    ``mnist_train_lmdb``); the plain names when nothing matches."""
    try:
        names = sorted(os.listdir(data))
    except OSError:
        names = []

    def pick(kind):
        if f"{kind}_lmdb" in names:
            return os.path.join(data, f"{kind}_lmdb")
        found = [n for n in names if kind in n and n.endswith("lmdb")]
        return os.path.join(data, found[0] if found else f"{kind}_lmdb")
    return pick("train"), pick("test")


def point_data(net_param, data):
    """Point the Data layers of ``net_param`` at the LMDBs of folder ``data``
    (:func:`data_sources`; TEST-only layers at the test one) and at ``data``/mean.binaryproto
    (where a layer has a mean file), in place."""
    train, test = data_sources(data)
    for layer in net_param.layer:
        if layer.type != "Data":
            continue
        phases = {rule.phase for rule in layer.include if rule.HasField("phase")}
        layer.data_param.source = test if phases == {caffe_pb2.TEST} else train
        if layer.transform_param.mean_file:
            layer.transform_param.mean_file = os.path.join(data, "mean.binaryproto")


def write_solver(solver, iters, workdir, display=None, data=None):
    """A copy of ``solver`` for measuring (absolute net path, ``max_iter = iters``, no tests,
    no snapshots; its net copied with :func:`point_data` when ``data``); returns its path."""
    param = caffe_pb2.SolverParameter()
    prototxt.read_text(solver, param, "solver")
    param.net = os.path.abspath(os.path.join(ROOT, param.net))
    if data:
        net = prototxt.read_net_param(param.net)
        point_data(net, os.path.abspath(data))
        param.net = os.path.join(workdir, "net.prototxt")
        prototxt.write_text(param.net, net)
    param.max_iter = iters
    param.display = display or max(1, iters // 8)
    param.test_interval = iters + 1
    param.test_initialization = False
    param.ClearField("test_iter")
    param.snapshot = 0
    param.snapshot_after_train = False
    path = os.path.join(workdir, "solver.prototxt")
    prototxt.write_text(path, param)
    return path


def train_argv(solver_path, comm, bucket, compress=None, density=None, error_feedback=True):
    cmd = caffe_cmd() + ["train", f"--solver={solver_path}", f"--comm={comm}"]
    cmd += [f"--bucket_mb={bucket}"] if bucket is not None else []
    if compress is not None:
        cmd.append(f"--comm_compress={compress}")
        if density is not None:
            cmd.append(f"--comm_density={density:g}")
        if not error_feedback:
            cmd.append("--nocomm_error_feedback")
    return cmd


def run_env(overlap=None, threads=None, netmod=None, cost_model_path=None):
    """The ranks' environment: overlap switch, BLAS threads, MPICH netmod, auto's cost model;
    without ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` (``bench_train.BLAS_OVERRIDES``), which
    force a kernel below this CPU's instruction set that a user's machine would not."""
    env = {name: value for name, value in os.environ.items()
           if name not in bench_train.BLAS_OVERRIDES}
    env.pop("CAFFE_GRAD_OVERLAP", None)
    if overlap is not None:
        env["CAFFE_GRAD_OVERLAP"] = OVERLAP_ENV[overlap]
    if threads:
        env.update({var: str(threads) for var in THREAD_VARS})
    if netmod and netmod != "default":
        env["MPIR_CVAR_CH4_NETMOD"] = netmod
    if cost_model_path:
        env["CAFFE_COST_MODEL"] = os.path.abspath(cost_model_path)
    return env


def measure(solver_path, procs, comm, bucket=None, overlap=None, env=None, lab_factory=None,
            skip_iters=0, timeout=None, compress=None, density=None, error_feedback=True,
            record_compress=False):
    """One training run; returns a dict: rates, median it/s, plan (auto's line), seconds,
    load average before it (and with ``compress`` or ``record_compress``: compress, density,
    bytes_iter from the log's traffic lines; P = 1 runs uncompressed). ``lab_factory(P)``
    (with P > 1) makes the lab to run in."""
    with_compress = record_compress or compress is not None
    if procs == 1:
        compress = density = None
    argv = train_argv(solver_path, comm, bucket if procs > 1 else None, compress, density,
                      error_feedback)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.time()
    try:
        if procs > 1 and lab_factory is not None:
            with lab_factory(procs) as lab:
                out = lab.mpiexec(argv, env=env, timeout=timeout, cwd=ROOT, capture_output=True,
                                  text=True)
        else:
            cmd = (["mpiexec", "-n", str(procs)] if procs > 1 else []) + argv
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                                 timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"scaling_check: training on {procs} ranks took more than {timeout:g} s")
    seconds = time.time() - t0
    text = (out.stderr or "") + (out.stdout or "")
    if out.returncode != 0:
        sys.exit(f"scaling_check: training on {procs} ranks (--bucket_mb {_fmt_bucket(bucket)}, "
                 f"overlap {overlap or '-'}) failed (exit {out.returncode}): "
                 f"{(text.strip().splitlines() or [''])[-1]}")
    rates, med = run_rate(text, skip_iters)
    if med is None:
        sys.exit(f"scaling_check: no iteration rates past iteration {skip_iters} in the log of "
                 f"the {procs}-rank run")
    out = {"procs": procs, "bucket_mb": bucket if procs > 1 else None,
           "overlap": overlap if procs > 1 else None, "rates": rates, "median": med,
           "plan": plan_line(text), "seconds": round(seconds, 2), "load_before": load}
    if with_compress:
        out.update({"compress": compress, "density": density,
                    "bytes_iter": traffic_bytes(text, skip_iters)[1]})
    return out


def netlab_factory(args):
    """(function P -> a fresh :class:`netlab.Lab` of P hosts, one rank each; description of where
    the runs go); (None, "one machine ...") without ``--netlab``."""
    if not args.netlab:
        return None, "one machine, MPICH shared memory"
    netlab = _launch.load_tool("netlab")
    ok, why = netlab.available()
    if not ok:
        sys.exit(f"scaling_check: --netlab: {why}")
    rate = netlab.format_rate(netlab.parse_rate(args.bandwidth))
    return ((lambda p: netlab.Lab(p, 1, args.bandwidth)),
            f"netlab: one rank per emulated host, {rate} host links, MPICH netmod {args.netmod} "
            f"over TCP; P = 1 plain")


# -- main ----------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--solver", default="models/lenet/lenet_solver.prototxt")
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--iters", type=int, default=400, help="training iterations per run")
    ap.add_argument("--display", type=int, default=None,
                    help="the solver's display interval (default iters // 8)")
    ap.add_argument("--skip_iters", type=int, default=0,
                    help="also drop the rates logged at iterations <= this")
    ap.add_argument("--time_iterations", type=int, default=50, help="caffe time --iterations")
    ap.add_argument("--comm", default="tree")
    ap.add_argument("--bucket_mb", type=bucket_value, nargs="+", default=["25"],
                    help="gradient bucket sizes in MiB or auto, each its own run "
                         "(default: 25, caffe train's)")
    ap.add_argument("--overlap", nargs="+", choices=sorted(OVERLAP_ENV), default=["on"],
                    help="on: allreduce buckets during backward (the engine's default); off: "
                         "all after backward (CAFFE_GRAD_OVERLAP=0)")
    ap.add_argument("--repeats", type=int, default=1, help="run the list of settings R times")
    ap.add_argument("--threads", type=int, default=None,
                    help="BLAS threads per rank (OMP/OPENBLAS/MKL_NUM_THREADS; default: the "
                         "engine's share of the cores locally, 1 with --netlab)")
    ap.add_argument("--data", default=None,
                    help="folder with train_lmdb, test_lmdb, mean.binaryproto for the Data layers")
    ap.add_argument("--auto_cost_model", default=None,
                    help="CAFFE_COST_MODEL for --bucket_mb auto (default: alpha and beta "
                         "measured at the start of each run)")
    ap.add_argument("--cost_model", default="docs/bench_allreduce_model.json")
    ap.add_argument("--no_predict", action="store_true", help="measure only (local mode)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--out", default=None, help="write table.md and results.json here")
    net = ap.add_argument_group("emulated network (tools/netlab.py; root)")
    net.add_argument("--netlab", action="store_true",
                     help="P > 1: P emulated hosts, one rank each, MPICH over TCP")
    net.add_argument("--bandwidth", default="1gbit", help="host links' rate (tc words)")
    net.add_argument("--netmod", default="ofi", choices=["ofi", "ucx", "default"],
                     help="MPICH's network module (MPIR_CVAR_CH4_NETMOD)")
    comp = ap.add_argument_group("gradient compression (caffe train --comm_compress ...)")
    comp.add_argument("--compress", nargs="+", choices=COMPRESS_METHODS, default=None,
                      help="each method its own run (--comm_compress); default: no flag")
    comp.add_argument("--density", type=float, nargs="+", default=[0.001],
                      help="topk/gtopk densities, each its own run (--comm_density)")
    comp.add_argument("--no_error_feedback", action="store_true",
                      help="pass --nocomm_error_feedback to the compressed runs")
    comp.add_argument("--link_model", default=None,
                      help="LinkModel JSON: add predicted ms/iter per compress setting")
    args = ap.parse_args(argv)
    if any(not 0 < d <= 1 for d in args.density):
        ap.error("--density values must be in (0, 1]")
    if args.link_model and not args.compress:
        ap.error("--link_model needs --compress")
    if args.repeats < 1 or args.iters < 1 or (args.display is not None and args.display < 1):
        ap.error("--repeats, --iters and --display must be positive")
    display = args.display or max(1, args.iters // 8)
    if (args.iters - 1) // display * display <= max(0, args.skip_iters):
        ap.error(f"--skip_iters {args.skip_iters} leaves no logged rate in {args.iters} "
                 f"iterations")
    if args.netlab:
        args.no_predict = True
        if args.threads is None:
            args.threads = 1
    return args


def main(argv=None):
    args = parse_args(argv)
    os.chdir(ROOT)
    try:
        return _main(args, argv)
    except CaffeError as exc:
        sys.exit(f"scaling_check: {exc}")


def _main(args, argv):
    workdir = tempfile.mkdtemp(prefix="scaling_check_")
    try:
        solver_path = write_solver(args.solver, args.iters, workdir, args.display, args.data)
        copy = caffe_pb2.SolverParameter()
        prototxt.read_text(solver_path, copy, "solver")
        net_path = copy.net
        batch = _train_batch(net_path)
        grads = param_bytes(net_path) if args.link_model else None
        lab_factory, lab_desc = netlab_factory(args)
        plan = [(p, b, o, m, d) for p, b, o in settings(args.procs, args.bucket_mb, args.overlap)
                for m, d in (compress_settings(args.compress, args.density) if p > 1
                             else [(None, None)])]
        runs = []
        t_start = time.time()
        for rep in range(args.repeats):
            for p, bucket, overlap, method, density in plan:
                env = run_env(overlap, args.threads, args.netmod if args.netlab else None,
                              args.auto_cost_model)
                run = measure(solver_path, p, args.comm, bucket, overlap, env, lab_factory,
                              args.skip_iters, args.timeout, method, density,
                              not args.no_error_feedback, record_compress=bool(args.compress))
                run["repeat"] = rep
                runs.append(run)
                what = "" if method is None else (
                    f", {method}" + ("" if density is None else f" {density:g}") +
                    ("" if run.get("bytes_iter") is None else
                     f", {run['bytes_iter']:.0f} bytes/iter"))
                print(f"[{rep + 1}/{args.repeats}] P = {p}, --bucket_mb {_fmt_bucket(bucket)}, "
                      f"overlap {overlap or '-'}{what}: {run['median']:.3f} it/s "
                      f"({len(run['rates'])} rates, {run['seconds']:.0f} s, load "
                      f"{run['load_before']:.1f})" + (f"\n    {run['plan']}" if run["plan"]
                                                      else ""), file=sys.stderr, flush=True)
        total_s = time.time() - t_start
        predictions = None if args.no_predict else predict(args, net_path, runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    rows = summarize(runs, batch)
    if args.link_model:
        model = link_model.LinkModel.load(args.link_model)
        bucket = args.bucket_mb[0] if args.bucket_mb[0] != "auto" else "25"
        counts = bucket_counts(grads, bucket)
        sel = {d: select_seconds(counts, d) for d in args.density}
        add_predictions(rows, model, counts, cpu_cores(), sel)
    header = (f"{args.solver}: batch {batch} per rank, {args.iters} iterations per run "
              f"(display {args.display or max(1, args.iters // 8)}, rates logged at iterations <= "
              f"{args.skip_iters} dropped), --comm {args.comm}, {lab_desc}, BLAS threads per "
              f"rank {args.threads or 'engine default'}, {cpu_cores()} cores, "
              + (f"compression {' '.join(args.compress)} (densities "
                 f"{' '.join(format(d, 'g') for d in args.density)}, error feedback "
                 f"{'off' if args.no_error_feedback else 'on'}), " if args.compress else "")
              + f"{args.repeats} repeat(s) in alternating order; {total_s:.0f} s in all")
    print(header)
    print()
    if predictions is not None:
        print(predictions)
        print()
    table = settings_table(rows)
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(header + "\n\n" + table + "\n")
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump({"command": sys.argv if argv is None else ["scaling_check.py"] + list(argv),
                       "header": header, "batch": batch, "rows": rows, "runs": runs,
                       "seconds": round(total_s, 1)}, f, indent=1)
    return 0


def predict(args, net_path, runs):
    """The local mode's table: predicted against measured (the first setting's median) per P."""
    model = alpha_beta.AlphaBetaModel.load(args.cost_model)
    grads = param_bytes(net_path)
    n_cores = cpu_cores()
    batch = _train_batch(net_path)
    bucket = float(args.bucket_mb[0]) if args.bucket_mb[0] != "auto" else 25.0
    overlap = args.overlap[0] == "on"
    rows = []
    for p in args.procs:
        threads = args.threads or max(1, n_cores // p)
        share = max(1.0, p / n_cores)
        times = {k: (f * share, b * share)
                 for k, (f, b) in layer_times(net_path, threads, args.time_iterations).items()}
        comm = (lambda n: 0.0) if p == 1 else (lambda n, p=p: model.predict(args.comm, n, p))
        it = iteration.iteration_time(times, grads, comm, overlap=overlap, bucket_mb=bucket)
        mine = [r["median"] for r in runs if r["procs"] == p and
                r["bucket_mb"] in (None, args.bucket_mb[0]) and
                r["overlap"] in (None, args.overlap[0])]
        rows.append((p, threads, it, 1.0 / statistics.median(mine)))
    t1_pred, t1_meas = rows[0][2]["total"], rows[0][3]
    lines = [f"Predicted with cost model {args.cost_model}:", "",
             "| P | BLAS threads/rank | predicted ms/iter (compute + exposed comm) | measured "
             "ms/iter | predicted img/s | measured img/s | predicted speedup | measured speedup |",
             "|---|---|---|---|---|---|---|---|"]
    for p, threads, it, t_meas in rows:
        t_pred = it["total"]
        compute = it["forward"] + it["backward"]
        lines.append(f"| {p} | {threads} | {t_pred * 1e3:.1f} ({compute * 1e3:.1f} + "
                     f"{it['exposed'] * 1e3:.2f}) | {t_meas * 1e3:.1f} | "
                     f"{p * batch / t_pred:.0f} | {p * batch / t_meas:.0f} | "
                     f"{p * t1_pred / t_pred:.2f} | "
                     f"{p * t1_meas / t_meas:.2f} |")
    return "\n".join(lines)


def _train_batch(net_path):
    from caffe_engine.net import Net
    net = Net(net_path, caffe_pb2.TRAIN)
    return net.blobs[net.blob_names[0]].shape[0]


if __name__ == "__main__":
    sys.exit(main())
