"""Net surgery, as Caffe's net_surgery notebook: edit parameters by hand, then cast a classifier
into a fully convolutional net that scores every window of a larger image.

1. Designer filters: LeNet's first convolution gets hand-made 5x5 filters (a delta, a Sobel
   edge filter, a box blur); its output must equal a correlation computed with NumPy.
2. Fully convolutional LeNet: the inner-product layers ip1 (800 -> 500) and ip2 (500 -> 10)
   become convolutions of kernel 4 and 1; their weights are copied over with ``.flat``. On an
   image of two digits side by side (28 x 56) the net outputs an 1 x 8 map of class scores, whose
   first and last columns are the original classifier's scores for each digit.
"""
import os

import lmdb
import numpy as np

import caffe

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
LENET = os.path.join(SHARED, "realworld", "HorizonRobotics-Platform__ModelZoo", "Lenet")
MODEL = os.path.join(LENET, "lenet_train_test.prototxt")
WEIGHTS = os.path.join(LENET, "lenet_iter_100000.caffemodel")

env = lmdb.open(os.path.join(SHARED, "data", "mnist_5k", "mnist_test_lmdb"), readonly=True, lock=False)
with env.begin() as txn:
    cursor = txn.cursor()
    digits = []
    for _, value in cursor:
        datum = caffe.proto.caffe_pb2.Datum.FromString(value)
        digits.append((caffe.io.datum_to_array(datum)[0] / 256.0).astype(np.float32))
        if len(digits) == 2:
            break
env.close()

# -- 1. designer filters ----------------------------------------------------------------------
caffe.set_mode_cpu()
net = caffe.Net(MODEL, caffe.TEST, weights=WEIGHTS)
print("conv1 weights", net.params["conv1"][0].data.shape)
filters = np.zeros((20, 1, 5, 5), np.float32)
filters[0, 0, 2, 2] = 1                                          # delta: copies the input
filters[1, 0, 1:4, 1:4] = [[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]]   # Sobel, vertical edges
filters[2, 0] = 1.0 / 25                                         # box blur
net.params["conv1"][0].data[...] = filters
net.params["conv1"][1].data[...] = 0
net.blobs["data"].data[0, 0] = digits[0]
net.forward(end="conv1")
windows = np.lib.stride_tricks.sliding_window_view(digits[0], (5, 5))    # (24, 24, 5, 5)
expected = np.einsum("yxij,kij->kyx", windows, filters[:, 0])
np.testing.assert_allclose(net.blobs["conv1"].data[0], expected, atol=1e-5)
np.testing.assert_allclose(net.blobs["conv1"].data[0, 0], digits[0][2:26, 2:26], atol=1e-6)
print("designer filters: conv1 output matches NumPy")

# -- 2. fully convolutional LeNet ---------------------------------------------------------------
net = caffe.Net(MODEL, caffe.TEST, weights=WEIGHTS)
params = ["ip1", "ip2"]
fc_params = {pr: (net.params[pr][0].data, net.params[pr][1].data) for pr in params}
for fc in params:
    print("{} weights are {} dimensional and biases are {} dimensional".format(
        fc, fc_params[fc][0].shape, fc_params[fc][1].shape))

with open(MODEL) as f:
    text = f.read()
# Same net with ip1 / ip2 as convolutions, on a 28 x 56 input.
text = text.replace("dim: 28\n}", "dim: 56\n}", 1)
for old, new, kernel in (("ip1", "ip1-conv", 4), ("ip2", "ip2-conv", 1)):
    text = text.replace('name: "%s"\n  type: "InnerProduct"' % old, 'name: "%s"\n  type: "Convolution"' % new)
    text = text.replace('top: "%s"\n' % old, 'top: "%s"\n' % new)
    text = text.replace('bottom: "%s"\n' % old, 'bottom: "%s"\n' % new)
    start = text.index('name: "%s"' % new)
    block = text.index("inner_product_param {", start)
    text = text[:block] + "convolution_param {\n    kernel_size: %d" % kernel + text[block + len("inner_product_param {"):]
with open("lenet_full_conv.prototxt", "w") as f:
    f.write(text)

net_full_conv = caffe.Net("lenet_full_conv.prototxt", WEIGHTS, caffe.TEST)   # conv1, conv2 copied
params_full_conv = ["ip1-conv", "ip2-conv"]
conv_params = {pr: (net_full_conv.params[pr][0].data, net_full_conv.params[pr][1].data)
               for pr in params_full_conv}
for conv in params_full_conv:
    print("{} weights are {} dimensional and biases are {} dimensional".format(
        conv, conv_params[conv][0].shape, conv_params[conv][1].shape))
for pr, pr_conv in zip(params, params_full_conv):
    conv_params[pr_conv][0].flat = fc_params[pr][0].flat    # flat unrolls the arrays
    conv_params[pr_conv][1][...] = fc_params[pr][1]
net_full_conv.save("lenet_full_conv.caffemodel")

both = np.concatenate(digits, axis=1)                        # 28 x 56: two digits side by side
out = net_full_conv.forward(data=both[None, None])
scores = out["ip2-conv"][0]
print("score map", scores.shape, "argmax per window", scores.argmax(0))
assert scores.shape == (10, 1, 8)

single = net.forward(data=digits[0][None, None])["ip2"][0].copy()
np.testing.assert_allclose(scores[:, 0, 0], single, rtol=1e-4, atol=1e-4)
single = net.forward(data=digits[1][None, None])["ip2"][0].copy()
np.testing.assert_allclose(scores[:, 0, 7], single, rtol=1e-4, atol=1e-4)

# The saved surgery reloads into the fully convolutional net.
again = caffe.Net("lenet_full_conv.prototxt", caffe.TEST, weights="lenet_full_conv.caffemodel")
np.testing.assert_array_equal(again.params["ip1-conv"][0].data, conv_params["ip1-conv"][0])
print("OK: the fully convolutional net scores both windows as the classifier does")
