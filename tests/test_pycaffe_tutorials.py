"""The classic pycaffe tutorial flows, written with ``import caffe`` as their notebooks are, run
against the engine and checked on numbers.

Each test follows one of BVLC Caffe's examples (the scripts are ours, in the tutorials' style):
- 00-classification.ipynb: a deploy net with its weights, images through caffe.io.Transformer;
  oracle: real Caffe's forward of the same net, weights and input (shared/realworld/reference).
- 01-learning-lenet.ipynb: LeNet written with NetSpec (L, P), SGDSolver stepping, the test net;
  oracles: the prototxt NetSpec writes, the loss falling and the test accuracy, and the same
  seed giving the same losses.
- net_surgery.ipynb: a classifier cast into a fully convolutional net by copying InnerProduct
  weights into convolutions; oracle: each cell of the score map equals the classifier's
  output on the input window under it.
- 02-fine-tuning.ipynb: a net with a new last layer initialised from a trained caffemodel,
  frozen lower layers, training on; oracles: copied layers equal the file's, frozen ones stay
  bit for bit, the new layer is the filler's.
- examples/pycaffe/layers/pyloss.py: a Euclidean loss written as a Python layer; oracle: the
  engine's own EuclideanLoss layer (itself checked against Caffe's golden cases).
"""
import textwrap

import numpy
import pytest

import caffe
from caffe import layers as L, params as P
from caffe.proto import caffe_pb2
from paths import SHARED

REALWORLD = SHARED / "realworld"
MNIST = SHARED / "data" / "mnist_5k"
CIFAR_DEPLOY = REALWORLD / "yuvval__nn_ex1/examples/cifar10/cifar10_full.prototxt"
CIFAR_WEIGHTS = REALWORLD / "yuvval__nn_ex1/examples/cifar10/cifar10_full_iter_70000.caffemodel"
CIFAR_MEAN = REALWORLD / "leetonfreestyle__DMSH/examples/cifar10/mean.binaryproto"
CIFAR_FORWARD = (REALWORLD / "reference/forward/yuvval__nn_ex1__examples__cifar10__cifar10_full"
                 "_iter_70000.caffemodel__cifar10_full.prototxt.TEST.npz")
LENET_WEIGHTS = REALWORLD / "Mounika1494__EYE-FOR-THE-BLIND/examples/mnist/lenet_iter_10000.caffemodel"


def test_import_caffe_is_the_engine():
    import caffe_engine
    assert caffe.Net is caffe_engine.Net and caffe.SGDSolver is caffe_engine.SGDSolver
    assert caffe.io is caffe_engine.io and caffe_pb2 is caffe_engine.proto.caffe_pb2
    assert caffe.TRAIN == caffe_pb2.TRAIN and caffe.TEST == caffe_pb2.TEST
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX


# -- 00-classification ------------------------------------------------------------------------
def test_classification_with_transformer_matches_caffe():
    ref = numpy.load(CIFAR_FORWARD)
    net = caffe.Net(str(CIFAR_DEPLOY), str(CIFAR_WEIGHTS), caffe.TEST)   # the notebook's order
    blob = caffe_pb2.BlobProto()
    blob.ParseFromString(CIFAR_MEAN.read_bytes())
    mean = caffe.io.blobproto_to_array(blob)[0]                         # (3, 32, 32)
    # The reference input is pixels - mean: the images a user would load, as load_image gives
    # them (H, W, K floats in [0, 1]).
    pixels = ref["input/data"] + mean
    assert numpy.allclose(pixels, numpy.round(pixels), atol=1e-3)
    images = [(p / 255.0).transpose(1, 2, 0) for p in numpy.round(pixels)]

    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    transformer.set_transpose("data", (2, 0, 1))
    transformer.set_mean("data", mean)
    transformer.set_raw_scale("data", 255)
    net.blobs["data"].reshape(2, 3, 32, 32)
    net.blobs["data"].data[...] = [transformer.preprocess("data", im) for im in images]
    numpy.testing.assert_allclose(net.blobs["data"].data, ref["input/data"], atol=1e-4)

    output = net.forward()
    numpy.testing.assert_allclose(output["prob"], ref["blob/prob"], rtol=1e-4, atol=1e-6)
    assert (output["prob"].argmax(1) == ref["blob/prob"].argmax(1)).all()
    # the notebook's deprocess for display gives the image back
    numpy.testing.assert_allclose(transformer.deprocess("data", net.blobs["data"].data[0]),
                                  images[0], atol=1e-5)


