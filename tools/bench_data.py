#!/usr/bin/env python3
"""Input-pipeline benchmark: the engine's data layers beside PyTorch's DataLoader on the same
JPEGs, and the share of a ResNet-50 training iteration spent waiting for data.

Data set: ``--images`` 256x256 colour JPEGs (smooth random colour fields, a gradient, a few
shapes, mild noise: ImageNet-sized files, the mean size is printed), made by a seeded script and
stored twice under ``--workdir``: as files with an image list (``images/NNNNN.jpg label``) and
as an encoded LMDB holding the files' own bytes (``caffe_pb2.Datum(data=<jpeg>, label,
encoded=True)`` under keys ``%08d_<name>``, as ``convert_imageset --encoded`` writes). Labels
are ``index % 1000``. A workdir that already holds a set of the same size is reused (the
default, ``$TMPDIR/caffe_engine_bench_data``, is kept for the next invocation).

0. Decoders: OpenCV (what Caffe calls, and the engine) against Pillow (what a torchvision user
   calls) on the first 200 files of the set and on PNG copies of them: the median ms per image
   of each, single-threaded, and whether their colour pixels are equal.
1. Loaders alone: TRAIN phase, batch 64, random 224 crop, random mirror, mean 104/117/123, for
   each core count of ``--cores`` (``all``: the cores this process may run on):

   * the engine's ``Data`` layer on the LMDB and ``ImageData`` layer on the list, with
     ``CAFFE_ENGINE_DATA_THREADS=k`` data threads, forwarded in a loop (a net of the one layer);
   * PyTorch's ``DataLoader`` with ``num_workers=k`` on the same files and on the same LMDB
     (``pin_memory=False``, ``persistent_workers=True``, both in list order), over a Dataset as
     a torchvision user writes it: ``PIL.Image.open(...).convert('RGB')``, a random 224 crop, a
     random horizontal flip, a float CHW tensor, minus the mean.

   Every (loader, k) run is its own subprocess whose CPU affinity is ``k`` cores
   (``os.sched_setaffinity``); it takes 3 warm-up batches, then times ``--batches`` batches.
   ``--repeats`` rounds run every configuration once each, engine and PyTorch alternating.
2. ResNet-50 training (``--resnet-iters`` iterations, batch 32, skipped by ``--skip-resnet``):
   KaimingHe's deploy prototxt (``../shared/realworld``) with a ``Data`` layer on the LMDB
   (same transform) in place of its input, batch statistics in BatchNorm, MSRA-filled weights,
   ``SoftmaxWithLoss`` on ``fc1000``; SGD (base_lr 0.01, momentum 0.9), all cores. For each
   iteration: the Data layer's ``wait_seconds`` increase over the iteration's wall time.

This machine's environment sets ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` (for old OpenBLAS
builds), which halve NumPy's GEMM on its AVX-512 CPU; users have neither, so the benchmark's own
subprocesses run without them (``../shared/notes/blas_kernels.md``). The ResNet-50 subprocess
prints the BLAS library, kernel and threads it runs with.

    python tools/bench_data.py [--images 2000] [--workdir DIR] [--cores 1,2,all] [--batches 20]
                               [--repeats 3] [--json out.json] [--no-torch]
                               [--skip-resnet] [--resnet-iters 4]

Reading the table: one row per core count and loader; ``img/s`` is the median over the
repeats of each run's images per second (the timed batches' images over their wall time),
``[min-max]`` the spread of the runs; ``eng/torch`` is engine over PyTorch on the same storage
(> 1: the engine is faster). The scaling line gives each loader's k-core / 1-core throughput
(2.0 is perfect on 2 cores). The targets: the engine at least as fast as PyTorch at every
core count, the engine on 2 cores at least 1.8x its own 1-core figure, and ResNet-50 waiting
for data at most 5 % of an iteration (median over the iterations after the first; iteration
0, whose first batch is loaded while the net is set up, is shown apart). On a shared machine
compare the ratios, taken in one invocation, rather than absolute figures. Each run's figure
is also printed to stderr as it comes; ``--json`` gets every run, the medians and the targets.
"""
import argparse
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy

