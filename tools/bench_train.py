#!/usr/bin/env python3
"""Training-speed benchmark: the engine beside PyTorch on the same nets, in the same run.

For each net — the small ones of ``models/`` (LeNet batch 64, cifar10_quick batch 100, NiN batch
128, the small inception net batch 32 at 112x112 crops) and GoogLeNet as trained on Places205
(``googlenet_places``, batch 32, 224x224 crops, from ``../shared/realworld``) by default, and the
Model Zoo's deep nets with ``--nets zoo`` (below) — this times full training iterations — Data
layer reading an LMDB and transforming, forward, backward, SGD update — after warm-up, and
reports the median iterations/s, images/s, achieved GFLOP/s (FLOPs counted from the net's
shapes: forward and backward to weights of every Convolution and InnerProduct, and backward to
data where the net computes it), the fraction of this machine's measured float32 GEMM peak, and
the peak RSS. When PyTorch is installed (extra ``bench``), the same nets are built in PyTorch
from the same prototxt and timed too, with the same number of threads, and the ratio
engine/PyTorch is printed per net. The data are random: an LMDB of 256 random records of each
net's input size (``make_data``; 3x256x256 for the ImageNet nets), labels below its classes.

The Model Zoo nets (``--nets zoo``, or by name), all at batch 32 and 1000 classes, 224x224
crops (227x227 for AlexNet, CaffeNet and SqueezeNet, as their prototxts crop):

* ``alexnet``: BVLC's ``models/bvlc_alexnet/train_val.prototxt`` (copied into ``models/``);
* ``caffenet``: BVLC CaffeNet as fine-tuned on flowers
  (``../shared/realworld/natanielruiz__net-archive/caffenet-flowers``: its ImageData input
  made a Data layer, its 102-way fc8 given 1000 outputs);
* ``googlenet``: BVLC GoogLeNet (``models/googlenet``; ``bvlc_googlenet`` is the same net under
  its old name);
* ``vgg16``: VGG_ILSVRC_16_layers' deploy prototxt (``../shared/realworld``);
* ``resnet50``: KaimingHe's ResNet-50 deploy prototxt (``../shared/realworld``);
* ``squeezenet``: forresti's SqueezeNet v1.1 ``train_val.prototxt`` (copied into ``models/``);
* ``mobilenet``: shicai's MobileNet v1 deploy prototxt (``../shared/realworld``; depthwise
  convolutions as group convolutions).

Their TRAIN nets are the TRAIN phase alone (TEST-phase and Accuracy layers dropped); a deploy
prototxt is made a TRAIN net by ``deploy_to_train`` (a Data layer in place of its input,
BatchNorm on batch statistics, MSRA/Xavier fillers where it has none, SoftmaxWithLoss on the
classifier in place of its Softmax).

PyTorch's model is ``torch_model``: our own ``torch.nn`` definition of the same layers, read
from the same TRAIN NetParameter (Convolution -> ``LazyConv2d`` with its groups, kernel, pad,
stride and dilation; InnerProduct -> ``LazyLinear``; BatchNorm + Scale -> ``LazyBatchNorm2d``
with affine; Pooling -> ``max_pool2d``/``avg_pool2d`` with Caffe's ceil rounding; LRN ->
``LocalResponseNorm``; Dropout, Concat, Eltwise, ReLU, SoftmaxWithLoss -> ``cross_entropy``;
see its docstring), trained by ``torch.optim.SGD`` with the solver's momentum and weight decay.
Before a net is timed, a subprocess checks that every top of the PyTorch model has the shape
of the engine Net's blob of that name (batch 2); a net that differs is timed for the engine
only, with a line on stderr. ``--check-shapes`` runs that check alone.

The benchmark's subprocesses run without ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` (this
machine sets them for old OpenBLAS builds, halving NumPy's GEMM on its AVX-512 CPU; users have
neither), with ``--threads`` BLAS/OpenMP threads; the GEMM peak's worker prints the BLAS it runs
(threadpoolctl: library, kernel architecture, threads, file) beside the peak it measures. Tests
call the functions in their own environment.

Beside each net's whole iterations, the engine's own ``caffe time`` (``python -m caffe_engine
time --model <net>/train.prototxt --iterations N``, ``--time-iters N``, default ``--iters``; 0
skips it) gives the Average Forward-Backward of the same TRAIN net (column ``F+B ms``), the
figure BVLC Caffe's ``caffe time`` prints. With ``--caffe-bin PATH`` (a BVLC Caffe build's
``caffe``), Caffe's ``caffe time`` forward+backward of exactly the benchmarked net (same
prototxt, same LMDB, same threads) is measured in the same run; otherwise the figures measured
for the issues on this kind of machine (``CAFFE_MS``) stand in. Either way the speed-up over
Caffe is printed (the engine's whole iterations, with data and update, against Caffe's
forward+backward alone).

Each (framework, net) run is its own subprocess so that peak RSS is its own. ``--repeats R`` runs
every pair R times, engine and PyTorch alternating, and reports the median of the runs' medians
(and the spread) — on a shared machine compare ratios taken in one invocation.

``--set NAME=VALUE`` sets a field of the cpu kernel set's tuning
(:class:`caffe_engine.kernels.cpu.tuning.CpuTuning`, e.g. ``block_columns=512``, ``kc=128``,
``images_per_chunk=1``, ``backward_data=col2im``) in the engine's runs, ``--kernels reference``
runs the reference kernel set instead, and ``--prefetch N`` sets every Data layer's
``data_param.prefetch``: the ablations of docs/performance.md (``caffe time``'s ``F+B ms`` runs
the engine's defaults).

    python tools/bench_train.py [--nets lenet,cifar10_quick,nin,inception,googlenet_places]
                                [--nets zoo | alexnet,caffenet,googlenet,vgg16,resnet50,
                                              squeezenet,mobilenet]
                                [--iters 20] [--warmup 3] [--repeats 1] [--threads 2]
                                [--time-iters N] [--no-torch] [--json out.json]
                                [--set NAME=VALUE ...] [--kernels reference|cpu] [--prefetch N]
                                [--caffe-bin PATH]
    python tools/bench_train.py --check-shapes [--nets zoo]     # PyTorch's shapes = the engine's
    python tools/bench_train.py --write-nets DIR [--nets ...]   # then: caffe time --model
                                                                  #   DIR/<net>/train.prototxt

``--write-nets DIR`` times nothing: it writes each net's benchmarked TRAIN prototxt and its
random LMDB (and mean file) under ``DIR/<net>/``, for ``caffe time``'s per-layer profile of
exactly what the benchmark runs (the engine's or BVLC Caffe's).

``--device gpu`` times the same iterations on the GPU: the engine in GPU mode (blobs on CuPy,
so the cuda kernel set; ``--gpu-kernels reference`` runs the reference set's CuPy array code
instead) and PyTorch on ``cuda`` (eager, float32: TF32 off for cuDNN and cuBLAS, as CuPy's
products without ``CUPY_TF32``), every timed iteration closed by a device synchronize. Its
default nets are lenet, cifar10_quick, nin and bvlc_googlenet (``models/googlenet``, BVLC
GoogLeNet, batch 32, 224x224 crops; the zoo nets read from ``../shared`` need it beside the
repository). The table then gives, instead of the CPU's RSS and Caffe columns, the GPU float32
GEMM peak's share, the engine's kernel launches per iteration (the cuda kernel set's own
kernels, counted by its ``CupyDevice``; cuBLAS products and CuPy's own elementwise and
reduction kernels, e.g. the layers' array code, are not counted), and peak GPU memory: the
engine's CuPy memory pool (``total_bytes``: what the pool holds, used or cached, at the end)
and PyTorch's ``max_memory_allocated`` (its ``max_memory_reserved`` is in the JSON), neither
counting the CUDA context or library workspaces. Without CuPy or a CUDA device it stops with
one line.

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

REALWORLD = "../shared/realworld/"
#: net -> (prototxt relative to the repository, shape of the LMDB records made for it).
NETS = {
    "lenet": ("models/lenet/lenet_train_test.prototxt", (1, 28, 28)),
    "cifar10_quick": ("models/cifar10_quick/cifar10_quick_train_test.prototxt", (3, 32, 32)),
    "nin": ("models/nin_cifar10/nin_cifar10_train_test.prototxt", (3, 32, 32)),
    "inception": ("models/inception_small/inception_small_train_test.prototxt", (3, 128, 128)),
    # GoogLeNet as trained on Places205 (205 classes; ``googlenet`` before the Model Zoo nets)
    "googlenet_places": (REALWORLD + "natanielruiz__net-archive/places205-googlenet/"
                         "train_val_googlenet_places205.prototxt", (3, 256, 256)),
    # The Model Zoo's deep nets (ZOO): ImageNet's 1000 classes, batch 32
    "alexnet": ("models/bvlc_alexnet/train_val.prototxt", (3, 256, 256)),
    "caffenet": (REALWORLD + "natanielruiz__net-archive/caffenet-flowers/train_val.prototxt",
                 (3, 256, 256)),
    # BVLC's own GoogLeNet, in the repository (the GPU machine has no ../shared)
    "googlenet": ("models/googlenet/train_val.prototxt", (3, 256, 256)),
    "vgg16": (REALWORLD + "natanielruiz__net-archive/vgg_ilsvrc_16/"
              "VGG_ILSVRC_16_layers_deploy.prototxt", (3, 256, 256)),
    "resnet50": (REALWORLD + "KaimingHe__deep-residual-networks/prototxt/"
                 "ResNet-50-deploy.prototxt", (3, 256, 256)),
    "squeezenet": ("models/squeezenet_v1.1/train_val.prototxt", (3, 256, 256)),
    "mobilenet": (REALWORLD + "shicai__MobileNet-Caffe/mobilenet_deploy.prototxt", (3, 256, 256)),
}
#: Old names still accepted by ``--nets`` (timed, and shown, under the name given).
ALIASES = {"bvlc_googlenet": "googlenet"}
NETS.update({alias: NETS[name] for alias, name in ALIASES.items()})
#: ``--nets zoo``: the Model Zoo's deep nets.
ZOO = ("alexnet", "caffenet", "googlenet", "vgg16", "resnet50", "squeezenet", "mobilenet")
DEFAULT_NETS = ("lenet", "cifar10_quick", "nin", "inception", "googlenet_places")
DEFAULT_GPU_NETS = ("lenet", "cifar10_quick", "nin", "bvlc_googlenet")
#: Zoo nets given as deploy prototxts, made TRAIN nets by ``deploy_to_train``: the Data layer's
#: transform (224 crops of the 256x256 records, mirror, BGR mean; MobileNet's own scale).
DEPLOY = {"vgg16": {"crop_size": 224}, "resnet50": {"crop_size": 224},
          "mobilenet": {"crop_size": 224, "scale": 0.017}}
#: Classes of each net's classifiers (the generated labels must fit).
CLASSES = dict({"inception": 100, "googlenet_places": 205, "bvlc_googlenet": 1000},
               **{net: 1000 for net in ZOO})
#: Batch sizes set by the benchmark (the prototxts say 128 for GoogLeNet, 256 for AlexNet...;
#: the issues time 32).
BATCH = dict({"googlenet_places": 32, "bvlc_googlenet": 32}, **{net: 32 for net in ZOO})
#: BVLC Caffe's ``caffe time`` forward+backward ms per iteration on this kind of machine (2 cores,
#: OpenBLAS), as measured for the issues (GoogLeNet Places205: 5.5-5.9 s on the net this benchmark
#: writes; 3.5 s was BVLC's own prototxt); the small inception net has no Caffe reference of its
#: own, nor have the Model Zoo nets (``--caffe-bin`` measures them).
CAFFE_MS = {"lenet": 17.0, "cifar10_quick": 135.0, "nin": 2000.0, "googlenet_places": 5700.0}
#: Set on this machine for old OpenBLAS builds (they halve NumPy's GEMM on its AVX-512 CPU);
#: users have neither, so the benchmark's subprocesses run without them (tools/bench_data.py).
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def canonical(net):
    """``net``'s own name (``bvlc_googlenet`` -> ``googlenet``)."""
    return ALIASES.get(net, net)


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


