"""``caffe time`` on a deploy net times the backward Caffe runs (tools/caffe.cpp ``time()``).

Caffe's benchmark calls every layer's ``Backward`` directly with the net's
``bottom_need_backward``, whatever ``layer_need_backward`` says: on a deploy net (no loss, so no
layer "needs backward") Convolution and InnerProduct still compute their weight and bias
gradients (``param_propagate_down``, from ``lr_mult``), so backward costs about as much as
forward. Skipping those layers (``Net::Backward``'s rule) would report a backward of ~0 ms.
"""
import re
import subprocess
import sys

from caffe_engine.cli import _time_propagate_down
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

DEPLOY = """name: "tiny_deploy"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 8 dim: 16 dim: 32 dim: 32 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 32 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def caffe_time(folder, text, iterations):
    """``caffe time`` of the net ``text``: its log messages and {(layer, pass): ms}."""
    (folder / "net.prototxt").write_text(text)
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "time", "--model=net.prototxt",
                        f"--iterations={iterations}"], cwd=folder, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    msgs = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if "] " in line]
    per_layer = {}
    for m in msgs:
        hit = re.match(r"^ *(\S+)\t(forward|backward): (\S+) ms\.$", m)
        if hit:
            per_layer[hit.group(1), hit.group(2)] = float(hit.group(3))
    return msgs, per_layer


def test_deploy_net_backward_is_timed_like_caffe(tmp_path):
    msgs, per_layer = caffe_time(tmp_path, DEPLOY, 3)
    assert "conv does not need backward computation." in msgs      # a deploy net, as in Caffe
    fwd = float(next(m for m in msgs if m.startswith("Average Forward pass: ")).split()[3])
    bwd = float(next(m for m in msgs if m.startswith("Average Backward pass: ")).split()[3])
    # The weight gradient of the convolution costs about what its forward does; without it the
    # backward would be a few microseconds.
    assert per_layer["conv", "backward"] > 0.3 * per_layer["conv", "forward"], per_layer
    assert per_layer["fc", "backward"] > 0.1 * per_layer["fc", "forward"], per_layer
    assert bwd > 0.3 * fwd, (fwd, bwd)


def _layer(type_, **lrn):
    """The registered layer class of ``type_``, built (not set up) from its parameter."""
    param = caffe_pb2.LayerParameter(name=type_.lower(), type=type_)
    if lrn:
        param.lrn_param.norm_region = lrn["region"]
    return create_layer(param, caffe_pb2.TRAIN)


def test_layers_whose_caffe_backward_ignores_propagate_down():
    # softmax_layer.cpp, batch_norm_layer.cpp, mvn_layer.cpp, im2col_layer.cpp and LRN across
    # channels compute the bottom gradient whatever propagate_down says; the others follow it.
    for type_ in ("Softmax", "BatchNorm", "MVN", "Im2col"):
        assert _time_propagate_down(_layer(type_), [False]) == [True]
    assert _time_propagate_down(_layer("LRN", region=caffe_pb2.LRNParameter.ACROSS_CHANNELS),
                                [False]) == [True]
    assert _time_propagate_down(_layer("LRN", region=caffe_pb2.LRNParameter.WITHIN_CHANNEL),
                                [False]) == [False]
    for type_ in ("Convolution", "ReLU", "Pooling", "InnerProduct", "Scale", "Eltwise"):
        assert _time_propagate_down(_layer(type_), [False, True]) == [False, True]


TRAIN_BN = """name: "bn_chain"
force_backward: true
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 4 dim: 3 dim: 16 dim: 16 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "scale" type: "Scale" bottom: "conv" top: "conv" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
"""


def test_batch_norm_chains_are_timed_as_training_runs_them(tmp_path):
    """A BatchNorm+Scale+ReLU chain runs as one pass in training, and so in ``caffe time``: its
    forward on the BatchNorm's line, its backward on the ReLU's, the others' lines 0."""
    msgs, per_layer = caffe_time(tmp_path, TRAIN_BN, 2)
    assert any(m.startswith("1 BatchNorm+Scale+ReLU chains run as one pass each") for m in msgs)
    assert per_layer["bn", "forward"] > 0 and per_layer["relu", "backward"] > 0
    assert per_layer["scale", "forward"] == per_layer["relu", "forward"] == 0
    assert per_layer["scale", "backward"] == per_layer["bn", "backward"] == 0