import bench_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESNET50 = os.path.join(ROOT, "../shared/realworld/KaimingHe__deep-residual-networks/prototxt/"
                              "ResNet-50-deploy.prototxt")
SIZE, CROP, BATCH, RESNET_BATCH, CLASSES = 256, 224, 64, 32, 1000
MEAN_BGR = (104.0, 117.0, 123.0)    # Caffe's order (OpenCV decodes BGR); PIL's RGB reverses it
WARMUP = 3
#: Set on this machine for old OpenBLAS builds; users have neither (see the module doc).
BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
#: Loaders: (framework, storage) -> the row's name.
LOADERS = {("engine", "lmdb"): "engine Data (LMDB)", ("engine", "list"): "engine ImageData",
           ("torch", "lmdb"): "DataLoader (LMDB)", ("torch", "list"): "DataLoader (files)"}
STORAGE = {"lmdb": "encoded LMDB", "list": "JPEG files + list"}


# --------------------------------------------------------------------------------------------
# The data set
# --------------------------------------------------------------------------------------------
def synthetic_jpeg(rng):
    """One natural-looking 256x256 colour image as JPEG bytes (OpenCV's default quality)."""
    import cv2
    grid = rng.randint(3, 9)
    colours = rng.randint(0, 256, (grid, grid, 3)).astype(numpy.uint8)
    field = cv2.resize(colours, (SIZE, SIZE), interpolation=cv2.INTER_CUBIC).astype(numpy.float32)
    y, x = numpy.mgrid[0:SIZE, 0:SIZE].astype(numpy.float32) / SIZE
    angle = rng.uniform(0, 2 * numpy.pi)
    field += (numpy.cos(angle) * x + numpy.sin(angle) * y)[..., None] * rng.uniform(-80, 80, 3)
    image = numpy.clip(field, 0, 255).astype(numpy.uint8)
    for _ in range(rng.randint(3, 9)):
        colour = tuple(int(c) for c in rng.randint(0, 256, 3))
        cx, cy = (int(v) for v in rng.randint(0, SIZE, 2))
        shape = rng.randint(3)
        if shape == 0:
            cv2.circle(image, (cx, cy), int(rng.randint(8, 70)), colour, -1, cv2.LINE_AA)
        elif shape == 1:
            w, h = (int(v) for v in rng.randint(10, 100, 2))
            cv2.rectangle(image, (cx, cy), (cx + w, cy + h), colour, -1)
        else:
            axes = (int(rng.randint(10, 80)), int(rng.randint(5, 40)))
            cv2.ellipse(image, (cx, cy), axes, float(rng.uniform(0, 180)), 0, 360, colour, -1,
                        cv2.LINE_AA)
    image = cv2.GaussianBlur(image, (0, 0), 1.0)
    image = numpy.clip(image + rng.normal(0, 6, image.shape), 0, 255).astype(numpy.uint8)
    return cv2.imencode(".jpg", image)[1].tobytes()


def make_dataset(workdir, images):
    """The JPEG files, their list and the encoded LMDB under ``workdir`` (made once, seeded;
    reused when ``workdir/dataset.json`` says it holds ``images`` of them). Returns that
    description: images, mean_bytes, list, root, lmdb."""
    from caffe_engine.io.lmdb_source import write_lmdb
    from caffe_engine.proto import caffe_pb2
    info_path = os.path.join(workdir, "dataset.json")
    if os.path.exists(info_path):
        with open(info_path) as f:
            info = json.load(f)
        if info["images"] == images:
            return info
        raise SystemExit(f"bench_data: {workdir} holds a set of {info['images']} images, not "
                         f"{images}; choose another --workdir")
    os.makedirs(os.path.join(workdir, "images"), exist_ok=True)
    rng = numpy.random.RandomState(0)
    lines, items, sizes = [], [], []
    for i in range(images):
        data, name, label = synthetic_jpeg(rng), f"{i:05d}.jpg", i % CLASSES
        with open(os.path.join(workdir, "images", name), "wb") as f:
            f.write(data)
        lines.append(f"images/{name} {label}\n")
        datum = caffe_pb2.Datum(data=data, label=label, encoded=True)
        items.append((b"%08d_%s" % (i, name.encode()), datum.SerializeToString()))
        sizes.append(len(data))
    with open(os.path.join(workdir, "train.txt"), "w") as f:
        f.writelines(lines)
    write_lmdb(os.path.join(workdir, "lmdb"), items)
    info = {"images": images, "mean_bytes": statistics.mean(sizes),
            "list": os.path.join(workdir, "train.txt"), "root": workdir + "/",
            "lmdb": os.path.join(workdir, "lmdb")}
    with open(info_path, "w") as f:
        json.dump(info, f)
    return info