def train_net_param(net, folder, batch=None, records=256):
    """The TRAIN net of ``net`` with its Data layer reading a fresh random LMDB of ``records``
    records in ``folder``, at the benchmark's batch size (or ``batch``). A Model Zoo net is the
    TRAIN phase alone: ``deploy_to_train`` of a deploy prototxt, ``zoo_train_val`` of a
    train_val one."""
    from caffe_engine.io import prototxt as pio
    path, shape = NETS[net]
    param = pio.read_net_param(os.path.join(ROOT, path))
    source, mean = make_data(folder, shape, records, CLASSES.get(net, 10))
    batch = batch or BATCH.get(net)
    name = canonical(net)
    if name in DEPLOY:
        return deploy_to_train(param, source, batch, CLASSES[name], **DEPLOY[name])
    if name in ZOO:
        param = zoo_train_val(param, CLASSES[name])
    for layer in param.layer:
        if layer.type == "Data":
            layer.data_param.source = source
            if batch:
                layer.data_param.batch_size = batch
            if layer.transform_param.mean_file:
                layer.transform_param.mean_file = mean
    return param


def _is_test_only(layer):
    """Whether ``layer``'s include rules name the TEST phase (the benchmark's nets use no other
    rules)."""
    from caffe_engine.proto import caffe_pb2
    return any(rule.HasField("phase") and rule.phase == caffe_pb2.TEST for rule in layer.include)


