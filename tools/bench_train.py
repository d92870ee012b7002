#!/usr/bin/env python3
"""Training-speed benchmark: the engine beside PyTorch on the same nets, in the same run.

For each net of ``models/`` (LeNet batch 64, cifar10_quick batch 100, NiN batch 128, the small
inception net batch 32 at 112x112 crops) and BVLC GoogLeNet (batch 32, 224x224 crops, from
``../shared/realworld``), this times full training iterations — Data layer reading an
LMDB and transforming, forward, backward, SGD update — after warm-up, and reports the median
iterations/s, images/s, achieved GFLOP/s (FLOPs counted from the net's shapes: forward and
backward to weights of every Convolution and InnerProduct, and backward to data where the net
computes it), the fraction of this machine's measured float32 GEMM peak, and the peak RSS. When
PyTorch is installed (extra ``bench``), the same nets are built in PyTorch from the same prototxt
and timed too, with the same number of threads, and the ratio engine/PyTorch is printed per net.
With ``--caffe-bin PATH`` (a BVLC Caffe build's ``caffe``), Caffe's ``caffe time``
forward+backward of exactly the benchmarked net (same prototxt, same LMDB, same threads) is
measured in the same run; otherwise the figures measured for the issues on this kind of machine
(``CAFFE_MS``) stand in. Either way the speed-up over Caffe is printed (the engine's whole
iterations, with data and update, against Caffe's forward+backward alone).

Each (framework, net) run is its own subprocess so that peak RSS is its own. ``--repeats R`` runs
every pair R times, engine and PyTorch alternating, and reports the median of the runs' medians
(and the spread) — on a shared machine compare ratios taken in one invocation.

``--set NAME=VALUE`` sets a field of the cpu kernel set's tuning
(:class:`caffe_engine.kernels.cpu.tuning.CpuTuning`, e.g. ``block_columns=512``, ``kc=128``,
``images_per_chunk=1``, ``backward_data=col2im``) in the engine's runs, ``--kernels reference``
runs the reference kernel set instead, and ``--prefetch N`` sets every Data layer's
``data_param.prefetch``: the ablations of docs/performance.md.

    python tools/bench_train.py [--nets lenet,cifar10_quick,nin,inception,googlenet]
                                [--iters 20] [--warmup 3] [--repeats 1] [--threads 2]
                                [--no-torch] [--json out.json] [--set NAME=VALUE ...]
                                [--kernels reference|cpu] [--prefetch N] [--caffe-bin PATH]
    python tools/bench_train.py --write-nets DIR [--nets ...]   # then: caffe time --model
                                                                  #   DIR/<net>/train.prototxt

``--write-nets DIR`` times nothing: it writes each net's benchmarked TRAIN prototxt and its
random LMDB (and mean file) under ``DIR/<net>/``, for ``caffe time``'s per-layer profile of
exactly what the benchmark runs.

``--device gpu`` times the same iterations on the GPU: the engine in GPU mode (blobs on CuPy,
so the cuda kernel set; ``--gpu-kernels reference`` runs the reference set's CuPy array code
instead) and PyTorch on ``cuda`` (eager, float32: TF32 off for cuDNN and cuBLAS, as CuPy's
products without ``CUPY_TF32``), every timed iteration closed by a device synchronize. Its
default nets are lenet, cifar10_quick, nin and bvlc_googlenet (``models/googlenet``, BVLC
GoogLeNet, batch 32, 224x224 crops: ``googlenet`` reads ``../shared``). The table then gives,
instead of the CPU's RSS and Caffe columns, the GPU float32 GEMM peak's share, the engine's
kernel launches per iteration (the cuda kernel set's own kernels, counted by its
``CupyDevice``; cuBLAS products and CuPy's own elementwise and reduction kernels, e.g. the
layers' array code, are not counted), and peak GPU memory: the engine's CuPy memory pool
(``total_bytes``: what the pool holds, used or cached, at the end) and PyTorch's
``max_memory_allocated`` (its ``max_memory_reserved`` is in the JSON), neither counting the
CUDA context or library workspaces. Without CuPy or a CUDA device it stops with one line.

    python tools/bench_train.py --device gpu [--nets lenet,cifar10_quick,nin,bvlc_googlenet]
                                [--gpu-kernels cuda|reference] [--iters 20] [--json out.json]
"""
import argparse
import importlib.util
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
    "googlenet": ("../shared/realworld/natanielruiz__net-archive/places205-googlenet/"
                  "train_val_googlenet_places205.prototxt", (3, 256, 256)),
    # BVLC's own GoogLeNet, in the repository (the GPU machine has no ../shared)
    "bvlc_googlenet": ("models/googlenet/train_val.prototxt", (3, 256, 256)),
}
DEFAULT_NETS = ("lenet", "cifar10_quick", "nin", "inception", "googlenet")
DEFAULT_GPU_NETS = ("lenet", "cifar10_quick", "nin", "bvlc_googlenet")
#: Classes of each net's last InnerProduct (the generated labels must fit).
CLASSES = {"inception": 100, "googlenet": 205, "bvlc_googlenet": 1000}
#: Batch sizes set by the benchmark (GoogLeNet's prototxt says 128; the issue times 32).
BATCH = {"googlenet": 32, "bvlc_googlenet": 32}
#: BVLC Caffe's ``caffe time`` forward+backward ms per iteration on this kind of machine (2 cores,
#: OpenBLAS), as measured for the issues (GoogLeNet: 5.5-5.9 s on the net this benchmark writes;
#: 3.5 s was BVLC's own prototxt); the small inception net has no Caffe reference of its own.
CAFFE_MS = {"lenet": 17.0, "cifar10_quick": 135.0, "nin": 2000.0, "googlenet": 5700.0}


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
    source, mean = make_data(folder, shape, 256, CLASSES.get(net, 10))
    for layer in param.layer:
        if layer.type == "Data":
            layer.data_param.source = source
            if net in BATCH:
                layer.data_param.batch_size = BATCH[net]
            if layer.transform_param.mean_file:
                layer.transform_param.mean_file = mean
    return param


