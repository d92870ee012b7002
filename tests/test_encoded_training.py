"""Training on encoded records equals training on the same images stored raw (issue 26's
must-show): databases written by ``convert_imageset --encoded`` -- LMDB and LevelDB -- train
LeNet on grey PNGs (lossless: identical losses and weights to the raw database) and a net on
224-pixel crops of colour JPEGs (identical to a raw database holding the same bytes decoded by
OpenCV, what the engine decodes with). The raw databases are written by ``convert_imageset``
without ``--encoded`` from the same files."""
import logging
import os
import re

import numpy
import pytest

from caffe_engine.io.db import iter_items
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver
from caffe_engine.tools import convert_imageset
from paths import ROOT, SHARED

cv2 = pytest.importorskip("cv2")


def convert(root, listing, db, *flags):
    assert convert_imageset.main([*flags, f"{root}/", str(listing), str(db)]) == 0


def mnist_pngs(folder, count):
    """The first ``count`` MNIST training digits as grey PNG files, and their list."""
    folder.mkdir()
    lines = []
    items = iter_items(SHARED / "data/mnist_5k/mnist_train_lmdb", "lmdb")
    for i, (_, value) in zip(range(count), items):
        datum = caffe_pb2.Datum.FromString(value)
        digit = numpy.frombuffer(datum.data, numpy.uint8).reshape(28, 28)
        cv2.imwrite(str(folder / f"d{i:03d}.png"), digit)
        lines.append(f"d{i:03d}.png {datum.label}")
    (folder.parent / "list.txt").write_text("\n".join(lines) + "\n")
    return folder.parent / "list.txt"


def colour_jpegs(folder, count):
    """``count`` 256x256 colour JPEGs of smooth fields with noise, and their list."""
    folder.mkdir()
    r = numpy.random.RandomState(26)
    y, x = numpy.mgrid[0:256, 0:256]
    lines = []
    for i in range(count):
        fx, fy = r.uniform(0.01, 0.06, 2)
        planes = [128 + 100 * numpy.sin(fx * x * (k + 1) + fy * y + i) for k in range(3)]
        image = numpy.clip(numpy.stack(planes, -1) + r.normal(0, 8, (256, 256, 3)), 0, 255)
        cv2.imwrite(str(folder / f"c{i:03d}.jpg"), image.astype(numpy.uint8))
        lines.append(f"c{i:03d}.jpg {i % 10}")
    (folder.parent / "list.txt").write_text("\n".join(lines) + "\n")
    return folder.parent / "list.txt"


#: The lines compared, without the timings: "Iteration N, loss = X" and the net outputs.
LOSS = re.compile(r"(Iteration \d+)(?: \(.*\))?(, loss = \S+)|(Test net output .*|Train net output .*)")


class Lines(logging.Handler):
    """The loss and test lines the solver logs (a handler of its own: the tools run before
    reconfigure the log)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        match = LOSS.search(record.getMessage())
        if match:
            self.lines.append(match.group(3) or match.group(1) + match.group(2))


def train(folder, net_text, **fields):
    """Train the net in ``folder``; returns (the loss and test lines logged, final params)."""
    folder.mkdir(exist_ok=True)
    (folder / "net.prototxt").write_text(net_text)
    solver = {"net": '"net.prototxt"', "base_lr": "0.01", "momentum": "0.9",
              "weight_decay": "0.0005", "lr_policy": '"fixed"', "display": "1",
              "max_iter": "12", "snapshot": "0", "snapshot_after_train": "false",
              "random_seed": "1701", "solver_mode": "CPU", **fields}
    (folder / "solver.prototxt").write_text("".join(f"{k}: {v}\n" for k, v in solver.items()))
    here = os.getcwd()
    os.chdir(folder)
    logger = logging.getLogger("caffe_engine")
    lines, level = Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        s = get_solver("solver.prototxt")
        s.solve()
    finally:
        os.chdir(here)
        logger.removeHandler(lines)
        logger.setLevel(level)
    lines = lines.lines
    params = [b.data.copy() for blobs in s.net.params.values() for b in blobs]
    assert lines
    return lines, params


def assert_same_training(a, b):
    assert a[0] == b[0]
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a[1], b[1]))


def lenet(train_db, test_db, backend):
    text = (ROOT / "models/lenet/lenet_train_test.prototxt").read_text()
    text = text.replace("data/mnist/mnist_train_lmdb", str(train_db))
    text = text.replace("data/mnist/mnist_test_lmdb", str(test_db))
    return text.replace("backend: LMDB", f"backend: {backend}")


@pytest.mark.parametrize("backend", ["LMDB", "LEVELDB"])
def test_lenet_on_encoded_grey_pngs_equals_the_raw_database(tmp_path, backend):
    listing = mnist_pngs(tmp_path / "digits", 400)
    flag = f"--backend={backend.lower()}"
    convert(tmp_path / "digits", listing, tmp_path / "enc", "--gray", "--encoded",
            "--encode_type=png", flag)
    convert(tmp_path / "digits", listing, tmp_path / "raw", "--gray", flag)
    first = next(iter_items(tmp_path / "enc", backend.lower()))[1]
    datum = caffe_pb2.Datum.FromString(first)
    assert datum.encoded and datum.data[:4] == b"\x89PNG" and datum.channels == 0
    fields = {"test_iter": "2", "test_interval": "6"}
    encoded = train(tmp_path / "a", lenet(tmp_path / "enc", tmp_path / "enc", backend), **fields)
    plain = train(tmp_path / "b", lenet(tmp_path / "raw", tmp_path / "raw", backend), **fields)
    assert any("Test net output" in line for line in encoded[0])
    assert_same_training(encoded, plain)


CROP_NET = """name: "crop224"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ crop_size: 224 mirror: true mean_value: 104 mean_value: 117
                     mean_value: 123 scale: 0.0078125 }}
  data_param {{ source: "{source}" batch_size: 4 backend: {backend} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 8 kernel_size: 7 stride: 4
                       weight_filler {{ type: "gaussian" std: 0.01 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "conv" top: "conv" }}
layer {{ name: "pool" type: "Pooling" bottom: "conv" top: "pool"
  pooling_param {{ pool: MAX kernel_size: 3 stride: 4 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""


@pytest.mark.parametrize("backend", ["LMDB", "LEVELDB"])
def test_224_crops_of_encoded_colour_jpegs_equal_the_opencv_decoded_database(tmp_path, backend):
    listing = colour_jpegs(tmp_path / "photos", 16)
    flag = f"--backend={backend.lower()}"
    convert(tmp_path / "photos", listing, tmp_path / "enc", "--encoded", flag)
    convert(tmp_path / "photos", listing, tmp_path / "raw", flag)
    key, first = next(iter_items(tmp_path / "enc", backend.lower()))
    assert key == b"00000000_c000.jpg"
    assert caffe_pb2.Datum.FromString(first).data == (tmp_path / "photos/c000.jpg").read_bytes()
    raw_first = caffe_pb2.Datum.FromString(next(iter_items(tmp_path / "raw", backend.lower()))[1])
    decoded = cv2.imread(str(tmp_path / "photos/c000.jpg"))
    assert raw_first.data == decoded.transpose(2, 0, 1).tobytes()
    encoded = train(tmp_path / "a", CROP_NET.format(source=tmp_path / "enc", backend=backend), max_iter="8")
    plain = train(tmp_path / "b", CROP_NET.format(source=tmp_path / "raw", backend=backend), max_iter="8")
    assert_same_training(encoded, plain)
