#!/usr/bin/env python
"""PCL-DNN's hybrid FC layers against data parallelism on emulated hosts, beside the balance
equations' prediction; and tree against ring against hier allreduce as the link latency grows.

Training (issue 29, "Measurements"): CaffeNet and VGG-16 train nets made from their deploy shapes
(``../shared/realworld``: CaffeNet-flowers with fc8 resized to 1000 classes, VGG-16's deploy;
DummyData images and labels, SoftmaxWithLoss; gaussian weights) run ``caffe train`` on a fresh
netlab lab per run: P hosts, one rank each, every rank ``OMP_NUM_THREADS=1``, MPICH over TCP
(OFI), host links of each ``--bandwidth`` and ``--latency``. Settings per P: data parallelism
(no flag), ``--fc_parallel G`` for each divisor G > 1 of P, and ``--fc_parallel auto``
(``--fc`` chooses). P = 1 runs plain, once per net. Each run records:

* iteration time: the median of the per-iteration rates the log prints (``display: 1``) past
  ``--skip`` iterations; speedup = P x T(1) / T(P) (weak scaling, ``--batch`` images per rank);
* wire bytes per iteration: each host's transmit counter (``Lab.tx_bytes``) read when the log
  reaches iteration ``--skip`` and at each later one: (last - first) / iterations, the busiest
  host's and the mean (frames with their headers: everything the rank sent, gradients,
  activations, MPI's own);
* the peak RSS of each rank (``ru_maxrss`` of a small wrapper's children), the load average;
* predicted: :func:`caffe_engine.perf.hybrid.predict_iteration` for the same setting, with the
  link model fitted on the emulated links (``docs/bench/netlab/<rate>/links_model.json``: alpha
  per message, beta) plus the set latency, the FLOP rate that makes the P = 1 prediction equal
  the P = 1 run, and P ranks sharing this machine's cores.

Per (net, link, P) the table gives the measured best setting, the predicted best G and what the
predicted best measured, as a share of the best (issue 29 asks for within 25 %).

Allreduce (``--allreduce``): ``tools/bench_allreduce.py --netlab`` per bandwidth and latency,
tree, ring and mpi at P = 2, 4, 8 one rank per host, and hier, ring and tree at P = 4, 8 with
two ranks per host, 4 KiB .. 4 MiB; the table lists per latency and P the largest size at which
the tree beats the ring (the crossover).

Outputs under ``--out`` (default docs/bench/netlab/hybrid): results.json (every run, written
after each: a rerun skips the runs already there, so an interrupted grid resumes), table.md,
plot.png (iteration time per setting; allreduce time per latency), allreduce/<rate>_<latency>/.

    python tools/hybrid_check.py --quick                     # 3 runs, a minute: the plumbing
    python tools/hybrid_check.py                             # 1 Gbit/s x 0, 50, 500 us (1 h)
    python tools/hybrid_check.py --nets caffenet --bandwidth 100mbit --latency none    # 30 min
    python tools/hybrid_check.py --nets vgg16 --procs 1 2 --bandwidth 100mbit --latency none
    python tools/hybrid_check.py --nets caffenet --procs 8 --fc auto    # what auto picks
    python tools/hybrid_check.py --allreduce --no-train --latency none 50us 500us
    python tools/hybrid_check.py --replot                    # tables and plot from results.json

Invocations with the same ``--out`` add to one results.json (a run's key is net, P, setting,
rate and latency), so the grid is the union of such commands; docs/scaling.md lists the ones
behind its tables and their durations.

Needs root (netlab) and the ``mpich`` wheel's mpiexec. Run from anywhere; paths are the repo's.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

TOOLS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TOOLS)
sys.path.insert(0, ROOT)
sys.path.insert(0, TOOLS)

import _launch  # noqa: E402
import scaling_check  # noqa: E402  (the ranks' environment and the log's rates, as its runs)

from caffe_engine.comm.hybrid_cost import Link, divisors  # noqa: E402
from caffe_engine.io import prototxt  # noqa: E402
from caffe_engine.perf import hybrid  # noqa: E402
from caffe_engine.proto import caffe_pb2  # noqa: E402

REALWORLD = os.path.join(os.path.dirname(ROOT), "shared", "realworld")
#: name -> (source prototxt under ../shared/realworld, classes of its last InnerProduct)
NETS = {"caffenet": ("natanielruiz__net-archive/caffenet-flowers/train_val.prototxt", 1000),
        "vgg16": ("natanielruiz__net-archive/vgg_ilsvrc_16/VGG_ILSVRC_16_layers_deploy.prototxt",
                  1000)}
DATA_TYPES = ("Data", "ImageData", "Input", "HDF5Data", "DummyData", "MemoryData", "WindowData")
RATE_LINE = scaling_check._RATE_LINE
RSS_LINE = re.compile(r"hybrid_check: rank peak RSS (\d+) kB")
HYBRID_LINE = re.compile(r"hybrid \(PCL-DNN\) layers: ([^\n]*)")
#: Each rank runs caffe under this wrapper, which reports its children's peak RSS (the
#: supervised child included) and passes the exit status on. close_fds=False: hydra's PMI fd.
RSS_WRAPPER = ("import resource, subprocess, sys\n"
               "code = subprocess.call([sys.executable, '-m', 'caffe_engine'] + sys.argv[1:],"
               " close_fds=False)\n"
               "kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
               "print(f'hybrid_check: rank peak RSS {kb} kB', file=sys.stderr, flush=True)\n"
               "sys.exit(code)\n")
LINK_MODELS = {"1gbit": "docs/bench/netlab/1gbit/links_model.json",
               "100mbit": "docs/bench/netlab/100mbit/links_model.json"}


# -- the nets ----------------------------------------------------------------------------------
def _input_shape(layers):
    """(C, H, W) of the net's image input: an Input layer's shape, else 3 x crop x crop."""
    for layer in layers:
        if layer.type == "Input" and layer.input_param.shape:
            return tuple(layer.input_param.shape[0].dim[1:4])
        if layer.transform_param.crop_size:
            return (3, layer.transform_param.crop_size, layer.transform_param.crop_size)
    raise ValueError("no Input layer and no crop_size: cannot tell the image shape")


def _dummy_data(batch, shape):
    layer = caffe_pb2.LayerParameter(name="data", type="DummyData", top=["data", "label"])
    p = layer.dummy_data_param
    p.shape.add().dim.extend([batch] + list(shape))
    p.shape.add().dim.extend([batch])
    p.data_filler.add(type="gaussian", std=1.0)
    p.data_filler.add(type="constant", value=0.0)
    return layer


def train_net(source, batch, classes):
    """A TRAIN net from a deploy (or train_val) prototxt: its data layers, TEST-only layers and
    Accuracy dropped, DummyData ``data`` (``batch`` x C x H x W, gaussian) and ``label`` (0)
    first, the last InnerProduct resized to ``classes`` outputs, a final Softmax turned into
    SoftmaxWithLoss against ``label``, gaussian (std 0.01) weights where no filler is given.

    Returns:
        caffe_pb2.NetParameter.
    """
    param = prototxt.read_net_param(source)
    shape = _input_shape(param.layer)
    keep = [l for l in param.layer
            if l.type not in DATA_TYPES + ("Accuracy",)
            and not any(r.phase == caffe_pb2.TEST for r in l.include if r.HasField("phase"))]
    out = caffe_pb2.NetParameter(name=param.name + f"_dummy_b{batch}")
    out.layer.extend([_dummy_data(batch, shape)] + keep)
    ips = [l for l in out.layer if l.type == "InnerProduct"]
    ips[-1].inner_product_param.num_output = classes
    for l in out.layer:
        p = {"Convolution": l.convolution_param, "InnerProduct": l.inner_product_param}.get(l.type)
        if p is not None and not p.HasField("weight_filler"):
            p.weight_filler.type, p.weight_filler.std = "gaussian", 0.01
        if l.type == "Softmax" and not any(x.type == "SoftmaxWithLoss" for x in out.layer):
            l.type, l.top[:] = "SoftmaxWithLoss", ["loss"]
            l.bottom.append("label")
    return out


def write_inputs(workdir, net_name, batch, iters, seed=1):
    """Write the train net and its solver (SGD, momentum 0.9, display 1, no tests, no
    snapshots) into ``workdir``; returns (solver path, net path)."""
    source, classes = NETS[net_name]
    net_path = os.path.join(workdir, f"{net_name}_b{batch}.prototxt")
    prototxt.write_text(net_path, train_net(os.path.join(REALWORLD, source), batch, classes))
    solver = caffe_pb2.SolverParameter(net=net_path, base_lr=0.001, momentum=0.9,
                                       lr_policy="fixed", max_iter=iters, display=1,
                                       snapshot=0, snapshot_after_train=False,
                                       random_seed=seed, test_initialization=False)
    path = os.path.join(workdir, f"{net_name}_b{batch}_solver.prototxt")
    prototxt.write_text(path, solver)
    return path, net_path


# -- the grid ----------------------------------------------------------------------------------
def fc_settings(procs, wanted):
    """``--fc`` words for P: "data", each divisor G > 1 ("G", as digits), "auto"."""
    out = []
    for w in wanted:
        if w == "groups":
            out += [str(g) for g in divisors(procs)[1:]]
        elif w == "data" or w == "auto" or (w.isdigit() and procs % int(w) == 0 and w != "1"):
            out.append(w)
    return out


def grid(args):
    """Every run of the measurement, in order: dicts net, procs, fc, bandwidth, latency
    (P = 1 once per net, with no link)."""
    runs = []
    for net in args.nets:
        procs = [p for p in args.procs if net != "vgg16" or p <= args.vgg_max_procs]
        if 1 in procs:
            runs.append({"net": net, "procs": 1, "fc": "data", "bandwidth": None,
                         "latency": None})
        for bw in args.bandwidth:
            for lat in args.latency:
                for p in (q for q in procs if q > 1):
                    runs += [{"net": net, "procs": p, "fc": fc, "bandwidth": bw, "latency": lat}
                             for fc in fc_settings(p, args.fc)]
    return runs


def run_key(run):
    """A run's identity in results.json (what a resumed grid skips)."""
    return f"{run['net']}|P{run['procs']}|{run['fc']}|{run['bandwidth']}|{run['latency']}"


