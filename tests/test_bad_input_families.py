"""Families of bad input beyond the issue's examples (issue 15: "a family of your own for each
row"): for each way the engine used to fail — a traceback, a traceback on a full disk, a hang,
exit 0 on invalid input, death by a signal — more inputs of the same kind, each of which must now
give one ``caffe: ...`` line and a non-zero exit. (The disk family is in
tests/solvers/test_full_disk.py, which needs a private mount namespace.)

Oracles: Caffe's CHECKs for each case (the layer's LayerSetUp/Reshape in src/caffe/layers/,
Blob::CanonicalAxisIndex and Blob::count in blob.hpp, tools/caffe.cpp's flags, protobuf's C++
TextFormat parser, LMDB's and the data layers' opening checks).
"""
import os
import shutil

import lmdb
import pytest

from paths import ROOT, SHARED
from test_bad_input import caffe, last_line_error

LENET = ROOT / "models/lenet/lenet_train_test.prototxt"
IN = ('layer { name: "in" type: "Input" top: "data" '
      'input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }\n')


def layer(text):
    return IN + "layer { " + text + " }\n"


# -- row 1: shapes, axes and sizes that were tracebacks ------------------------------------------
@pytest.mark.parametrize("net, expected", [
    (layer('name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
           'inner_product_param { num_output: 3 axis: 9 } '),
     "layer 'ip' (InnerProduct): axis 9 out of range for a 4-axis blob"),
    (layer('name: "c" type: "Concat" bottom: "data" bottom: "data" top: "c" '
           'concat_param { axis: 5 }'), "layer 'c' (Concat): axis 5 out of range"),
    (layer('name: "s" type: "Softmax" bottom: "data" top: "s" softmax_param { axis: -7 }'),
     "layer 's' (Softmax): axis -7 out of range"),
    (layer('name: "f" type: "Flatten" bottom: "data" top: "f" '
           'flatten_param { axis: 3 end_axis: 1 }'),
     "layer 'f' (Flatten): end_axis (1) comes before axis (3)"),
    ('layer { name: "d" type: "DummyData" top: "d" '
     'dummy_data_param { shape { dim: 2 dim: -5 } } }\n',
     "layer 'd' (DummyData): blob dimensions must be non-negative"),
    ('layer { name: "d" type: "DummyData" top: "d" '
     'dummy_data_param { shape { dim: 100000 dim: 100000 } } }\n',
     "layer 'd' (DummyData): blob size exceeds INT_MAX"),
    (layer('name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 0 }'),
     "layer 'p' (Pooling): filter dimensions cannot be zero"),
    (layer('name: "p" type: "Pooling" bottom: "data" top: "p" '
           'pooling_param { kernel_size: 3 pad: 3 }'),
     "layer 'p' (Pooling): pad (3, 3) must be smaller than kernel"),
    (layer('name: "l" type: "LRN" bottom: "data" top: "l" lrn_param { local_size: 4 }'),
     "layer 'l' (LRN): LRN only supports odd values for local_size"),
    (layer('name: "r" type: "Reshape" bottom: "data" top: "r" '
           'reshape_param { shape { dim: 7 dim: -1 } }'),
     "layer 'r' (Reshape): bottom count (384) must be divisible"),
    (layer('name: "s" type: "Slice" bottom: "data" top: "a" top: "b" '
           'slice_param { axis: 1 slice_point: 9 }'),
     "layer 's' (Slice): slice point 9 beyond the axis size 3"),
    (layer('name: "c" type: "Crop" bottom: "data" bottom: "data" top: "c" '
           'crop_param { axis: 2 offset: 5 }'), "layer 'c' (Crop): invalid crop parameters"),
    (layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
           'convolution_param { num_output: 2 kernel_size: 3 dilation: 100 }'),
     "layer 'c' (Convolution): output size (-192, -192) < 1"),
    (layer('name: "c" type: "Convolution" bottom: "data" top: "c" '
           'convolution_param { num_output: 4 kernel_size: 3 group: 2 }'),
     "layer 'c' (Convolution): input channels (3) must be a multiple of group (2)"),
    (layer('name: "c" type: "Deconvolution" bottom: "data" top: "c" '
           'convolution_param { num_output: 4 kernel_size: 3 stride: 2147483647 }'),
     "layer 'c' (Deconvolution): blob size exceeds INT_MAX"),
    (layer('name: "t" type: "Tile" bottom: "data" top: "t" tile_param { tiles: 0 }'),
     "layer 't' (Tile): number of tiles must be positive"),
    (layer('name: "a" type: "ArgMax" bottom: "data" top: "a" argmax_param { top_k: 1000 }'),
     "layer 'a' (ArgMax): top_k (1000) must be less than or equal"),
    (layer('name: "s" type: "SPP" bottom: "data" top: "s" spp_param { pyramid_height: 0 }'),
     "layer 's' (SPP): pyramid_height must be >= 1"),
])
def test_layer_checks_name_the_layer_and_the_field(net, expected, tmp_path):
    model = tmp_path / "net.prototxt"
    model.write_text(net)
    line = last_line_error(caffe("time", "--model", str(model), "--iterations", "1"))
    assert line.startswith("caffe: ") and expected in line, line


# -- row 3: what could run for ever, or read nothing for ever ------------------------------------
def empty_lmdb_net(tmp_path):
    lmdb.open(str(tmp_path / "empty_lmdb")).close()
    net = tmp_path / "net.prototxt"
    net.write_text(LENET.read_text().replace("data/mnist/mnist_test_lmdb", "empty_lmdb")
                   .replace("data/mnist/mnist_train_lmdb", "empty_lmdb"))
    (tmp_path / "w.caffemodel").write_bytes(b"")
    return net


