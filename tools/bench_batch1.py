#!/usr/bin/env python
"""``caffe time`` of the Model Zoo's deploy nets at batch 1, the engine beside BVLC Caffe.

At batch 1 a deploy net's forward+backward is a few GFLOP (ResNet-50: about 12), so what a
framework pays per layer -- its dispatch, scratch memory, thread hand-offs, small products --
shows. This runs ``caffe time --model <deploy at batch 1> --iterations N`` of the engine
(``python -m caffe_engine``) and, with ``--caffe-bin``, of a BVLC Caffe build, alternately
(engine, Caffe, engine, ...; ``--runs`` of each), and prints each net's median "Average
Forward-Backward" (ms), every run's figure, the load average before and after, and the
engine's per-layer-type sums of its last run (``--types``).

Nets (``--nets``): ``resnet50`` (KaimingHe's ResNet-50 deploy), ``googlenet`` (BVLC's
``bvlc_googlenet/deploy.prototxt`` beside ``--caffe-bin``'s build, else the cars GoogLeNet of
the net archive), ``mobilenet`` (shicai's MobileNet v1), ``vgg16`` (VGG_ILSVRC_16_layers), all
from ``../shared/realworld``. Each deploy's input is rewritten to batch 1 (its first input
dimension) in a temporary copy; the phase is ``caffe time``'s default, TRAIN.

Both commands run without ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` (a user's machine has
neither), with ``--threads`` BLAS/OpenMP threads (default: every core); the BLAS kernel and
threads of that environment are printed first (threadpoolctl, in a child process).

``--baseline DIR`` times another checkout of the engine (``PYTHONPATH=DIR``) in the same turns,
for a before/after figure on the same load.

``--train-nets DIR`` times the TRAIN nets that ``tools/bench_train.py --write-nets DIR`` wrote
(``DIR/<net>/train.prototxt``: batch 32, a Data layer on an LMDB, the losses) instead of the
deploy nets at batch 1: the ``caffe time`` figures of the zoo table, with a baseline beside.

Usage: python tools/bench_batch1.py [--nets resnet50,googlenet,mobilenet,vgg16] [--runs 3]
[--iterations 10] [--caffe-bin /path/to/caffe] [--baseline DIR] [--train-nets DIR] [--types]
[--json out.json]
"""
import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train  # noqa: E402  (the benchmarks' shared environment and BLAS report)

REALWORLD = os.path.join(HERE, "..", "..", "shared", "realworld")
NETS = {
    "resnet50": "KaimingHe__deep-residual-networks/prototxt/ResNet-50-deploy.prototxt",
    "googlenet": "natanielruiz__net-archive/googlenet_cars/deploy.prototxt",
    "mobilenet": "shicai__MobileNet-Caffe/mobilenet_deploy.prototxt",
    "vgg16": "natanielruiz__net-archive/vgg_ilsvrc_16/VGG_ILSVRC_16_layers_deploy.prototxt",
}
_FIRST_DIM = (re.compile(r"(input_dim\s*:\s*)\d+"), re.compile(r"(dim\s*:\s*)\d+"))


def deploy_path(name, caffe_bin):
    """The deploy prototxt of net ``name``: BVLC's GoogLeNet from ``caffe_bin``'s source tree
    (``<root>/build/tools/caffe``) where there is one."""
    if name == "googlenet" and caffe_bin:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(caffe_bin))))
        bvlc = os.path.join(root, "models", "bvlc_googlenet", "deploy.prototxt")
        if os.path.exists(bvlc):
            return bvlc
    return os.path.join(REALWORLD, NETS[name])


def at_batch_1(path, folder):
    """A copy of the deploy prototxt at ``path`` in ``folder`` with its first input dimension
    (``input_dim``, else the first ``dim`` of an input shape) set to 1; its path.

    Raises:
        ValueError: no input dimension found."""
    with open(path) as f:
        text = f.read()
    for pattern in _FIRST_DIM:
        text, count = pattern.subn(r"\g<1>1", text, count=1)
        if count:
            break
    else:
        raise ValueError(f"{path}: no input dimension to set to 1")
    out = os.path.join(folder, os.path.basename(os.path.dirname(path)) + "_b1.prototxt")
    with open(out, "w") as f:
        f.write(text)
    return out


