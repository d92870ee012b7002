#!/usr/bin/env python
"""Benchmark the allreduce algorithms: time and bus bandwidth vs message size and process count.

Run it plainly; it starts ``mpiexec -n P`` itself for each P and gathers the results:

    python tools/bench_allreduce.py                       # P = 2 4 8, 4 KiB .. 64 MiB
    python tools/bench_allreduce.py --procs 2 4 --algorithms tree mpi --sizes 32M
    python tools/bench_allreduce.py --procs 4 --algorithms hier hier,lanes=1   # options
    python tools/bench_allreduce.py --out bench_out        # table.md, results.json, plot.png

Each cell is the median over ``--reps`` repetitions of the slowest rank's time for one blocking
``allreduce_`` (a barrier before each repetition, one warm-up call). Bus bandwidth follows
nccl-tests: busbw = bytes / time * 2 (P - 1) / P, the per-link traffic an optimal algorithm needs.
With more processes than cores (this machine has 2), the P > cores rows measure the schedulers
as much as the algorithms: read them as relative numbers.

``results.json`` is what :func:`caffe_engine.perf.alpha_beta.fit_alpha_beta` reads.
The ``--worker`` mode (internal) is what runs under mpiexec.

On an emulated network (``--netlab``; needs root, see ``tools/netlab.py``) each P gets a lab of
its own: P hosts of one rank (or P / ``--ranks-per-host`` hosts of R ranks) behind one switch,
every host link shaped to ``--bandwidth``; the same worker runs through the lab's mpiexec (MPICH
over TCP between hosts)::

    python tools/bench_allreduce.py --netlab --bandwidth 1gbit --out docs/bench/netlab/1gbit
    python tools/bench_allreduce.py --netlab --procs 8 --sizes 32M --append --out DIR
    python tools/bench_allreduce.py --netlab --procs 8 --ranks-per-host 4 \
        --inter-bandwidth 1gbit --algorithms hier ring tree --out docs/bench/netlab/nodes

``--ranks-per-host R`` alone: a host's ranks share memory and ``--bandwidth`` shapes the host
links. With ``--inter-bandwidth`` (nodes): the host links take it, a host's ranks talk TCP over
its loopback, shaped by ``--bandwidth`` (default unshaped). ``--latency`` delays the host links
through netlab's user-space relay (no netem needed); a loopback delay (``--latency`` with
``--inter-*``) still needs the kernel's netem. Every row of results.json then records its lab (``"netlab"``: hosts, ranks per host,
the host links' and the intra-node rate in bits/s, ``"shm"`` for shared memory, None for
unshaped), and ``"labs"`` what each lab measured before the run: one TCP stream h0 -> h1 (and
the loopback), and during it the machine's busy CPU share. ``--append`` merges the rows into
an existing results.json (same cell: replaced). ``model.md`` beside them compares every cell
with :class:`caffe_engine.perf.link_model.LinkModel` fitted on those rows (``--fit-procs``
chooses the rows of the fit), and the plot draws its predictions dashed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _launch  # noqa: E402  (tools/_launch.py: loads netlab.py beside this script)

ALGORITHMS = ["tree", "ring", "ps", "mpi"]
DEFAULT_SIZES = ["4K", "16K", "64K", "256K", "1M", "4M", "16M", "32M", "64M"]


def parse_size(text):
    text = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def human(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{nbytes} B"


def reps_for(nbytes, base):
    """Fewer repetitions for the big messages (they are also the steadiest)."""
    if nbytes >= 16 << 20:
        return max(3, base // 4)
    if nbytes >= 1 << 20:
        return max(5, base // 2)
    return base


# --------------------------------------------------------------------------------------------
def worker(args):
    from mpi4py import MPI
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from caffe_engine.comm.communicator import get_communicator
    from caffe_engine.perf.schedules import parse_algorithm
    world = MPI.COMM_WORLD
    rows = []
    for name in args.algorithms:
        spec, options = name.split(",")[0], parse_algorithm(name)[1]
        options.pop("inter", None)                     # in ``spec`` already
        comm = get_communicator(spec, world, timeout=600, **options)
        for nbytes in [parse_size(s) for s in args.sizes]:
            n = nbytes // 4
            buf = numpy.ones(n, numpy.float32)
            comm.allreduce_(buf)                       # warm-up (scratch buffers, connections)
            times = []
            for _ in range(reps_for(nbytes, args.reps)):
                if (args.cell_seconds and len(times) >= 3
                        and sum(times) >= args.cell_seconds):
                    break                              # the same decision on every rank
                buf[...] = 1.0
                world.Barrier()
                t0 = time.perf_counter()
                comm.allreduce_(buf)
                dt = time.perf_counter() - t0
                times.append(world.allreduce(dt, op=MPI.MAX))
            if world.rank == 0:
                if not numpy.all(buf == world.size):
                    raise SystemExit(f"{name}: wrong sum at {nbytes} bytes")
                rows.append({"algorithm": name, "procs": world.size, "bytes": nbytes,
                             "seconds": float(numpy.median(times)),
                             "min_seconds": float(numpy.min(times)), "reps": len(times)})
        comm.close()
    if world.rank == 0:
        with open(args.worker, "w") as f:
            json.dump(rows, f)


# --------------------------------------------------------------------------------------------
def bus_bandwidth(row):
    p = row["procs"]
    return row["bytes"] / row["seconds"] * 2 * (p - 1) / p if row["seconds"] > 0 else 0.0


def table(rows, stat="seconds"):
    """Markdown table: one row per (P, size), a time and busbw column pair per algorithm.

    ``stat``: "seconds" (the median) or "min_seconds" (the fastest repetition)."""
    rows = [dict(r, seconds=r.get(stat, r["seconds"])) for r in rows]
    algs = [a for a in ALGORITHMS if any(r["algorithm"] == a for r in rows)]
    algs += sorted({r["algorithm"] for r in rows} - set(algs))
    cell = {(r["algorithm"], r["procs"], r["bytes"]): r for r in rows}
    head = "| P | size | " + " | ".join(f"{a} ms | {a} GB/s" for a in algs) + " |"
    sep = "|---|---|" + "---|---|" * len(algs)
    lines = [head, sep]
    for p in sorted({r["procs"] for r in rows}):
        for nbytes in sorted({r["bytes"] for r in rows}):
            parts = []
            for a in algs:
                r = cell.get((a, p, nbytes))
                parts += (["-", "-"] if r is None else
                          [f"{r['seconds'] * 1e3:.3f}", f"{bus_bandwidth(r) / 1e9:.2f}"])
            lines.append(f"| {p} | {human(nbytes)} | " + " | ".join(parts) + " |")
    return "\n".join(lines)


def plot(rows, path, predict=None, title=None, fig4_bytes=None):
    """Time and bus bandwidth against size per P, and time against P at the largest size
    measured at every P (or ``fig4_bytes``).

    ``predict``: optional function (algorithm, bytes, procs) -> seconds, drawn dashed beside each
    measured line (the cost model)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    procs = sorted({r["procs"] for r in rows})
    algs = [a for a in ALGORITHMS if any(r["algorithm"] == a for r in rows)]
    algs += sorted({r["algorithm"] for r in rows} - set(algs))
    colors = {a: f"C{i}" for i, a in enumerate(algs)}
    fig, axes = plt.subplots(2, len(procs) + 1, figsize=(4.2 * (len(procs) + 1), 7.5),
                             squeeze=False)

    def model_line(ax, a, xs, fn, p=None, loglog=True):
        if predict is None:
            return
        try:
            ys = [fn(x) for x in xs]
        except Exception:                  # no model for this algorithm
            return
        (ax.loglog if loglog else ax.plot)(xs, ys, "--", color=colors[a], alpha=0.7)

    for j, p in enumerate(procs):
        for a in algs:
            rs = sorted((r for r in rows if r["procs"] == p and r["algorithm"] == a),
                        key=lambda r: r["bytes"])
            if not rs:
                continue
            x = [r["bytes"] for r in rs]
            axes[0][j].loglog(x, [r["seconds"] * 1e3 for r in rs], "o-", label=a,
                              color=colors[a])
            model_line(axes[0][j], a, x, lambda n, a=a, p=p: predict(a, n, p) * 1e3)
            axes[1][j].semilogx(x, [bus_bandwidth(r) / 1e9 for r in rs], "o-", label=a,
                                color=colors[a])
        axes[0][j].set_title(f"P = {p}" + (" (dashed: model)" if predict else ""))
        axes[0][j].set_ylabel("time (ms)")
        axes[1][j].set_ylabel("bus bandwidth (GB/s)")
        axes[1][j].set_xlabel("message (bytes)")
        axes[0][j].legend()
    # FireCaffe figure 4: time vs P at the largest size measured at every P (ps ~P, tree ~log P).
    sizes = [n for n in sorted({r["bytes"] for r in rows})
             if all(any(r["bytes"] == n and r["procs"] == p for r in rows) for p in procs)]
    big = fig4_bytes if fig4_bytes in sizes else max(sizes or [r["bytes"] for r in rows])
    ax = axes[0][-1]
    for a in algs:
        rs = sorted((r for r in rows if r["bytes"] == big and r["algorithm"] == a),
                    key=lambda r: r["procs"])
        if not rs:
            continue
        ax.plot([r["procs"] for r in rs], [r["seconds"] * 1e3 for r in rs], "o-", label=a,
                color=colors[a])
        model_line(ax, a, [r["procs"] for r in rs],
                   lambda p, a=a: predict(a, big, p) * 1e3, loglog=False)
    ax.set_title(f"time vs P at {human(big)} (cf. FireCaffe fig. 4)")
    ax.set_xlabel("processes P")
    ax.set_ylabel("time (ms)")
    ax.legend()
    axes[1][-1].axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


