"""The solver's nets from its parameters, built alone (solvers/net_factory.py).

Caffe: src/caffe/solver.cpp (InitTrainNet, InitTestNets): the test nets come in the order
``test_net_param``, ``test_net`` files, then the generic net once per remaining ``test_iter``;
each net's state is its phase, then its own ``state``, then ``train_state`` / ``test_state``.
"""
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import net_factory

NET = """
name: "{name}"
layer {{ name: "input" type: "Input" top: "data" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: 2 }} }}
layer {{ name: "only_train" type: "ReLU" bottom: "ip" top: "ip" include {{ phase: TRAIN }} }}
layer {{ name: "only_stage_s" type: "ReLU" bottom: "ip" top: "ip" include {{ stage: "s" }} }}
"""


def net_param(name):
    return text_format.Parse(NET.format(name=name), caffe_pb2.NetParameter())


def solver_param(text=""):
    return text_format.Parse(text, caffe_pb2.SolverParameter())


def test_train_net_state_merges_phase_net_state_and_train_state():
    p = solver_param('train_state { stage: "s" }')
    p.net_param.CopyFrom(net_param("generic"))
    net = net_factory.build_train_net(p, "s.prototxt")
    assert net.name == "generic"
    assert net.layer_names == ["input", "ip", "only_train", "only_stage_s"]


def test_test_nets_in_caffes_order_with_their_states(tmp_path):
    path = tmp_path / "file_net.prototxt"
    path.write_text(NET.format(name="from_file"))
    p = solver_param(f'test_net: "{path}" test_iter: 1 test_iter: 1 test_iter: 1 test_iter: 1 '
                     'test_interval: 10 test_state {} test_state {} '
                     'test_state { stage: "s" } test_state {}')
    p.test_net_param.add().CopyFrom(net_param("inline"))
    p.net_param.CopyFrom(net_param("generic"))
    nets = net_factory.build_test_nets(p, "s.prototxt")
    assert [net.name for net in nets] == ["inline", "from_file", "generic", "generic"]
    assert [len(net.layers) for net in nets] == [2, 2, 3, 2]


@pytest.mark.parametrize("generic, text, message", [
    (False, "test_iter: 1", "test_iter must be specified for each test network"),
    (True, "test_iter: 1 test_interval: 5 test_state {} test_state {}", "test_state must be"),
    (True, "test_iter: 1", "test_interval must be positive"),
])
def test_test_net_checks(generic, text, message):
    p = solver_param(text)
    if generic:
        p.net_param.CopyFrom(net_param("generic"))
    with pytest.raises(CaffeError, match=message):
        net_factory.build_test_nets(p, "s.prototxt")


def test_exactly_one_train_net():
    p = solver_param()
    with pytest.raises(CaffeError, match=r"exactly one train net.*\(0 given\)"):
        net_factory.build_train_net(p, "s.prototxt")
    p.net_param.CopyFrom(net_param("a"))
    p.train_net_param.CopyFrom(net_param("b"))
    with pytest.raises(CaffeError, match=r"\(2 given\)"):
        net_factory.build_train_net(p, "s.prototxt")
