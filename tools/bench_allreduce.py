#!/usr/bin/env python
"""Benchmark the allreduce algorithms: time and bus bandwidth vs message size and process count.

Run it plainly; it starts ``mpiexec -n P`` itself for each P and gathers the results:

    python tools/bench_allreduce.py                       # P = 2 4 8, 4 KiB .. 64 MiB
    python tools/bench_allreduce.py --procs 2 4 --algorithms tree mpi --sizes 32M
    python tools/bench_allreduce.py --out bench_out        # table.md, results.json, plot.png

Each cell is the median over ``--reps`` repetitions of the slowest rank's time for one blocking
``allreduce_`` (a barrier before each repetition, one warm-up call). Bus bandwidth follows
nccl-tests: busbw = bytes / time * 2 (P - 1) / P, the per-link traffic an optimal algorithm needs.
With more processes than cores (this machine has 2), the P > cores rows measure the schedulers
as much as the algorithms: read them as relative numbers.

``results.json`` is what :func:`caffe_engine.comm.cost_model.fit_alpha_beta` reads.
The ``--worker`` mode (internal) is what runs under mpiexec.
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
    world = MPI.COMM_WORLD
    rows = []
    for name in args.algorithms:
        comm = get_communicator(name, world, timeout=600)
        for nbytes in [parse_size(s) for s in args.sizes]:
            n = nbytes // 4
            buf = numpy.ones(n, numpy.float32)
            comm.allreduce_(buf)                       # warm-up (scratch buffers, connections)
            times = []
            for _ in range(reps_for(nbytes, args.reps)):
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


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    procs = sorted({r["procs"] for r in rows})
    algs = [a for a in ALGORITHMS if any(r["algorithm"] == a for r in rows)]
    fig, axes = plt.subplots(2, len(procs) + 1, figsize=(4.2 * (len(procs) + 1), 7.5),
                             squeeze=False)
    for j, p in enumerate(procs):
        for a in algs:
            rs = sorted((r for r in rows if r["procs"] == p and r["algorithm"] == a),
                        key=lambda r: r["bytes"])
            x = [r["bytes"] for r in rs]
            axes[0][j].loglog(x, [r["seconds"] * 1e3 for r in rs], "o-", label=a)
            axes[1][j].semilogx(x, [bus_bandwidth(r) / 1e9 for r in rs], "o-", label=a)
        axes[0][j].set_title(f"P = {p}")
        axes[0][j].set_ylabel("time (ms)")
        axes[1][j].set_ylabel("bus bandwidth (GB/s)")
        axes[1][j].set_xlabel("message (bytes)")
        axes[0][j].legend()
    # FireCaffe figure 4: time vs P at the largest size (ps grows ~P, tree ~log P).
    big = max(r["bytes"] for r in rows)
    ax = axes[0][-1]
    for a in algs:
        rs = sorted((r for r in rows if r["bytes"] == big and r["algorithm"] == a),
                    key=lambda r: r["procs"])
        ax.plot([r["procs"] for r in rs], [r["seconds"] * 1e3 for r in rs], "o-", label=a)
    ax.set_title(f"time vs P at {human(big)} (cf. FireCaffe fig. 4)")
    ax.set_xlabel("processes P")
    ax.set_ylabel("time (ms)")
    ax.legend()
    axes[1][-1].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    ap.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="bench_allreduce_out")
    ap.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpiexec"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
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


if __name__ == "__main__":
    sys.exit(main())
