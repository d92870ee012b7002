"""NetSpec (pycaffe's net_spec): the NetParameter Caffe's NetSpec would write.

The oracle for names and layout is Caffe's documented behaviour (python/caffe/net_spec.py):
tops assigned to the NetSpec take their attribute names, others ``<Type><k>`` in the order
``to_proto`` reaches them, a layer takes its first top's name, keywords go to the type's
``*_param`` message when it has such a field. The LeNet test rebuilds the repository's
models/lenet/lenet_train_test.prototxt (written by hand, Caffe's examples/mnist net) the way
Caffe's 01-learning-lenet notebook builds LeNet.
"""
import numpy
import pytest
from google.protobuf import text_format

import caffe_engine as caffe
from caffe_engine import net_spec
from caffe_engine.proto import caffe_pb2
from paths import ROOT

L, P = caffe.layers, caffe.params


def lenet_layers(n, source, batch_size, phase):
    """The notebook's LeNet with models/lenet's names, lr_mults and phase rules."""
    lr = [dict(lr_mult=1), dict(lr_mult=2)]
    fillers = dict(weight_filler=dict(type="xavier"), bias_filler=dict(type="constant"))
    n.data, n.label = L.Data(name="mnist", include=dict(phase=phase), batch_size=batch_size,
                             backend=P.Data.LMDB, source=source,
                             transform_param=dict(scale=0.00390625), ntop=2)
    n.conv1 = L.Convolution(n.data, param=lr, kernel_size=5, stride=1, num_output=20, **fillers)
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, param=lr, kernel_size=5, stride=1, num_output=50, **fillers)
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, param=lr, num_output=500, **fillers)
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, param=lr, num_output=10, **fillers)
    n.accuracy = L.Accuracy(n.ip2, n.label, include=dict(phase=caffe.TEST))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n


def test_lenet_matches_the_models_file():
    train = lenet_layers(caffe.NetSpec(), "data/mnist/mnist_train_lmdb", 64, caffe.TRAIN).to_proto()
    # The TEST data layer has the same tops, so it comes from a NetSpec of its own; the
    # notebook writes two files, models/lenet keeps both data layers in one.
    t = caffe.NetSpec()
    t.data, t.label = L.Data(name="mnist", include=dict(phase=caffe.TEST), batch_size=100,
                             backend=P.Data.LMDB, source="data/mnist/mnist_test_lmdb",
                             transform_param=dict(scale=0.00390625), ntop=2)
    net = caffe_pb2.NetParameter(name="LeNet")
    net.layer.extend([train.layer[0], t.to_proto().layer[0]] + list(train.layer[1:]))

    expected = text_format.Parse((ROOT / "models/lenet/lenet_train_test.prototxt").read_text(),
                                 caffe_pb2.NetParameter())
    parsed = text_format.Parse(str(net), caffe_pb2.NetParameter())   # serialised and read back
    assert [l.name for l in parsed.layer] == [l.name for l in expected.layer]
    for mine, theirs in zip(parsed.layer, expected.layer):
        assert mine == theirs, f"layer {theirs.name}:\n{mine}\nvs\n{theirs}"
    assert parsed == expected


def test_auto_names_and_layout_are_caffes():
    data = L.Input(shape=dict(dim=[2, 3, 8, 8]))
    conv = L.Convolution(data, kernel_size=3, num_output=4)
    top = L.Softmax(L.InnerProduct(L.ReLU(conv, in_place=True), num_output=5))
    text = str(net_spec.to_proto(top))
    assert text == """layer {
  name: "Input1"
  type: "Input"
  top: "Input1"
  input_param {
    shape {
      dim: 2
      dim: 3
      dim: 8
      dim: 8
    }
  }
}
layer {
  name: "Convolution1"
  type: "Convolution"
  bottom: "Input1"
  top: "Convolution1"
  convolution_param {
    num_output: 4
    kernel_size: 3
  }
}
layer {
  name: "ReLU1"
  type: "ReLU"
  bottom: "Convolution1"
  top: "Convolution1"
}
layer {
  name: "InnerProduct1"
  type: "InnerProduct"
  bottom: "Convolution1"
  top: "InnerProduct1"
  inner_product_param {
    num_output: 5
  }
}
layer {
  name: "Softmax1"
  type: "Softmax"
  bottom: "InnerProduct1"
  top: "Softmax1"
}
"""
    assert str(top.to_proto()) == text


