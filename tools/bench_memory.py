#!/usr/bin/env python3
"""Time and peak memory of one forward+backward of a net, against the bytes its blobs need.

Builds the net (TRAIN phase by default) with every Input layer's batch set to ``--batch``,
fills the inputs with random values (labels in [0, --classes)), runs one warm-up and ``--iters``
timed forward+backward passes, and prints the median time, the process's peak RSS and the
bytes of all blobs' data and diffs plus params' data and diffs (what Caffe itself would hold),
with their ratio.

    python tools/bench_memory.py ../shared/realworld/reference/substituted/\
natanielruiz__net-archive__places205-googlenet__train_val_googlenet_places205.prototxt --batch 32
"""
import argparse
import os
import resource
import statistics
import sys
import time

import numpy

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="net prototxt whose data layers are Input layers")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--phase", default="TRAIN", choices=["TRAIN", "TEST"])
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args(argv)

    import logging
    import caffe_engine as caffe
    from caffe_engine.errors import CaffeError
    from caffe_engine.io import prototxt as pio
    from caffe_engine.log import logger
    logger.setLevel(logging.WARNING)
    try:
        param = pio.read_net_param(args.model)
    except CaffeError as exc:
        print(f"bench_memory: {exc}", file=sys.stderr)
        return 1
    for layer in param.layer:
        if layer.type == "Input":
            for shape in layer.input_param.shape:
                if shape.dim:
                    shape.dim[0] = args.batch
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    caffe.set_random_seed(1)
    net = caffe.Net(param, caffe.TRAIN if args.phase == "TRAIN" else caffe.TEST)
    rng = numpy.random.RandomState(0)
    for name in net.inputs:
        blob = net.blobs[name]
        if "label" in name:
            blob.data[...] = rng.randint(0, args.classes, blob.shape)
        else:
            blob.data[...] = rng.standard_normal(blob.shape)
    net.forward_backward()
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        net.forward_backward()
        times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    seen = set()
    nbytes = 0
    for blob in list(net.blobs.values()) + [b for blobs in net.params.values() for b in blobs]:
        for arr in (blob.data, blob.diff):
            if id(arr) not in seen:
                seen.add(id(arr))
                nbytes += arr.nbytes
    mb = nbytes / 2 ** 20
    print(f"net {net.name}: batch {args.batch}, {len(net.layers)} layers")
    print(f"forward+backward median {statistics.median(times):.3f} s over {args.iters}")
    print(f"peak RSS {peak:.0f} MiB (interpreter and libraries before the net: {rss_before:.0f} MiB)")
    print(f"blob data+diff and param data+diff: {mb:.0f} MiB; peak RSS / blob bytes = {peak / mb:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
