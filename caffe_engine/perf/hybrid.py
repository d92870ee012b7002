"""PCL-DNN's balance equations over a whole net: each InnerProduct layer data parallel or hybrid.

:mod:`caffe_engine.comm.hybrid_cost` times one InnerProduct layer at group size G (PCL-DNN,
arXiv:1602.06709, section 3); this module reads a net's layers (a BVLC shape report of
``shared/realworld/reference/shapes``, or a prototxt built at batch 1) and predicts one training
iteration on one of P ranks with every InnerProduct layer at G (``caffe train --fc_parallel G``)
or each at its own best G (``--fc_parallel auto``):

    T(P) = (compute of the other layers) * s + (their gradients' allreduce, after backward)
           + sum over the InnerProduct layers of T_layer(G)   (compute inside it also * s)

with s = max(1, P / cores) when P ranks share ``cores`` cores (the emulated hosts of
``tools/netlab.py`` share this machine's; None: a core each), and the weak-scaling speedup
``P T(1) / T(P)`` with T(1) the compute alone. FLOPs per image as :mod:`.profiles` counts them:
a convolution's forward 2 x weights x output pixels, an InnerProduct's 2 x weights per row of its
bottom, backward twice the forward (once where the bottom is the net's input). ``tools/cost_model.py
hybrid`` prints the tables; docs/scaling.md, "Hybrid parallelism for fully connected layers".
"""
import json
import time
from collections import namedtuple

import numpy

from ..comm.hybrid_cost import (allreduce_seconds, allreduce_terms, best_group, divisors,
                                layer_time)

#: One layer with params: forward FLOPs per image, backward FLOPs per image, learnable elements;
#: for InnerProduct also K (inputs), N (outputs) and rows of its bottom per image (else 0).
LayerShape = namedtuple("LayerShape", "name type flops backward_flops elements k n rows")


def _layer(name, kind, flops, first, elements, k=0, n=0, rows=0):
    return LayerShape(name, kind, float(flops), float(flops) * (1 if first else 2),
                      int(elements), int(k), int(n), int(rows))


def from_shapes(path, classes=None):
    """The layers with params of a BVLC Caffe shape report (``reference/shapes/*.json``).

    ``classes=(old, new)`` re-sizes an InnerProduct with ``old`` outputs to ``new`` (the
    CaffeNet-flowers report's fc8 of 102 classes to ImageNet's 1000). BatchNorm's statistics are
    not learnable and are skipped.
    """
    with open(path) as f:
        d = json.load(f)
    blobs = {b["name"]: b["shape"] for b in d["blobs"]}
    inputs = set(d.get("inputs") or [])
    for layer in d["layers"]:
        if layer["type"] in ("Input", "Data", "DummyData", "ImageData"):
            inputs.update(layer["tops"])
    batch = next(blobs[t][0] for layer in d["layers"] for t in layer["tops"])
    out = []
    for layer in d["layers"]:
        params = layer.get("params") or []
        if not params or layer["type"] == "BatchNorm":
            continue
        first = all(b in inputs for b in layer["bottoms"])
        weights = list(params[0])
        if layer["type"] == "InnerProduct":
            n, k = weights
            if classes and n == classes[0]:
                n, params = classes[1], [[classes[1], k]] + [[classes[1]]] * (len(params) - 1)
            rows = int(numpy.prod(blobs[layer["bottoms"][0]][:1])) // batch
            out.append(_layer(layer["name"], "InnerProduct", 2.0 * n * k * rows, first,
                              sum(int(numpy.prod(s)) for s in params), k, n, rows))
            continue
        top = blobs[layer["tops"][0]]
        per_pixel = int(numpy.prod(top[2:])) if layer["type"] == "Convolution" else 1
        out.append(_layer(layer["name"], layer["type"], 2.0 * numpy.prod(weights) * per_pixel,
                          first, sum(int(numpy.prod(s)) for s in params)))
    return out


