"""A solver written in Python: momentum SGD with weight decay and a step learning rate, run by
hand with net.forward / net.backward / net.params, with a hand-made test pass every 10
iterations (test net sharing the weights, accuracy counted from its scores).

The same MLP is trained by caffe.SGDSolver from the same seed: both runs start from the same
weights, read the same batches and follow Caffe's update order (clear diffs; forward, backward;
diff += decay * w; h = lr * diff + momentum * h; w -= h), so their losses and weights must agree.
"""
import os

import numpy as np
from google.protobuf import text_format

import caffe

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
MNIST = os.path.join(SHARED, "data", "mnist_5k")


def mlp(source, batch_size, test=False):
    return """name: "mlp"
layer { name: "mnist" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "%s" batch_size: %d backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 64 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
%s""" % (source, batch_size, 'layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }'
         if test else "")


with open("mlp_train.prototxt", "w") as f:
    f.write(mlp(os.path.join(MNIST, "mnist_train_lmdb"), 32))
with open("mlp_test.prototxt", "w") as f:
    f.write(mlp(os.path.join(MNIST, "mnist_test_lmdb"), 100, test=True))
base_lr, momentum, weight_decay, gamma, stepsize, niter, seed = 0.05, 0.9, 5e-4, 0.5, 10, 30, 11
with open("mlp_solver.prototxt", "w") as f:
    f.write('train_net: "mlp_train.prototxt"\ntest_net: "mlp_test.prototxt"\ntest_iter: 2\n'
            "test_interval: 10\ntest_initialization: false\nbase_lr: %g\nmomentum: %g\n"
            'weight_decay: %g\nlr_policy: "step"\ngamma: %g\nstepsize: %d\nmax_iter: %d\n'
            "random_seed: %d\nsnapshot_after_train: false\n"
            % (base_lr, momentum, weight_decay, gamma, stepsize, niter, seed))

caffe.set_mode_cpu()

# -- Caffe's solver ---------------------------------------------------------------------------
solver = caffe.SGDSolver("mlp_solver.prototxt")
solver_losses = []
for it in range(niter):
    solver.step(1)
    solver_losses.append(float(solver.net.blobs["loss"].data))

# -- the same, by hand ------------------------------------------------------------------------
caffe.set_random_seed(seed)             # what the solver does first with random_seed
net = caffe.Net("mlp_train.prototxt", caffe.TRAIN)
test_net = caffe.Net("mlp_test.prototxt", caffe.TEST)
spec = caffe.proto.caffe_pb2.NetParameter()
with open("mlp_train.prototxt") as f:
    text_format.Merge(f.read(), spec)
mults = {layer.name: [(p.lr_mult, p.decay_mult) for p in layer.param] for layer in spec.layer}
history = {name: [np.zeros_like(blob.data) for blob in blobs] for name, blobs in net.params.items()}

f32 = np.float32
losses, accuracies = [], []
for it in range(niter):
    net.clear_param_diffs()
    loss = net.forward()["loss"]
    net.backward()
    losses.append(float(loss))
    rate = f32(base_lr) * f32(gamma) ** (it // stepsize)
    for name, blobs in net.params.items():
        for k, blob in enumerate(blobs):
            lr_mult, decay_mult = mults[name][k]
            decay = f32(weight_decay) * f32(decay_mult)
            if decay:
                blob.diff[...] += blob.data * decay
            h = history[name][k]
            h *= f32(momentum)
            h += blob.diff * (rate * f32(lr_mult))
            blob.data[...] -= h
    if (it + 1) % 10 == 0:              # manual test: share the weights, count correct answers
        test_net.share_with(net)
        correct = 0
        for _ in range(2):
            out = test_net.forward()
            correct += int((test_net.blobs["ip2"].data.argmax(1) == test_net.blobs["label"].data).sum())
        accuracies.append(correct / 200.0)
        print("iteration %d: loss %.4f, test accuracy %.3f (Accuracy layer: %.3f)"
              % (it + 1, losses[-1], accuracies[-1], float(out["acc"])))

print("first losses, solver:", np.round(solver_losses[:4], 5), "by hand:", np.round(losses[:4], 5))
np.testing.assert_allclose(losses, solver_losses, rtol=1e-4, atol=1e-5)
for name in net.params:
    for mine, theirs in zip(net.params[name], solver.net.params[name]):
        np.testing.assert_allclose(mine.data, theirs.data, rtol=1e-3, atol=1e-5)
assert losses[-1] < 0.6 * losses[0]
assert accuracies[-1] > 0.75 and accuracies[-1] >= accuracies[0], accuracies
print("OK")