def data_layer(info, storage, batch):
    """The engine's TRAIN data layer (LayerParameter) on the set: ``Data`` on the LMDB or
    ``ImageData`` on the list, tops data and label, crop, mirror, mean."""
    from caffe_engine.proto import caffe_pb2
    layer = caffe_pb2.LayerParameter(name="data", top=["data", "label"])
    layer.transform_param.crop_size = CROP
    layer.transform_param.mirror = True
    layer.transform_param.mean_value.extend(MEAN_BGR)
    if storage == "lmdb":
        layer.type = "Data"
        layer.data_param.source = info["lmdb"]
        layer.data_param.backend = caffe_pb2.DataParameter.LMDB
        layer.data_param.batch_size = batch
    else:
        layer.type = "ImageData"
        layer.image_data_param.source = info["list"]
        layer.image_data_param.root_folder = info["root"]
        layer.image_data_param.batch_size = batch
    return layer


# --------------------------------------------------------------------------------------------
# PyTorch's side: Datasets as a torchvision user writes them (plain classes, so that this
# module imports without torch; DataLoader needs only __len__ and __getitem__)
# --------------------------------------------------------------------------------------------
def torch_augment(image):
    """torchvision's RandomCrop(224), RandomHorizontalFlip(), PILToTensor().float() and the
    mean's subtraction, on a PIL RGB image."""
    import torch
    from PIL import Image
    x = int(torch.randint(image.width - CROP + 1, ()))
    y = int(torch.randint(image.height - CROP + 1, ()))
    image = image.crop((x, y, x + CROP, y + CROP))
    if torch.rand(()) < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    tensor = torch.from_numpy(numpy.array(image)).permute(2, 0, 1).contiguous().float()
    return tensor.sub_(torch.tensor(MEAN_BGR[::-1]).view(3, 1, 1))


class TorchFiles:
    """The image list's files, read with PIL."""

    def __init__(self, info):
        with open(info["list"]) as f:
            pairs = [line.rsplit(" ", 1) for line in f.read().splitlines()]
        self.items = [(info["root"] + path, int(label)) for path, label in pairs]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        from PIL import Image
        path, label = self.items[i]
        return torch_augment(Image.open(path).convert("RGB")), label


class TorchLmdb:
    """The encoded LMDB's Datums, their JPEG bytes decoded with PIL (the environment is opened
    in each worker, as LMDB requires after a fork)."""

    def __init__(self, info):
        import lmdb
        self.path, self.env = info["lmdb"], None
        with lmdb.open(self.path, readonly=True, lock=False) as env, env.begin() as txn:
            self.keys = [key for key, _ in txn.cursor()]

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, i):
        import lmdb
        from PIL import Image
        from caffe_engine.proto import caffe_pb2
        if self.env is None:
            self.env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self.env.begin() as txn:
            datum = caffe_pb2.Datum.FromString(txn.get(self.keys[i]))
        return torch_augment(Image.open(io.BytesIO(datum.data)).convert("RGB")), datum.label


