"""Fine-tuning a trained net on a new classifier layer (the idea of Caffe's 02-fine-tuning
notebook, on MNIST): the feature layers of HorizonRobotics' LeNet are copied from its caffemodel
and frozen (lr_mult 0), the last layer is replaced by a fresh one ('ip2_new') that is trained.

Checks: the copied layers equal the caffemodel (and stay equal while training), the new layer
starts from its filler and changes, and after a few iterations the fine-tuned net classifies
held-out digits nearly as well as the original.
"""
import os

import numpy as np

import caffe
from caffe import layers as L, params as P

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
LENET = os.path.join(SHARED, "realworld", "HorizonRobotics-Platform__ModelZoo", "Lenet")
WEIGHTS = os.path.join(LENET, "lenet_iter_100000.caffemodel")
MNIST = os.path.join(SHARED, "data", "mnist_5k")

frozen = [dict(lr_mult=0), dict(lr_mult=0)]
learned = [dict(lr_mult=1), dict(lr_mult=2)]


def lenet_finetune(source, batch_size, train=True):
    n = caffe.NetSpec()
    n.data, n.label = L.Data(source=source, batch_size=batch_size, backend=P.Data.LMDB,
                             transform_param=dict(scale=0.00390625), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, param=frozen)
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, param=frozen)
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, param=frozen)
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2_new = L.InnerProduct(n.relu1, num_output=10, param=learned,
                               weight_filler=dict(type="gaussian", std=0.01),
                               bias_filler=dict(type="constant", value=0))
    n.loss = L.SoftmaxWithLoss(n.ip2_new, n.label)
    if not train:
        n.acc = L.Accuracy(n.ip2_new, n.label)
    return n.to_proto()


with open("finetune_train.prototxt", "w") as f:
    f.write(str(lenet_finetune(os.path.join(MNIST, "mnist_train_lmdb"), 32)))
with open("finetune_test.prototxt", "w") as f:
    f.write(str(lenet_finetune(os.path.join(MNIST, "mnist_test_lmdb"), 100, train=False)))
with open("finetune_solver.prototxt", "w") as f:
    f.write('train_net: "finetune_train.prototxt"\ntest_net: "finetune_test.prototxt"\n'
            "test_iter: 2\ntest_interval: 1000\ntest_initialization: false\n"
            'base_lr: 0.01\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: 20\n'
            "random_seed: 7\nsnapshot_after_train: false\n")

caffe.set_mode_cpu()
solver = caffe.SGDSolver("finetune_solver.prototxt")
solver.net.copy_from(WEIGHTS)        # conv1, conv2, ip1 by name; 'ip2' has no counterpart

reference = caffe.Net(os.path.join(LENET, "lenet_train_test.prototxt"), caffe.TEST, weights=WEIGHTS)
for name in ("conv1", "conv2", "ip1"):
    for mine, theirs in zip(solver.net.params[name], reference.params[name]):
        np.testing.assert_array_equal(mine.data, theirs.data)
start = solver.net.params["ip2_new"][0].data.copy()
assert 0.005 < start.std() < 0.015            # the gaussian filler, not the caffemodel's ip2

solver.step(20)
losses = [float(solver.net.forward()["loss"]) for _ in range(3)]
print("train loss after 20 iterations:", np.mean(losses))
for name in ("conv1", "conv2", "ip1"):
    np.testing.assert_array_equal(solver.net.params[name][0].data, reference.params[name][0].data)
assert np.abs(solver.net.params["ip2_new"][0].data - start).max() > 1e-3

test_net = solver.test_nets[0]
test_net.share_with(solver.net)
reference.blobs["data"].reshape(100, 1, 28, 28)
reference.reshape()
accuracy, original = [], []
for _ in range(2):                   # 200 held-out digits: fine-tuned vs the original classifier
    accuracy.append(float(test_net.forward()["acc"]))
    scores = reference.forward(data=test_net.blobs["data"].data)["ip2"]
    original.append(float((scores.argmax(1) == test_net.blobs["label"].data).mean()))
print("accuracy on 200 test digits: fine-tuned %.3f, original %.3f" % (np.mean(accuracy), np.mean(original)))
assert np.mean(accuracy) > 0.9 and np.mean(accuracy) > np.mean(original) - 0.06, (accuracy, original)
assert np.mean(losses) < 0.5, losses
print("OK")
