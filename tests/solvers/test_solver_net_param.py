"""Nets embedded in a solver (``net_param``, ``train_net_param``, ``test_net_param``) in the V1
``layers {}`` syntax are upgraded as net files are, instead of building an empty net that
"trains" with loss 0; a net mixing ``layer`` and ``layers`` is refused in one line.

Caffe: src/caffe/solver.cpp (InitTrainNet, InitTestNets) and src/caffe/util/upgrade_proto.cpp
(UpgradeNetAsNeeded, UpgradeV1Net). Note: BVLC Caffe master upgrades only nets it reads from
files (ReadNetParamsFromTextFileOrDie); it copies an embedded net as it is, and its Net::Init
reads only ``layer``, so there the V1 layers are silently dropped. The engine upgrades them (with a
WARNING saying Caffe would not), which is what such a solver was written for.
"""
import numpy as np
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver

V1_NET = """
name: "tiny"
input: "data" input_shape { dim: 4 dim: 3 }
input: "label" input_shape { dim: 4 }
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
         inner_product_param { num_output: 3 weight_filler { type: "uniform" min: -1 max: 1 }
                               bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layers { name: "loss" type: SOFTMAX_LOSS bottom: "ip" bottom: "label" top: "loss" }
"""
V2_NET = """
name: "tiny"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 3 weight_filler { type: "uniform" min: -1 max: 1 }
                              bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
DATA = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0], [-0.7, 2.0, 1.5], [2.5, -0.2, 0.0]], np.float32)
LABEL = np.array([0, 2, 1, 2], np.float32)
SOLVER = ('type: "SGD" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 3 random_seed: 3 '
          "snapshot_after_train: false ")


def solver_with(field, net_text, extra=""):
    p = text_format.Parse(SOLVER + extra, caffe_pb2.SolverParameter())
    getattr(p, field).CopyFrom(text_format.Parse(net_text, caffe_pb2.NetParameter()))
    return p


def feed(solver):
    for net in [solver.net] + solver.test_nets:
        net.blobs["data"].data[...] = DATA
        net.blobs["label"].data[...] = LABEL
    return solver


def trained_weights(param):
    solver = feed(get_solver(param))
    solver.step(3)
    return solver, [b.data.copy() for b in solver.net.learnable_params]


@pytest.mark.parametrize("field", ["net_param", "train_net_param"])
def test_v1_embedded_train_net_is_upgraded_and_trains_as_its_v2_form(field, caplog):
    with caplog.at_level("WARNING", logger="caffe_engine"):
        solver, v1 = trained_weights(solver_with(field, V1_NET))
    assert solver.net.layer_names == ["input", "ip", "loss"]
    assert solver.net.forward_loss() > 0
    _, v2 = trained_weights(solver_with(field, V2_NET))
    assert len(v1) == 2
    for a, b in zip(v1, v2):
        np.testing.assert_array_equal(a, b)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(f"<SolverParameter>: {field} uses the deprecated V1 'layers' field" in w
               for w in warnings)


def test_v1_embedded_test_net_is_upgraded():
    p = solver_with("train_net_param", V2_NET, "test_iter: 1 test_interval: 10")
    p.test_net_param.add().CopyFrom(text_format.Parse(V1_NET, caffe_pb2.NetParameter()))
    solver = feed(get_solver(p))
    assert solver.test_nets[0].layer_names == ["input", "ip", "loss"]
    outputs = solver.test(0)
    assert outputs["loss"] > 0


def test_mixed_layer_and_layers_in_net_param_is_one_line_error(tmp_path):
    mixed = V2_NET + 'layers { name: "extra" type: RELU bottom: "ip" top: "ip" }\n'
    path = tmp_path / "solver.prototxt"
    p = solver_with("net_param", mixed)
    path.write_text(text_format.MessageToString(p))
    with pytest.raises(CaffeError) as info:
        get_solver(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: net_param: Refusing to upgrade inconsistent NetParameter "
                              "input; the definition includes both 'layer' and 'layers' fields")
    assert "\n" not in message


def test_caffe_train_with_mixed_embedded_net_exits_1_with_one_line(tmp_path):
    import subprocess
    import sys
    mixed = V2_NET + 'layers { name: "extra" type: RELU bottom: "ip" top: "ip" }\n'
    (tmp_path / "solver.prototxt").write_text(text_format.MessageToString(
        solver_with("net_param", mixed)))
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "train", "--solver", "solver.prototxt"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "caffe: solver.prototxt: net_param: Refusing to upgrade inconsistent NetParameter input")
