#!/usr/bin/env python3
"""Start-up benchmark: ``caffe train`` from process start to iteration 0, from its own log.

Each run starts ``python -m caffe_engine train --solver S`` (``GLOG_logtostderr=1``) in a fresh
process; the clock is read just before the process is started (``time.time()``, the clock glog's
timestamps use) and every mark below is the timestamp of a log line, minus that start:

``first log``   the first line (``Use CPU.``): interpreter start plus the imports of the CLI;
``train net``   ``Creating training net``: the kernel set chosen (Numba imported, the ``CPU
                kernels`` line) and the solver parameters read and printed;
``test net``    ``Creating test net`` (nets with a TEST phase): the train net built and filled;
``solving``     ``Solving <name>``: both nets set up; nothing has run yet;
``iter 0``      ``Iteration 0 (...)``: the first forward/backward done (the first call of every
                kernel: Numba's cache loads land here);
``iter 1``      ``Iteration 1 (...)``: iteration 0's update and iteration 1's forward/backward
                later (the line is logged before the update, as Caffe's);
``exit``        the process reaped.

The first ``--warmup`` runs of each net are not counted (they populate Numba's on-disk cache and
the ``.pyc`` files: ``PYTHONDONTWRITEBYTECODE`` is removed from the runs' environment unless
``--no-pyc``); the others' medians (and min/max) are printed. Every solver has ``test_initialization: false``
(no test pass before iteration 0), ``display: 1``, ``max_iter: 2`` and no snapshot.

Nets (written once under ``--workdir``, reused afterwards):

``lenet``    models/lenet on shared/data/mnist_5k's LMDBs (batch 64 train, 100 test);
``alexnet``  BVLC AlexNet (train_val as in Caffe's models/bvlc_alexnet, 61M weights) at batch
             32 train / 32 test, on a random LMDB of 64 3x256x256 records (crop 227, mirror,
             a mean file of 127.5), 1000 classes;
``vgg16``    VGG-16 (138M weights: xavier convolutions, gaussian InnerProducts) at batch 32 on
             the same kind of LMDB (crop 224): an iteration takes tens of seconds on two cores,
             so time its set-up with ``--stop-at solving``.

Usage::

    python tools/bench_startup.py [--nets lenet,alexnet] [--runs 5] [--warmup 1]
        [--workdir /tmp/caffe_engine_bench_startup] [--python PYTHON] [--env NAME=VALUE]
        [--vs-env NAME=VALUE] [--stop-at MARK] [--no-pyc] [--json FILE]

What BVLC Caffe must compute for the same nets' fillers is timed by ``tools/caffe_fill_floor.cpp``
(Boost's distributions as Caffe calls them; see docs/performance.md, "Start-up").

``--vs-env PYTHONPATH=/tmp/base`` with a copy of the engine at another commit (``git archive
HEAD caffe_engine caffe | tar -x -C /tmp/base``) times the change against it, run by run.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MARKS = (("first log", None), ("train net", "Creating training net"),
         ("test net", "Creating test net"), ("solving", "Solving "),
         ("iter 0", "] Iteration 0 ("), ("iter 1", "] Iteration 1 ("))
_STAMP = re.compile(r"^[IWEF](\d{4})?(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")

SOLVER = """net: "{net}"
test_iter: 1
test_interval: 1000
test_initialization: false
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "step"
gamma: 0.1
stepsize: 100000
display: 1
max_iter: 2
snapshot_after_train: false
snapshot_prefix: "{prefix}"
random_seed: 1701
solver_mode: CPU
"""


# --------------------------------------------------------------------------------------------
# The nets
# --------------------------------------------------------------------------------------------
def _conv(name, bottom, num, kernel, stride=1, pad=0, group=1, std=0.01, bias=0.0):
    return f"""layer {{
  name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"
  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  convolution_param {{
    num_output: {num} kernel_size: {kernel} stride: {stride} pad: {pad} group: {group}
    weight_filler {{ type: "gaussian" std: {std} }}
    bias_filler {{ type: "constant" value: {bias} }}
  }}
}}
layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}
"""


def _fc(name, bottom, num, std, bias, relu_drop=True):
    text = f"""layer {{
  name: "{name}" type: "InnerProduct" bottom: "{bottom}" top: "{name}"
  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
  inner_product_param {{
    num_output: {num}
    weight_filler {{ type: "gaussian" std: {std} }}
    bias_filler {{ type: "constant" value: {bias} }}
  }}
}}
"""
    if relu_drop:
        text += f"""layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}
layer {{ name: "drop_{name}" type: "Dropout" bottom: "{name}" top: "{name}"
  dropout_param {{ dropout_ratio: 0.5 }} }}
"""
    return text


def _lrn(name, bottom):
    return f"""layer {{ name: "{name}" type: "LRN" bottom: "{bottom}" top: "{name}"
  lrn_param {{ local_size: 5 alpha: 0.0001 beta: 0.75 }} }}