# --------------------------------------------------------------------------------------------
# On an emulated network (tools/netlab.py)
# --------------------------------------------------------------------------------------------
def _cpu_times():
    """(busy, total) jiffies of the whole machine from /proc/stat (None where unreadable)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def lab_settings(lab, netlab):
    """What a row records of its lab: hosts, ranks per host, host links' and intra-node rate
    (bits/s; None: unshaped; "shm": a host's ranks share memory), one-way delays."""
    return {"hosts": lab.n_hosts, "ranks_per_host": lab.ranks_per_host,
            "link": lab.inter_bandwidth if lab.nodes else lab.bandwidth,
            "intra": (lab.bandwidth if lab.nodes else "shm"),
            "latency": lab.inter_latency if lab.nodes else lab.latency,
            "intra_latency": lab.latency if lab.nodes else None}


def run_netlab(args, worker_argv):
    """One lab per P; returns (rows, labs): the worker's rows tagged with their lab, and per lab
    its description, measured stream rates, the machine's busy CPU share and the duration."""
    netlab = _launch.load_tool("netlab")
    ok, why = netlab.available()
    if not ok:
        raise SystemExit(f"bench_allreduce: --netlab: {why}")
    r = args.ranks_per_host
    bad = [p for p in args.procs if p % r]
    if r < 1 or bad:
        raise SystemExit(f"bench_allreduce: P = {', '.join(map(str, bad)) or '?'} is not a "
                         f"multiple of --ranks-per-host {r}")
    rows, labs = [], []
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    if args.netmod != "default":
        env["MPIR_CVAR_CH4_NETMOD"] = args.netmod
    for p in args.procs:
        lab = netlab.Lab(p // r, r, args.bandwidth, args.latency, args.inter_bandwidth,
                         args.inter_latency, mpiexec=args.mpiexec_path)
        t0 = time.time()
        with lab:
            info = {"procs": p, "describe": lab.describe(), "netmod": args.netmod,
                    **lab_settings(lab, netlab)}
            if args.measure_links:
                if lab.n_hosts >= 2:
                    info["stream_h0_h1_bits_per_s"] = lab.throughput("h0", "h1")
                if lab.nodes and r >= 2:
                    info["stream_loopback_bits_per_s"] = lab.throughput("h0", "h0")
            print(f"P = {p}: {lab.describe()}", file=sys.stderr)
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
                path = tmp.name
            cpu0, w0 = _cpu_times(), time.time()
            done = lab.mpiexec(worker_argv(path), env=env, timeout=args.timeout)
            cpu1, w1 = _cpu_times(), time.time()
        if done.returncode != 0:
            raise SystemExit(f"bench_allreduce: P = {p}: mpiexec exited {done.returncode}")
        with open(path) as f:
            got = json.load(f)
        os.unlink(path)
        if cpu0 and cpu1 and cpu1[1] > cpu0[1]:
            info["cpu_busy"] = (cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1])
        info["run_seconds"] = w1 - w0
        info["seconds"] = time.time() - t0
        settings = dict(lab_settings(lab, netlab), netmod=args.netmod)
        for row in got:
            row["netlab"] = settings
        rows += got
        labs.append(info)
        busy = f", CPU busy {info['cpu_busy']:.0%}" if "cpu_busy" in info else ""
        print(f"P = {p}: {info['seconds']:.1f} s{busy}", file=sys.stderr)
    return rows, labs