# -- 01-learning-lenet ------------------------------------------------------------------------
def lenet(lmdb, batch_size):
    """The notebook's NetSpec LeNet."""
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=str(lmdb),
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def write_lenet_solver(folder, seed=1701):
    (folder / "train.prototxt").write_text(str(lenet(MNIST / "mnist_train_lmdb", 64)))
    (folder / "test.prototxt").write_text(str(lenet(MNIST / "mnist_test_lmdb", 100)))
    solver = folder / "solver.prototxt"
    solver.write_text(textwrap.dedent(f"""\
        train_net: "{folder / 'train.prototxt'}"
        test_net: "{folder / 'test.prototxt'}"
        test_iter: 10
        test_interval: 100000
        base_lr: 0.01
        momentum: 0.9
        weight_decay: 0.0005
        lr_policy: "inv"
        gamma: 0.0001
        power: 0.75
        display: 0
        max_iter: 10000
        snapshot: 0
        snapshot_prefix: "{folder / 'lenet'}"
        random_seed: {seed}
        solver_mode: CPU
        """))
    return str(solver)


def test_netspec_lenet_trains_with_solver_stepping(tmp_path):
    solver_path = write_lenet_solver(tmp_path)
    text = (tmp_path / "train.prototxt").read_text()
    net_param = caffe_pb2.NetParameter()
    from google.protobuf import text_format
    text_format.Merge(text, net_param)
    assert [layer.type for layer in net_param.layer] == [
        "Data", "Convolution", "Pooling", "Convolution", "Pooling", "InnerProduct", "ReLU",
        "InnerProduct", "SoftmaxWithLoss"]
    assert net_param.layer[0].data_param.backend == caffe_pb2.DataParameter.LMDB
    assert net_param.layer[6].top == net_param.layer[6].bottom == ["fc1"]   # in_place

    solver = caffe.SGDSolver(solver_path)
    assert [(k, v.data.shape) for k, v in solver.net.blobs.items()][:2] == [
        ("data", (64, 1, 28, 28)), ("label", (64,))]
    assert [(k, v[0].data.shape) for k, v in solver.net.params.items()] == [
        ("conv1", (20, 1, 5, 5)), ("conv2", (50, 20, 5, 5)), ("fc1", (500, 800)), ("score", (10, 500))]
    solver.net.forward()
    solver.test_nets[0].forward()
    first_loss = float(solver.net.blobs["loss"].data)
    assert 2.0 < first_loss < 2.6                     # ln(10) = 2.30 at xavier initialisation
    solver.step(1)
    assert numpy.abs(solver.net.params["conv1"][0].diff).max() > 0

    losses, accuracies = [], []
    for it in range(60):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
        if it % 30 == 29:
            correct = 0
            for _ in range(5):
                solver.test_nets[0].forward()
                scores = solver.test_nets[0].blobs["score"].data
                correct += (scores.argmax(1) == solver.test_nets[0].blobs["label"].data).sum()
            accuracies.append(correct / 500)
    assert numpy.mean(losses[-10:]) < 0.5 < first_loss
    assert accuracies[-1] > 0.8

    again = caffe.SGDSolver(write_lenet_solver(tmp_path))     # same seed: same numbers
    again.net.forward()                                       # the same batches consumed
    again.step(1)
    replay = []
    for _ in range(60):
        again.step(1)
        replay.append(float(again.net.blobs["loss"].data))
    assert replay == losses


# -- net surgery ------------------------------------------------------------------------------
LENET_DEPLOY = """
name: "LeNet"
input: "data"
input_shape { dim: 2 dim: 1 dim: %d dim: %d }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 20 kernel_size: 5 } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 50 kernel_size: 5 } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
%s
"""
CLASSIFIER_TAIL = """
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 500 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 10 } }
"""
FULL_CONV_TAIL = """
layer { name: "ip1-conv" type: "Convolution" bottom: "pool2" top: "ip1-conv"
        convolution_param { num_output: 500 kernel_size: 4 } }
layer { name: "relu1" type: "ReLU" bottom: "ip1-conv" top: "ip1-conv" }
layer { name: "ip2-conv" type: "Convolution" bottom: "ip1-conv" top: "ip2-conv"
        convolution_param { num_output: 10 kernel_size: 1 } }
"""


