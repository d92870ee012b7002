#!/usr/bin/env python
"""How fast a BLAS multiplies the matrices a net's convolutions are made of: the ceiling of
"percent of the GEMM peak over convolution FLOPs" for that net on this machine.

Each Convolution of the net's TRAIN graph at its batch is three products per image (Caffe's
im2col lowering: src/caffe/layers/base_conv_layer.cpp): the forward ``W (M x K) . col (K x P)``,
the data gradient ``W^T (K x M) . dY (M x P)``, the weight gradient ``dY (M x P) . col^T (P x
K)``, with ``K = C / group * kh * kw`` and ``P = OH * OW`` (per group). This script times those
products alone -- no im2col, no packing of the input, no bias -- with NumPy's BLAS (OpenBLAS's
SkylakeX kernels with ``OPENBLAS_CORETYPE``/``OPENBLAS_L2_SIZE`` unset, as for users) and with
the engine's own GEMM (``CpuKernels.matmul``), each product per image as Caffe runs it and as
one product over the whole batch (columns of all images side by side), keeps the fastest, and
sums over the layers: the FLOP-weighted rate is what a convolution built on GEMM could reach
at best, to put beside the measured 2048^3 peak and the engine's convolutions.

Beside it, the engine's own convolution layers of the same net: each layer's forward and backward
timed alone (median of 3), their FLOPs over their seconds, in percent of the same peak; with
``--layers`` each layer's GEMM rate, forward and backward milliseconds and rate (to set beside
``caffe time``'s per-layer figures of the same TRAIN net).

Usage: python tools/bench_gemm_shapes.py --nets resnet50,googlenet,vgg16 [--batch 32]
[--json docs/bench/gemm_shapes.json]. The measuring runs in a child process without the two
OpenBLAS variables; the BLAS kernel and thread count are printed.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train  # noqa: E402


def build(net_name, batch):
    """The net's TRAIN graph at ``batch``, after one forward and backward."""
    import logging
    import tempfile
    from caffe_engine.log import logger
    from caffe_engine.net import Net
    from caffe_engine.proto import caffe_pb2
    logger.setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as folder:
        param = bench_train.train_net_param(net_name, folder, batch=batch)
        net = Net(param, caffe_pb2.TRAIN)
        net.forward_backward()
    return net