def deploy_to_train(deploy, source, batch, classes, crop_size=224, scale=None,
                    mean_value=(104.0, 117.0, 123.0)):
    """A deploy NetParameter made a TRAIN net: a ``Data`` layer on the LMDB ``source`` (``batch``
    images, random ``crop_size`` crops and mirror, the BGR ``mean_value`` subtracted, then
    ``scale``) in place of its ``Input`` layer (the ``input``/``input_dim`` fields, upgraded);
    BatchNorm on batch statistics (``use_global_stats: false``); MSRA fillers for the weights of
    Convolutions and Xavier for InnerProducts where the deploy file has none; the classifier (the
    bottom of the last ``Softmax``, else the last InnerProduct or Convolution) given ``classes``
    outputs and a ``SoftmaxWithLoss`` on it against the label, in place of the ``Softmax``;
    ``Accuracy`` and TEST-phase layers dropped."""
    from caffe_engine.proto import caffe_pb2
    param = caffe_pb2.NetParameter(name=deploy.name)
    data = param.layer.add(name="data", type="Data", top=["data", "label"])
    data.transform_param.crop_size = crop_size
    data.transform_param.mirror = True
    data.transform_param.mean_value.extend(mean_value)
    if scale is not None:
        data.transform_param.scale = scale
    data.data_param.source = source
    data.data_param.batch_size = batch
    data.data_param.backend = caffe_pb2.DataParameter.LMDB
    inputs, producers, logits = set(), {}, None
    for source_layer in deploy.layer:
        if source_layer.type == "Input":
            inputs.update(source_layer.top)
            continue
        if source_layer.type == "Accuracy" or _is_test_only(source_layer):
            continue
        if source_layer.type == "Softmax":
            logits = source_layer.bottom[0]
            continue
        layer = param.layer.add()
        layer.CopyFrom(source_layer)
        # the deploy's input blob is the Data layer's "data"
        for i, bottom in enumerate(layer.bottom):
            if bottom in inputs:
                layer.bottom[i] = "data"
        if layer.type == "BatchNorm":
            layer.batch_norm_param.use_global_stats = False
        elif layer.type in ("Convolution", "InnerProduct"):
            weights = (layer.convolution_param if layer.type == "Convolution"
                       else layer.inner_product_param)
            if not weights.HasField("weight_filler"):
                weights.weight_filler.type = "msra" if layer.type == "Convolution" else "xavier"
        for top in layer.top:
            producers[top] = layer
    if logits is None:
        logits = next(layer.top[0] for layer in reversed(param.layer)
                      if layer.type in ("Convolution", "InnerProduct"))
    _set_classes(producers.get(logits), classes)
    param.layer.add(name="loss", type="SoftmaxWithLoss", bottom=[logits, "label"], top=["loss"])
    return param