def time_once(command, model, iterations, threads, pythonpath=None):
    """One ``caffe time`` run: (average forward-backward ms, {layer type: ms}) from its log, or
    (None, {}) when it failed (its stderr's tail printed). ``pythonpath``: the engine checkout
    to run instead of this one. The run's working directory is that checkout (this one's by
    default): ``python -m`` puts the working directory before ``PYTHONPATH`` on ``sys.path``, so
    a baseline run from this checkout's directory would import this checkout."""
    env = bench_train.child_env(threads)
    root = os.path.abspath(pythonpath or bench_train.ROOT)
    env["PYTHONPATH"] = root
    r = subprocess.run(list(command) + ["time", "--model", os.path.abspath(model),
                                        "--iterations", str(iterations)],
                       capture_output=True, text=True, env=env, cwd=root)
    log = r.stdout + r.stderr
    match = re.search(r"Average Forward-Backward: ([0-9.e+-]+) ms", log)
    if not match:
        sys.stderr.write(f"bench_batch1: {' '.join(command)} time failed:\n{log[-1500:]}\n")
        return None, {}
    return float(match.group(1)), per_type(log, model)


def per_type(log, model):
    """The per-layer lines of a ``caffe time`` log summed by layer type (forward + backward,
    ms), the types read from the prototxt (``name``/``type`` of each layer, V1 types too)."""
    with open(model) as f:
        text = f.read()
    types = {}
    for block in re.findall(r"layers?\s*\{(.*?)\n\}", text, re.S):
        name = re.search(r'name:\s*"([^"]+)"', block)
        kind = re.search(r'type:\s*"?(\w+)"?', block)
        if name and kind:
            types[name.group(1)] = kind.group(1)
    sums = collections.defaultdict(float)
    for name, ms in re.findall(r"\]\s+(\S+)\s+(?:forward|backward): ([0-9.e+-]+) ms", log):
        sums[types.get(name, "?")] += float(ms)
    return dict(sums)


def bench(names, args):
    """Per net, alternate runs of the engine (then ``--baseline``'s, then Caffe's); a result
    dict per net."""
    commands = [("engine", bench_train.ENGINE_CAFFE, None)]
    if args.baseline:
        commands.append(("baseline", bench_train.ENGINE_CAFFE, args.baseline))
    if args.caffe_bin:
        commands.append(("caffe", [args.caffe_bin], None))
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            if args.train_nets:
                model = os.path.join(args.train_nets, name, "train.prototxt")
            else:
                model = at_batch_1(deploy_path(name, args.caffe_bin), folder)
            runs = {label: [] for label, _, _ in commands}
            types = {label: {} for label, _, _ in commands}
            load = [os.getloadavg()[0]]
            for _ in range(args.runs):
                for label, command, path in commands:
                    ms, types[label] = time_once(command, model, args.iterations,
                                                 args.threads, path)
                    runs[label].append(ms)
            load.append(os.getloadavg()[0])
            results[name] = {"model": model if args.train_nets else
                             deploy_path(name, args.caffe_bin), "runs": runs,
                             "load": load, "types": types,
                             **{k + "_median": _median(v) for k, v in runs.items()}}
            report(name, results[name], args.types)
    return results


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(name, result, types):
    """Print one net's line (and the engines' per-type sums of their last run with
    ``types``)."""
    fmt = lambda v: "failed" if v is None else f"{v:.1f}"
    medians = ", ".join(f"{label} {fmt(result[label + '_median'])} ms"
                        for label in result["runs"])
    engine, caffe = result["engine_median"], result.get("caffe_median")
    ratio = f", Caffe/engine {caffe / engine:.2f}x" if engine and caffe else ""
    runs = "; ".join(f"{k} " + " ".join(fmt(v) for v in vs) for k, vs in result["runs"].items())
    print(f"{name}: {medians}{ratio} (runs: {runs}; load {result['load'][0]:.2f} -> "
          f"{result['load'][1]:.2f})", flush=True)
    if types:
        for label in ("engine", "baseline"):
            sums = result["types"].get(label)
            if sums:
                top = sorted(sums.items(), key=lambda kv: -kv[1])[:10]
                print(f"  {label} by layer type (ms): "
                      + ", ".join(f"{kind} {ms:.1f}" for kind, ms in top), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", default="resnet50,googlenet,mobilenet,vgg16")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--caffe-bin", default=None)
    parser.add_argument("--baseline", default=None,
                        help="another engine checkout (its PYTHONPATH) timed in the same turns")
    parser.add_argument("--types", action="store_true")
    parser.add_argument("--train-nets", default=None,
                        help="time DIR/<net>/train.prototxt (bench_train.py --write-nets DIR) "
                             "instead of the deploy nets at batch 1")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    names = [n for n in args.nets.split(",") if n]
    known = NETS if not args.train_nets else [
        n for n in sorted(os.listdir(args.train_nets))
        if os.path.exists(os.path.join(args.train_nets, n, "train.prototxt"))]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown nets {unknown}; known: {', '.join(known)}")
    info = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys; sys.path.insert(0, %r); import bench_train; "
         "print(json.dumps(bench_train.blas_info()))" % HERE],
        capture_output=True, text=True, env=bench_train.child_env(args.threads),
        check=True).stdout)
    print(bench_train.blas_text(info), flush=True)
    results = bench(names, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"blas": info, "iterations": args.iterations, "nets": results}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