# -- one run -----------------------------------------------------------------------------------
def rank_argv(solver_path, comm, fc):
    """What each rank runs: ``caffe train`` under :data:`RSS_WRAPPER`."""
    argv = [sys.executable, "-c", RSS_WRAPPER, "train", f"--solver={solver_path}",
            f"--comm={comm}"]
    return argv + ([f"--fc_parallel={fc}"] if fc != "data" else [])


def watch(proc, skip, sample, timeout):
    """Read a run's merged output line by line; at every rate line logged at an iteration
    >= ``skip`` call ``sample()`` (None: nothing to sample). Kills the process group past
    ``timeout`` seconds.

    Returns:
        (text, [(iteration, sample)], timed_out)
    """
    netlab = _launch.load_tool("netlab")
    expired = threading.Event()

    def kill():
        expired.set()
        netlab._kill_group(proc)
    timer = threading.Timer(timeout, kill)
    timer.start()
    lines, samples = [], []
    try:
        for line in proc.stdout:
            lines.append(line)
            m = RATE_LINE.search(line)
            if m and int(m.group(1)) >= skip and sample is not None:
                samples.append((int(m.group(1)), sample()))
        proc.wait()
    finally:
        timer.cancel()
    return "".join(lines), samples, expired.is_set()


def wire_bytes(samples):
    """(busiest host's, mean) bytes sent per iteration between the first and last sample, or
    (None, None) with fewer than two samples."""
    if len(samples) < 2 or samples[-1][0] == samples[0][0]:
        return None, None
    (i0, s0), (i1, s1) = samples[0], samples[-1]
    per = [(b - a) / (i1 - i0) for a, b in zip(s0, s1)]
    return max(per), sum(per) / len(per)