def zoo_train_val(param, classes):
    """A Model Zoo train_val NetParameter's TRAIN net: its TEST-phase layers and ``Accuracy``
    layers dropped, an ``ImageData`` input made a ``Data`` layer (same transform; the caller
    sets its source), and the classifier under every ``SoftmaxWithLoss`` given ``classes``
    outputs (CaffeNet's flowers fine-tuning prototxt has 102)."""
    from caffe_engine.proto import caffe_pb2
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    producers = {}
    for source_layer in param.layer:
        if source_layer.type == "Accuracy" or _is_test_only(source_layer):
            continue
        layer = out.layer.add()
        layer.CopyFrom(source_layer)
        if layer.type == "ImageData":
            layer.type = "Data"
            layer.data_param.batch_size = layer.image_data_param.batch_size
            layer.data_param.backend = caffe_pb2.DataParameter.LMDB
            layer.ClearField("image_data_param")
        if layer.type == "SoftmaxWithLoss":
            _set_classes(producers.get(layer.bottom[0]), classes)
        for top in layer.top:
            producers[top] = layer
    return out


def _set_classes(layer, classes):
    """Give the classifier ``layer`` (an InnerProduct or Convolution; anything else, e.g.
    SqueezeNet's global pooling after its last Convolution, is left) ``classes`` outputs."""
    if layer is not None and layer.type == "InnerProduct":
        layer.inner_product_param.num_output = classes
    elif layer is not None and layer.type == "Convolution":
        layer.convolution_param.num_output = classes


def write_nets(nets, folder, quiet=False):
    """``--write-nets``: each net's TRAIN NetParameter and random LMDB under ``folder/<net>/``
    (``quiet``: no lines, and none of the upgrade's warnings about a deploy's input fields)."""
    import logging
    from caffe_engine.log import logger
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        return _write_nets(nets, folder, quiet)
    finally:
        logger.setLevel(level)


def _write_nets(nets, folder, quiet):
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


def child_env(threads):
    """The environment of the benchmark's subprocesses (workers, ``caffe time``): this one's
    without ``BLAS_OVERRIDES``, every BLAS/OpenMP thread count set to ``threads``, and glog's
    lines on stderr only (no log files from ``caffe time``)."""
    env = {name: value for name, value in os.environ.items() if name not in BLAS_OVERRIDES}
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), GLOG_logtostderr="1")
    return env


#: ``caffe time`` of the engine itself (``caffe_time_ms``'s ``caffe_bin``).
ENGINE_CAFFE = (sys.executable, "-m", "caffe_engine")


def caffe_time_ms(caffe_bin, net, iters, threads, gpu=False):
    """``caffe time``'s "Average Forward-Backward" of the benchmarked ``net`` (ms; on GPU 0 with
    ``gpu``), or None when the binary failed: ``caffe_bin`` is a BVLC Caffe build's ``caffe``, or
    a command as a sequence (``ENGINE_CAFFE``: the engine's own ``caffe time``, for a figure
    to put beside Caffe's on the same TRAIN net). Run in ``child_env(threads)``."""
    command = [caffe_bin] if isinstance(caffe_bin, str) else list(caffe_bin)
    with tempfile.TemporaryDirectory() as folder:
        if write_nets([net], folder, quiet=True):
            return None
        r = subprocess.run(command + ["time", "--model",
                                      os.path.join(folder, net, "train.prototxt"),
                                      "--iterations", str(iters)] + (["--gpu", "0"] if gpu else []),
                           capture_output=True, text=True, env=child_env(threads))
        for line in (r.stdout + r.stderr).splitlines():
            if "Average Forward-Backward:" in line:
                return float(line.split("Average Forward-Backward:")[1].split()[0])
    sys.stderr.write(f"bench_train: {' '.join(command)} time failed for {net}:\n"
                     f"{r.stderr[-1500:]}\n")
    return None


def blas_info():
    """NumPy's BLAS as this process runs it: threadpoolctl's ``threadpool_info()`` entries of
    user_api blas (internal_api, version, architecture: the kernel, num_threads, filepath), and
    the engine's cpu kernel set and its threads."""
    from threadpoolctl import threadpool_info
    from caffe_engine import kernels
    blas = [{key: lib.get(key) for key in ("internal_api", "version", "architecture",
                                           "num_threads", "threading_layer", "filepath")}
            for lib in threadpool_info() if lib["user_api"] == "blas"]
    kernel_set = kernels.for_array(numpy.empty(0, numpy.float32))
    tuning = getattr(kernel_set, "tuning", None)        # the reference set has none
    return {"blas": blas, "kernels": kernel_set.name,
            "kernel_threads": tuning.threads if tuning else 1,
            "overrides": {name: os.environ[name] for name in BLAS_OVERRIDES
                          if name in os.environ}}


