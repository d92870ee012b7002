"""``Net(file, phase, level=0, stages=None)`` sets the NetState as Caffe's
``Net(param_file, phase, level, stages)`` (src/caffe/net.cpp), which pycaffe's ``caffe.Net``
(python/caffe/_caffe.cpp Net_Init) and ``caffe test`` / ``caffe time`` (tools/caffe.cpp) use:
``set_phase(phase)``, ``add_stage(s)`` for each given stage (the file's own stages stay), then
``set_level(level)`` (so the file's ``state { level: N }`` is replaced, by 0 unless given).
"""
import subprocess
import sys

import pytest
from google.protobuf import text_format

import caffe_engine.graph as graph
from caffe_engine.graph import filter_net
from caffe_engine.net import TEST, TRAIN, Net
from caffe_engine.proto import caffe_pb2

NET = """
name: "states"
state { level: 2 stage: "a" }
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }
layer { name: "lvl1" type: "ReLU" bottom: "data" top: "l1" include { min_level: 1 } }
layer { name: "stage_a" type: "ReLU" bottom: "data" top: "sa" include { stage: "a" } }
layer { name: "stage_b" type: "ReLU" bottom: "data" top: "sb" include { stage: "b" } }
layer { name: "not_a" type: "ReLU" bottom: "data" top: "na" exclude { stage: "a" } }
layer { name: "train_only" type: "ReLU" bottom: "data" top: "t" include { phase: TRAIN } }
"""


def built(net):
    """The net's layers from the file (the implicit Split layers left out)."""
    return [n for n in net.layer_names if not n.endswith("_split")]


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "states.prototxt"
    path.write_text(NET)
    return str(path)


@pytest.mark.parametrize("kwargs, expected", [
    # the file's level 2 is replaced by 0; its stage "a" stays
    ({}, ["data", "stage_a"]),
    ({"level": 2}, ["data", "lvl1", "stage_a"]),
    # given stages are added to the file's
    ({"stages": ["b"]}, ["data", "stage_a", "stage_b"]),
    ({"level": 1, "stages": ["b"]}, ["data", "lvl1", "stage_a", "stage_b"]),
])
def test_file_state_level_is_replaced_and_stages_added(net_file, kwargs, expected, monkeypatch):
    states = []

    def spy(param, state):
        states.append(caffe_pb2.NetState())
        states[-1].CopyFrom(state)
        return filter_net(param, state)
    monkeypatch.setattr(graph, "filter_net", spy)
    net = Net(net_file, TEST, **kwargs)
    assert built(net) == expected
    assert len(states) == 1 and states[0].phase == TEST
    assert states[0].level == kwargs.get("level", 0)
    assert list(states[0].stage) == ["a"] + kwargs.get("stages", [])


def test_phase_is_the_given_one(net_file):
    assert built(Net(net_file, TRAIN)) == ["data", "stage_a", "train_only"]


def test_legacy_constructor_uses_level_0(net_file, tmp_path):
    weights = tmp_path / "empty.caffemodel"
    weights.write_bytes(caffe_pb2.NetParameter(name="states").SerializeToString())
    assert built(Net(net_file, str(weights), TEST)) == ["data", "stage_a"]


def test_net_parameter_keeps_its_state():
    # Caffe's Net(const NetParameter&) uses the param's state as it is (the solver relies on it).
    param = text_format.Parse(NET, caffe_pb2.NetParameter())
    assert built(Net(param, TEST, level=param.state.level,
                     stages=list(param.state.stage))) == ["data", "lvl1", "stage_a"]


def test_caffe_time_uses_its_level_and_stage_flags(net_file):
    # tools/caffe.cpp: Net(FLAGS_model, phase, FLAGS_level, &stages); --stage splits at ','.
    def layers(*flags):
        r = subprocess.run([sys.executable, "-m", "caffe_engine", "time", "--model", net_file,
                            "--iterations", "1", "--phase", "TEST", *flags],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        names = [line.split("Creating Layer ", 1)[1].strip()
                 for line in r.stderr.splitlines() if "Creating Layer " in line]
        return [n for n in names if not n.endswith("_split")]
    assert layers() == ["data", "stage_a"]
    assert layers("--level", "1", "--stage", "b") == ["data", "lvl1", "stage_a", "stage_b"]