def measure(run, solver_path, args):
    """One training run of :func:`grid`'s ``run``; returns its record (module docstring)."""
    netlab = _launch.load_tool("netlab")
    argv = rank_argv(solver_path, args.comm, run["fc"])
    env = scaling_check.run_env(threads=1, netmod=args.netmod)
    load = os.getloadavg()[0]
    t0 = time.time()
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                 start_new_session=True)
    if run["procs"] == 1:
        proc = subprocess.Popen(argv, env=env, **popen)
        text, samples, expired = watch(proc, args.skip, None, args.timeout)
    else:
        with netlab.Lab(run["procs"], 1, run["bandwidth"], run["latency"]) as lab:
            env.pop("CAFFE_NODE", None)
            proc = subprocess.Popen(lab.mpiexec_argv(argv), env=env, **popen)
            text, samples, expired = watch(
                proc, args.skip, lambda: [lab.tx_bytes(h.name) for h in lab.hosts],
                args.timeout)
    rates, median = scaling_check.run_rate(text, args.skip)
    rss = [int(kb) / 1024 for kb in RSS_LINE.findall(text)]
    busiest, mean = wire_bytes(samples)
    chosen = HYBRID_LINE.search(text)
    out = dict(run, key=run_key(run), batch=args.batch, rates=rates,
               hybrid_layers=chosen.group(1).strip() if chosen else None,
               median_it_s=median,
               wire_bytes_max=busiest, wire_bytes_mean=mean,
               rss_mb=rss, rss_mb_max=max(rss) if rss else None,
               load_before=round(load, 2), seconds=round(time.time() - t0, 1),
               returncode=proc.returncode)
    if expired or proc.returncode != 0 or not rates:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-3:]
        out["error"] = ("timed out; " if expired else "") + " / ".join(tail)
    out["ms_iter"] = 1e3 / out["median_it_s"] if out["median_it_s"] else None
    return out


