"""Weights into a net with two layers of one name go where Caffe puts them, with a WARNING.

Caffe (src/caffe/net.cpp): CopyTrainedLayersFrom(NetParameter) and ShareTrainedLayersWith find
each source layer's target by searching ``layer_names_`` from the start, so the *first* net layer
of that name gets it (every source layer of that name in turn) and a later one keeps its filler
values; CopyTrainedLayersFromHDF5 looks the name up in ``layer_names_index_``, filled in layer
order, so there the *last* one gets it. Net::ToHDF5 cannot write such a net (one group per name).
"""
import numpy as np
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.io.blobproto import array_to_proto
from caffe_engine.net import TEST, Net
from caffe_engine.proto import caffe_pb2

h5py = pytest.importorskip("h5py")

NET = """
name: "dup"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "a"
        inner_product_param { num_output: 3 weight_filler { type: "constant" value: 1 }
                              bias_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "a" top: "b"
        inner_product_param { num_output: 3 weight_filler { type: "constant" value: 2 }
                              bias_filler { type: "constant" value: 2 } } }
"""
FIRST, SECOND = 1, 2   # layer indices of the two "ip" layers


def dup_net():
    return Net(text_format.Parse(NET, caffe_pb2.NetParameter()), TEST)


def source(*values):
    """A NetParameter holding one "ip" layer per value, weights and bias filled with it."""
    param = caffe_pb2.NetParameter(name="src")
    for v in values:
        lp = param.layer.add(name="ip", type="InnerProduct")
        array_to_proto(np.full((3, 3), v, np.float32), lp.blobs.add())
        array_to_proto(np.full((3,), v, np.float32), lp.blobs.add())
    return param


def values(net, layer):
    return [float(b.data.ravel()[0]) for b in net.layers[layer].blobs]


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_caffemodel_weights_go_into_the_first_layer_of_the_name(tmp_path, caplog):
    path = tmp_path / "src.caffemodel"
    path.write_bytes(source(7).SerializeToString())
    net = dup_net()
    with caplog.at_level("WARNING", logger="caffe_engine"):
        net.copy_from(str(path))
    assert values(net, FIRST) == [7, 7] and values(net, SECOND) == [2, 2]
    (line,) = warnings(caplog)
    assert "2 layers named 'ip'" in line and str(path) in line and f"layer {FIRST} only" in line


def test_repeated_source_layers_are_copied_in_turn_into_the_first():
    net = dup_net()
    net.copy_from(source(5, 9))
    assert values(net, FIRST) == [9, 9] and values(net, SECOND) == [2, 2]


def test_hdf5_weights_go_into_the_last_layer_of_the_name(tmp_path, caplog):
    path = tmp_path / "src.caffemodel.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("data").create_group("ip")
        g.create_dataset("0", data=np.full((3, 3), 7, np.float32))
        g.create_dataset("1", data=np.full((3,), 7, np.float32))
    net = dup_net()
    with caplog.at_level("WARNING", logger="caffe_engine"):
        net.copy_from(str(path))
    assert values(net, FIRST) == [1, 1] and values(net, SECOND) == [7, 7]
    (line,) = warnings(caplog)
    assert "2 layers named 'ip'" in line and f"layer {SECOND} only" in line


def test_hdf5_snapshot_of_such_a_net_is_one_line_error(tmp_path):
    path = tmp_path / "x.caffemodel.h5"
    with pytest.raises(CaffeError, match="several layers named 'ip'") as info:
        dup_net().save_hdf5(str(path))
    assert str(info.value).startswith(f"{path}: ") and list(tmp_path.iterdir()) == []


def test_shared_test_net_views_the_first_layer_of_the_name():
    train, test = dup_net(), dup_net()
    train.layers[FIRST].blobs[0].data[...] = 5
    train.layers[SECOND].blobs[0].data[...] = 6
    test.share_trained_layers_with(train)
    # each train "ip" in turn into the test net's first "ip": it ends viewing the second
    assert test.layers[FIRST].blobs[0].data is train.layers[SECOND].blobs[0].data
    assert values(test, SECOND) == [2, 2]


def test_unique_names_give_no_warning(tmp_path, caplog):
    net = Net(text_format.Parse(NET.replace('name: "ip" type: "InnerProduct" bottom: "a"',
                                            'name: "ip2" type: "InnerProduct" bottom: "a"'),
                                caffe_pb2.NetParameter()), TEST)
    with caplog.at_level("WARNING", logger="caffe_engine"):
        net.copy_from(source(7))
    assert warnings(caplog) == [] and values(net, FIRST) == [7, 7]
