#!/usr/bin/env bash
# The main job: write the MNIST LMDBs (once) and train LeNet with `caffe train`.
# Run from anywhere; it works in the repository root. Set MNIST_DIR to a folder holding the four
# standard MNIST IDX files to use the full data set instead of the 5,000 bundled digits.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d data/mnist/mnist_train_lmdb ] || [ ! -d data/mnist/mnist_test_lmdb ]; then
    python tools/create_mnist.py --out data/mnist ${MNIST_DIR:+"$MNIST_DIR"}
fi
mkdir -p data/lenet
start=$(date +%s)
caffe train --solver models/lenet/lenet_solver.prototxt "$@"
echo "train_lenet: finished in $(( $(date +%s) - start )) s"
