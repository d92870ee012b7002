"""Which reader a weights file gets is read from its content, as Caffe's CopyTrainedLayersFrom
asks ``H5Fis_hdf5`` (src/caffe/net.cpp): HDF5 weights load under any file name (BVLC's
python/caffe/test/test_net.py ``test_save_hdf5`` writes to a tempfile with no suffix), and a
binary ``.caffemodel`` stays a protobuf whatever it is called."""
import os
import tempfile

import h5py
import numpy as np
import pytest
from google.protobuf import text_format

import caffe_engine as caffe
from caffe_engine.errors import CaffeError
from caffe_engine.io.hdf5_weights import HDF5_SIGNATURE, is_hdf5_weights
from caffe_engine.proto import caffe_pb2

NET = """
name: "tiny"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 }
                        bias_filler { type: "gaussian" std: 1 } } }
"""


def net(seed):
    caffe.set_random_seed(seed)
    return caffe.Net(text_format.Parse(NET, caffe_pb2.NetParameter()), caffe.TEST)


def same_params(a, b):
    return all(np.array_equal(p.data, q.data)
               for name in a.params for p, q in zip(a.params[name], b.params[name]))


def test_save_hdf5_then_load_hdf5_under_a_name_without_suffix():
    # BVLC's test_net.py test_save_hdf5, step for step.
    f = tempfile.NamedTemporaryFile(mode="w+", delete=False)
    f.close()
    try:
        saved = net(1)
        saved.save_hdf5(f.name)
        loaded = net(2)
        assert not same_params(saved, loaded)
        assert sorted(loaded.load_hdf5(f.name)) == ["ip", "x"]
        assert same_params(saved, loaded)
    finally:
        os.remove(f.name)


@pytest.mark.parametrize("name", ["w", "w.caffemodel", "w.caffemodel.h5", "w.bin"])
def test_copy_from_and_weights_argument_pick_the_reader_by_content(tmp_path, name):
    saved = net(1)
    h5, proto = tmp_path / "h5", tmp_path / "proto"
    h5.mkdir()
    proto.mkdir()
    saved.save_hdf5(h5 / name)
    saved.save(proto / name)
    assert is_hdf5_weights(h5 / name) and not is_hdf5_weights(proto / name)
    for path in (h5 / name, proto / name):
        loaded = net(2)
        loaded.copy_from(str(path))
        assert same_params(saved, loaded)
        weighted = caffe.Net(text_format.Parse(NET, caffe_pb2.NetParameter()), caffe.TEST,
                             weights=str(path))
        assert same_params(saved, weighted)


def test_signature_after_a_user_block_and_files_that_are_not_hdf5(tmp_path):
    with_block = tmp_path / "block"
    with h5py.File(with_block, "w", userblock_size=1024) as f:
        f.create_group("data")
    assert with_block.read_bytes()[1024:1032] == HDF5_SIGNATURE
    assert is_hdf5_weights(with_block)
    short = tmp_path / "short.h5"
    short.write_bytes(HDF5_SIGNATURE[:5])
    assert not is_hdf5_weights(short)
    assert not is_hdf5_weights(os.devnull)
    # A file that cannot be opened goes to the reader its name suggests (its error names it).
    assert is_hdf5_weights(tmp_path / "absent.caffemodel.h5")
    assert not is_hdf5_weights(tmp_path / "absent.caffemodel")


def test_load_hdf5_of_a_protobuf_file_is_one_line(tmp_path):
    path = tmp_path / "w.caffemodel"
    net(1).save(path)
    with pytest.raises(CaffeError) as info:
        net(2).load_hdf5(path)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
