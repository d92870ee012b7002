"""Classifying an image with a trained CIFAR-10 net: deploy prototxt, caffemodel, mean image,
caffe.io.Transformer (as Caffe's 00-classification notebook does for CaffeNet).

The image is the one BVLC Caffe classified for the reference outputs in
shared/realworld/reference/forward (its pixels are the stored input plus the mean), written to
a PNG and read back with caffe.io.load_image, so the whole Python pipeline runs: load ->
transpose -> [0, 255] -> minus mean -> forward. The class probabilities must be
Caffe's.
"""
import os

import numpy as np
from PIL import Image

import caffe

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
ZOO = os.path.join(SHARED, "realworld")
CIFAR = os.path.join(ZOO, "yuvval__nn_ex1", "examples", "cifar10")
REFERENCE = os.path.join(ZOO, "reference", "forward",
                         "yuvval__nn_ex1__examples__cifar10__cifar10_full_iter_70000.caffemodel"
                         "__cifar10_full.prototxt.TEST.npz")
MEAN_FILE = os.path.join(ZOO, "leetonfreestyle__DMSH", "examples", "cifar10", "mean.binaryproto")
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

caffe.set_mode_cpu()
net = caffe.Net(os.path.join(CIFAR, "cifar10_full.prototxt"),
                os.path.join(CIFAR, "cifar10_full_iter_70000.caffemodel"), caffe.TEST)
print([(name, blob.data.shape) for name, blob in net.blobs.items()])
print([(name, params[0].data.shape, params[1].data.shape) for name, params in net.params.items()])

# The mean image, as a pycaffe user reads a .binaryproto.
blob = caffe.proto.caffe_pb2.BlobProto()
with open(MEAN_FILE, "rb") as f:
    blob.ParseFromString(f.read())
mean = caffe.io.blobproto_to_array(blob)[0]          # (3, 32, 32)
# Caffe's CIFAR-10 LMDBs (convert_cifar_data) keep the dataset's RGB order: no channel swap.
print("mean per channel (RGB):", mean.mean(1).mean(1))

transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
transformer.set_transpose("data", (2, 0, 1))        # H x W x C -> C x H x W
transformer.set_raw_scale("data", 255)              # [0, 1] -> [0, 255]
transformer.set_mean("data", mean)

reference = np.load(REFERENCE)
caffe_input = reference["input/data"]               # what Caffe was fed: pixels - mean
caffe_prob = reference["blob/prob"]
net.blobs["data"].reshape(*caffe_input.shape)       # two images
net.reshape()

for i in range(len(caffe_input)):
    pixels = np.round(caffe_input[i] + mean).astype(np.uint8)      # C x H x W, RGB
    Image.fromarray(pixels.transpose(1, 2, 0)).save("image%d.png" % i)
    image = caffe.io.load_image("image%d.png" % i)
    assert image.shape == (32, 32, 3) and image.dtype == np.float32 and image.max() <= 1
    net.blobs["data"].data[i, ...] = transformer.preprocess("data", image)

np.testing.assert_allclose(net.blobs["data"].data, caffe_input, atol=2e-4)
output = net.forward()
prob = output["prob"]
for i in range(len(prob)):
    top = prob[i].argsort()[::-1][:3]
    print("image %d:" % i, [(LABELS[k], round(float(prob[i, k]), 4)) for k in top])
np.testing.assert_allclose(prob, caffe_prob, rtol=1e-4, atol=1e-5)
assert (prob.argmax(1) == caffe_prob.argmax(1)).all()

# deprocess inverts preprocess (back to the [0, 1] RGB image).
back = transformer.deprocess("data", net.blobs["data"].data[0])
np.testing.assert_allclose(back, caffe.io.load_image("image0.png"), atol=1e-5)
print("OK: probabilities match BVLC Caffe's")
