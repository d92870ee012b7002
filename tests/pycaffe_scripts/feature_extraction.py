"""Extracting features with a pretrained net and using them (Caffe's feature-extraction recipe,
in Python): the 500-d ip1 activations of HorizonRobotics' LeNet for 300 MNIST digits.

net.forward_all runs any number of items in batches of the net's batch size (the last batch
padded); its results must equal batch-by-batch forward passes. The features are written to an
LMDB of float Datum records (caffe.io.array_to_datum), as Caffe's extract_features tool writes
them, read back, and a nearest-class-mean classifier on them labels held-out digits correctly.
"""
import os

import lmdb
import numpy as np

import caffe

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
LENET = os.path.join(SHARED, "realworld", "HorizonRobotics-Platform__ModelZoo", "Lenet")
N = 300

env = lmdb.open(os.path.join(SHARED, "data", "mnist_5k", "mnist_train_lmdb"), readonly=True, lock=False)
images, labels = [], []
with env.begin() as txn:
    for _, value in txn.cursor():
        datum = caffe.proto.caffe_pb2.Datum()
        datum.ParseFromString(value)
        images.append(caffe.io.datum_to_array(datum).astype(np.float32) * 0.00390625)
        labels.append(datum.label)
        if len(images) == N:
            break
env.close()
images, labels = np.stack(images), np.array(labels)

caffe.set_mode_cpu()
net = caffe.Net(os.path.join(LENET, "lenet_train_test.prototxt"),
                os.path.join(LENET, "lenet_iter_100000.caffemodel"), caffe.TEST)
net.blobs["data"].reshape(64, 1, 28, 28)     # 300 = 4 batches of 64 + 44, padded to 64
net.reshape()
out = net.forward_all(data=images, blobs=["ip1"])
features = out["ip1"]
assert features.shape == (N, 500) and out["ip2"].shape == (N, 10), (features.shape, out["ip2"].shape)

# forward_all == batch-by-batch forward (the padding's outputs dropped).
net.blobs["data"].reshape(50, 1, 28, 28)
net.reshape()
by_batch = np.concatenate([net.forward(blobs=["ip1"], data=images[i:i + 50])["ip1"].copy()
                           for i in range(0, N, 50)])
np.testing.assert_allclose(features, by_batch, rtol=1e-5, atol=1e-5)

# Features to an LMDB of Datum (float_data), and back.
db = lmdb.open("ip1_features_lmdb", map_size=1 << 26)
with db.begin(write=True) as txn:
    for i, feature in enumerate(features):
        datum = caffe.io.array_to_datum(feature.reshape(500, 1, 1), label=int(labels[i]))
        txn.put(("%010d" % i).encode(), datum.SerializeToString())
stored, stored_labels = [], []
with db.begin() as txn:
    for _, value in txn.cursor():
        datum = caffe.proto.caffe_pb2.Datum.FromString(value)
        stored.append(caffe.io.datum_to_array(datum).ravel())
        stored_labels.append(datum.label)
db.close()
stored, stored_labels = np.array(stored), np.array(stored_labels)
np.testing.assert_array_equal(stored.astype(np.float32), features)
np.testing.assert_array_equal(stored_labels, labels)

# Nearest class mean on the features: first 200 digits to learn, last 100 to test.
means = np.stack([stored[:200][stored_labels[:200] == c].mean(0) for c in range(10)])
distances = ((stored[200:, None, :] - means[None]) ** 2).sum(-1)
accuracy = float((distances.argmin(1) == labels[200:]).mean())
print("nearest-class-mean accuracy on ip1 features: %.3f" % accuracy)
assert accuracy > 0.9, accuracy
print("OK")