def write_nets(nets, folder, quiet=False):
    """``--write-nets``: each net's TRAIN NetParameter and random LMDB under ``folder/<net>/``."""
    from google.protobuf import text_format
    for net in nets:
        target = os.path.join(os.path.abspath(folder), net)
        if os.path.exists(os.path.join(target, "train_lmdb")):
            print(f"bench_train: {target} already holds a written net; choose another --write-nets "
                  f"folder", file=sys.stderr)
            return 1
        os.makedirs(target, exist_ok=True)
        path = os.path.join(target, "train.prototxt")
        with open(path + ".tmp", "w") as out:
            out.write(text_format.MessageToString(train_net_param(net, target)))
        os.replace(path + ".tmp", path)
        if not quiet:
            print(f"caffe time --model {path} --iterations 5")
    return 0


def caffe_time_ms(caffe_bin, net, iters, threads, gpu=False):
    """BVLC Caffe's ``caffe time`` "Average Forward-Backward" of the benchmarked ``net`` (ms; on
    GPU 0 with ``gpu``), or None when the binary failed."""
    with tempfile.TemporaryDirectory() as folder:
        if write_nets([net], folder, quiet=True):
            return None
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
                   MKL_NUM_THREADS=str(threads))
        r = subprocess.run([caffe_bin, "time", "--model",
                            os.path.join(folder, net, "train.prototxt"),
                            "--iterations", str(iters)] + (["--gpu", "0"] if gpu else []),
                           capture_output=True, text=True, env=env)
        for line in (r.stdout + r.stderr).splitlines():
            if "Average Forward-Backward:" in line:
                return float(line.split("Average Forward-Backward:")[1].split()[0])
    sys.stderr.write(f"bench_train: {caffe_bin} time failed for {net}:\n{r.stderr[-1500:]}\n")
    return None


