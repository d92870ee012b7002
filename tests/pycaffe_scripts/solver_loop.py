"""Training driven from Python, one solver.step(1) at a time, reading the nets' blobs as it goes
(the loop of Caffe's 01-learning-lenet notebook).

The nets are plain prototxt (the repository's LeNet with its data sources pointed at the MNIST
LMDBs); the solver is caffe.SGDSolver(path). Every iteration records the train loss from
net.blobs['loss'] and the test net's scores on its first batch (forward(start='conv1'): the
data layer is not advanced); every 4 iterations the test accuracy is computed by hand.
"""
import os

import numpy as np

import caffe

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(HERE, "..", "..", "..", "shared")
MNIST = os.path.join(SHARED, "data", "mnist_5k")
MODEL = os.path.join(HERE, "..", "..", "models", "lenet", "lenet_train_test.prototxt")

with open(MODEL) as f:
    net_text = f.read()
net_text = (net_text.replace("data/mnist/mnist_train_lmdb", os.path.join(MNIST, "mnist_train_lmdb"))
            .replace("data/mnist/mnist_test_lmdb", os.path.join(MNIST, "mnist_test_lmdb"))
            .replace("batch_size: 64", "batch_size: 32").replace("batch_size: 100", "batch_size: 25"))
with open("lenet_train_test.prototxt", "w") as f:
    f.write(net_text)
with open("lenet_solver.prototxt", "w") as f:
    f.write('net: "lenet_train_test.prototxt"\n'
            "test_iter: 4\ntest_interval: 100000\ntest_initialization: false\n"
            'base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\n'
            "gamma: 0.0001\npower: 0.75\nmax_iter: 1000\nrandom_seed: 1701\n"
            "snapshot_after_train: false\nsolver_mode: CPU\n")

caffe.set_mode_cpu()
solver = caffe.SGDSolver("lenet_solver.prototxt")
test_net = solver.test_nets[0]

niter = 16
test_interval = 4
train_loss = np.zeros(niter)
test_acc = []
output = np.zeros((niter, 8, 10))

for it in range(niter):
    solver.step(1)  # SGD by Caffe
    train_loss[it] = solver.net.blobs["loss"].data
    # the test net shares the solver's weights only when the solver tests, so share them here
    test_net.share_with(solver.net)
    test_net.forward(start="conv1")
    output[it] = test_net.blobs["ip2"].data[:8]
    if it % test_interval == 0 or it == niter - 1:
        correct = 0
        for test_it in range(4):
            test_net.forward()
            correct += sum(test_net.blobs["ip2"].data.argmax(1) == test_net.blobs["label"].data)
        test_acc.append(correct / 100.0)
        print("iteration %d: train loss %.4f, test accuracy %.3f" % (it, train_loss[it], test_acc[-1]))

assert solver.iter == niter
assert abs(train_loss[0] - np.log(10)) < 0.3, train_loss[0]
assert train_loss[-3:].mean() < 0.75 * train_loss[:3].mean(), train_loss
assert test_acc[-1] > 0.4 and test_acc[-1] > test_acc[0] + 0.25, test_acc
# The test net's scores on one fixed batch sharpen: the top score's margin grows.
margin = np.sort(output[:, :, :], axis=2)
assert (margin[-1, :, -1] - margin[-1, :, -2]).mean() > (margin[0, :, -1] - margin[0, :, -2]).mean()
# The weights the solver trained are the ones the train net holds.
assert np.abs(solver.net.params["conv1"][0].data).sum() > 0
print("OK")