# -- results -----------------------------------------------------------------------------------
def load_results(path):
    """results.json's content, or a fresh one."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {"runs": [], "allreduce": {}}


def save_results(results, path):
    """Write atomically (a killed grid leaves the previous file whole)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, path)


def run_grid(args, results, path):
    """Measure every run of :func:`grid` not yet in ``results`` (failed runs are retried only
    with ``--retry``), saving after each."""
    done = {r["key"] for r in results["runs"] if "error" not in r or not args.retry}
    todo = [r for r in grid(args) if run_key(r) not in done]
    results["runs"] = [r for r in results["runs"] if r["key"] not in {run_key(t) for t in todo}]
    with tempfile.TemporaryDirectory(prefix="hybrid_check_") as workdir:
        solvers = {}
        for i, run in enumerate(todo):
            if run["net"] not in solvers:
                solvers[run["net"]] = write_inputs(workdir, run["net"], args.batch,
                                                   args.iters)[0]
            rec = measure(run, solvers[run["net"]], args)
            results["runs"].append(rec)
            save_results(results, path)
            ms = f"{rec['ms_iter']:.0f} ms/iter" if rec["ms_iter"] else "no rate"
            wire = (f", {rec['wire_bytes_max'] / 1e6:.1f} MB/iter busiest host"
                    if rec["wire_bytes_max"] else "")
            print(f"[{i + 1}/{len(todo)}] {rec['key']}: {ms}{wire}, peak RSS "
                  f"{rec['rss_mb_max'] or 0:.0f} MB/rank, {rec['seconds']:.0f} s, load "
                  f"{rec['load_before']}" + (f"\n    ERROR {rec['error']}" if "error" in rec
                                              else ""), file=sys.stderr, flush=True)


# -- predictions -------------------------------------------------------------------------------
def link_for(bandwidth, latency):
    """The link model fitted on ``bandwidth``'s emulated links (alpha, beta) plus ``latency``;
    None where no model file exists for that rate."""
    netlab = _launch.load_tool("netlab")
    path = os.path.join(ROOT, LINK_MODELS.get(str(bandwidth), "-"))
    if not os.path.exists(path):
        return None
    with open(path) as f:
        d = json.load(f)
    return Link(d["alpha"] + (netlab.parse_time(latency) or 0.0), d["beta"])