def blas_text(info):
    """One line of ``blas_info()``'s figures."""
    libs = "; ".join(f"{lib['internal_api']} {lib.get('version') or ''} kernel "
                     f"{lib.get('architecture') or '?'}, {lib['num_threads']} threads "
                     f"({lib.get('threading_layer') or '?'}), {lib['filepath']}"
                     for lib in info["blas"]) or "no BLAS found by threadpoolctl"
    overrides = ", ".join(f"{k}={v}" for k, v in info["overrides"].items()) or "none"
    return (f"BLAS in the workers: {libs}; engine kernel set {info['kernels']} with "
            f"{info['kernel_threads']} threads; {'/'.join(BLAS_OVERRIDES)} in the workers: "
            f"{overrides}")


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


def _hw(param, single, prefix, default):
    """A spatial field of a Convolution or Pooling parameter as ``(h, w)``: ``<prefix>_h`` and
    ``<prefix>_w`` where set, else ``single`` (repeated in ConvolutionParameter: one value for
    both, or h then w; optional in PoolingParameter), else ``default``."""
    if param.HasField(prefix + "_h") or param.HasField(prefix + "_w"):
        return getattr(param, prefix + "_h"), getattr(param, prefix + "_w")
    value = getattr(param, single)
    if isinstance(value, int):                      # PoolingParameter's optional field
        return (value, value) if param.HasField(single) else (default, default)
    values = list(value)
    if not values:
        return default, default
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


#: Layer types that feed the net (their tops are the model's ``data`` and ``label`` arguments).
_INPUT_TYPES = ("Data", "ImageData", "Input", "MemoryData", "HDF5Data")


def _in_train(layer):
    """Whether ``layer`` is in the TRAIN net (phase rules only, as the benchmark's nets use)."""
    train = caffe_train()
    if any(rule.HasField("phase") and rule.phase != train for rule in layer.include):
        return False
    return not any(rule.HasField("phase") and rule.phase == train for rule in layer.exclude)