def conv_shapes(net):
    """[(layer, M, K, P, groups, images)] of the net's convolutions."""
    shapes = []
    for name, layer, top in zip(net.layer_names, net.layers, net.top_vecs):
        if layer.type != "Convolution":
            continue
        w = layer.blobs[0].shape
        group = layer.param.convolution_param.group or 1
        out = top[0].shape
        P = 1
        for d in out[2:]:
            P *= d
        K = 1
        for d in w[1:]:
            K *= d
        shapes.append((name, w[0] // group, K, P, group, out[0]))
    return shapes


#: Largest batch-wide operands tried (floats of A, B and C together: 1 GB).
BATCH_FLOATS = 1 << 28


def _median_seconds(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def time_products(shapes, reps=3):
    """Per layer: (FLOPs, best seconds) of its three products over the batch."""
    import numpy
    from caffe_engine.kernels.cpu import CpuKernels
    from caffe_engine.kernels.cpu.tuning import CpuTuning
    engine = CpuKernels(CpuTuning.from_environment())
    rng = numpy.random.default_rng(0)
    rows = []
    for name, M, K, P, G, N in shapes:
        flops = 0
        best_total = 0.0
        # (rows, inner, cols) per image, and over the whole batch (images side by side as
        # columns, or for the weight gradient along the inner dimension): the forward, the
        # data gradient, the weight gradient
        for (m, k, n), (bm, bk, bn) in (((M, K, P), (M, K, P * N)), ((K, M, P), (K, M, P * N)),
                                        ((M, P, K), (M, P * N, K))):
            a = rng.standard_normal((m, k), dtype=numpy.float32)
            b = rng.standard_normal((k, n), dtype=numpy.float32)
            c = numpy.empty((m, n), numpy.float32)
            count = N * G

            def blas_images():
                for _ in range(count):
                    numpy.matmul(a, b, out=c)

            def engine_images():
                for _ in range(count):
                    engine.matmul(a, b, c)
            candidates = [blas_images, engine_images]
            if bm * bk + bk * bn + bm * bn <= BATCH_FLOATS:
                ba = rng.standard_normal((bm, bk), dtype=numpy.float32)
                bb = rng.standard_normal((bk, bn), dtype=numpy.float32)
                bc = numpy.empty((bm, bn), numpy.float32)

                def blas_batch():
                    for _ in range(G):
                        numpy.matmul(ba, bb, out=bc)
                candidates.append(blas_batch)
            best = min(_median_seconds(fn, reps) for fn in candidates)
            flops += 2.0 * m * k * n * count
            best_total += best
        rows.append((name, M, K, P, G, flops, best_total))
    return rows


def engine_layers(net, reps=3):
    """[(layer, FLOPs, forward s, backward s)]: the engine's convolution layers of ``net``, each
    layer's forward and backward timed alone (median of ``reps``), FLOPs as the products above
    count them (no data gradient where the layer does not propagate down, as for a net's first
    convolution)."""
    rows = []
    for i, layer in enumerate(net.layers):
        if layer.type != "Convolution":
            continue
        bottom, top = net.bottom_vecs[i], net.top_vecs[i]
        down = net.bottom_need_backward[i]
        product = 2.0 * top[0].count * layer.blobs[0].count // layer.blobs[0].shape[0]
        forward = _median_seconds(lambda: layer.forward(bottom, top), reps)
        backward = _median_seconds(lambda: layer.backward(top, down, bottom), reps)
        rows.append((net.layer_names[i], product * (3 if any(down) else 2), forward, backward))
    return rows


def engine_convolutions(net, reps=3):
    """(FLOPs, seconds): :func:`engine_layers` summed."""
    rows = engine_layers(net, reps)
    return sum(r[1] for r in rows), sum(r[2] + r[3] for r in rows)


def worker(args):
    from threadpoolctl import threadpool_info
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    peak = bench_train.gemm_peak(args.threads)
    out = {"blas": blas, "peak": peak, "nets": {}}
    for name in args.nets.split(","):
        net = build(name, args.batch)
        layers = engine_layers(net)
        out["nets"][name] = {"products": time_products(conv_shapes(net)),
                             "engine": (sum(r[1] for r in layers),
                                        sum(r[2] + r[3] for r in layers)),
                             "engine_layers": layers}
        del net
    json.dump(out, sys.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nets", default="resnet50,googlenet,vgg16")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--layers", action="store_true", help="print every layer")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--nets", args.nets,
               "--batch", str(args.batch), "--threads", str(args.threads)]
    r = subprocess.run(command, capture_output=True, text=True,
                       env=bench_train.child_env(args.threads))
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-3000:])
        return 1
    result = json.loads(r.stdout)
    for info in result["blas"]:
        print(f"BLAS: {info.get('internal_api')} {info.get('version')} kernel "
              f"{info.get('architecture')}, {info.get('num_threads')} threads")
    peak = result["peak"]
    print(f"float32 GEMM peak (2048^3, {args.threads} threads): {peak:.0f} GFLOP/s; batch "
          f"{args.batch}; best of BLAS per image, BLAS over the batch, engine per image")
    print(f"{'net':<12}{'conv GFLOP':>12}{'GEMM s':>9}{'GFLOP/s':>9}{'% peak':>8}"
          f"{'engine s':>10}{'GFLOP/s':>9}{'% peak':>8}{'/ GEMM':>8}")
    for net, found in result["nets"].items():
        rows = found["products"]
        flops = sum(r[5] for r in rows)
        seconds = sum(r[6] for r in rows)
        rate = flops / seconds / 1e9
        eflops, eseconds = found["engine"]
        erate = eflops / eseconds / 1e9
        print(f"{net:<12}{flops / 1e9:>12.1f}{seconds:>9.3f}{rate:>9.0f}{100 * rate / peak:>7.0f}%"
              f"{eseconds:>10.3f}{erate:>9.0f}{100 * erate / peak:>7.0f}%{erate / rate:>8.2f}")
        if args.layers:
            print(f"    {'layer':<22} {'':>7} {'':>7} {'':>8} {'':>6}  {'GEMM':>12}"
                  f"{'engine fwd ms':>15}{'bwd ms':>9}{'GFLOP/s':>9}")
            for (name, M, K, P, G, f, s), (_, ef, fs, bs) in zip(rows, found["engine_layers"]):
                print(f"    {name:<22} M {M:>5} K {K:>5} P {P:>6} G {G:>4}  "
                      f"{f / s / 1e9:>6.0f} GFLOP/s{1e3 * fs:>15.2f}{1e3 * bs:>9.2f}"
                      f"{ef / (fs + bs) / 1e9:>9.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