def add_predictions(results, batch, comm, cores):
    """Add predicted ms/iter, groups and bytes per rank to every run with P > 1 (in place):
    :func:`caffe_engine.perf.hybrid.predict_iteration` with the FLOP rate that makes the P = 1
    prediction equal that net's P = 1 run."""
    from caffe_engine.backend import cpu_cores
    cores = cores or cpu_cores()
    with tempfile.TemporaryDirectory(prefix="hybrid_check_") as workdir:
        for net in sorted({r["net"] for r in results["runs"]}):
            one = [r for r in results["runs"] if r["net"] == net and r["procs"] == 1
                   and r.get("ms_iter")]
            if not one:
                continue
            layers = hybrid.from_prototxt(write_inputs(workdir, net, batch, 1)[1])
            work = sum(s.flops + s.backward_flops for s in layers) * batch
            flops = work / (one[0]["ms_iter"] / 1e3)
            for r in results["runs"]:
                link = link_for(r["bandwidth"], r["latency"])
                if r["net"] != net or r["procs"] == 1 or link is None:
                    continue
                fc = "auto" if r["fc"] == "auto" else (1 if r["fc"] == "data" else int(r["fc"]))
                it = hybrid.predict_iteration(layers, batch, r["procs"], fc, link, comm, flops,
                                              cores)
                r["predicted_ms"] = it["total"] * 1e3
                r["predicted_groups"] = {n: t["group"] for n, t in it["layers"].items()}
                r["predicted_sent_bytes"] = it["sent_bytes"]
                r["predicted_flops"] = flops
    return results


def best_rows(runs):
    """Per (net, bandwidth, latency, P): the measured best of data parallelism and the G
    settings, the predicted best among them, the measured time of the predicted best over the
    measured best's, data parallelism's over the best's, and ``auto``'s over the best's (it runs
    one of the G settings: the one its log's plan chose)."""
    cells = {}
    for r in runs:
        if r["procs"] > 1 and r.get("ms_iter") and r.get("predicted_ms"):
            cells.setdefault((r["net"], r["bandwidth"], r["latency"], r["procs"]), []).append(r)
    out = []
    for (net, bw, lat, p), rs in cells.items():
        fixed = [r for r in rs if r["fc"] != "auto"]
        if not fixed:
            continue
        measured = min(fixed, key=lambda r: r["ms_iter"])
        predicted = min(fixed, key=lambda r: r["predicted_ms"])
        data = next((r for r in fixed if r["fc"] == "data"), None)
        auto = next((r for r in rs if r["fc"] == "auto"), None)
        out.append({"net": net, "bandwidth": bw, "latency": lat, "procs": p,
                    "measured_best": measured["fc"], "measured_ms": measured["ms_iter"],
                    "predicted_best": predicted["fc"], "predicted_best_ms": predicted["ms_iter"],
                    "ratio": predicted["ms_iter"] / measured["ms_iter"],
                    "data_over_best": data["ms_iter"] / measured["ms_iter"] if data else None,
                    "auto_over_best": auto["ms_iter"] / measured["ms_iter"] if auto else None})
    return out