def torch_model(param):
    """A torch.nn.Module computing the TRAIN net of NetParameter ``param``: the same layers, in
    the same order, on the same blob names, each written with PyTorch's own ``torch.nn``
    modules and functions: Convolution (``LazyConv2d``: kernel, pad, stride as one value or h/w,
    dilation, group, so depthwise too; ``bias_term``), InnerProduct (``LazyLinear`` on the bottom
    flattened from ``axis``), BatchNorm (``LazyBatchNorm2d`` on batch statistics, eps and
    ``1 - moving_average_fraction`` as momentum; with the Scale with bias that follows it on its
    top as the module's affine, as a PyTorch user writes it), Scale (a per-channel factor and
    bias of its own otherwise), ReLU (``negative_slope``; in place when Caffe's is), Pooling (MAX
    and AVE with Caffe's ceil rounding, global), LRN across channels (``LocalResponseNorm``,
    whose alpha is Caffe's alpha / local_size too), Dropout, Concat, Eltwise (SUM with
    coefficients, PROD, MAX), Softmax, Flatten, Sigmoid, TanH, Split, and SoftmaxWithLoss
    (``cross_entropy`` times its loss weight; the losses are summed). ``forward(data, label)``
    returns the loss; with ``model.record = []`` it appends ``(layer, top, shape)`` of every top
    (``check_shapes`` compares them with the engine Net's blobs). Other types raise
    NotImplementedError."""
    import torch
    from torch import nn
    from caffe_engine.proto import caffe_pb2
    F = nn.functional
    P = caffe_pb2.PoolingParameter
    E = caffe_pb2.EltwiseParameter

    class Scale(nn.modules.lazy.LazyModuleMixin, nn.Module):
        """Caffe's one-bottom Scale over axis 1: a learnt factor per channel (filled with 1, as
        Caffe's default) and, with ``bias_term``, a learnt bias per channel (0)."""

        def __init__(self, bias):
            super().__init__()
            self.weight = nn.parameter.UninitializedParameter()
            self.bias = nn.parameter.UninitializedParameter() if bias else None

        def initialize_parameters(self, x):
            if self.has_uninitialized_params():
                with torch.no_grad():
                    self.weight.materialize((x.shape[1],))
                    self.weight.fill_(1.0)
                    if self.bias is not None:
                        self.bias.materialize((x.shape[1],))
                        self.bias.zero_()

        def forward(self, x):
            view = (1, -1) + (1,) * (x.dim() - 2)
            y = x * self.weight.view(view)
            return y if self.bias is None else y + self.bias.view(view)

    def per_channel_scale(layer):
        p = layer.scale_param
        return len(layer.bottom) == 1 and p.axis == 1 and p.num_axes == 1

    class CaffeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.ops = [layer for layer in param.layer if _in_train(layer)]
            self.mods = nn.ModuleDict()
            self.fused = set()              # Scale layers computed as their BatchNorm's affine
            self.record = None
            for i, layer in enumerate(self.ops):
                t, name = layer.type, layer.name
                if t == "Convolution":
                    p = layer.convolution_param
                    if p.axis != 1 or len(p.kernel_size) > 2:
                        raise NotImplementedError(f"{name}: Convolution other than 2-D")
                    dilation = list(p.dilation) or [1]
                    self.mods[name] = nn.LazyConv2d(
                        p.num_output, _hw(p, "kernel_size", "kernel", 1),
                        _hw(p, "stride", "stride", 1), _hw(p, "pad", "pad", 0),
                        (dilation[0], dilation[-1]), groups=p.group, bias=p.bias_term)
                elif t == "InnerProduct":
                    p = layer.inner_product_param
                    self.mods[name] = nn.LazyLinear(p.num_output, bias=p.bias_term)
                elif t == "BatchNorm":
                    p = layer.batch_norm_param
                    after = self.ops[i + 1] if i + 1 < len(self.ops) else None
                    affine = (after is not None and after.type == "Scale"
                              and after.bottom[0] == layer.top[0] and per_channel_scale(after)
                              and after.scale_param.bias_term)
                    if affine:
                        self.fused.add(after.name)
                    self.mods[name] = nn.LazyBatchNorm2d(
                        p.eps, 1.0 - p.moving_average_fraction, affine=affine)
                elif t == "Scale" and name not in self.fused:
                    if not per_channel_scale(layer):
                        raise NotImplementedError(f"{name}: Scale other than per channel")
                    self.mods[name] = Scale(layer.scale_param.bias_term)
                elif t == "LRN":
                    p = layer.lrn_param
                    if p.norm_region != caffe_pb2.LRNParameter.ACROSS_CHANNELS:
                        raise NotImplementedError(f"{name}: LRN within channels")
                    self.mods[name] = nn.LocalResponseNorm(p.local_size, p.alpha, p.beta, p.k)
                elif t == "Dropout":
                    self.mods[name] = nn.Dropout(layer.dropout_param.dropout_ratio)

        def forward(self, data, label):
            blobs = {}
            loss = 0
            for layer in self.ops:
                t = layer.type
                if t in _INPUT_TYPES:
                    for top, value in zip(layer.top, (data, label)):
                        blobs[top] = value
                        if self.record is not None:
                            self.record.append((layer.name, top, tuple(value.shape)))
                    continue
                if t in ("Accuracy", "Silence"):
                    continue
                x = blobs[layer.bottom[0]]
                in_place = bool(layer.top) and layer.top[0] == layer.bottom[0]
                if layer.name in self.fused:
                    y = x                   # its BatchNorm's affine did it
                elif t in ("Convolution", "BatchNorm", "Scale", "LRN", "Dropout"):
                    y = self.mods[layer.name](x)
                elif t == "InnerProduct":
                    y = self.mods[layer.name](x.flatten(layer.inner_product_param.axis))
                elif t == "ReLU":
                    slope = layer.relu_param.negative_slope
                    if slope:
                        y = F.leaky_relu(x, slope, inplace=in_place)
                    else:
                        y = torch.relu_(x) if in_place else torch.relu(x)
                elif t == "Pooling":
                    p = layer.pooling_param
                    if p.pool not in (P.MAX, P.AVE):
                        raise NotImplementedError(f"{layer.name}: stochastic pooling")
                    if p.global_pooling:
                        y = x.amax((2, 3), keepdim=True) if p.pool == P.MAX else \
                            x.mean((2, 3), keepdim=True)
                    else:
                        kernel = _hw(p, "kernel_size", "kernel", 1)
                        stride = _hw(p, "stride", "stride", 1)
                        pad = _hw(p, "pad", "pad", 0)
                        if p.pool == P.MAX:
                            y = F.max_pool2d(x, kernel, stride, pad, ceil_mode=True)
                        else:
                            y = F.avg_pool2d(x, kernel, stride, pad, ceil_mode=True,
                                             count_include_pad=True)
                elif t == "Concat":
                    p = layer.concat_param
                    axis = p.concat_dim if p.HasField("concat_dim") else p.axis
                    y = torch.cat([blobs[b] for b in layer.bottom], axis)
                elif t == "Eltwise":
                    p = layer.eltwise_param
                    xs = [blobs[b] for b in layer.bottom]
                    if p.operation == E.SUM:
                        coeff = list(p.coeff) or [1.0] * len(xs)
                        y = xs[0] if coeff[0] == 1 else coeff[0] * xs[0]
                        for c, v in zip(coeff[1:], xs[1:]):
                            y = y + v if c == 1 else y + c * v
                    elif p.operation == E.PROD:
                        y = xs[0]
                        for v in xs[1:]:
                            y = y * v
                    else:
                        y = xs[0]
                        for v in xs[1:]:
                            y = torch.maximum(y, v)
                elif t == "Softmax":
                    y = torch.softmax(x, layer.softmax_param.axis)
                elif t == "Flatten":
                    y = x.flatten(layer.flatten_param.axis, layer.flatten_param.end_axis)
                elif t == "Sigmoid":
                    y = torch.sigmoid(x)
                elif t == "TanH":
                    y = torch.tanh(x)
                elif t == "Split":
                    for top in layer.top:
                        blobs[top] = x
                    continue
                elif t == "SoftmaxWithLoss":
                    weight = layer.loss_weight[0] if layer.loss_weight else 1.0
                    # N x C (x 1 x 1, as SqueezeNet's and MobileNet's classifiers give)
                    logits = x.flatten(1) if x[0, 0].numel() == 1 else x
                    y = weight * F.cross_entropy(logits, blobs[layer.bottom[1]])
                    loss = loss + y
                    if not layer.top:       # Caffe gives it an anonymous top
                        continue
                else:
                    raise NotImplementedError(t)
                blobs[layer.top[0]] = y
                if self.record is not None:
                    self.record.append((layer.name, layer.top[0], tuple(y.shape)))
            return loss

    return CaffeNet()