def test_net_surgery_casts_the_classifier_into_a_fully_convolutional_net(tmp_path):
    (tmp_path / "deploy.prototxt").write_text(LENET_DEPLOY % (28, 28, CLASSIFIER_TAIL))
    (tmp_path / "full_conv.prototxt").write_text(LENET_DEPLOY % (36, 36, FULL_CONV_TAIL))
    net = caffe.Net(str(tmp_path / "deploy.prototxt"), str(LENET_WEIGHTS), caffe.TEST)
    params = ["ip1", "ip2"]
    fc_params = {pr: (net.params[pr][0].data, net.params[pr][1].data) for pr in params}
    assert fc_params["ip1"][0].shape == (500, 800)

    net_full_conv = caffe.Net(str(tmp_path / "full_conv.prototxt"), str(LENET_WEIGHTS), caffe.TEST)
    params_full_conv = ["ip1-conv", "ip2-conv"]
    assert net_full_conv.params["ip1-conv"][0].data.shape == (500, 50, 4, 4)
    for pr, pr_conv in zip(params, params_full_conv):
        net_full_conv.params[pr_conv][0].data.flat = fc_params[pr][0].flat   # flat unrolled
        net_full_conv.params[pr_conv][1].data[...] = fc_params[pr][1]
    net_full_conv.save(str(tmp_path / "lenet_full_conv.caffemodel"))

    rng = numpy.random.RandomState(0)
    image = rng.rand(2, 1, 36, 36).astype(numpy.float32)
    net_full_conv.blobs["data"].data[...] = image
    score_map = net_full_conv.forward()["ip2-conv"]
    assert score_map.shape == (2, 10, 3, 3)                  # stride 4: windows at 0, 4, 8
    for i in range(3):
        for j in range(3):
            net.blobs["data"].data[...] = image[:, :, 4 * i:4 * i + 28, 4 * j:4 * j + 28]
            numpy.testing.assert_allclose(score_map[:, :, i, j], net.forward()["ip2"],
                                          rtol=1e-4, atol=1e-4)
    reloaded = caffe.Net(str(tmp_path / "full_conv.prototxt"),
                         str(tmp_path / "lenet_full_conv.caffemodel"), caffe.TEST)
    assert numpy.array_equal(reloaded.params["ip1-conv"][0].data,
                             net_full_conv.params["ip1-conv"][0].data)