# --------------------------------------------------------------------------------------------
# Workers (one subprocess each, its affinity set by the driver)
# --------------------------------------------------------------------------------------------
def timed(next_batch, batches):
    """Seconds ``batches`` calls of ``next_batch`` take after ``WARMUP`` untimed ones."""
    for _ in range(WARMUP):
        next_batch()
    started = time.perf_counter()
    for _ in range(batches):
        next_batch()
    return time.perf_counter() - started


def worker_engine(info, storage, batches):
    """The engine's data layer on ``storage`` ("lmdb": Data, "list": ImageData), forwarded."""
    import logging
    from caffe_engine import TRAIN, Net
    from caffe_engine.io import workers
    from caffe_engine.log import logger
    from caffe_engine.proto import caffe_pb2
    logger.setLevel(logging.WARNING)
    param = caffe_pb2.NetParameter(name="bench_data")
    param.layer.add().CopyFrom(data_layer(info, storage, BATCH))
    net = Net(param, TRAIN)
    seconds = timed(net.forward, batches)
    return {"seconds": seconds, "images_per_s": batches * BATCH / seconds,
            "threads": workers.shared().threads}


def worker_torch(info, storage, batches, k):
    """PyTorch's DataLoader with ``k`` workers on ``storage``, iterated over epochs."""
    import torch
    dataset = TorchLmdb(info) if storage == "lmdb" else TorchFiles(info)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=k,
                                         pin_memory=False, persistent_workers=True,
                                         drop_last=True)

    def epochs():
        while True:
            yield from loader
    batch_stream = epochs()
    seconds = timed(lambda: next(batch_stream), batches)
    return {"seconds": seconds, "images_per_s": batches * BATCH / seconds, "threads": k,
            "torch": torch.__version__}


def resnet_param(info):
    """ResNet-50's TRAIN NetParameter: the deploy file made a TRAIN net by bench_train's
    ``deploy_to_train`` (BatchNorm on batch statistics, MSRA fillers, SoftmaxWithLoss), with this
    benchmark's Data layer on the LMDB."""
    from bench_train import deploy_to_train
    from caffe_engine.io import prototxt as pio
    param = deploy_to_train(pio.read_net_param(RESNET50), info["lmdb"], RESNET_BATCH, CLASSES)
    param.layer[0].CopyFrom(data_layer(info, "lmdb", RESNET_BATCH))
    return param