def check_shapes(param, net=None):
    """The architecture check: the engine Net of TRAIN NetParameter ``param`` (or ``net``) and
    ``torch_model(param)`` run on a batch of the Net's data shape, every top's shape compared
    with the Net's blob of that name (a loss is () in PyTorch, (1,) or () in the engine, both
    one value). Returns ``(tops compared, mismatches as 'layer top: engine ... torch ...')``."""
    import torch
    import caffe_engine as caffe
    if net is None:
        net = caffe.Net(param, caffe.TRAIN)
    model = torch_model(param)
    model.record = []
    data_layer = next(layer for layer in model.ops if layer.type in _INPUT_TYPES)
    shape = tuple(net.blobs[data_layer.top[0]].shape)
    classes = 2
    with torch.no_grad():
        model(torch.rand(shape), torch.randint(0, classes, shape[:1]))
    bad = []
    for name, top, theirs in model.record:
        ours = tuple(net.blobs[top].shape)
        if ours != theirs and not (numpy.prod(ours) == 1 and theirs == ()):
            bad.append(f"{name} {top}: engine {ours} torch {theirs}")
    return len(model.record), bad


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
    out = {"times": times, "batch": batch, "threads": torch.get_num_threads()}
    if device == "gpu":
        out["gpu_mb"] = torch.cuda.max_memory_allocated() / 2 ** 20
        out["gpu_reserved_mb"] = torch.cuda.max_memory_reserved() / 2 ** 20
    return out


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def worker_shapes(net_name, batch=2):
    """``check_shapes`` of ``net``'s benchmarked TRAIN net at ``batch`` images (a small LMDB)."""
    import logging
    from caffe_engine.log import logger
    logger.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        param = train_net_param(net_name, folder, batch=batch, records=batch)
        compared, mismatches = check_shapes(param)
    return {"compared": compared, "mismatches": mismatches, "batch": batch}