"""


def _pool(name, bottom):
    return f"""layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}"
  pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}
"""


def data_layers(source, mean_file, batch, crop):
    """The TRAIN (mirrored) and TEST Data layers of the LMDB ``source``, ``crop`` crops."""
    data = ""
    for phase, mirror in (("TRAIN", "true"), ("TEST", "false")):
        data += f"""layer {{
  name: "data" type: "Data" top: "data" top: "label"
  include {{ phase: {phase} }}
  transform_param {{ mirror: {mirror} crop_size: {crop} mean_file: "{mean_file}" }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }}
}}
"""
    return data


def alexnet_prototxt(source, mean_file, batch):
    data = data_layers(source, mean_file, batch, 227)
    return ('name: "AlexNet"\n' + data
            + _conv("conv1", "data", 96, 11, stride=4) + _lrn("norm1", "conv1")
            + _pool("pool1", "norm1")
            + _conv("conv2", "pool1", 256, 5, pad=2, group=2, bias=0.1) + _lrn("norm2", "conv2")
            + _pool("pool2", "norm2")
            + _conv("conv3", "pool2", 384, 3, pad=1)
            + _conv("conv4", "conv3", 384, 3, pad=1, group=2, bias=0.1)
            + _conv("conv5", "conv4", 256, 3, pad=1, group=2, bias=0.1)
            + _pool("pool5", "conv5")
            + _fc("fc6", "pool5", 4096, 0.005, 0.1) + _fc("fc7", "fc6", 4096, 0.005, 0.1)
            + _fc("fc8", "fc7", 1000, 0.01, 0.0, relu_drop=False)
            + """layer { name: "accuracy" type: "Accuracy" bottom: "fc8" bottom: "label"
  top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss" }
""")


def write_alexnet(folder, records=64, shape=(3, 256, 256), classes=1000,
                  prototxt=alexnet_prototxt):
    sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]
    from bench_train import make_data       # the random LMDB and its mean file
    source, mean_file = make_data(folder, shape, records, classes)
    net = os.path.join(folder, "train_val.prototxt")
    with open(net, "w") as out:
        out.write(prototxt(source, mean_file, 32))
    return net


def write_lenet(folder):
    data = os.path.join(os.path.dirname(ROOT), "shared", "data", "mnist_5k")
    with open(os.path.join(ROOT, "models", "lenet", "lenet_train_test.prototxt")) as src:
        text = src.read().replace("data/mnist/", data + "/")
    net = os.path.join(folder, "lenet_train_test.prototxt")
    with open(net, "w") as out:
        out.write(text)
    return net


def vgg16_prototxt(source, mean_file, batch):
    """VGG-16 (13 convolutions, xavier; 3 InnerProducts, gaussian 0.005; 138M weights)."""
    data = data_layers(source, mean_file, batch, 224)
    body, bottom = "", "data"
    for block, (convs, width) in enumerate(((2, 64), (2, 128), (3, 256), (3, 512), (3, 512))):
        for k in range(convs):
            name = f"conv{block + 1}_{k + 1}"
            body += _conv(name, bottom, width, 3, pad=1).replace(
                'type: "gaussian" std: 0.01', 'type: "xavier"')
            bottom = name
        body += f"""layer {{ name: "pool{block + 1}" type: "Pooling" bottom: "{bottom}"
  top: "pool{block + 1}" pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
"""
        bottom = f"pool{block + 1}"
    return ('name: "VGG_ILSVRC_16_layers"\n' + data + body
            + _fc("fc6", bottom, 4096, 0.005, 0.1) + _fc("fc7", "fc6", 4096, 0.005, 0.1)
            + _fc("fc8", "fc7", 1000, 0.005, 0.0, relu_drop=False)
            + """layer { name: "accuracy" type: "Accuracy" bottom: "fc8" bottom: "label"
  top: "accuracy" include { phase: TEST } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" top: "loss" }
""")


def write_vgg16(folder):
    return write_alexnet(folder, prototxt=vgg16_prototxt)


WRITERS = {"lenet": write_lenet, "alexnet": write_alexnet, "vgg16": write_vgg16}


def solver_for(net, workdir):
    folder = os.path.join(workdir, net)
    solver = os.path.join(folder, "solver.prototxt")
    if not os.path.exists(solver):
        os.makedirs(folder, exist_ok=True)
        path = WRITERS[net](folder)
        with open(solver + ".tmp", "w") as out:
            out.write(SOLVER.format(net=path, prefix=os.path.join(folder, "snap")))
        os.replace(solver + ".tmp", solver)
    return solver


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------
def stamp(line, year):
    m = _STAMP.match(line)
    if not m:
        return None
    y = int(m.group(1)) if m.group(1) else year
    t = datetime.datetime(y, int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                          int(m.group(6)))
    return time.mktime(t.timetuple()) + int(m.group(7)) * 1e-6


def run_once(python, solver, extra_env=None, pyc=True, stop_at=None):
    """One ``caffe train`` run: its marks (seconds from just before the start), ``exit`` and
    ``loss0`` (iteration 0's loss as logged). ``stop_at``: a mark's name; the process is killed
    once that mark's line is logged (no ``exit`` then)."""
    env = dict(os.environ, GLOG_logtostderr="1")
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(extra_env or {})
    year = datetime.datetime.now().year
    stop_text = dict(MARKS).get(stop_at) if stop_at else None
    t0 = time.time()
    proc = subprocess.Popen([python, "-m", "caffe_engine", "train", "--solver", solver],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=os.path.dirname(solver))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if stop_text and stop_text in line and stamp(line, year) is not None:
            proc.kill()
            break
    proc.stdout.close()
    returncode = proc.wait()
    t_exit = time.time() - t0
    output = "".join(lines)
    if returncode and not stop_text:
        sys.exit(f"bench_startup: {solver} failed ({returncode}):\n{output[-3000:]}")
    marks = {}
    for line in lines:
        t = stamp(line, year)
        if t is None:
            continue
        for name, text in MARKS:
            if name not in marks and (text is None or text in line):
                marks[name] = t - t0
    if stop_text and stop_at not in marks:
        sys.exit(f"bench_startup: {solver} ended before '{stop_text}':\n{output[-3000:]}")
    if not stop_text:
        marks["exit"] = t_exit
    loss = re.search(r"Iteration 0 \(.*loss = (\S+)", output)
    marks["loss0"] = loss.group(1) if loss else None
    return marks


def _summary(label, runs):
    losses = {str(r["loss0"]) for r in runs}
    print(f"{label}: {len(runs)} warm runs (seconds from process start; median [min, max]); "
          f"iteration 0 loss {', '.join(sorted(losses))}")
    for name in [m for m, _ in MARKS] + ["exit"]:
        values = [r[name] for r in runs if name in r]
        if values:
            print(f"  {name:10s} {statistics.median(values):7.3f}  "
                  f"[{min(values):.3f}, {max(values):.3f}]")
    steady = [r["iter 1"] - r["iter 0"] for r in runs if "iter 1" in r]
    first = [r["iter 0"] - r["solving"] for r in runs if "iter 0" in r]
    if steady and first:
        print(f"  iteration 0 took {statistics.median(first):.3f}, iteration 1 "
              f"{statistics.median(steady):.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="lenet,alexnet",
                        help=f"comma-separated, of: {', '.join(WRITERS)} (default lenet,alexnet)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per net (and config)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("--workdir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                          "caffe_engine_bench_startup"),
                        help="where the nets, LMDBs and solvers are written (kept)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs -m caffe_engine (default this one)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in the runs' environment (e.g. PYTHONPATH=/copy/of/the/tree)")
    parser.add_argument("--vs-env", action="append", default=None, metavar="NAME=VALUE",
                        help="a second configuration B (its environment settings, e.g. "
                             "PYTHONPATH=/copy/of/the/baseline): A and B run in turn, A B A B "
                             "..., and the paired differences A - B are printed too")
    parser.add_argument("--stop-at", choices=[m for m, _ in MARKS],
                        help="kill each run once this mark is logged (e.g. solving: the set-up "
                             "of a net whose iterations take long)")
    parser.add_argument("--no-pyc", action="store_true",
                        help="keep PYTHONDONTWRITEBYTECODE if set (every run then compiles the "
                             "engine's sources again; by default it is removed from the runs' "
                             "environment, so that the warm-up writes the .pyc files)")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    configs = {"A": dict(item.split("=", 1) for item in args.env)}
    if args.vs_env is not None:
        configs["B"] = dict(item.split("=", 1) for item in args.vs_env)
    pyc = not args.no_pyc
    results = {}
    for net in args.nets.split(","):
        solver = solver_for(net, args.workdir)
        for extra in configs.values():
            for _ in range(args.warmup):
                run_once(args.python, solver, extra, pyc, args.stop_at)
        runs = {label: [] for label in configs}
        for _ in range(args.runs):
            for label, extra in configs.items():
                runs[label].append(run_once(args.python, solver, extra, pyc, args.stop_at))
        results[net] = runs
        for label in configs:
            _summary(f"{net} [{label}]" if len(configs) > 1 else net, runs[label])
        if len(configs) > 1:
            print(f"{net}: A - B, paired, median [min, max]")
            for name in [m for m, _ in MARKS] + ["exit"]:
                diffs = [a[name] - b[name] for a, b in zip(runs["A"], runs["B"])
                         if name in a and name in b]
                if diffs:
                    print(f"  {name:10s} {statistics.median(diffs):+7.3f}  "
                          f"[{min(diffs):+.3f}, {max(diffs):+.3f}]")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