def test_netspec_names_ntop_and_params():
    n = caffe.NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[4, 6]), dict(dim=[4])],
                                  data_filler=[dict(type="gaussian", std=1), dict(type="constant")],
                                  ntop=2)
    n["ip"] = L.InnerProduct(n.data, num_output=3, param=[dict(lr_mult=1, decay_mult=1),
                                                         dict(lr_mult=2, decay_mult=0)],
                             loss_weight=0, propagate_down=[True])
    a, b = L.Slice(n.ip, slice_point=[1], axis=1, ntop=2)
    n.b = b
    n.silence = L.Silence(a, ntop=0)
    n.loss = L.SoftmaxWithLoss(n.ip, n.label, loss_param=dict(ignore_label=-1), loss_weight=2)
    proto = n.to_proto()
    layers = {l.name: l for l in proto.layer}
    # A layer takes its first top's name (here unnamed: Slice1); a layer without tops assigned
    # to the NetSpec takes the attribute's name.
    assert list(layers) == ["data", "ip", "Slice1", "silence", "loss"]
    assert list(layers["data"].top) == ["data", "label"]
    assert [list(s.dim) for s in layers["data"].dummy_data_param.shape] == [[4, 6], [4]]
    assert layers["data"].dummy_data_param.data_filler[0].std == 1
    ip = layers["ip"]
    assert [(p.lr_mult, p.decay_mult) for p in ip.param] == [(1, 1), (2, 0)]
    assert list(ip.loss_weight) == [0] and list(ip.propagate_down) == [True]
    # Slice tops: the one assigned is named, the other one gets the type counter.
    assert list(layers["Slice1"].top) == ["Slice1", "b"]
    assert list(layers["Slice1"].slice_param.slice_point) == [1]
    assert list(layers["silence"].bottom) == ["Slice1"] and not layers["silence"].top
    assert layers["loss"].loss_param.ignore_label == -1 and list(layers["loss"].loss_weight) == [2]
    assert n.keys() == ["data", "label", "ip", "b", "silence", "loss"]
    # It builds and runs.
    net = caffe.Net(proto, caffe.TRAIN)
    assert net.blobs["ip"].shape == (4, 3) and numpy.isfinite(float(net.forward()["loss"]))


def test_params_pseudo_module_and_layers_getattr():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
    assert caffe.params is net_spec.params and caffe.to_proto is net_spec.to_proto
    # caffe_engine.layers is the layer package; CamelCase names are NetSpec factories.
    from caffe_engine import layers
    assert layers.convolution.__name__ == "caffe_engine.layers.convolution"
    assert callable(layers.Convolution) and layers.Convolution.__name__ == "Convolution"
    with pytest.raises(AttributeError):
        layers.not_a_layer
    with pytest.raises(AttributeError):
        P.NoSuchThing


def test_mistakes_are_reported():
    with pytest.raises(TypeError, match="input 0 is not a Top"):
        L.ReLU("data")
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 2]))
    n.bad = L.InnerProduct(n.data, num_outputs=3)       # misspelt: no such field anywhere
    with pytest.raises(AttributeError):
        n.to_proto()
    with pytest.raises(AttributeError):
        n.missing


def test_scalar_for_repeated_field_and_tuple():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=(1, 1, 5, 5)))
    n.conv = L.Convolution(n.data, kernel_size=3, pad=(1,), num_output=1)
    layer = n.to_proto().layer[1]
    assert list(layer.convolution_param.kernel_size) == [3]
    assert list(layer.convolution_param.pad) == [1]
    assert list(n.to_proto().layer[0].input_param.shape[0].dim) == [1, 1, 5, 5]