def _batch_one(param):
    """Set the batch of a NetParameter's Input, DummyData and Data layers to 1, in place."""
    for layer in param.layer:
        for shape in list(layer.input_param.shape) + list(layer.dummy_data_param.shape):
            if shape.dim:
                shape.dim[0] = 1
        if layer.HasField("data_param"):
            layer.data_param.batch_size = 1


def from_prototxt(path):
    """The layers with params of a net prototxt (TEST phase), built at batch 1.

    Raises:
        CaffeError: the net cannot be built (as :class:`caffe_engine.net.Net`).
    """
    from ..io import prototxt
    from ..net import Net
    from ..proto import caffe_pb2
    param = prototxt.read_net_param(path)
    _batch_one(param)
    net = Net(param, caffe_pb2.TEST)
    inputs = set()
    for layer, tops in zip(net.layers, net.top_vecs):
        if layer.type in ("Input", "Data", "DummyData", "ImageData", "HDF5Data"):
            inputs.update(id(t) for t in tops)
    out = []
    for i, layer in enumerate(net.layers):
        if not layer.blobs or layer.type == "BatchNorm":
            continue
        bottoms = net.bottom_vecs[i]
        first = all(id(b) in inputs for b in bottoms)
        elements = sum(b.count for b in layer.blobs)
        if layer.type == "InnerProduct":
            n, k = layer.num_output, layer.k
            rows = bottoms[0].count_range(0, layer.axis)
            out.append(_layer(layer.name, "InnerProduct", 2.0 * n * k * rows, first, elements,
                              k, n, rows))
            continue
        per_pixel = int(numpy.prod(net.top_vecs[i][0].shape[2:])) \
            if layer.type == "Convolution" else 1
        out.append(_layer(layer.name, layer.type, 2.0 * layer.blobs[0].count * per_pixel, first,
                          elements))
    return out


def load_layers(path, classes=None):
    """:func:`from_shapes` for a ``.json`` shape report, else :func:`from_prototxt`."""
    return from_shapes(path, classes) if str(path).endswith(".json") else from_prototxt(path)


def measure_flops(m=64, k=4096, n=4096, reps=3):
    """FLOP/s of this process's float32 GEMM (numpy's BLAS, its threads) on (m, k) x (k, n):
    the best of ``reps`` after one warm-up."""
    rng = numpy.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=numpy.float32)
    b = rng.standard_normal((k, n), dtype=numpy.float32)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * m * k * n / best


def _groups_for(layers, batch, procs, fc_parallel, link, algorithm, flops):
    """{InnerProduct name: G}: ``fc_parallel`` an int G (every layer; 1 where G does not divide
    P), or "auto" (each layer's :func:`best_group`)."""
    out = {}
    for s in layers:
        if s.type != "InnerProduct":
            continue
        if fc_parallel == "auto":
            out[s.name] = best_group(s.k, s.n, batch * s.rows, procs, link, algorithm, flops)
        else:
            g = int(fc_parallel)
            out[s.name] = g if procs % g == 0 else 1
    return out


def predict_iteration(layers, batch, procs, fc_parallel, link, algorithm, flops, cores=None):
    """One iteration on one of P ranks (module docstring).

    Args:
        layers: :func:`load_layers`'s list. batch: images per rank. procs: P.
        fc_parallel: G for every InnerProduct layer (1: data parallel), or "auto".
        link, algorithm, flops: as :func:`caffe_engine.comm.hybrid_cost.layer_time`.
        cores: cores the P ranks share (None: one each).

    Returns:
        dict: total, compute (all layers, scaled), rest (the other layers' compute and
        allreduce), layers {name: layer_time dict scaled, plus "group"}, sent_bytes (one rank's
        bytes per iteration, the InnerProduct layers' plus the rest's allreduce).
    """
    scale = max(1.0, procs / cores) if cores else 1.0
    groups = _groups_for(layers, batch, procs, fc_parallel, link, algorithm, flops)
    other = [s for s in layers if s.type != "InnerProduct"]
    compute_rest = sum(s.flops + s.backward_flops for s in other) * batch / flops * scale
    rest_bytes = 4.0 * sum(s.elements for s in other)
    comm_rest = allreduce_seconds(rest_bytes, procs, link, algorithm)
    fc, compute_fc, sent = {}, 0.0, 0.0
    for s in layers:
        if s.type != "InnerProduct":
            continue
        t = layer_time(s.k, s.n, batch * s.rows, procs, groups[s.name], link, algorithm,
                       flops / scale)
        fc[s.name] = t
        compute_fc += t["compute"]
        sent += t["sent_bytes"]
    sent += rest_bytes * allreduce_terms(algorithm, procs)[1]
    total = compute_rest + comm_rest + sum(t["total"] for t in fc.values())
    return {"total": total, "compute": compute_rest + compute_fc, "rest": compute_rest + comm_rest,
            "layers": fc, "sent_bytes": sent}


