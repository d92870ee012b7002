#!/usr/bin/env python
"""Bytes on the wire per gradient sum: dense ring / tree against fp16, Top-k and gTop-k.

    python tools/bench_compress.py                         # starts mpiexec -n 8 itself
    python tools/bench_compress.py --procs 4 --count 431080 --densities 0.001 0.01
    mpiexec -n 8 python tools/bench_compress.py --worker   # what runs under mpiexec

One bucket of ``--count`` float32 values (random normal, a different stream per rank) is summed
over the P ranks by each method. Every byte is counted in the code that sends it: the
compressed methods by their own :class:`caffe_engine.comm.compress.Exchange`; the dense ring and
tree by running the communicators' own ``_allreduce_sum`` over a counting proxy of their MPI
communicator (every ``Isend`` / ``Send`` / ``Irecv`` / ``Recv`` buffer's bytes). The table (rank
0, markdown) gives, per method, the largest number of bytes any rank sent and received in one
sum, the bound or formula it should meet, and the median time of one sum (slowest rank, over
``--reps``; with more processes than cores, as on this 2-core machine, the times measure the
scheduler as much as the method: read them relative to each other).

Bounds: ring 2 (P-1)/P n 4 (bandwidth-optimal dense); Top-k (P-1) k 8 (all-gather of k
(index, value) pairs); gTop-k 2 k log2(P) 8 (Shi et al.); fp16 over the binary tree: an inner
rank sends n 2 bytes up and n 2 to each of its 2 children, 3 n 2 at most.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class CountingComm:
    """An mpi4py communicator whose point-to-point calls count their buffers' bytes."""

    def __init__(self, comm):
        self._comm = comm
        self.sent = self.received = self.messages = 0

    @staticmethod
    def _bytes(spec):
        arr = spec[0] if isinstance(spec, (list, tuple)) else spec
        return arr.nbytes

    def Isend(self, spec, dest, tag=0):
        self.sent += self._bytes(spec)
        self.messages += 1
        return self._comm.Isend(spec, dest=dest, tag=tag)

    def Send(self, spec, dest, tag=0):
        self.sent += self._bytes(spec)
        self.messages += 1
        return self._comm.Send(spec, dest=dest, tag=tag)

    def Irecv(self, spec, source, tag=0):
        self.received += self._bytes(spec)
        return self._comm.Irecv(spec, source=source, tag=tag)

    def Recv(self, spec, source, tag=0):
        self.received += self._bytes(spec)
        return self._comm.Recv(spec, source=source, tag=tag)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def worker(args):
    from mpi4py import MPI

    from caffe_engine.comm import compress
    from caffe_engine.comm.ring import RingCommunicator
    from caffe_engine.comm.tree import TreeCommunicator

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    n = args.count
    grad = numpy.random.default_rng(1000 + rank).standard_normal(n).astype(numpy.float32)
    ring, tree = RingCommunicator(world, timeout=300), TreeCommunicator(world, timeout=300)
    rows = []

    def timed(run):
        times, counts = [], None
        for rep in range(args.reps + 1):
            buf = grad.copy()
            world.Barrier()
            t = time.perf_counter()
            got = run(buf)
            dt = time.perf_counter() - t
            if rep == 0:
                counts = got          # bytes are the same every repetition
            else:
                times.append(max(world.allgather(dt)))
        return counts, float(numpy.median(times))

    def dense(comm):
        def run(buf):
            proxy = CountingComm(comm.comm)
            comm._allreduce_sum(proxy, buf)
            return proxy.sent, proxy.received, proxy.messages
        return run

    def compressed(settings):
        comp = settings.for_bucket(n)

        def run(buf):
            tree.allreduce_compressed_(buf, comp, op="sum")
            return comp.sent, comp.received, comp.messages
        return run, comp

    def row(method, density, k, counts, seconds, bound, formula):
        sent = world.allgather(counts[0])
        received = world.allgather(counts[1])
        messages = world.allgather(counts[2])
        rows.append({"method": method, "density": density, "k": k, "P": size, "n": n,
                     "sent_max": max(sent), "received_max": max(received),
                     "sent_per_rank": sent, "messages_max": max(messages),
                     "bound": bound, "bound_formula": formula, "median_ms": seconds * 1e3,
                     "within_bound": bound is None or max(max(sent), max(received)) <= bound})

    counts, secs = timed(dense(ring))
    row("ring (dense)", None, None, counts, secs, compress.dense_ring_bytes(n, size),
        "2(P-1)/P n 4")
    counts, secs = timed(dense(tree))
    row("tree (dense)", None, None, counts, secs, None, "")
    run, comp = compressed(compress.Compression("fp16"))
    counts, secs = timed(run)
    row("fp16 (tree)", None, None, counts, secs, 3 * n * 2, "3 n 2")
    for density in args.densities:
        for method in ("topk", "gtopk"):
            run, comp = compressed(compress.Compression(method, density))
            counts, secs = timed(run)
            if method == "topk":
                bound, formula = compress.topk_bytes(comp.k, size), "(P-1) k 8"
            else:
                bound, formula = compress.gtopk_bound(comp.k, size), "2 k log2(P) 8"
            row(method, density, comp.k, counts, secs, bound, formula)
    ring.close()
    tree.close()
    if rank == 0:
        print_table(rows, size, n)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)


def print_table(rows, size, n):
    print(f"P = {size}, n = {n} float32 values ({n * 4} bytes) per bucket; bytes per rank for "
          f"one sum, the largest over the ranks (loopback, one host)")
    print()
    print("| method | density | k | bytes sent | bytes received | bound | formula | "
          "vs dense ring | median ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    ring_bytes = 2 * (size - 1) / size * n * 4
    for r in rows:
        bound = "" if r["bound"] is None else f"{r['bound']:.0f}"
        ok = "" if r["bound"] is None else (" (ok)" if r["within_bound"] else " (EXCEEDED)")
        print(f"| {r['method']} | {'' if r['density'] is None else r['density']} | "
              f"{'' if r['k'] is None else r['k']} | {r['sent_max']} | {r['received_max']} | "
              f"{bound}{ok} | {r['bound_formula']} | {r['sent_max'] / ring_bytes:.4f} | "
              f"{r['median_ms']:.2f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=8, help="P (default 8)")
    parser.add_argument("--count", type=int, default=1 << 20,
                        help="floats in the bucket (default 1048576 = 4 MiB)")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", help="also write the rows as JSON here (rank 0)")
    parser.add_argument("--worker", action="store_true", help="(internal) run under mpiexec")
    args = parser.parse_args(argv)
    from caffe_engine.comm.launcher import launched_under_mpi
    if args.worker or launched_under_mpi():
        worker(args)
        return 0
    cmd = ["mpiexec", "-n", str(args.procs), sys.executable, os.path.abspath(__file__),
           "--worker", "--count", str(args.count), "--reps", str(args.reps),
           "--densities", *map(str, args.densities)]
    if args.json:
        cmd += ["--json", os.path.abspath(args.json)]
    return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main())