@pytest.mark.parametrize("case, expected", [
    ("empty_lmdb", "LMDB 'empty_lmdb' holds no records"),
    ("empty_image_list", "image list 'list.txt' is empty"),
    ("empty_hdf5_list", "must have at least 1 HDF5 filename listed in 'list.txt'"),
    ("test_iterations", "illegal value '2147483648' specified for int32 flag 'iterations'"),
    ("level", "illegal value '99999999999' specified for int32 flag 'level'"),
])
def test_nothing_to_read_or_a_count_past_int32_ends_at_once(case, expected, tmp_path):
    (tmp_path / "list.txt").write_text("")
    model = tmp_path / "net.prototxt"
    if case == "empty_lmdb":
        args = ("test", "--model", str(empty_lmdb_net(tmp_path)), "--weights", "w.caffemodel",
                "--iterations", "2")
    elif case == "empty_image_list":
        model.write_text('layer { name: "d" type: "ImageData" top: "data" top: "label" '
                         'image_data_param { source: "list.txt" batch_size: 2 } }\n')
        args = ("time", "--model", str(model), "--iterations", "1")
    elif case == "empty_hdf5_list":
        model.write_text('layer { name: "d" type: "HDF5Data" top: "data" '
                         'hdf5_data_param { source: "list.txt" batch_size: 2 } }\n')
        args = ("time", "--model", str(model), "--iterations", "1")
    elif case == "test_iterations":
        args = ("test", "--model", str(LENET), "--weights", "w.caffemodel",
                "--iterations", "2147483648")
    else:
        args = ("time", "--model", str(LENET), "--level", "99999999999")
    line = last_line_error(caffe(*args, cwd=tmp_path))
    assert line.startswith("caffe: ") and expected in line, line


# -- row 4: invalid input that used to exit 0 ---------------------------------------------------
@pytest.mark.parametrize("args, files, expected", [
    (("train", "--solver", "s.prototxt"), {"s.prototxt": 'net: "n.prototxt"\nbase_lr: 0.1\n'
                                                          "base_lr: 0.2\n"},
     'should not have multiple "base_lr" fields'),
    (("train", "--solver", "s.prototxt"), {"s.prototxt": 'net: "n\\q.prototxt"\n'},
     "Invalid escape sequence in string literal."),
    (("train", "--solver", "s.prototxt"), {"s.prototxt": 'net: "n\x00.prototxt"\n'},
     "Invalid control characters encountered in text."),
    (("time", "--model", "n.prototxt", "--iterations", "1"),
     {"n.prototxt": 'layer { name: "a" name: "b" type: "ReLU" }\n'},
     'should not have multiple "name" fields'),
    (("time", "--model", "n.prototxt", "--iterations", "1"),
     {"n.prototxt": 'input: "a"\ninput: "b"\ninput_shape { dim: 1 }\n'},
     "net declares 2 input(s) but 1 input_shape(s)"),
    (("time", "--model", str(LENET), "--iterations", "0"), {},
     "--iterations must be a positive number of iterations, got 0"),
    (("time", "--model", str(LENET), "--iterations", "1", "--phase", "BOGUS"), {},
     "--phase must be TRAIN or TEST, got 'BOGUS'"),
    (("train", "--solver", "s.prototxt", "--weights", "a.caffemodel",
      "--snapshot", "b.solverstate"), {"s.prototxt": 'net: "n.prototxt"\n'},
     "Give a snapshot to resume training or weights to finetune but not both."),
    (("time", "--model", str(LENET), "--bogus"), {}, "unknown command line flag 'bogus'"),
    (("time", "--model", str(LENET), "--iterations"), {},
     "flag 'iterations' is missing its argument"),
])
def test_invalid_files_and_flags_never_exit_zero(args, files, expected, tmp_path):
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode())
    line = last_line_error(caffe(*args, cwd=tmp_path))
    assert line.startswith("caffe: ") and expected in line, line


# -- row 5: damaged LMDBs that a reader would die on (SIGBUS) -----------------------------------
@pytest.mark.parametrize("damage, expected", [
    ("one_page_short", "is truncated"),
    ("ninety_percent", "is truncated"),
    ("empty_file", "cannot open LMDB"),
    ("no_data_file", "cannot open LMDB"),
])
def test_damaged_lmdbs_are_refused_before_a_read(damage, expected, tmp_path):
    copy = tmp_path / "db"
    shutil.copytree(SHARED / "data/mnist_5k/mnist_test_lmdb", copy)
    data = copy / "data.mdb"
    data.chmod(0o644)
    size = data.stat().st_size
    if damage == "no_data_file":
        data.unlink()
    else:
        os.truncate(data, {"one_page_short": size - 4096, "ninety_percent": size * 9 // 10,
                           "empty_file": 0}[damage])
    net = tmp_path / "net.prototxt"
    net.write_text(LENET.read_text().replace("data/mnist/mnist_test_lmdb", str(copy))
                   .replace("data/mnist/mnist_train_lmdb", str(copy)))
    (tmp_path / "w.caffemodel").write_bytes(b"")
    done = caffe("test", "--model", str(net), "--weights", "w.caffemodel", "--iterations", "100",
                 cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    line = last_line_error(done)
    assert "layer 'mnist' (Data)" in line and expected in line and str(copy) in line, line