def count_flops(net):
    """Training FLOPs per iteration of an engine Net, 2 per multiply-add of every Convolution and
    InnerProduct: forward, backward to the weights, and backward to the data where the net
    computes it (not for a first layer fed by the Data layer)."""
    total = 0
    for layer, tops, need_down in zip(net.layers, net.top_vecs, net.bottom_need_backward):
        if layer.type in ("Convolution", "InnerProduct") and layer.blobs:
            weight = layer.blobs[0]
            macs = tops[0].count * (weight.count // weight.shape[0])
            total += (2 + any(need_down)) * 2 * macs
    return total


def peak_rss_mb():
    """This process's peak resident set size in MiB: Linux's ``VmHWM``, which starts afresh
    at exec (``getrusage``'s ``ru_maxrss`` of a child starts at its parent's peak), else
    ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def gemm_peak(threads, size=2048, reps=7):
    """Float32 GEMM GFLOP/s of this machine: the best of ``reps`` 2048^3 products (the best,
    because on a shared machine the slower ones measure the other processes). Run in a worker,
    whose environment limits the BLAS to ``threads`` threads as for the nets."""
    a = numpy.random.rand(size, size).astype(numpy.float32)
    b = numpy.random.rand(size, size).astype(numpy.float32)
    a @ b
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * size ** 3 / min(times) / 1e9


def gpu_missing():
    """Why ``--device gpu`` cannot run here (None when it can): ``backend.gpu_missing``."""
    from caffe_engine.backend import gpu_missing as missing
    return missing()


def gemm_peak_gpu(size=8192, reps=5):
    """Float32 GEMM GFLOP/s of the current GPU through ``cupy.matmul`` (cuBLAS, no TF32 unless
    ``CUPY_TF32=1``): the best of ``reps`` 8192^3 products, timed with CUDA events."""
    import cupy
    a = cupy.random.random((size, size), dtype=cupy.float32)
    b = cupy.random.random((size, size), dtype=cupy.float32)
    c = a @ b
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        cupy.matmul(a, b, out=c)
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return 2 * size ** 3 / min(times) / 1e9


def _engine_gpu():
    """GPU mode for this (worker) process: ``(synchronize, pool bytes, launches)`` callables;
    ``launches`` returns None where the cuda kernel set is not the one CuPy arrays use."""
    from caffe_engine import backend, kernels
    reason = gpu_missing()
    if reason is not None or not backend.set_mode_gpu():
        raise SystemExit(f"bench_train: --device gpu: {reason or 'set_mode_gpu failed'}")
    import cupy
    device = cupy.cuda.Device()
    pool = cupy.get_default_memory_pool()
    launches = lambda: None  # noqa: E731
    if kernels.gpu_default() == "cuda":
        counter = kernels.get("cuda").device
        launches = lambda: getattr(counter, "launches", None)  # noqa: E731
    return device.synchronize, pool.total_bytes, launches


# --------------------------------------------------------------------------------------------
# Workers (one subprocess each)
# --------------------------------------------------------------------------------------------
def worker_engine(net_name, iters, warmup, settings=(), prefetch=None, kernel_set=None,
                  device="cpu"):
    import dataclasses
    import logging
    from caffe_engine import kernels
    from caffe_engine.log import logger
    from caffe_engine.proto import caffe_pb2
    from caffe_engine.solvers import get_solver
    logger.setLevel(logging.WARNING)
    if kernel_set:
        kernels.use(kernel_set)
    if settings:
        from caffe_engine.kernels.cpu import CpuKernels
        from caffe_engine.kernels.cpu.tuning import CpuTuning
        fields = {f.name for f in dataclasses.fields(CpuTuning)}
        changes = {}
        for setting in settings:
            name, value = setting.split("=", 1)
            if name not in fields:
                raise SystemExit(f"--set: CpuTuning has no field {name} (fields: "
                                 f"{', '.join(sorted(fields))})")
            changes[name] = type_of(value)
        kernels.use(CpuKernels(dataclasses.replace(CpuTuning.from_environment(), **changes)))
    sync, pool_bytes, launches = (lambda: None), (lambda: None), (lambda: None)
    if device == "gpu":
        sync, pool_bytes, launches = _engine_gpu()
    with tempfile.TemporaryDirectory() as folder:
        param = train_net_param(net_name, folder)
        if prefetch is not None:
            for layer in param.layer:
                if layer.type == "Data":
                    layer.data_param.prefetch = prefetch
        solver_param = caffe_pb2.SolverParameter(
            base_lr=0.001, momentum=0.9, weight_decay=0.0005, lr_policy="fixed", max_iter=10 ** 6,
            display=0, snapshot_after_train=False, random_seed=1, snapshot_prefix=folder + "/s")
        solver_param.train_net_param.CopyFrom(param)
        solver = get_solver(solver_param)
        batch = solver.net.blobs["data"].shape[0]
        flops = count_flops(solver.net)
        for _ in range(warmup):
            solver.step(1)
        sync()
        times, counts = [], []
        for _ in range(iters):
            before = launches()
            t = time.perf_counter()
            solver.step(1)
            sync()
            times.append(time.perf_counter() - t)
            after = launches()
            if before is not None and after is not None:
                counts.append(after - before)
    out = {"times": times, "batch": batch, "flops": flops}
    if device == "gpu":
        out["gpu_mb"] = pool_bytes() / 2 ** 20
        out["launches"] = statistics.median(counts) if counts else None
    return out


def type_of(text):
    """``"3"`` -> 3, ``"1e9"`` -> 1e9 (an int when whole: the constants are counts or costs)."""
    value = float(text)
    return int(value) if value.is_integer() and abs(value) < 2 ** 62 else value


def torch_model(param):
    """A torch.nn.Module computing the TRAIN net of NetParameter ``param`` (a subset of types)."""
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
                    self.mods[layer.name] = nn.LazyConv2d(p.num_output, k, stride, pad,
                                                          groups=p.group)
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
            loss = 0
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
                    pool = torch.nn.functional.max_pool2d if p.pool == 0 else \
                        torch.nn.functional.avg_pool2d
                    if p.global_pooling:
                        y = x.amax((2, 3), keepdim=True) if p.pool == 0 else \
                            x.mean((2, 3), keepdim=True)
                    else:
                        y = pool(x, p.kernel_size, p.stride, p.pad, ceil_mode=True)
                elif t == "Concat":
                    y = torch.cat([blobs[b] for b in layer.bottom], 1)
                elif t == "SoftmaxWithLoss":
                    weight = layer.loss_weight[0] if layer.loss_weight else 1.0
                    loss = loss + weight * torch.nn.functional.cross_entropy(
                        x.flatten(1), blobs[layer.bottom[1]])
                    continue
                elif t == "Accuracy":
                    continue
                else:
                    raise NotImplementedError(t)
                blobs[layer.top[0]] = y
            return loss

    return CaffeNet()


def caffe_train():
    from caffe_engine.proto import caffe_pb2
    return caffe_pb2.TRAIN


def worker_torch(net_name, iters, warmup, threads, device="cpu"):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dev, sync = torch.device("cpu"), (lambda: None)
    if device == "gpu":
        if not torch.cuda.is_available():
            raise SystemExit(f"bench_train: --device gpu: PyTorch {torch.__version__} sees no CUDA "
                             f"device")
        dev, sync = torch.device("cuda"), torch.cuda.synchronize
        # float32 as the engine computes it: no TF32 in cuDNN's convolutions or cuBLAS
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as folder:
        param = train_net_param(net_name, folder)
    data_layer = next(l for l in param.layer if l.type == "Data"
                      and not (l.include and l.include[0].phase != caffe_train()))
    batch = data_layer.data_param.batch_size
    shape = NETS[net_name][1]
    crop = data_layer.transform_param.crop_size
    if crop:
        shape = (shape[0], crop, crop)
    classes = CLASSES.get(net_name, 10)
    model = torch_model(param).to(dev)
    data = torch.rand((batch,) + shape, device=dev)
    label = torch.randint(0, classes, (batch,), device=dev)
    model(data, label)
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9, weight_decay=0.0005)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = model(data, label)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t)
    out = {"times": times, "batch": batch}
    if device == "gpu":
        out["gpu_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
        out["gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2 ** 20
    return out


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def run_worker(kind, net, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--nets", net,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--device", args.device]
    if kind == "engine":
        cmd += [f"--set={s}" for s in args.set]
        if args.kernels:
            cmd += ["--kernels", args.kernels]
        if args.prefetch is not None:
            cmd += ["--prefetch", str(args.prefetch)]
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
               MKL_NUM_THREADS=threads)
    if args.gpu_kernels:
        env["CAFFE_ENGINE_GPU_KERNELS"] = args.gpu_kernels
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-2000:])
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarize(runs):
    """Median iteration time of each run -> (median over runs, min, max) in seconds."""
    medians = [statistics.median(r["times"]) for r in runs]
    return statistics.median(medians), min(medians), max(medians)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nets", help=f"comma-separated, of: {', '.join(NETS)} (default: "
                        f"{','.join(DEFAULT_NETS)}; with --device gpu: {','.join(DEFAULT_GPU_NETS)})")
    parser.add_argument("--iters", type=int, default=20, help="timed iterations per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed iterations first")
    parser.add_argument("--repeats", type=int, default=1, help="runs per (framework, net)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="set a CpuTuning field of the cpu kernel set (engine runs)")
    parser.add_argument("--kernels", choices=["reference", "cpu"],
                        help="the engine's kernel set (default: the engine's own choice)")
    parser.add_argument("--caffe-bin", metavar="PATH",
                        help="a BVLC Caffe 'caffe' binary: measure its caffe time in this run")
    parser.add_argument("--prefetch", type=int, help="data_param.prefetch of every Data layer")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                        help="gpu: the engine in GPU mode (CuPy) and PyTorch on cuda")
    parser.add_argument("--gpu-kernels", choices=["cuda", "reference"],
                        help="with --device gpu: the kernel set CuPy arrays use (default cuda)")
    parser.add_argument("--write-nets", metavar="DIR",
                        help="write the nets' TRAIN prototxts and LMDBs under DIR, time nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gpu = args.device == "gpu"
    if args.nets is None:
        args.nets = ",".join(DEFAULT_GPU_NETS if gpu else DEFAULT_NETS)
    nets = [n for n in args.nets.split(",") if n]
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        parser.error(f"unknown net(s): {', '.join(unknown)} (known: {', '.join(NETS)})")

    if args.write_nets:
        return write_nets(nets, args.write_nets)
    if args.worker:
        net = nets[0]
        if args.worker == "peak":
            out = {"gflops": gemm_peak_gpu() if gpu else gemm_peak(args.threads)}
        elif args.worker == "engine":
            out = worker_engine(net, args.iters, args.warmup, args.set, args.prefetch,
                                args.kernels, args.device)
        else:
            out = worker_torch(net, args.iters, args.warmup, args.threads, args.device)
        out["peak_rss_mb"] = peak_rss_mb()
        print(json.dumps(out))
        return 0

    if gpu:
        reason = gpu_missing()
        if reason is not None:
            print(f"bench_train: --device gpu: {reason}", file=sys.stderr)
            return 1
    elif args.gpu_kernels:
        parser.error("--gpu-kernels needs --device gpu")

    # Looked up, not imported: the workers are this process's children, and a child's
    # getrusage high-water mark starts at its parent's.
    have_torch = False
    if not args.no_torch:
        have_torch = importlib.util.find_spec("torch") is not None
        if not have_torch:
            print("PyTorch not installed: engine only (pip install -e '.[bench]')")
    peak_run = run_worker("peak", nets[0], args)
    peak = peak_run["gflops"] if peak_run else None
    if gpu:
        peak_txt = (f"{peak:.0f} GFLOP/s" if peak else "not measured (its worker failed)")
        print(f"GPU float32 GEMM peak (8192^3, cupy.matmul): {peak_txt}; "
              f"{args.warmup} warm-up + {args.iters} timed iterations per run, "
              f"{args.repeats} run(s) each; medians; "
              f"{args.gpu_kernels or 'cuda'} kernel set for CuPy arrays"
              + "".join(f"; {s}" for s in args.set)
              + (f"; {args.kernels} kernels for NumPy arrays" if args.kernels else "")
              + ("; Caffe measured by " + args.caffe_bin if args.caffe_bin else "")
              + (f"; prefetch {args.prefetch}" if args.prefetch is not None else ""))
        print("launch/it: the cuda kernel set's kernels per iteration (not cuBLAS products nor "
              "CuPy's own kernels); GPU MB: CuPy pool total_bytes (engine), "
              "max_memory_allocated (PyTorch)")
        header = (f"{'net':<16}{'batch':>6}{'it/s':>9}{'ms/it':>9}{'img/s':>8}{'GFLOP/s':>9}"
                  f"{'%peak':>7}{'launch/it':>10}{'GPU MB':>8}{'torch ms':>10}{'torch MB':>10}"
                  f"{'eng/torch':>10}" + (f"{'Caffe ms':>10}{'x Caffe':>9}" if args.caffe_bin
                                          else ""))
    else:
        print(f"float32 GEMM peak (2048^3, {args.threads} threads): {peak:.0f} GFLOP/s; "
              f"{args.warmup} warm-up + {args.iters} timed iterations per run, "
              f"{args.repeats} run(s) each; medians"
              + "".join(f"; {s}" for s in args.set)
              + (f"; {args.kernels} kernels" if args.kernels else "")
              + ("; Caffe measured by " + args.caffe_bin if args.caffe_bin else "")
              + (f"; prefetch {args.prefetch}" if args.prefetch is not None else ""))
        header = (f"{'net':<14}{'batch':>6}{'it/s':>9}{'ms/it':>9}{'img/s':>8}{'GFLOP/s':>9}"
                  f"{'%peak':>7}{'RSS MB':>8}{'torch it/s':>11}{'torch RSS':>10}{'eng/torch':>10}"
                  f"{'Caffe ms':>10}{'x Caffe':>9}")
    print(header)
    print("-" * len(header))
    results = {}
    for net in nets:
        eng_runs, tor_runs = [], []
        for _ in range(args.repeats):
            eng = run_worker("engine", net, args)
            if eng is not None:
                eng_runs.append(eng)
            if have_torch:
                tor = run_worker("torch", net, args)
                if tor is not None:
                    tor_runs.append(tor)
        if not eng_runs:
            print(f"{net:<14} engine run failed", flush=True)
            continue
        eng = eng_runs[0]
        sec, sec_lo, sec_hi = summarize(eng_runs)
        its = 1.0 / sec
        gflops = eng["flops"] * its / 1e9
        rss = max(r["peak_rss_mb"] for r in eng_runs)
        results[net] = {"engine_runs": eng_runs, "engine_its": its, "engine_ms": sec * 1e3,
                        "engine_ms_range": [sec_lo * 1e3, sec_hi * 1e3], "gflops": gflops,
                        "peak": peak, "engine_rss_mb": rss, "batch": eng["batch"],
                        "device": args.device}
        if gpu:
            share = f"{100 * gflops / peak:>6.0f}%" if peak else f"{'-':>7}"
            counts = [r["launches"] for r in eng_runs if r.get("launches") is not None]
            launches = statistics.median(counts) if counts else None
            gpu_mb = max(r["gpu_mb"] for r in eng_runs)
            row = (f"{net:<16}{eng['batch']:>6}{its:>9.2f}{sec * 1e3:>9.1f}"
                   f"{its * eng['batch']:>8.0f}{gflops:>9.1f}{share}"
                   + (f"{launches:>10.0f}" if launches is not None else f"{'-':>10}")
                   + f"{gpu_mb:>8.0f}")
            results[net].update(engine_launches_per_iter=launches, engine_gpu_mb=gpu_mb)
            if tor_runs:
                t_sec, t_lo, t_hi = summarize(tor_runs)
                t_mb = max(r["gpu_mb"] for r in tor_runs)
                row += f"{t_sec * 1e3:>10.1f}{t_mb:>10.0f}{t_sec / sec:>10.2f}"
                results[net].update(
                    torch_runs=tor_runs, torch_its=1 / t_sec, torch_ms=t_sec * 1e3,
                    torch_ms_range=[t_lo * 1e3, t_hi * 1e3], torch_gpu_mb=t_mb,
                    torch_gpu_reserved_mb=max(r["gpu_reserved_mb"] for r in tor_runs),
                    engine_ms_over_torch_ms=sec / t_sec)
            else:
                row += f"{'-':>10}{'-':>10}{'-':>10}"
            if args.caffe_bin:
                caffe_ms = caffe_time_ms(args.caffe_bin, net, args.iters, args.threads, gpu=True)
                if caffe_ms:
                    row += f"{caffe_ms:>10.1f}{caffe_ms / (sec * 1e3):>9.2f}"
                    results[net].update(caffe_ms=caffe_ms, caffe_measured=True)
            print(row, flush=True)
            write_json(args.json, results)
            continue
        row = (f"{net:<14}{eng['batch']:>6}{its:>9.2f}{sec * 1e3:>9.1f}{its * eng['batch']:>8.0f}"
               f"{gflops:>9.1f}{100 * gflops / peak:>6.0f}%{rss:>8.0f}")
        if tor_runs:
            t_sec, t_lo, t_hi = summarize(tor_runs)
            t_rss = max(r["peak_rss_mb"] for r in tor_runs)
            row += f"{1 / t_sec:>11.2f}{t_rss:>10.0f}{t_sec / sec:>10.2f}"
            results[net].update(torch_runs=tor_runs, torch_its=1 / t_sec, torch_ms=t_sec * 1e3,
                                torch_ms_range=[t_lo * 1e3, t_hi * 1e3], torch_rss_mb=t_rss)
        else:
            row += f"{'-':>11}{'-':>10}{'-':>10}"
        caffe_ms = CAFFE_MS.get(net)
        if args.caffe_bin:
            caffe_ms = caffe_time_ms(args.caffe_bin, net, args.iters, args.threads)
        if caffe_ms:
            row += f"{caffe_ms:>10.0f}{caffe_ms / (sec * 1e3):>9.2f}"
            results[net]["caffe_ms"] = caffe_ms
            results[net]["caffe_measured"] = bool(args.caffe_bin)
        print(row, flush=True)
        write_json(args.json, results)
    write_json(args.json, results)
    return 0


def write_json(path, results):
    """``--json``: the results so far (rewritten after every net, so that a run stopped
    part-way still leaves the nets it finished)."""
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