def cell_key(row):
    """What makes two rows the same cell: algorithm, P, bytes and (on a netlab) the lab."""
    lab = row.get("netlab")
    return (row["algorithm"], row["procs"], row["bytes"],
            json.dumps(lab, sort_keys=True) if lab else None)


def merge_rows(old, new):
    """``old`` rows with the cells of ``new`` replaced or added (new ones last, in order)."""
    fresh = {cell_key(r) for r in new}
    return [r for r in old if cell_key(r) not in fresh] + list(new)


def write_model_report(rows, out, fit_procs=None, stat="seconds", model_path=None, labs=(),
                       min_bytes=0, intra_path=None):
    """model.md and links_model.json: the link model fitted on ``rows`` (those of ``fit_procs``
    only, when given), or read from ``model_path``, with the intra-node rate the labs measured
    on a loopback; then measured against predicted for every row. Returns the model's predict
    function (for the plot), or None."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from caffe_engine.errors import CaffeError
    from caffe_engine.perf.link_model import LinkModel
    from caffe_engine.perf.link_report import link_report
    try:
        if model_path:
            model = LinkModel.load(model_path)
            model.source = f"{model_path} ({model.source})"
        else:
            model = LinkModel.fit(rows, procs=fit_procs, min_bytes=min_bytes, stat=stat)
    except CaffeError as exc:
        print(f"no model: {exc}", file=sys.stderr)
        return None
    loop = [lab["stream_loopback_bits_per_s"] for lab in labs
            if lab.get("stream_loopback_bits_per_s")]
    if intra_path:
        intra = LinkModel.load(intra_path)
        model.alpha_intra, model.beta_intra = intra.alpha_intra, intra.beta_intra
        model.source += f"; intra-node from {intra_path}"
    elif any((r.get("netlab") or {}).get("hosts") == 1 and r["procs"] > 1 for r in rows):
        model.fit_intra(rows, min_bytes=min_bytes, stat=stat)     # the one-host rows
    elif loop:
        model.beta_intra = 8.0 / float(sorted(loop)[len(loop) // 2])
    model.save(os.path.join(out, "links_model.json"))
    text = link_report(model, rows, stat=stat)
    with open(os.path.join(out, "model.md"), "w") as f:
        f.write(text + "\n")
    print(text)

    def predict(algorithm, nbytes, procs):
        lab = next((r["netlab"] for r in rows if r["procs"] == procs and r.get("netlab")), {})
        rph = int(lab.get("ranks_per_host", 1))
        if algorithm == "mpi" and lab.get("intra") == "shm" and lab.get("hosts", 1) > 1 < rph:
            raise ValueError("MPICH's node-aware allreduce is not modelled")
        return model.predict(algorithm, nbytes, procs, rph)
    return predict


def parser():
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cell-seconds", type=float, default=None,
                    help="stop repeating a cell once its repetitions took this long (at least 3;"
                         " default: no limit, 20 with --netlab)")
    ap.add_argument("--out", default="bench_allreduce_out")
    ap.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    net = ap.add_argument_group("emulated network (tools/netlab.py; root)")
    net.add_argument("--netlab", action="store_true",
                     help="run each P in a lab of emulated hosts with shaped links")
    net.add_argument("--bandwidth", default="default",
                     help="host links' rate (default 1gbit); with --inter-bandwidth the "
                          "intra-node (loopback) rate, default unshaped")
    net.add_argument("--inter-bandwidth", default=None,
                     help="nodes topology: the host links' rate (a host's ranks talk TCP)")
    net.add_argument("--ranks-per-host", type=int, default=1,
                     help="ranks per emulated host (default 1: P hosts)")
    net.add_argument("--netmod", default="ofi", choices=["ofi", "ucx", "default"],
                     help="MPICH's network module (MPIR_CVAR_CH4_NETMOD), both over TCP only;"
                          " default ofi: UCX's tcp transport halves an exchange in both"
                          " directions on one connection when ranks outnumber cores")
    net.add_argument("--latency", default=None, help="one-way delay on the host links (netlab's relay)")
    net.add_argument("--inter-latency", default=None, help="nodes topology: host links' delay")
    net.add_argument("--no-measure-links", dest="measure_links", action="store_false",
                     help="skip the one-stream throughput measured in each lab")
    net.add_argument("--timeout", type=float, default=3600,
                     help="seconds per lab before its mpiexec is killed")
    net.add_argument("--append", action="store_true",
                     help="merge into --out's results.json instead of replacing it")
    net.add_argument("--fit-procs", type=int, nargs="+", default=None,
                     help="fit the link model on the rows of these P only (default: all)")
    net.add_argument("--fit-min-bytes", default="4M",
                     help="fit the link model on the rows of at least this size (default 4M:"
                          " below ~1 MiB the token bucket's burst and, with more ranks than"
                          " cores, the scheduler set the time)")
    net.add_argument("--replot", action="store_true",
                     help="measure nothing: rewrite table.md, model.md and the plot from --out's"
                          " results.json")
    net.add_argument("--intra-model", default=None,
                     help="take the intra-node alpha and beta from this saved link model (one"
                          " fitted on one-host runs)")
    net.add_argument("--links-model", default=None,
                     help="compare with this saved link model (links_model.json of another"
                          " run) instead of fitting one on these rows")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    """Measure (or, with --worker, run one P's cells under mpiexec); returns the exit status."""
    args = parser().parse_args(argv)
    if args.worker:
        return worker(args)
    if args.netlab:
        return main_netlab(args)
    if shutil.which(args.mpiexec) is None:
        raise SystemExit(f"{args.mpiexec} not found: pip install mpich mpi4py")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for p in args.procs:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        cmd = [args.mpiexec, "-n", str(p), sys.executable, os.path.abspath(__file__),
               "--worker", path, "--reps", str(args.reps),
               "--algorithms", *args.algorithms, "--sizes", *args.sizes]
        if args.cell_seconds:
            cmd += ["--cell-seconds", str(args.cell_seconds)]
        t0 = time.time()
        subprocess.run(cmd, check=True)
        with open(path) as f:
            rows += json.load(f)
        os.unlink(path)
        print(f"P = {p}: {time.time() - t0:.1f} s", file=sys.stderr)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"cores": os.cpu_count(), "load_average": load, "rows": rows}, f, indent=1)
    text = table(rows)
    fastest = table(rows, "min_seconds")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"Median of repetitions (cores: {os.cpu_count()}, load average at the end: "
                f"{load}):\n\n{text}\n\nFastest repetition:\n\n{fastest}\n")
    print(text)
    print("\nfastest repetition:")
    print(fastest)
    try:
        plot(rows, os.path.join(args.out, "plot.png"))
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 0