# -- 02-fine-tuning ---------------------------------------------------------------------------
def finetune_net(lmdb, new_classes, learn_all=False):
    """LeNet with a new, renamed last layer (the notebook's style: frozen lower layers unless
    learn_all)."""
    frozen = [dict(lr_mult=1), dict(lr_mult=2)] if learn_all else [dict(lr_mult=0), dict(lr_mult=0)]
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=64, backend=P.Data.LMDB, source=str(lmdb),
                             transform_param=dict(scale=0.00390625), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, param=frozen)
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, param=frozen)
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, param=frozen)
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.score_new = L.InnerProduct(n.relu1, num_output=new_classes,
                                 weight_filler=dict(type="gaussian", std=0.01),
                                 param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.loss = L.SoftmaxWithLoss(n.score_new, n.label)
    return n.to_proto()


def test_finetuning_copies_trained_layers_by_name_and_keeps_frozen_ones(tmp_path):
    (tmp_path / "train.prototxt").write_text(str(finetune_net(MNIST / "mnist_train_lmdb", 10)))
    solver_path = tmp_path / "solver.prototxt"
    solver_path.write_text(f'train_net: "{tmp_path / "train.prototxt"}"\nbase_lr: 0.01\n'
                           f'momentum: 0.9\nlr_policy: "fixed"\ndisplay: 0\nmax_iter: 100\n'
                           f'snapshot: 0\nsnapshot_prefix: "{tmp_path / "ft"}"\nrandom_seed: 7\n')
    pretrained = caffe.Net(str(tmp_path / "train.prototxt"), caffe.TEST, weights=str(LENET_WEIGHTS))
    scratch = caffe.get_solver(str(solver_path))
    solver = caffe.get_solver(str(solver_path))
    solver.net.copy_from(str(LENET_WEIGHTS))                 # the notebook's copy_from
    for name in ("conv1", "conv2", "ip1"):
        for got, want in zip(solver.net.params[name], pretrained.params[name]):
            assert numpy.array_equal(got.data, want.data)
    # the new layer is not in the file: it keeps its gaussian filler values
    assert numpy.array_equal(solver.net.params["score_new"][0].data,
                             scratch.net.params["score_new"][0].data)
    assert 0 < solver.net.params["score_new"][0].data.std() < 0.02
    frozen = {name: solver.net.params[name][0].data.copy() for name in ("conv1", "conv2", "ip1")}
    new_before = solver.net.params["score_new"][0].data.copy()

    losses, scratch_losses = [], []
    for _ in range(20):
        solver.step(1)
        scratch.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
        scratch_losses.append(float(scratch.net.blobs["loss"].data))
    for name, weights in frozen.items():
        assert numpy.array_equal(solver.net.params[name][0].data, weights)   # lr_mult 0
    assert not numpy.array_equal(solver.net.params["score_new"][0].data, new_before)
    # pretrained features: only the new classifier learns, and it learns faster than the same
    # net from random lower layers
    assert numpy.mean(losses[-5:]) < 0.5 * numpy.mean(scratch_losses[-5:])


# -- pyloss.py --------------------------------------------------------------------------------
PYLOSS = '''
import caffe
import numpy as np


class EuclideanLossLayer(caffe.Layer):
    """Compute the Euclidean Loss in the same manner as the C++ EuclideanLossLayer
    to demonstrate the class interface for developing layers in Python."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")
        self.scale = float(self.param_str or 1)

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff**2) / bottom[0].num / 2.

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            sign = 1 if i == 0 else -1
            bottom[i].diff[...] = sign * self.diff / bottom[i].num
'''


def euclidean_net(python):
    n = caffe.NetSpec()
    n.data, n.label = L.Input(shape=[dict(dim=[10, 3, 4, 5]), dict(dim=[10, 3, 4, 5])], ntop=2)
    n.ip = L.InnerProduct(n.data, num_output=60, weight_filler=dict(type="xavier"))
    n.flat = L.Flatten(n.label)
    if python:
        n.loss = L.Python(n.ip, n.flat, module="pyloss", layer="EuclideanLossLayer", loss_weight=1)
    else:
        n.loss = L.EuclideanLoss(n.ip, n.flat)
    return n.to_proto()


def test_python_loss_layer_equals_caffes_euclidean_loss(tmp_path, monkeypatch):
    (tmp_path / "pyloss.py").write_text(PYLOSS)
    monkeypatch.syspath_prepend(str(tmp_path))
    nets = {}
    for python in (True, False):
        path = tmp_path / f"net_{python}.prototxt"
        path.write_text("force_backward: true\n" + str(euclidean_net(python)))
        caffe.set_random_seed(5)
        nets[python] = caffe.Net(str(path), caffe.TRAIN)
    py, native = nets[True], nets[False]
    assert type(py.layers[list(py._layer_names).index("loss")]).__name__ == "PythonLayer"
    assert numpy.array_equal(py.params["ip"][0].data, native.params["ip"][0].data)
    rng = numpy.random.RandomState(0)
    inputs = {name: rng.randn(10, 3, 4, 5).astype(numpy.float32) for name in ("data", "label")}
    loss_py, loss_native = py.forward(**inputs)["loss"], native.forward(**inputs)["loss"]
    numpy.testing.assert_allclose(loss_py, loss_native, rtol=1e-5)
    assert loss_native > 1
    py.backward()
    native.backward()
    numpy.testing.assert_allclose(py.params["ip"][0].diff, native.params["ip"][0].diff,
                                  rtol=1e-4, atol=1e-6)
    numpy.testing.assert_allclose(py.blobs["data"].diff, native.blobs["data"].diff,
                                  rtol=1e-4, atol=1e-6)