def worker_resnet(info, iters):
    """ResNet-50 trained ``iters`` iterations: each one's wall time and data wait, the BLAS
    libraries and thread counts in use."""
    import logging
    from threadpoolctl import threadpool_info
    from caffe_engine import kernels
    from caffe_engine.io import workers
    from caffe_engine.log import logger
    from caffe_engine.proto import caffe_pb2
    from caffe_engine.solvers import get_solver
    logger.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        solver_param = caffe_pb2.SolverParameter(
            base_lr=0.01, momentum=0.9, lr_policy="fixed", max_iter=iters, display=0,
            snapshot=0, snapshot_after_train=False, random_seed=1,
            snapshot_prefix=os.path.join(folder, "resnet50"))
        solver_param.train_net_param.CopyFrom(resnet_param(info))
        solver = get_solver(solver_param)
        data = solver.net.layers[solver.net.layer_names.index("data")]
        times, waits = [], []
        for i in range(iters):
            waited, started = data.wait_seconds, time.perf_counter()
            solver.step(1)
            times.append(time.perf_counter() - started)
            waits.append(data.wait_seconds - waited)
            print(f"bench_data: ResNet-50 iteration {i}: {times[-1]:.2f} s, waited "
                  f"{waits[-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    blas = [{key: lib.get(key) for key in ("internal_api", "version", "architecture",
                                           "num_threads", "filepath")}
            for lib in threadpool_info() if lib["user_api"] == "blas"]
    kernel_set = kernels.for_array(numpy.empty(0, numpy.float32))
    tuning = getattr(kernel_set, "tuning", None)        # the reference set has none
    return {"times": times, "waits": waits, "blas": blas, "batch": RESNET_BATCH,
            "kernels": kernel_set.name, "kernel_threads": tuning.threads if tuning else 1,
            "data_threads": workers.shared().threads, "peak_rss_mb": bench_train.peak_rss_mb()}


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------
def child_env(k=None):
    """The environment of the benchmark's subprocesses: without the BLAS overrides and, for a
    k-core run, with every thread count (data threads, BLAS, OpenMP) set to k."""
    env = {name: value for name, value in os.environ.items() if name not in BLAS_OVERRIDES}
    if k is not None:
        env.update({name: str(k) for name in ("CAFFE_ENGINE_DATA_THREADS", "OMP_NUM_THREADS",
                                              "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def run_worker(worker, args, k=None):
    """Run ``worker`` ("engine:lmdb", "torch:list", ..., "resnet") in a subprocess, on the
    first ``k`` cores this process may use (all with None); its JSON result or None."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--workdir",
           args.workdir, "--images", str(args.images), "--batches", str(args.batches),
           "--resnet-iters", str(args.resnet_iters), "--cores", str(k or "all")]
    cores = sorted(os.sched_getaffinity(0))[:k] if k else None
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=child_env(k),
                       preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    if r.returncode != 0:
        print(f"bench_data: worker {worker} ({k or 'all'} cores) failed with status "
              f"{r.returncode}", file=sys.stderr)
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def core_counts(text):
    """``--cores``: distinct counts in the order given, ``all`` being this process's cores."""
    available = len(os.sched_getaffinity(0))
    counts = []
    for item in text.split(","):
        k = available if item.strip() == "all" else int(item)
        if not 1 <= k <= available:
            raise SystemExit(f"bench_data: --cores {item}: this process may use {available} "
                             f"cores")
        if k not in counts:
            counts.append(k)
    return counts


def spread(runs):
    """(median, min, max) images/s of a configuration's runs, or None without runs."""
    rates = [r["images_per_s"] for r in runs]
    return (statistics.median(rates), min(rates), max(rates)) if rates else None


def rate_text(stats, missing="-"):
    """``median [min-max]`` images/s in a 21-character column, or ``missing``."""
    if stats is None:
        return f"{missing:>21}"
    return f"{stats[0]:>7.0f} [{stats[1]:.0f}-{stats[2]:.0f}]".ljust(21)


def check(targets, passed, text):
    """Record and print one target's outcome."""
    targets.append({"target": text, "passed": passed})
    print(f"  {'PASS' if passed else 'FAIL'}  {text}")


def bench_decoders(info, results, count=200):
    """Part 0: OpenCV against Pillow on ``count`` of the set's JPEGs and on PNG copies of
    them; prints the table (median ms per image over 5 passes, equal pixels or not)."""
    import cv2
    from PIL import Image
    with open(info["list"]) as f:
        paths = [info["root"] + line.rsplit(" ", 1)[0] for line in f.read().splitlines()[:count]]
    jpegs = []
    for path in paths:
        with open(path, "rb") as f:
            jpegs.append(f.read())
    pngs = [cv2.imencode(".png", cv2.imdecode(numpy.frombuffer(j, numpy.uint8), 1))[1].tobytes()
            for j in jpegs]

    def opencv(data):
        return cv2.imdecode(numpy.frombuffer(data, numpy.uint8), cv2.IMREAD_COLOR)

    def pillow(data):
        with Image.open(io.BytesIO(data)) as img:
            return numpy.asarray(img.convert("RGB"))[:, :, ::-1]

    print(f"\nDecoders: {count} images {SIZE}x{SIZE}, colour, one thread; ms per image, median "
          f"of 5 passes (OpenCV {cv2.__version__}, Pillow {Image.__version__})")
    header = f"{'format':<8}{'OpenCV ms':>11}{'Pillow ms':>11}{'same pixels':>13}"
    print(header)
    print("-" * len(header))
    rows = []
    for name, files in (("JPEG", jpegs), ("PNG", pngs)):
        times = {}
        for decoder in (opencv, pillow):
            passes = []
            for _ in range(5):
                started = time.perf_counter()
                for data in files:
                    decoder(data)
                passes.append((time.perf_counter() - started) / len(files) * 1e3)
            times[decoder.__name__] = statistics.median(passes)
        same = all(numpy.array_equal(opencv(d), pillow(d)) for d in files)
        rows.append({"format": name, "ms": times, "same_pixels": same})
        print(f"{name:<8}{times['opencv']:>11.3f}{times['pillow']:>11.3f}{str(same):>13}")
    results["decoders"] = rows


def bench_loaders(args, torch_missing, results):
    """Part 1: every loader at every core count, ``--repeats`` rounds; prints the table and
    the targets. ``torch_missing``: why PyTorch does not run, or None."""
    counts = core_counts(args.cores)
    available = len(os.sched_getaffinity(0))
    frameworks = ["engine"] + (["torch"] if torch_missing is None else [])
    runs = {(k, f, s): [] for k in counts for f in frameworks for s in STORAGE}
    for repeat in range(args.repeats):
        for k in counts:
            for storage in STORAGE:
                for framework in frameworks:
                    out = run_worker(f"{framework}:{storage}", args, k)
                    if out is not None:
                        runs[k, framework, storage].append(out)
                        print(f"bench_data: round {repeat + 1}/{args.repeats}, {k} core(s), "
                              f"{LOADERS[framework, storage]}: {out['images_per_s']:.0f} img/s",
                              file=sys.stderr, flush=True)
    stats = {key: spread(value) for key, value in runs.items()}
    versions = {r["torch"] for key, value in runs.items() for r in value if key[1] == "torch"}
    torch_text = torch_missing or ", ".join(sorted(versions)) or "failed"
    print(f"\nLoaders alone: batch {BATCH}, random {CROP} crop, mirror, mean "
          f"{'/'.join(f'{m:.0f}' for m in MEAN_BGR)}, TRAIN; {WARMUP} warm-up + {args.batches} "
          f"timed batches per run, {args.repeats} run(s) each; img/s median [min-max]")
    print(f"engine: Data layer on the LMDB, ImageData layer on the list, k data threads; "
          f"PyTorch {torch_text}: DataLoader, num_workers=k, PIL decoding")
    header = f"{'cores':<9}{'storage':<20}{'engine img/s':<21}{'PyTorch img/s':<21}{'eng/torch':>9}"
    print(header)
    print("-" * len(header))
    for k in counts:
        label = f"{k} (all)" if k == available else str(k)
        for storage, name in STORAGE.items():
            engine, torch = stats[k, "engine", storage], stats.get((k, "torch", storage))
            ratio = f"{engine[0] / torch[0]:>9.2f}" if engine and torch else f"{'-':>9}"
            print(f"{label:<9}{name:<20}{rate_text(engine)}"
                  f"{rate_text(torch, torch_missing or '-')}{ratio}")
    for k in counts:
        if k > 1 and 1 in counts:
            print(f"scaling, {k} cores / 1 core: " + ", ".join(
                f"{LOADERS[f, s]} {stats[k, f, s][0] / stats[1, f, s][0]:.2f}x"
                for f in frameworks for s in STORAGE if stats[k, f, s] and stats[1, f, s]))
    print("targets:")
    targets = results["targets"]
    for k in counts:
        for storage in STORAGE:
            engine, torch = stats[k, "engine", storage], stats.get((k, "torch", storage))
            if engine and torch:
                check(targets, engine[0] >= torch[0],
                      f"{LOADERS['engine', storage]} >= {LOADERS['torch', storage]} on {k} "
                      f"core(s): {engine[0] / torch[0]:.2f}x")
    for storage in STORAGE:
        one, two = stats.get((1, "engine", storage)), stats.get((2, "engine", storage))
        if one and two:
            check(targets, two[0] >= 1.8 * one[0],
                  f"{LOADERS['engine', storage]} on 2 cores >= 1.8x its 1-core figure: "
                  f"{two[0] / one[0]:.2f}x")
    results["torch"] = torch_text
    results["loaders"] = [
        {"cores": k, "framework": f, "storage": s, "runs": value,
         "images_per_s": stats[k, f, s] and stats[k, f, s][0],
         "range": stats[k, f, s] and list(stats[k, f, s][1:])}
        for (k, f, s), value in runs.items()]


def bench_resnet(args, results):
    """Part 2: ResNet-50 training on the LMDB; prints each iteration's data wait and the
    target."""
    out = run_worker("resnet", args)
    if out is None:
        print("\nResNet-50: the run failed")
        return
    times, waits = out["times"], out["waits"]
    shares = [100 * w / t for w, t in zip(waits, times)]
    print(f"\nResNet-50 training: batch {out['batch']}, Data layer on the encoded LMDB, "
          f"{out['data_threads']} data threads, {out['kernels']} kernel set with "
          f"{out['kernel_threads']} threads, {len(times)} iterations, peak RSS "
          f"{out['peak_rss_mb']:.0f} MiB")
    print("BLAS libraries in the ResNet-50 process (threadpoolctl):")
    for b in out["blas"]:
        print(f"  {b['internal_api']} {b['version']}, kernel {b['architecture']}, "
              f"{b['num_threads']} thread(s): {os.path.join(*b['filepath'].split(os.sep)[-2:])}")
    header = f"{'iteration':<11}{'s':>8}{'img/s':>8}{'waited ms':>11}{'wait %':>8}"
    print(header)
    print("-" * len(header))
    for i, (t, w, share) in enumerate(zip(times, waits, shares)):
        print(f"{i:<11}{t:>8.2f}{out['batch'] / t:>8.1f}{w * 1e3:>11.1f}{share:>8.3f}")
    results["resnet"] = dict(out, wait_percent=shares)
    print("targets:")
    if len(shares) > 1:
        later = shares[1:]
        check(results["targets"], statistics.median(later) <= 5,
              f"ResNet-50 waits for data <= 5 % of an iteration: median "
              f"{statistics.median(later):.3f} %, max {max(later):.3f} % over iterations "
              f"1-{len(shares) - 1} (iteration 0: {shares[0]:.3f} %)")
    else:
        print(f"  n/a   one iteration only (iteration 0: {shares[0]:.3f} %)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000, help="JPEGs in the data set")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                          "caffe_engine_bench_data"),
                        help="where the data set is made, or reused (default: %(default)s)")
    parser.add_argument("--cores", default="1,2,all",
                        help="core counts, comma-separated; all: this process's cores")
    parser.add_argument("--batches", type=int, default=20, help="timed batches per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--skip-resnet", action="store_true")
    parser.add_argument("--resnet-iters", type=int, default=4)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workdir = os.path.abspath(args.workdir)

    if args.worker:
        info = make_dataset(args.workdir, args.images)
        if args.worker == "resnet":
            out = worker_resnet(info, args.resnet_iters)
        else:
            framework, storage = args.worker.split(":")
            if framework == "engine":
                out = worker_engine(info, storage, args.batches)
            else:
                out = worker_torch(info, storage, args.batches, int(args.cores))
        print(json.dumps(out))
        return 0

    started = time.perf_counter()
    torch_missing = ("not run (--no-torch)" if args.no_torch else
                     None if importlib.util.find_spec("torch") else "not installed")
    info = make_dataset(args.workdir, args.images)
    overrides = ", ".join(f"{name}={os.environ[name]}" for name in BLAS_OVERRIDES
                          if name in os.environ) or "neither set here"
    print(f"Data set: {info['images']} JPEGs {SIZE}x{SIZE}, mean {info['mean_bytes'] / 1024:.1f} "
          f"KiB, as files + list and as an encoded LMDB, in {args.workdir}")
    print(f"Subprocesses run without {' and '.join(BLAS_OVERRIDES)} ({overrides})")
    results = {"dataset": info, "targets": []}
    bench_decoders(info, results)
    bench_loaders(args, torch_missing, results)
    bench_train.write_json(args.json, results)
    if not args.skip_resnet:
        bench_resnet(args, results)
    results["wall_seconds"] = time.perf_counter() - started
    bench_train.write_json(args.json, results)
    print(f"\nwall time {results['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
