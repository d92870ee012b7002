"""LeNet written with NetSpec and trained on MNIST, as Caffe's 01-learning-lenet notebook.

The net is built in Python (caffe.layers / caffe.params), written as train and test prototxts,
the solver is a SolverParameter message written as text, and training runs through
caffe.get_solver. Checks: the generated prototxt has the notebook's layers and names, the loss
at the start is about ln(10), training lowers it, and the test net (which shares the trained
weights) classifies held-out digits far better than chance.
"""
import os

import numpy as np
from google.protobuf import text_format

import caffe
from caffe import layers as L, params as P

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
MNIST = os.path.join(SHARED, "data", "mnist_5k")


def lenet(lmdb, batch_size):
    # our version of LeNet: a series of linear and simple nonlinear transformations
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=lmdb,
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


with open("lenet_auto_train.prototxt", "w") as f:
    f.write(str(lenet(os.path.join(MNIST, "mnist_train_lmdb"), 32)))
with open("lenet_auto_test.prototxt", "w") as f:
    f.write(str(lenet(os.path.join(MNIST, "mnist_test_lmdb"), 100)))

proto = caffe.proto.caffe_pb2.NetParameter()
with open("lenet_auto_train.prototxt") as f:
    text_format.Merge(f.read(), proto)
assert [l.name for l in proto.layer] == ["data", "conv1", "pool1", "conv2", "pool2", "fc1",
                                         "relu1", "score", "loss"]
assert list(proto.layer[6].top) == ["fc1"] and proto.layer[0].transform_param.scale == np.float32(1 / 255.)

s = caffe.proto.caffe_pb2.SolverParameter()
s.train_net = "lenet_auto_train.prototxt"
s.test_net.append("lenet_auto_test.prototxt")
s.test_interval = 10000          # we test by hand below
s.test_iter.append(2)
s.test_initialization = False
s.base_lr = 0.01
s.momentum = 0.9
s.weight_decay = 5e-4
s.lr_policy = "inv"
s.gamma = 1e-4
s.power = 0.75
s.max_iter = 20
s.display = 5
s.random_seed = 1701
s.snapshot_prefix = "lenet"
with open("lenet_auto_solver.prototxt", "w") as f:
    f.write(str(s))

caffe.set_device(0)
caffe.set_mode_cpu()
solver = caffe.get_solver("lenet_auto_solver.prototxt")
print([(k, v.data.shape) for k, v in solver.net.blobs.items()])
print([(k, v[0].data.shape) for k, v in solver.net.params.items()])

solver.net.forward()        # train net
solver.test_nets[0].forward()  # test net (there can be more than one)
first_loss = float(solver.net.blobs["loss"].data)
print("initial loss", first_loss)
assert abs(first_loss - np.log(10)) < 0.3, first_loss

solver.solve()              # max_iter = 20 iterations, then a snapshot
assert solver.iter == 20
assert os.path.exists("lenet_iter_20.caffemodel") and os.path.exists("lenet_iter_20.solverstate")

losses = []
for _ in range(3):
    losses.append(float(solver.net.forward()["loss"]))
print("loss after 20 iterations", np.mean(losses))
assert np.mean(losses) < 0.6 * first_loss, losses

test_net = solver.test_nets[0]
test_net.share_with(solver.net)
correct = 0
for test_it in range(2):
    test_net.forward()
    correct += int((test_net.blobs["score"].data.argmax(1) == test_net.blobs["label"].data).sum())
accuracy = correct / 200.0
print("test accuracy", accuracy)
assert accuracy > 0.5, accuracy
print("OK")