# -- allreduce ---------------------------------------------------------------------------------
def run_allreduce(args, results, path):
    """tools/bench_allreduce.py --netlab per bandwidth and latency (skipping those done): flat
    (tree, ring, mpi at ``--ar-procs``, one rank per host) and two ranks per host (hier, ring,
    tree at those P >= 4)."""
    flat = [str(p) for p in args.ar_procs]
    pairs = [str(p) for p in args.ar_procs if p >= 4 and p % 2 == 0]
    kinds = [("flat", ["--procs", *flat, "--algorithms", "tree", "ring", "mpi"])]
    if pairs:
        kinds.append(("hier2", ["--procs", *pairs, "--ranks-per-host", "2", "--algorithms",
                                "hier", "ring", "tree"]))
    for bw in args.bandwidth:
        for lat in args.latency:
            for kind, extra in kinds:
                key = f"{bw}|{lat}|{kind}"
                if key in results["allreduce"] and not args.retry:
                    continue
                out = os.path.join(args.out, "allreduce", f"{bw}_{lat}_{kind}")
                cmd = [sys.executable, os.path.join(TOOLS, "bench_allreduce.py"), "--netlab",
                       "--bandwidth", bw, "--sizes", *args.ar_sizes, "--reps", str(args.reps),
                       "--out", out, *extra] + (["--latency", lat] if lat != "none" else [])
                t0 = time.time()
                done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                rec = {"command": cmd, "seconds": round(time.time() - t0, 1),
                       "returncode": done.returncode, "rows": []}
                if done.returncode == 0:
                    with open(os.path.join(out, "results.json")) as f:
                        rec["rows"] = json.load(f)["rows"]
                else:
                    rec["error"] = (done.stderr.strip().splitlines() or [""])[-1]
                results["allreduce"][key] = rec
                save_results(results, path)
                print(f"allreduce {key}: {rec['seconds']:.0f} s"
                      + (f" ERROR {rec['error']}" if "error" in rec else ""), file=sys.stderr,
                      flush=True)


def crossovers(results):
    """Per (bandwidth, latency, P) of the flat runs: the sizes at which the tree beat the ring,
    and the largest of them."""
    out = []
    for key, rec in results.get("allreduce", {}).items():
        bw, lat, kind = key.split("|")
        if kind != "flat":
            continue
        cell = {}
        for r in rec["rows"]:
            cell.setdefault(int(r["procs"]), {}).setdefault(int(r["bytes"]), {})[
                r["algorithm"]] = r["seconds"]
        for p, by_size in sorted(cell.items()):
            wins = [n for n, t in sorted(by_size.items())
                    if "tree" in t and "ring" in t and t["tree"] < t["ring"]]
            out.append({"bandwidth": bw, "latency": lat, "procs": p, "tree_wins": wins,
                        "crossover": max(wins) if wins else None, "times": by_size})
    return out


# -- tables and plot ---------------------------------------------------------------------------
def _f(value, fmt):
    return "-" if value is None else format(value, fmt)


def _mb(nbytes):
    return _f(nbytes / 1e6 if nbytes else None, ".1f")


def _link(r):
    return "-" if r["procs"] == 1 else f"{r['bandwidth']}, {r['latency']}"