def main_netlab(args):
    """``--netlab``: a lab per P, the rows tagged with their lab, results merged on --append."""
    if args.cell_seconds is None:
        args.cell_seconds = 20.0
    args.mpiexec_path = None if args.mpiexec == "mpiexec" else shutil.which(args.mpiexec)
    os.makedirs(args.out, exist_ok=True)

    def worker_argv(path):
        return [sys.executable, os.path.abspath(__file__), "--worker", path,
                "--reps", str(args.reps), "--cell-seconds", str(args.cell_seconds),
                "--algorithms", *args.algorithms, "--sizes", *args.sizes]

    results_path = os.path.join(args.out, "results.json")
    if args.replot:
        with open(results_path) as f:
            old = json.load(f)
        rows, runs, load = old["rows"], old.get("runs", []), old.get("load_average")
    else:
        t0 = time.time()
        rows, labs = run_netlab(args, worker_argv)
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        run = {"argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "cores": os.cpu_count(), "load_average": load, "seconds": time.time() - t0,
               "labs": labs}
        runs = [run]
        if args.append and os.path.exists(results_path):
            with open(results_path) as f:
                old = json.load(f)
            rows = merge_rows(old.get("rows", []), rows)
            runs = old.get("runs", []) + runs
        with open(results_path, "w") as f:
            json.dump({"cores": os.cpu_count(), "load_average": load, "runs": runs,
                       "rows": rows}, f, indent=1)
    described = sorted({lab["describe"].split(":", 1)[1].strip() for r in runs
                        for lab in r["labs"]})
    text = table(rows)
    fastest = table(rows, "min_seconds")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"Emulated network (tools/netlab.py): {'; '.join(described)}.\n"
                f"Median of repetitions (cores: {os.cpu_count()}, load average at the end: "
                f"{load}):\n\n{text}\n\nFastest repetition:\n\n{fastest}\n")
    print(text)
    predict = write_model_report(rows, args.out, args.fit_procs, model_path=args.links_model,
                                 labs=[lab for r in runs for lab in r["labs"]],
                                 min_bytes=parse_size(args.fit_min_bytes),
                                 intra_path=args.intra_model)
    try:
        plot(rows, os.path.join(args.out, "plot.png"), predict=predict,
             title="; ".join(described) + " (MPICH netmod " + ", ".join(sorted(
                 {str((r.get("netlab") or {}).get("netmod")) for r in rows})) + ")",
             fig4_bytes=32 << 20)
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
