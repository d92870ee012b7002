"""Layers written in Python (type "Python", pycaffe's caffe.Layer), as Caffe's pyloss example.

A regression net ends in two Python layers from pylayers.py: a learned scalar scale and a
Euclidean loss. It must compute what the same net with Caffe's built-in Scale and EuclideanLoss
computes (loss, every gradient), pass a finite-difference gradient check, and train with
caffe.SGDSolver: the Python layer's own parameter is learned.
"""

import numpy as np

import caffe

NET = """name: "regression"
force_backward: true
layer { name: "input" type: "Input" top: "data" top: "target"
        input_param { shape { dim: 8 dim: 5 } shape { dim: 8 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "constant" value: 0.1 } } }
%s
"""
PYTHON_HEAD = """
layer { name: "scale" type: "Python" bottom: "ip" top: "scaled"
        python_param { module: "pylayers" layer: "LearnedScale" param_str: "{'init': 2.0}" } }
layer { name: "loss" type: "Python" bottom: "scaled" bottom: "target" top: "loss"
        python_param { module: "pylayers" layer: "EuclideanLossLayer" } loss_weight: 1 }
"""
BUILTIN_HEAD = """
layer { name: "scale" type: "Scale" bottom: "ip" top: "scaled"
        scale_param { axis: 0 num_axes: 0 filler { type: "constant" value: 2.0 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "scaled" bottom: "target" top: "loss" }
"""
with open("python_net.prototxt", "w") as f:
    f.write(NET % PYTHON_HEAD)
with open("builtin_net.prototxt", "w") as f:
    f.write(NET % BUILTIN_HEAD)

rs = np.random.RandomState(0)
data = rs.randn(8, 5).astype(np.float32)
target = rs.randn(8, 3).astype(np.float32)

caffe.set_mode_cpu()
caffe.set_random_seed(5)
python_net = caffe.Net("python_net.prototxt", caffe.TRAIN)
caffe.set_random_seed(5)
builtin_net = caffe.Net("builtin_net.prototxt", caffe.TRAIN)
print("layer types:", [layer.type for layer in python_net.layers])
assert [layer.type for layer in python_net.layers] == ["Input", "InnerProduct", "Python", "Python"]
np.testing.assert_array_equal(python_net.params["ip"][0].data, builtin_net.params["ip"][0].data)
assert python_net.params["scale"][0].data.shape == (1,)
assert python_net.blob_loss_weights["loss"] == 1

for net in (python_net, builtin_net):
    net.forward(data=data, target=target)
    net.backward()
loss = float(python_net.blobs["loss"].data[0])
print("loss: python %.6f, built-in %.6f" % (loss, float(builtin_net.blobs["loss"].data)))
np.testing.assert_allclose(loss, builtin_net.blobs["loss"].data, rtol=1e-6)
for name in ("data", "ip", "scaled"):
    np.testing.assert_allclose(python_net.blobs[name].diff, builtin_net.blobs[name].diff,
                               rtol=1e-5, atol=1e-7)
for mine, theirs in zip(python_net.params["ip"], builtin_net.params["ip"]):
    np.testing.assert_allclose(mine.diff, theirs.diff, rtol=1e-5, atol=1e-7)
np.testing.assert_allclose(python_net.params["scale"][0].diff[0], builtin_net.params["scale"][0].diff,
                           rtol=1e-5)

# Finite differences (float64 arithmetic on float32 nets: a coarse step).
analytic = python_net.blobs["data"].diff.copy()
step = 1e-2
for index in [(0, 0), (3, 2), (7, 4)]:
    probe = data.copy()
    probe[index] += step
    up = float(python_net.forward(data=probe, target=target)["loss"][0])
    probe[index] -= 2 * step
    down = float(python_net.forward(data=probe, target=target)["loss"][0])
    numeric = (up - down) / (2 * step)
    assert abs(numeric - analytic[index]) < 1e-3 * max(1.0, abs(numeric)), (index, numeric, analytic[index])

# Training: the Python layer's scalar is a learnable parameter like any other.
with open("python_solver.prototxt", "w") as f:
    f.write('net: "python_net.prototxt"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\n'
            "max_iter: 100\nrandom_seed: 5\nsnapshot_after_train: false\n")
solver = caffe.SGDSolver("python_solver.prototxt")
solver.net.blobs["data"].data[...] = data
solver.net.blobs["target"].data[...] = target
solver.step(1)
first = float(solver.net.blobs["loss"].data[0])
solver.step(60)
last = float(solver.net.blobs["loss"].data[0])
learned_scale = float(solver.net.params["scale"][0].data[0])
print("training loss %.4f -> %.4f, learned scale %.4f" % (first, last, learned_scale))
assert last < 0.5 * first and learned_scale != 2.0
print("OK")