def hybrid_rows(layers, batch, procs_list, link, algorithm, flops, cores=None):
    """Per P and per G (each divisor of P, and "auto"): the iteration of
    :func:`predict_iteration` and the weak-scaling speedup over one process.

    Returns:
        list of dicts: procs, fc_parallel (G or "auto"), groups {layer: G}, iteration (the
        :func:`predict_iteration` dict), speedup; in order of P, then G, auto last.
    """
    t1 = predict_iteration(layers, batch, 1, 1, link, algorithm, flops)["total"]
    rows = []
    for p in procs_list:
        for g in divisors(p) + ["auto"]:
            it = predict_iteration(layers, batch, p, g, link, algorithm, flops, cores)
            rows.append({"procs": p, "fc_parallel": g, "iteration": it,
                         "groups": {n: t["group"] for n, t in it["layers"].items()},
                         "speedup": p * t1 / it["total"]})
    return rows


def _mb(nbytes):
    return f"{nbytes / 1e6:.2f}"


def layer_table(rows, layers):
    """Markdown: per P, InnerProduct layer and G, the layer's bytes sent per iteration by one
    rank, its predicted time and share of the iteration at ``--fc_parallel G``; "best" marks
    the layer's best G (what ``auto`` picks)."""
    lines = ["| P | layer | K x N | G | MB sent/iter/rank | layer ms (compute + exchange + "
             "allreduce) | share of iteration | best G |", "|---|---|---|---|---|---|---|---|"]
    shapes = {s.name: s for s in layers}
    best = {(r["procs"], n): g for r in rows if r["fc_parallel"] == "auto"
            for n, g in r["groups"].items()}
    for r in rows:
        if r["fc_parallel"] == "auto":
            continue
        it = r["iteration"]
        for name, t in it["layers"].items():
            if t["group"] != r["fc_parallel"]:
                continue
            k_n = f"{shapes[name].k} x {shapes[name].n}"
            lines.append(
                f"| {r['procs']} | {name} | {k_n} | {t['group']} | {_mb(t['sent_bytes'])} | "
                f"{t['total'] * 1e3:.1f} ({t['compute'] * 1e3:.1f} + {t['exchange'] * 1e3:.1f} "
                f"+ {t['exposed'] * 1e3:.1f}) | {100 * t['total'] / it['total']:.0f} % | "
                f"{'**best**' if best.get((r['procs'], name)) == t['group'] else ''} |")
    return "\n".join(lines)


def iteration_table(rows, batch):
    """Markdown: per P and ``--fc_parallel`` setting, the predicted iteration, images/s,
    speedup over one process and one rank's bytes per iteration."""
    lines = ["| P | --fc_parallel | groups | predicted ms/iter | images/s | speedup | MB "
             "sent/iter/rank |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        it = r["iteration"]
        groups = ", ".join(f"{n} {g}" for n, g in r["groups"].items())
        lines.append(f"| {r['procs']} | {r['fc_parallel']} | {groups} | {it['total'] * 1e3:.1f} "
                     f"| {r['procs'] * batch / it['total']:.1f} | {r['speedup']:.2f} | "
                     f"{_mb(it['sent_bytes'])} |")
    return "\n".join(lines)
