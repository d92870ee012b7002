"""Weights: Caffe's .caffemodel loads by layer name; ours read back identically and atomically."""
from pathlib import Path

import numpy as np
import pytest

import caffe_engine as caffe
from caffe_engine.errors import CaffeError
from caffe_engine.io.blobproto import proto_shape, proto_to_array
from caffe_engine.proto import caffe_pb2
from paths import SHARED

LENET = SHARED / "caffe_reference" / "training" / "lenet_sgd"

DEPLOY = """
name: "LeNet"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 28 dim: 28 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: %d weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip2" top: "prob" }
"""


def caffe_arrays(path):
    model = caffe_pb2.NetParameter()
    model.ParseFromString(Path(path).read_bytes())
    return {l.name: [proto_to_array(b) for b in l.blobs] for l in model.layer if l.blobs}


@pytest.fixture
def deploy(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text(DEPLOY % 500)
    return path


def test_caffe_written_caffemodel_loads_by_layer_name(deploy):
    net = caffe.Net(str(deploy), caffe.TEST, weights=str(LENET / "lenet_sgd_iter_300.caffemodel"))
    ref = caffe_arrays(LENET / "lenet_sgd_iter_300.caffemodel")
    assert list(net.params) == list(ref)
    for name, blobs in ref.items():
        for mine, theirs in zip(net.params[name], blobs):
            np.testing.assert_array_equal(mine.data, theirs)
    # Caffe's trained LeNet classifies a real digit from the test set (record 0, label 7).
    from caffe_engine.io.lmdb_source import LMDBCursor
    with LMDBCursor(str(SHARED / "data/mnist_5k/mnist_test_lmdb")) as cursor:
        datum = caffe_pb2.Datum()
        datum.ParseFromString(cursor.value())
    image = np.frombuffer(datum.data, np.uint8).reshape(1, 28, 28).astype(np.float32) / 256
    prob = net.forward(data=np.stack([image, image]))["prob"]
    assert prob.shape == (2, 10) and int(prob[0].argmax()) == datum.label


def test_written_caffemodel_reads_back_identical(deploy, tmp_path):
    caffe.set_random_seed(3)
    net = caffe.Net(str(deploy), caffe.TEST)
    out = tmp_path / "w.caffemodel"
    net.save(str(out))
    back = caffe_arrays(out)
    for name, blobs in net.params.items():
        for mine, read in zip(blobs, back[name]):
            assert mine.data.shape == read.shape
            np.testing.assert_array_equal(mine.data, read)
    # The file is Caffe's structure: every layer, its phase, blobs with N-D shapes.
    model = caffe_pb2.NetParameter()
    model.ParseFromString(out.read_bytes())
    assert [l.name for l in model.layer] == net.layer_names
    assert all(l.phase == caffe_pb2.TEST for l in model.layer)
    assert list(model.layer[1].blobs[0].shape.dim) == [20, 1, 5, 5]
    # Reloading into a fresh net gives the same params.
    again = caffe.Net(str(deploy), caffe.TEST, weights=str(out))
    np.testing.assert_array_equal(again.params["ip1"][0].data, net.params["ip1"][0].data)
    assert not list(tmp_path.glob(".tmp-*")), "atomic write left a temporary file"


def test_shape_mismatch_names_layer_and_both_shapes(tmp_path):
    path = tmp_path / "narrow.prototxt"
    path.write_text(DEPLOY % 400)
    with pytest.raises(CaffeError) as err:
        caffe.Net(str(path), caffe.TEST, weights=str(LENET / "lenet_sgd_iter_300.caffemodel"))
    msg = str(err.value)
    assert "'ip1'" in msg and "500 800" in msg and "400 800" in msg


def test_legacy_4d_blob_shape_matches_trailing_axes():
    bp = caffe_pb2.BlobProto(num=1, channels=1, height=1, width=3, data=[1, 2, 3])
    assert proto_shape(bp, (3,)) == (3,)
    assert proto_shape(bp, (3, 1)) == (1, 1, 1, 3)
    assert proto_to_array(bp).shape == (1, 1, 1, 3)


def test_not_a_caffemodel_is_a_one_line_error(deploy, tmp_path):
    junk = tmp_path / "junk.caffemodel"
    junk.write_bytes(b"\xff\xff\xff\xff not protobuf")
    with pytest.raises(CaffeError, match="junk.caffemodel"):
        caffe.Net(str(deploy), caffe.TEST, weights=str(junk))