def run_worker(kind, net, args):
    """Run the worker ``kind`` (peak, engine, torch, shapes) for ``net`` in a subprocess of
    ``child_env``; its JSON result, or None when it failed (its stderr's end is printed)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--nets", net,
           "--iters", str(args.iters), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--device", args.device]
    if kind == "engine":
        cmd += [f"--set={s}" for s in args.set]
        if args.kernels:
            cmd += ["--kernels", args.kernels]
        if args.prefetch is not None:
            cmd += ["--prefetch", str(args.prefetch)]
    env = child_env(args.threads)
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
    parser.add_argument("--nets", help=f"comma-separated, of: {', '.join(NETS)}, or zoo (= "
                        f"{','.join(ZOO)}) (default: {','.join(DEFAULT_NETS)}; with --device "
                        f"gpu: {','.join(DEFAULT_GPU_NETS)})")
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
    parser.add_argument("--time-iters", type=int, metavar="N",
                        help="iterations of the engine's own caffe time per net (default: "
                             "--iters; 0: not run)")
    parser.add_argument("--check-shapes", action="store_true",
                        help="only compare every top's shape of each PyTorch model with the "
                             "engine Net's (batch 2), time nothing")
    parser.add_argument("--write-nets", metavar="DIR",
                        help="write the nets' TRAIN prototxts and LMDBs under DIR, time nothing")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    gpu = args.device == "gpu"
    if args.nets is None:
        args.nets = ",".join(DEFAULT_GPU_NETS if gpu else DEFAULT_NETS)
    nets = []
    for name in args.nets.split(","):
        for net in (ZOO if name == "zoo" else [name] if name else []):
            if net not in nets:
                nets.append(net)
    unknown = [n for n in nets if n not in NETS]
    if unknown:
        parser.error(f"unknown net(s): {', '.join(unknown)} (known: {', '.join(NETS)}, or zoo)")

    if args.write_nets:
        return write_nets(nets, args.write_nets)
    if args.worker:
        net = nets[0]
        if args.worker == "peak":
            out = {"gflops": gemm_peak_gpu() if gpu else gemm_peak(args.threads)}
            out.update(blas_info())
        elif args.worker == "shapes":
            out = worker_shapes(net)
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
    if args.check_shapes:
        return check_shapes_main(nets, args)
    if args.time_iters is None:
        args.time_iters = args.iters

    # Looked up, not imported: the workers are this process's children, and a child's
    # getrusage high-water mark starts at its parent's.
    have_torch = False
    if not args.no_torch:
        have_torch = importlib.util.find_spec("torch") is not None
        if not have_torch:
            print("PyTorch not installed: engine only (pip install -e '.[bench]')")
    peak_run = run_worker("peak", nets[0], args)
    peak = peak_run["gflops"] if peak_run else None
    if peak_run and "blas" in peak_run:
        print(blas_text(peak_run))
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
        peak_txt = (f"{peak:.0f} GFLOP/s" if peak else "not measured (its worker failed)")
        print(f"float32 GEMM peak (2048^3, {args.threads} threads, NumPy in a worker): {peak_txt}; "
              f"{args.warmup} warm-up + {args.iters} timed iterations per run, "
              f"{args.repeats} run(s) each; medians"
              + "".join(f"; {s}" for s in args.set)
              + (f"; {args.kernels} kernels" if args.kernels else "")
              + ("; Caffe measured by " + args.caffe_bin if args.caffe_bin else "")
              + (f"; prefetch {args.prefetch}" if args.prefetch is not None else ""))
        if args.time_iters:
            print(f"F+B ms: the engine's own 'caffe time --iterations {args.time_iters}' Average "
                  f"Forward-Backward of the same TRAIN net (no data loading, no update), as "
                  f"Caffe's is")
        header = (f"{'net':<17}{'batch':>6}{'it/s':>9}{'ms/it':>9}{'img/s':>8}{'GFLOP/s':>9}"
                  f"{'%peak':>7}{'RSS MB':>8}{'torch it/s':>11}{'torch ms':>10}{'torch RSS':>10}"
                  f"{'eng/torch':>10}{'F+B ms':>9}{'Caffe ms':>10}{'x Caffe':>9}")
    print(header)
    print("-" * len(header))
    results = {}
    for net in nets:
        eng_runs, tor_runs = [], []
        time_torch = have_torch
        if have_torch:
            shapes = run_worker("shapes", net, args) or {}
            if shapes.get("mismatches"):
                print(f"bench_train: {net}: the PyTorch model's shapes differ from the engine "
                      f"Net's, PyTorch not timed: " + "; ".join(shapes["mismatches"][:5]),
                      file=sys.stderr)
                time_torch = False
        for _ in range(args.repeats):
            eng = run_worker("engine", net, args)
            if eng is not None:
                eng_runs.append(eng)
            if time_torch:
                tor = run_worker("torch", net, args)
                if tor is not None:
                    tor_runs.append(tor)
        if not eng_runs:
            print(f"{net:<17} engine run failed", flush=True)
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
        if peak_run and "blas" in peak_run:
            results[net]["blas"] = {key: peak_run[key] for key in
                                    ("blas", "kernels", "kernel_threads", "overrides")}
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
        share = f"{100 * gflops / peak:>6.0f}%" if peak else f"{'-':>7}"
        row = (f"{net:<17}{eng['batch']:>6}{its:>9.2f}{sec * 1e3:>9.1f}{its * eng['batch']:>8.0f}"
               f"{gflops:>9.1f}{share}{rss:>8.0f}")
        if tor_runs:
            t_sec, t_lo, t_hi = summarize(tor_runs)
            t_rss = max(r["peak_rss_mb"] for r in tor_runs)
            row += f"{1 / t_sec:>11.2f}{t_sec * 1e3:>10.1f}{t_rss:>10.0f}{t_sec / sec:>10.2f}"
            results[net].update(torch_runs=tor_runs, torch_its=1 / t_sec, torch_ms=t_sec * 1e3,
                                torch_ms_range=[t_lo * 1e3, t_hi * 1e3], torch_rss_mb=t_rss)
        else:
            row += f"{'-':>11}{'-':>10}{'-':>10}{'-':>10}"
        fb_ms = None
        if args.time_iters:
            fb_ms = caffe_time_ms(ENGINE_CAFFE, net, args.time_iters, args.threads)
            results[net]["engine_caffe_time_ms"] = fb_ms
        row += f"{fb_ms:>9.1f}" if fb_ms else f"{'-':>9}"
        caffe_ms = CAFFE_MS.get(net)
        if args.caffe_bin:
            caffe_ms = caffe_time_ms(args.caffe_bin, net, args.iters, args.threads)
        if caffe_ms:
            row += f"{caffe_ms:>10.0f}{caffe_ms / (sec * 1e3):>9.2f}"
            results[net]["caffe_ms"] = caffe_ms
            results[net]["caffe_measured"] = bool(args.caffe_bin)
        else:
            row += f"{'-':>10}{'-':>9}"
        print(row, flush=True)
        write_json(args.json, results)
    write_json(args.json, results)
    return 0


def check_shapes_main(nets, args):
    """``--check-shapes``: each net's ``worker_shapes`` (batch 2) in a subprocess; one line per
    net; status 1 when a PyTorch model's shapes differ from its engine Net's or a check failed."""
    status = 0
    for net in nets:
        out = run_worker("shapes", net, args)
        if out is None:
            print(f"{net}: shape check failed")
            status = 1
        elif out["mismatches"]:
            print(f"{net}: {len(out['mismatches'])} of {out['compared']} tops differ: "
                  + "; ".join(out["mismatches"]))
            status = 1
        else:
            print(f"{net}: the {out['compared']} tops of the PyTorch model have the engine "
                  f"Net's shapes (batch {out['batch']})")
    return status


def write_json(path, results):
    """``--json``: the results so far (rewritten after every net, so that a run stopped
    part-way still leaves the nets it finished)."""
    if path:
        with open(path + ".tmp", "w") as f:
            json.dump(results, f, indent=1)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
