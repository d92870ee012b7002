"""perf/hybrid.py and ``tools/cost_model.py hybrid``: PCL-DNN's balance equations over a net.

Oracles: the shapes BVLC Caffe reported for CaffeNet (``reference/shapes``, fc6 9216 x 4096,
fc7 4096 x 4096, fc8 resized to 1000 classes), a two-layer prototxt written here (its FLOPs
counted by hand), and :mod:`caffe_engine.comm.hybrid_cost` (tested on its own) for the layers.
"""
import os
import subprocess
import sys

import pytest

from caffe_engine.comm.hybrid_cost import Link, layer_time
from caffe_engine.perf import hybrid
from caffe_engine.perf.profiles import SHAPES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAFFENET = os.path.join(SHAPES, "natanielruiz__net-archive__caffenet-flowers__train_val."
                                "prototxt.TRAIN.json")
GBIT = Link.from_rate(1e9, 50e-6)

TWO_LAYERS = """name: "two"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 10 dim: 2 dim: 3 dim: 5 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 7 axis: 2 } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 4 } }
"""

needs_shapes = pytest.mark.skipif(not os.path.exists(CAFFENET), reason="no ../shared shapes")


@needs_shapes
def test_caffenet_layers_from_the_shape_report():
    layers = hybrid.from_shapes(CAFFENET, classes=(102, 1000))
    fc = [(s.name, s.k, s.n, s.rows) for s in layers if s.type == "InnerProduct"]
    assert fc == [("fc6", 9216, 4096, 1), ("fc7", 4096, 4096, 1),
                  ("fc8_oxford_102", 4096, 1000, 1)]
    assert [s.name for s in layers if s.type == "Convolution"] == [f"conv{i}" for i in range(1, 6)]
    fc6 = layers[5]
    assert (fc6.flops, fc6.backward_flops, fc6.elements) == (2 * 9216 * 4096, 4 * 9216 * 4096,
                                                             9217 * 4096)
    assert layers[0].backward_flops == layers[0].flops          # conv1: no bottom gradient


def test_prototxt_built_at_batch_one(tmp_path):
    path = tmp_path / "two.prototxt"
    path.write_text(TWO_LAYERS)
    ip1, ip2 = hybrid.from_prototxt(str(path))
    # ip1, axis 2: K = 3 * 5 = 15 inputs, 2 rows per image (the axis-1 dimension).
    assert (ip1.k, ip1.n, ip1.rows, ip1.flops) == (15, 7, 2, 2.0 * 15 * 7 * 2)
    assert ip1.backward_flops == ip1.flops                       # its bottom is the input
    assert (ip2.k, ip2.n, ip2.rows, ip2.elements) == (14, 4, 1, 14 * 4 + 4)
    assert ip2.backward_flops == 2 * ip2.flops


@needs_shapes
def test_iteration_adds_the_layers():
    layers = hybrid.from_shapes(CAFFENET, classes=(102, 1000))
    flops = 10e9
    one = hybrid.predict_iteration(layers, 8, 1, 1, GBIT, "ring", flops)
    compute = sum(s.flops + s.backward_flops for s in layers) * 8 / flops
    assert one["total"] == pytest.approx(compute) and one["sent_bytes"] == 0
    it = hybrid.predict_iteration(layers, 8, 8, 8, GBIT, "ring", flops, cores=2)
    fc6 = layer_time(9216, 4096, 8, 8, 8, GBIT, "ring", flops / 4)
    assert it["layers"]["fc6"] == fc6                            # 8 ranks on 2 cores: x 4
    assert it["total"] == pytest.approx(it["rest"] + sum(t["total"]
                                                         for t in it["layers"].values()))


@needs_shapes
def test_auto_picks_model_parallel_for_caffenet_on_1gbit():
    layers = hybrid.from_shapes(CAFFENET, classes=(102, 1000))
    rows = hybrid.hybrid_rows(layers, 8, [2, 4, 8], GBIT, "ring", 10e9, cores=2)
    auto = {r["procs"]: r for r in rows if r["fc_parallel"] == "auto"}
    assert {p: set(r["groups"].values()) for p, r in auto.items()} == {2: {2}, 4: {4}, 8: {8}}
    data = {r["procs"]: r for r in rows if r["fc_parallel"] == 1}
    assert all(auto[p]["speedup"] > data[p]["speedup"] for p in (2, 4, 8))
    table = hybrid.layer_table(rows, layers)
    assert "| 8 | fc6 | 9216 x 4096 | 8 | 4.36 |" in table and "**best**" in table


@needs_shapes
def test_cost_model_hybrid_subcommand():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cost_model.py"), "hybrid",
                          "--net", CAFFENET, "--classes", "102", "1000", "--batch", "8",
                          "--procs", "2", "8", "--bandwidth", "1gbit", "--latency", "50us",
                          "--gflops", "10", "--cores", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "link alpha 50.0 us, beta 8.000 ns/byte, 10.0 GFLOP/s per rank, 2 cores" in text
    assert "| 8 | fc6 | 9216 x 4096 | 1 | 264.27 |" in text        # the ring's 1.75 |W|
    assert "| 8 | auto | fc6 8, fc7 8, fc8_oxford_102 8 |" in text
    assert "| 2 | 2 | fc6 2, fc7 2, fc8_oxford_102 2 |" in text


def test_cost_model_hybrid_refuses_a_net_without_inner_product(tmp_path):
    path = tmp_path / "conv.prototxt"
    path.write_text('layer { name: "data" type: "Input" top: "data" input_param { shape { '
                    'dim: 1 dim: 1 dim: 4 dim: 4 } } }\nlayer { name: "c" type: "Convolution" '
                    'bottom: "data" top: "c" convolution_param { num_output: 2 kernel_size: 3 }'
                    ' }\n')
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "cost_model.py"), "hybrid",
                          "--net", str(path), "--gflops", "1"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1
    assert out.stderr.strip().endswith("has no InnerProduct layer")
