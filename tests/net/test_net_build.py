"""Net normalisation as pure functions: phase/level/stage filtering and implicit splits."""
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.graph import filter_net, insert_splits
from caffe_engine.proto import caffe_pb2


def net(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


def names(param):
    return [l.name for l in param.layer]


RULES = net("""
layer { name: "always" type: "Input" top: "x" }
layer { name: "train" type: "ReLU" bottom: "x" top: "x" include { phase: TRAIN } }
layer { name: "test" type: "ReLU" bottom: "x" top: "x" include { phase: TEST } }
layer { name: "not_test" type: "ReLU" bottom: "x" top: "x" exclude { phase: TEST } }
layer { name: "lvl2" type: "ReLU" bottom: "x" top: "x" include { min_level: 2 } }
layer { name: "upto1" type: "ReLU" bottom: "x" top: "x" include { max_level: 1 } }
layer { name: "deploy" type: "ReLU" bottom: "x" top: "x" include { stage: "deploy" } }
layer { name: "notdeploy" type: "ReLU" bottom: "x" top: "x" include { not_stage: "deploy" } }
layer { name: "either" type: "ReLU" bottom: "x" top: "x"
        include { phase: TEST } include { stage: "deploy" } }
""")


@pytest.mark.parametrize("phase,level,stages,expected", [
    (caffe_pb2.TRAIN, 0, [], ["always", "train", "not_test", "upto1", "notdeploy"]),
    (caffe_pb2.TEST, 0, [], ["always", "test", "upto1", "notdeploy", "either"]),
    (caffe_pb2.TRAIN, 2, ["deploy"], ["always", "train", "not_test", "lvl2", "deploy", "either"]),
])
def test_filter_net_follows_caffes_rules(phase, level, stages, expected):
    state = caffe_pb2.NetState(phase=phase, level=level, stage=stages)
    assert names(filter_net(RULES, state)) == expected


def test_include_and_exclude_together_is_an_error():
    bad = net('layer { name: "l" type: "ReLU" include { phase: TEST } exclude { phase: TRAIN } }')
    with pytest.raises(CaffeError, match="'l'"):
        filter_net(bad, caffe_pb2.NetState())


def test_splits_named_and_wired_as_caffe():
    param = insert_splits(net("""
    layer { name: "data" type: "Input" top: "data" }
    layer { name: "a" type: "ReLU" bottom: "data" top: "a" }
    layer { name: "b" type: "ReLU" bottom: "data" top: "b" }
    layer { name: "c" type: "Eltwise" bottom: "a" bottom: "b" bottom: "data" top: "c" }
    """))
    assert names(param) == ["data", "data_data_0_split", "a", "b", "c"]
    split = param.layer[1]
    assert split.type == "Split" and list(split.bottom) == ["data"]
    assert list(split.top) == [f"data_data_0_split_{k}" for k in range(3)]
    assert list(param.layer[2].bottom) == ["data_data_0_split_0"]
    assert list(param.layer[3].bottom) == ["data_data_0_split_1"]
    assert list(param.layer[4].bottom) == ["a", "b", "data_data_0_split_2"]


def test_in_place_chain_needs_no_split_and_loss_use_counts():
    no_split = insert_splits(net("""
    layer { name: "d" type: "Input" top: "x" }
    layer { name: "r" type: "ReLU" bottom: "x" top: "x" }
    layer { name: "s" type: "Sigmoid" bottom: "x" top: "y" }
    """))
    assert names(no_split) == ["d", "r", "s"]
    # A top with a loss weight that is also consumed gets a split whose first top keeps the loss.
    with_loss = insert_splits(net("""
    layer { name: "d" type: "Input" top: "x" }
    layer { name: "e" type: "EuclideanLoss" bottom: "x" bottom: "x" top: "l" loss_weight: 2 }
    layer { name: "p" type: "Power" bottom: "l" top: "q" }
    """))
    split = with_loss.layer[-2]
    assert split.name == "l_e_0_split" and list(split.loss_weight) == [2, 0]
    assert list(with_loss.layer[1].loss_weight) == []
    assert list(with_loss.layer[-1].bottom) == ["l_e_0_split_1"]


def test_unknown_bottom_names_layer_and_index():
    with pytest.raises(CaffeError, match=r"Unknown bottom blob 'nope' \(layer 'r', bottom index 0\)"):
        insert_splits(net('layer { name: "r" type: "ReLU" bottom: "nope" top: "y" }'))
