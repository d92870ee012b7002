#!/usr/bin/env python3
"""Whole-process benchmark: ``caffe train`` of LeNet for 500 iterations, start-up included.

Times the command a user runs, from exec to exit: interpreter start, imports, reading the
solver and net, loading (or compiling) the compiled kernels, 500 training iterations reading
MNIST from LMDB, the tests at iterations 0 and 500, and shutdown. The solver is
``models/lenet/lenet_solver.prototxt`` with ``max_iter: 500``, no snapshots and the LMDBs of
``../shared/data/mnist_5k`` (or ``--data DIR`` holding ``mnist_train_lmdb`` and
``mnist_test_lmdb``), written to a temporary folder.

The first engine run compiles the kernels into an empty Numba cache (``NUMBA_CACHE_DIR`` set to
a fresh folder: what a fresh clone pays once); the next ``--repeats`` runs load that cache.
With ``--caffe-bin PATH`` (a BVLC Caffe build's ``caffe``), Caffe trains the same solver in the
same invocation, alternating with the engine's warm runs. Medians of the wall-clock times and
the iterations/s (500 / seconds) are printed, and the ratio engine/Caffe when Caffe ran.

    python tools/bench_process.py [--repeats 5] [--threads 2] [--caffe-bin PATH] [--data DIR]
                                  [--json out.json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_MNIST = os.path.join(ROOT, "..", "shared", "data", "mnist_5k")
ITERATIONS = 500


def write_solver(folder, data):
    """LeNet's solver and net in ``folder``, 500 iterations, no snapshot, reading ``data``."""
    sys.path.insert(0, ROOT)
    from google.protobuf import text_format
    from caffe_engine.io import prototxt as pio
    net = pio.read_net_param(os.path.join(ROOT, "models/lenet/lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            name = "mnist_train_lmdb" if "train" in layer.data_param.source else "mnist_test_lmdb"
            layer.data_param.source = os.path.abspath(os.path.join(data, name))
    net_path = os.path.join(folder, "lenet_train_test.prototxt")
    with open(net_path, "w") as f:
        f.write(text_format.MessageToString(net))
    solver = pio.read_solver_param(os.path.join(ROOT, "models/lenet/lenet_solver.prototxt"))
    solver.net = net_path
    solver.max_iter = ITERATIONS
    solver.snapshot = 0
    solver.snapshot_after_train = False
    solver.snapshot_prefix = os.path.join(folder, "lenet")
    path = os.path.join(folder, "lenet_solver.prototxt")
    with open(path, "w") as f:
        f.write(text_format.MessageToString(solver))
    return path


def timed(cmd, env, cwd):
    """Wall-clock seconds of ``cmd``; raises SystemExit with its stderr tail on failure."""
    start = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"bench_process: {' '.join(cmd[:3])} ... failed ({r.returncode}):\n"
                         + r.stderr[-2000:])
    return elapsed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="warm runs of each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--caffe-bin", help="a BVLC Caffe 'caffe' binary to run beside")
    parser.add_argument("--data", default=SHARED_MNIST,
                        help="folder with mnist_train_lmdb and mnist_test_lmdb")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data, "mnist_train_lmdb")):
        parser.error(f"--data {args.data}: no mnist_train_lmdb there")
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads)
    with tempfile.TemporaryDirectory() as folder:
        solver = write_solver(folder, args.data)
        engine = [sys.executable, "-m", "caffe_engine", "train", f"--solver={solver}"]
        cold_env = dict(env, NUMBA_CACHE_DIR=os.path.join(folder, "numba_cache"))
        results = {"cold": timed(engine, cold_env, ROOT), "warm": [], "caffe": []}
        for _ in range(args.repeats):
            results["warm"].append(timed(engine, cold_env, ROOT))
            if args.caffe_bin:
                results["caffe"].append(timed([args.caffe_bin, "train", f"--solver={solver}"],
                                              env, folder))
    warm = statistics.median(results["warm"])
    print(f"caffe train, LeNet, {ITERATIONS} iterations from LMDB (tests at 0 and {ITERATIONS}), "
          f"whole process, {args.threads} threads; medians of {args.repeats} runs")
    print(f"engine, first run (compiling into an empty Numba cache): {results['cold']:.2f} s "
          f"({ITERATIONS / results['cold']:.1f} it/s)")
    print(f"engine, cached kernels: {warm:.2f} s ({ITERATIONS / warm:.1f} it/s; runs "
          + ", ".join(f"{t:.2f}" for t in results["warm"]) + ")")
    print(f"compile cost of the first run: {results['cold'] - warm:.2f} s")
    if results["caffe"]:
        caffe = statistics.median(results["caffe"])
        print(f"BVLC Caffe: {caffe:.2f} s ({ITERATIONS / caffe:.1f} it/s); engine/Caffe "
              f"{caffe / warm:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
