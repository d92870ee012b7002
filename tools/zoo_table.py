#!/usr/bin/env python3
"""Measure the real-world model zoo (../shared/realworld) and print docs/model_zoo.md's table.

For every net, phase and stage set Caffe built (reference/shapes), the net is built as
tests/test_model_zoo.py builds it (substituted data layers, constant fillers, then NumPy
random weights), fed random inputs
(deploy nets at batch <= 2, with force_backward and random output diffs), and one forward and
one backward pass are timed (after one untimed warm-up pass). Printed: a markdown table of
phase, output shapes, parameter count, build time, forward and backward time, and whether the
build matched Caffe's reference exactly; nets that cannot be built are listed with the reason.

Usage: python tools/zoo_table.py [--match SUBSTRING] [--no-warmup]
"""
import argparse
import gc
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "tests")):
    if path not in sys.path:
        sys.path.insert(0, path)

import numpy  # noqa: E402

import test_model_zoo as zoo  # noqa: E402
from caffe_engine import backend  # noqa: E402
from caffe_engine.errors import CaffeError  # noqa: E402
from caffe_engine.proto import caffe_pb2  # noqa: E402


def measure(case, warmup=True):
    ref = zoo.reference(case["shapes"])
    start = time.perf_counter()
    net = zoo.build(case, force_backward=case["deploy"])
    built = time.perf_counter() - start
    matched = not zoo.differences(zoo.describe(net), ref)
    rs = numpy.random.RandomState(0)
    zoo.randomize_weights(net, rs)
    zoo.fill_inputs(net, ref, rs)
    times = []
    for _ in range(2 if warmup else 1):
        t0 = time.perf_counter()
        net.forward_loss()
        t1 = time.perf_counter()
        if case["deploy"]:
            for name in net.outputs:
                blob = net.blobs[name]
                blob.diff[...] = backend.get_array_module(blob.data).asarray(
                    rs.standard_normal(blob.shape).astype(numpy.float32))
        net.backward_from_to()
        t2 = time.perf_counter()
        times.append((t1 - t0, t2 - t1))
    fwd, bwd = times[-1]
    outputs = ", ".join(f"{n} {'x'.join(str(d) for d in net.blobs[n].shape) or 'scalar'}"
                        for n in net.outputs)
    params = sum(b.count for layer in net.layers for b in layer.blobs)
    batch = net.blobs[net.inputs[0]].shape[0] if net.inputs else "-"
    return {"built": built, "forward": fwd, "backward": bwd, "matched": matched,
            "outputs": outputs or "(none)", "params": params, "batch": batch}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--match", default="", help="only cases whose id contains this")
    parser.add_argument("--no-warmup", action="store_true", help="time the first pass")
    args = parser.parse_args(argv)
    print("| net | phase | batch | outputs | params | build s | forward s | backward s | "
          "matches Caffe |")
    print("|---|---|---:|---|---:|---:|---:|---:|---|")
    failures = []
    for case in zoo.zoo_cases():
        if args.match not in case["id"]:
            continue
        phase = "TRAIN" if case["phase"] == caffe_pb2.TRAIN else "TEST"
        if case["stages"]:
            phase += " " + "+".join(case["stages"])
        missing = zoo.missing_types(case)
        if missing:
            failures.append((case["file"], phase,
                             f"layer types not implemented: {', '.join(missing)}"))
            continue
        try:
            m = measure(case, warmup=not args.no_warmup)
        except (CaffeError, Exception) as exc:  # report, keep measuring the others
            failures.append((case["file"], phase, f"{type(exc).__name__}: {exc}"))
            continue
        finally:
            gc.collect()
        print(f"| `{case['file']}` | {phase} | {m['batch']} | {m['outputs']} | {m['params']:,} | "
              f"{m['built']:.2f} | {m['forward']:.2f} | {m['backward']:.2f} | "
              f"{'yes' if m['matched'] else 'NO'} |", flush=True)
    if failures:
        print("\nNot measured:\n")
        for file, phase, why in failures:
            print(f"- `{file}` {phase}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