def training_table(runs):
    """Markdown: every training run, measured beside predicted."""
    base = {r["net"]: r["ms_iter"] for r in runs if r["procs"] == 1 and r.get("ms_iter")}
    lines = ["| net | link, latency | P | --fc_parallel | measured ms/iter | predicted ms/iter "
             "(groups) | measured / predicted | speedup | wire MB/iter, busiest host | "
             "predicted MB/iter/rank | peak RSS MB/rank | hybrid layers (the run's log) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        ms, pred = r.get("ms_iter"), r.get("predicted_ms")
        groups = ", ".join(f"{n} {g}" for n, g in (r.get("predicted_groups") or {}).items())
        speed = (r["procs"] * base[r["net"]] / ms) if ms and r["net"] in base else None
        lines.append(
            f"| {r['net']} | {_link(r)} | {r['procs']} | {r['fc']} | "
            f"{_f(ms, '.0f') if 'error' not in r else 'failed: ' + r['error'][:60]} | "
            f"{_f(pred, '.0f')}{f' ({groups})' if groups else ''} | "
            f"{_f(ms / pred if ms and pred else None, '.2f')} | {_f(speed, '.2f')} | "
            f"{_mb(r.get('wire_bytes_max'))} | {_mb(r.get('predicted_sent_bytes'))} | "
            f"{_f(r.get('rss_mb_max'), '.0f')} | {r.get('hybrid_layers') or '-'} |")
    return "\n".join(lines)


def best_table(rows):
    """Markdown: measured best against predicted best per (net, link, P)."""
    lines = ["| net | link, latency | P | measured best | predicted best | measured ms at "
             "predicted best / best | data parallel ms / best | auto ms / best |",
             "|---|---|---|---|---|---|---|---|"]
    for b in rows:
        lines.append(f"| {b['net']} | {b['bandwidth']}, {b['latency']} | {b['procs']} | "
                     f"{b['measured_best']} ({b['measured_ms']:.0f} ms) | {b['predicted_best']} "
                     f"| {b['ratio']:.2f} | {_f(b['data_over_best'], '.2f')} | "
                     f"{_f(b['auto_over_best'], '.2f')} |")
    return "\n".join(lines)


def crossover_table(rows):
    """Markdown: per link, latency and P, where the tree beat the ring, and tree / ring at the
    smallest and the largest size."""
    lines = ["| link | latency | P | sizes where tree < ring | crossover (largest) | tree / ring"
             " ms, smallest size | tree / ring ms, largest size |", "|---|---|---|---|---|---|---|"]
    for c in rows:
        wins = ", ".join(_size(n) for n in c["tree_wins"]) or "none"
        ends = []
        for n in (min(c["times"]), max(c["times"])):
            t = c["times"][n]
            ends.append(f"{_size(n)}: {t.get('tree', 0) * 1e3:.2f} / {t.get('ring', 0) * 1e3:.2f}")
        lines.append(f"| {c['bandwidth']} | {c['latency']} | {c['procs']} | {wins} | "
                     f"{_size(c['crossover']) if c['crossover'] else '-'} | {ends[0]} | "
                     f"{ends[1]} |")
    return "\n".join(lines)


def _size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def plot(results, path):
    """plot.png: per net, measured (filled) and predicted (hollow) ms/iter per setting and
    link; then the allreduce time of tree and ring against the size, per latency, at P = 8."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = [r for r in results["runs"] if r["procs"] > 1 and r.get("ms_iter")]
    nets = sorted({r["net"] for r in runs})
    cross = crossovers(results)
    panels = len(nets) + (1 if cross else 0)
    if not panels:
        return None
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    for ax, net in zip(axes[0], nets):
        mine = [r for r in runs if r["net"] == net]
        labels = sorted({(r["procs"], r["fc"]) for r in mine},
                        key=lambda x: (x[0], x[1] != "data", x[1] == "auto", x[1]))
        xs = {lab: i for i, lab in enumerate(labels)}
        for j, link in enumerate(sorted({(r["bandwidth"], r["latency"]) for r in mine})):
            rs = [r for r in mine if (r["bandwidth"], r["latency"]) == link]
            color = f"C{j}"
            ax.plot([xs[(r["procs"], r["fc"])] for r in rs], [r["ms_iter"] for r in rs], "o",
                    color=color, label=f"{link[0]}, {link[1]} measured")
            pr = [r for r in rs if r.get("predicted_ms")]
            ax.plot([xs[(r["procs"], r["fc"])] for r in pr], [r["predicted_ms"] for r in pr],
                    "o", mfc="none", color=color, label="predicted")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels([f"P{p}\n{fc}" for p, fc in labels], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("ms per iteration")
        ax.set_title(f"{net}: data parallel vs --fc_parallel G")
        ax.legend(fontsize=6)
    if cross:
        ax = axes[0][-1]
        for j, c in enumerate(x for x in cross if x["procs"] == max(y["procs"] for y in cross)):
            sizes = sorted(c["times"])
            for alg, style in (("tree", "-"), ("ring", "--")):
                pts = [(n, c["times"][n][alg]) for n in sizes if alg in c["times"][n]]
                ax.plot([n for n, _ in pts], [t * 1e3 for _, t in pts], style, color=f"C{j}",
                        label=f"{alg} {c['bandwidth']} {c['latency']}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("ms per allreduce")
        ax.set_title("tree (solid) vs ring (dashed), largest P")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(args, results, path):
    """table.md, plot.png (and the predictions in results.json)."""
    add_predictions(results, args.batch, args.comm, args.cores)
    save_results(results, path)
    best = best_rows(results["runs"])
    commands = "; ".join(f"`{' '.join(c)}`" for c in results.get("commands", []))
    text = ["# Hybrid (PCL-DNN) FC layers on emulated hosts", "", f"Made by {commands}.", "",
            f"Batch {args.batch} per rank, --comm {args.comm}, one rank per host, "
            "OMP_NUM_THREADS=1; ms/iter: median of the per-iteration rates past the first "
            f"{args.skip}; predicted: perf/hybrid.py with the fitted link model + latency.", "",
            training_table(results["runs"]), "", "## Best setting, measured and predicted", "",
            best_table(best), "", "## Tree against ring as latency grows (allreduce)", "",
            crossover_table(crossovers(results))]
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write("\n".join(text) + "\n")
    plot(results, os.path.join(args.out, "plot.png"))
    return "\n".join(text)


# -- command line ------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nets", nargs="+", choices=sorted(NETS), default=["caffenet", "vgg16"])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--vgg-max-procs", type=int, default=4,
                    help="VGG-16 runs only up to this P (its ranks' RSS; see the docstring)")
    ap.add_argument("--fc", nargs="+", default=["data", "groups"],
                    help="settings per P: data, groups (every divisor G > 1), auto, or digits")
    ap.add_argument("--bandwidth", nargs="+", default=["1gbit"])
    ap.add_argument("--latency", nargs="+", default=["none", "50us", "500us"])
    ap.add_argument("--batch", type=int, default=4, help="images per rank")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--skip", type=int, default=3, help="rates logged up to this are dropped")
    ap.add_argument("--comm", default="ring")
    ap.add_argument("--netmod", default="ofi", choices=["ofi", "ucx", "default"])
    ap.add_argument("--cores", type=int, default=None, help="cores the ranks share (default: "
                    "this machine's)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per training run")
    ap.add_argument("--allreduce", action="store_true", help="also the allreduce sweep")
    ap.add_argument("--no-train", action="store_true", help="skip the training runs")
    ap.add_argument("--reps", type=int, default=5, help="bench_allreduce repetitions")
    ap.add_argument("--ar-procs", type=int, nargs="+", default=[2, 4, 8],
                    help="allreduce P, one rank per host (and two per host from P = 4: hier)")
    ap.add_argument("--ar-sizes", nargs="+", default=["4K", "16K", "64K", "256K", "1M", "4M"])
    ap.add_argument("--retry", action="store_true", help="rerun failed runs and done sweeps")
    ap.add_argument("--replot", action="store_true", help="tables and plot from results.json")
    ap.add_argument("--quick", action="store_true",
                    help="CaffeNet, P = 1 and 2, data and G = 2, 1gbit, no delay, batch 2, 4 "
                         "iterations (the plumbing, a few minutes); --out default /tmp/...")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.nets, args.procs, args.fc = ["caffenet"], [1, 2], ["data", "2"]
        args.bandwidth, args.latency = ["1gbit"], ["none"]
        args.batch, args.iters, args.skip = 2, 4, 1
    if args.out is None:
        args.out = ("/tmp/hybrid_check_quick" if args.quick
                    else os.path.join(ROOT, "docs", "bench", "netlab", "hybrid"))
    if args.skip >= args.iters - 1:
        ap.error("--skip must leave at least two logged iterations")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "results.json")
    results = load_results(path)
    if not args.replot:
        results.setdefault("commands", []).append(
            ["python", "tools/hybrid_check.py"] + list(sys.argv[1:] if argv is None else argv))
        netlab = _launch.load_tool("netlab")
        ok, why = netlab.available()
        if not ok:
            sys.exit(f"hybrid_check: {why}")
        t0 = time.time()
        if not args.no_train:
            run_grid(args, results, path)
        if args.allreduce:
            run_allreduce(args, results, path)
        results["seconds_last"] = round(time.time() - t0, 1)
    print(write_outputs(args, results, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
