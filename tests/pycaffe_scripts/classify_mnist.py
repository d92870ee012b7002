"""Classifying handwritten digits with caffe.Classifier and a LeNet trained by someone else.

Real MNIST test digits are read from an LMDB of Datum records (caffe.io.datum_to_array), written
as PNG files, loaded back with caffe.io.load_image(color=False) and classified by
caffe.Classifier with the deploy net and the caffemodel of HorizonRobotics' model zoo. That
LeNet was trained on pixels / 256, hence raw_scale 255 and input_scale 1/256.
"""
import os

import lmdb
import numpy as np
from PIL import Image

import caffe

SHARED = os.environ.get("CAFFE_SHARED") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
LENET = os.path.join(SHARED, "realworld", "HorizonRobotics-Platform__ModelZoo", "Lenet")
MODEL = os.path.join(LENET, "lenet_train_test.prototxt")       # deploy-style: input 1x1x28x28
WEIGHTS = os.path.join(LENET, "lenet_iter_100000.caffemodel")
TEST_LMDB = os.path.join(SHARED, "data", "mnist_5k", "mnist_test_lmdb")
N = 100

# Read N test digits (the database is read-only: no lock file).
env = lmdb.open(TEST_LMDB, readonly=True, lock=False)
digits, labels = [], []
with env.begin() as txn:
    for key, value in txn.cursor():
        datum = caffe.proto.caffe_pb2.Datum()
        datum.ParseFromString(value)
        digits.append(caffe.io.datum_to_array(datum))     # (1, 28, 28) uint8
        labels.append(datum.label)
        if len(digits) == N:
            break
env.close()
labels = np.array(labels)
for i, digit in enumerate(digits):
    Image.fromarray(digit[0]).save("digit%03d.png" % i)
images = [caffe.io.load_image("digit%03d.png" % i, color=False) for i in range(N)]
assert images[0].shape == (28, 28, 1)

caffe.set_mode_cpu()
classifier = caffe.Classifier(MODEL, WEIGHTS, raw_scale=255, input_scale=0.00390625)
classifier.blobs["data"].reshape(50, 1, 28, 28)     # classify in batches of 50, not 1
classifier.reshape()
scores = classifier.predict(images, oversample=False)            # ip2: (N, 10) class scores
predicted = scores.argmax(1)
accuracy = float((predicted == labels).mean())
print("accuracy on %d digits: %.3f" % (N, accuracy))
assert scores.shape == (N, 10)
assert accuracy >= 0.97, accuracy

# The same numbers straight through the net, from the raw pixels / 256.
net = caffe.Net(MODEL, caffe.TEST, weights=WEIGHTS)
net.blobs["data"].reshape(N, 1, 28, 28)
net.reshape()
direct = net.forward(data=np.stack(digits).astype(np.float32) / 256)["ip2"].copy()
np.testing.assert_allclose(scores, direct, rtol=1e-4, atol=1e-4)

# caffe.io.oversample: at the input's own size the ten crops are the digit five times and its
# mirror image five times, so the averaged scores are the mean of the two (digits are not
# mirror-symmetric, which is why oversampling is off above).
ten = caffe.Classifier(MODEL, WEIGHTS, raw_scale=255, input_scale=0.00390625)
ten.blobs["data"].reshape(40, 1, 28, 28)
ten.reshape()
averaged = ten.predict(images[:20], oversample=True)
mirrored = net.forward(data=np.stack(digits)[:, :, :, ::-1].astype(np.float32) / 256)["ip2"][:20]
np.testing.assert_allclose(averaged, (direct[:20] + mirrored) / 2, rtol=1e-4, atol=1e-4)
print("OK")
