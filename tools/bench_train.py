#!/usr/bin/env python3
"""Training-speed benchmark: the engine beside PyTorch on the same nets, in the same run.

For each net of ``models/`` (LeNet batch 64, cifar10_quick batch 100, NiN batch 128, the small
inception net batch 32 at 112x112) this times full training iterations — Data layer reading an
LMDB and transforming, forward, backward, SGD update — after warm-up, and reports the median
iterations/s, images/s, achieved GFLOP/s (FLOPs counted from the net's shapes: forward, backward
to data and backward to weights of every Convolution and InnerProduct), the fraction of this
machine's measured float32 GEMM peak, and the peak RSS. When PyTorch is installed (extra
``bench``), the same nets are built in PyTorch from the same prototxt and timed too, with the
same number of threads, and the ratio engine/PyTorch is printed per net.

Each (framework, net) pair runs in its own subprocess so that peak RSS is its own.

    python tools/bench_train.py [--nets lenet,cifar10_quick,nin,inception] [--iters 20] [--warmup 3]
                                [--threads 2] [--no-torch] [--json out.json]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NETS = {
    "lenet": ("models/lenet/lenet_train_test.prototxt", (1, 28, 28)),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt", (3, 32, 32)),
    "nin": ("models/nin_cifar10/nin_cifar10_train_test.prototxt", (3, 32, 32)),
    "inception": ("models/inception_small/inception_small_train_test.prototxt", (3, 128, 128)),
}


# --------------------------------------------------------------------------------------------
# Shared set-up: a random LMDB (and mean file) shaped for the net, and the rewritten NetParameter
# --------------------------------------------------------------------------------------------
def make_data(folder, shape, records, num_classes=10):
    from caffe_engine.io.blobproto import write_blobproto
    from caffe_engine.io.lmdb_source import write_lmdb
    from caffe_engine.proto import caffe_pb2
    rng = numpy.random.RandomState(0)
    items = []
    for i in range(records):
        pixels = rng.randint(0, 256, shape).astype(numpy.uint8)
        datum = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2],
                                data=pixels.tobytes(), label=int(rng.randint(num_classes)))
        items.append((b"%08d" % i, datum.SerializeToString()))
    source = os.path.join(folder, "train_lmdb")
    write_lmdb(source, items)
    mean_path = os.path.join(folder, "mean.binaryproto")
    write_blobproto(mean_path, numpy.full((1,) + tuple(shape), 127.5, numpy.float32))
    return source, mean_path


def train_net_param(net, folder):
    """The TRAIN net of ``net`` with its Data layer reading a fresh random LMDB in ``folder``."""
    from caffe_engine.io import prototxt as pio
    path, shape = NETS[net]
    param = pio.read_net_param(os.path.join(ROOT, path))
    classes = 100 if net == "inception" else 10
    source, mean = make_data(folder, shape, 256, classes)
    for layer in param.layer:
        if layer.type == "Data":
            layer.data_param.source = source
            if layer.transform_param.mean_file:
                layer.transform_param.mean_file = mean
    return param


def count_flops(net):
    """Training FLOPs per iteration of an engine Net: 3x the forward multiply-adds x 2."""
    total = 0
    for layer, bottoms, tops in zip(net.layers, net.bottom_vecs, net.top_vecs):
        if layer.type in ("Convolution", "InnerProduct") and layer.blobs:
            weight = layer.blobs[0]
            if layer.type == "Convolution":
                out = tops[0]
                macs = out.count * (weight.count // weight.shape[0])
            else:
                macs = tops[0].count * (weight.count // weight.shape[0])
            total += 3 * 2 * macs
    return total


def gemm_peak(threads, size=2048, reps=5):
    """Median GFLOP/s of a float32 square matrix product on this machine."""
    a = numpy.random.rand(size, size).astype(numpy.float32)
    b = numpy.random.rand(size, size).astype(numpy.float32)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * size ** 3 / statistics.median(times) / 1e9


# --------------------------------------------------------------------------------------------
# Workers (one subprocess each)
# --------------------------------------------------------------------------------------------
def worker_engine(net_name, iters, warmup):
    import logging
    from caffe_engine.log import logger
    from caffe_engine.proto import caffe_pb2
    from caffe_engine.solvers import get_solver
    logger.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        param = train_net_param(net_name, folder)
        solver_param = caffe_pb2.SolverParameter(
            base_lr=0.001, momentum=0.9, weight_decay=0.0005, lr_policy="fixed", max_iter=10 ** 6,
            display=0, snapshot_after_train=False, random_seed=1, snapshot_prefix=folder + "/s")
        solver_param.train_net_param.CopyFrom(param)
        solver = get_solver(solver_param)
        batch = solver.net.blobs["data"].shape[0]
        flops = count_flops(solver.net)
        for _ in range(warmup):
            solver.step(1)
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            solver.step(1)
            times.append(time.perf_counter() - t)
    return {"times": times, "batch": batch, "flops": flops}


def torch_model(param):
    """A torch.nn.Module computing the same TRAIN net as NetParameter ``param`` (subset of types)."""
    import torch
    from torch import nn

    class CaffeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.ops = []
            self.mods = nn.ModuleDict()
            shapes = {}
            for layer in param.layer:
                if layer.include and layer.include[0].phase != caffe_train():
                    continue
                self.ops.append(layer)
                t = layer.type
                if t == "Data":
                    continue
                if t == "Convolution":
                    p = layer.convolution_param
                    k = p.kernel_size[0]
                    pad = p.pad[0] if p.pad else 0
                    stride = p.stride[0] if p.stride else 1
                    self.mods[layer.name] = nn.LazyConv2d(p.num_output, k, stride, pad, groups=p.group)
                elif t == "InnerProduct":
                    self.mods[layer.name] = nn.LazyLinear(layer.inner_product_param.num_output)
                elif t == "LRN":
                    p = layer.lrn_param
                    self.mods[layer.name] = nn.LocalResponseNorm(p.local_size, p.alpha, p.beta, p.k)
                elif t == "Dropout":
                    self.mods[layer.name] = nn.Dropout(layer.dropout_param.dropout_ratio)
            self.shapes = shapes

        def forward(self, data, label):
            blobs = {"data": data, "label": label}
            loss = None
            for layer in self.ops:
                t = layer.type
                if t == "Data":
                    continue
                x = blobs[layer.bottom[0]]
                if t in ("Convolution", "LRN", "Dropout"):
                    y = self.mods[layer.name](x)
                elif t == "InnerProduct":
                    y = self.mods[layer.name](x.flatten(1))
                elif t == "ReLU":
                    y = torch.relu_(x) if layer.top[0] == layer.bottom[0] else torch.relu(x)
                elif t == "Pooling":
                    p = layer.pooling_param
                    if p.global_pooling:
                        y = x.mean((2, 3), keepdim=True)
                    elif p.pool == 0:
                        y = torch.nn.functional.max_pool2d(x, p.kernel_size, p.stride, p.pad, ceil_mode=True)
                    else:
                        y = torch.nn.functional.avg_pool2d(x, p.kernel_size, p.stride, p.pad, ceil_mode=True)
                elif t == "Concat":
                    y = torch.cat([blobs[b] for b in layer.bottom], 1)
                elif t == "SoftmaxWithLoss":
                    loss = torch.nn.functional.cross_entropy(x.flatten(1), blobs[layer.bottom[1]])
                    continue
                else:
                    raise NotImplementedError(t)
                blobs[layer.top[0]] = y
            return loss

    return CaffeNet()


def caffe_train():
    from caffe_engine.proto import caffe_pb2
    return caffe_pb2.TRAIN


def worker_torch(net_name, iters, warmup, threads):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        param = train_net_param(net_name, folder)
    data_layer = next(l for l in param.layer if l.type == "Data")
    batch = data_layer.data_param.batch_size
    shape = NETS[net_name][1]
    crop = data_layer.transform_param.crop_size
    if crop:
        shape = (shape[0], crop, crop)
    classes = 100 if net_name == "inception" else 10
    model = torch_model(param)
    data = torch.rand((batch,) + shape)
    label = torch.randint(0, classes, (batch,))
    model(data, label)
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, weight_decay=0.0005)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(data, label)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return {"times": times, "batch": batch}


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def run_worker(kind, net, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--nets", net,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
               MKL_NUM_THREADS=str(args.threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", default=",".join(NETS))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    nets = [n for n in args.nets.split(",") if n]
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        parser.error(f"unknown net(s): {', '.join(unknown)} (known: {', '.join(NETS)})")

    if args.worker:
        net = nets[0]
        if args.worker == "engine":
            out = worker_engine(net, args.iters, args.warmup)
        else:
            out = worker_torch(net, args.iters, args.warmup, args.threads)
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(out))
        return 0

    have_torch = False
    if not args.no_torch:
        try:
            import torch  # noqa: F401
            have_torch = True
        except ImportError:
            print("PyTorch not installed: engine only (pip install -e '.[bench]')")
    peak = gemm_peak(args.threads)
    print(f"float32 GEMM peak (2048^3, {args.threads} threads): {peak:.0f} GFLOP/s")
    header = (f"{'net':<14}{'batch':>6}{'it/s':>9}{'img/s':>9}{'GFLOP/s':>9}{'%peak':>7}"
              f"{'RSS MB':>8}{'torch it/s':>11}{'torch RSS':>10}{'eng/torch':>10}")
    print(header)
    print("-" * len(header))
    results = {}
    for net in nets:
        eng = run_worker("engine", net, args)
        tor = run_worker("torch", net, args) if have_torch else None
        if eng is None:
            print(f"{net:<14} engine run failed")
            continue
        its = 1.0 / statistics.median(eng["times"])
        gflops = eng["flops"] * its / 1e9
        row = (f"{net:<14}{eng['batch']:>6}{its:>9.2f}{its * eng['batch']:>9.0f}{gflops:>9.1f}"
               f"{100 * gflops / peak:>6.0f}%{eng['peak_rss_mb']:>8.0f}")
        results[net] = {"engine": eng, "engine_its": its, "gflops": gflops, "peak": peak}
        if tor:
            t_its = 1.0 / statistics.median(tor["times"])
            row += f"{t_its:>11.2f}{tor['peak_rss_mb']:>10.0f}{its / t_its:>10.2f}"
            results[net].update(torch=tor, torch_its=t_its)
        print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
