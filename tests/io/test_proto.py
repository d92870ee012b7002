"""The schema: generated module in sync with proto/caffe.proto, and Caffe's files parse."""
import subprocess
import sys

import pytest

from caffe_engine.proto import caffe_pb2
from paths import ROOT, SHARED


def test_generated_module_matches_schema(tmp_path):
    pytest.importorskip("grpc_tools")
    subprocess.run([sys.executable, str(ROOT / "tools" / "gen_proto.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    fresh = (tmp_path / "caffe_pb2.py").read_text()
    committed = (ROOT / "caffe_engine" / "proto" / "caffe_pb2.py").read_text()
    assert fresh == committed, "caffe_pb2.py is stale: run python tools/gen_proto.py"


@pytest.mark.parametrize("message,field,number", [
    ("LayerParameter", "convolution_param", 106),
    ("LayerParameter", "clip_param", 148),
    ("LayerParameter", "swish_param", 147),
    ("NetParameter", "layer", 100),
    ("NetParameter", "layers", 2),
    ("SolverParameter", "random_seed", 20),
    ("SolverParameter", "weights", 42),
    ("SolverState", "current_step", 4),
    ("PoolingParameter", "round_mode", 13),
    ("V1LayerParameter", "blobs_lr", 7),
])
def test_field_numbers_are_caffes(message, field, number):
    assert getattr(caffe_pb2, message).DESCRIPTOR.fields_by_name[field].number == number


def test_defaults_are_caffes():
    s = caffe_pb2.SolverParameter()
    assert (s.type, s.solver_mode, s.random_seed, s.average_loss, s.iter_size) == ("SGD", 1, -1, 1, 1)
    assert s.clip_gradients == -1 and s.test_initialization and s.snapshot_after_train
    assert caffe_pb2.NetState().phase == caffe_pb2.TEST
    assert caffe_pb2.FillerParameter().type == "constant"
    assert caffe_pb2.LRNParameter().local_size == 5


def test_caffe_written_files_round_trip_byte_for_byte():
    folder = SHARED / "caffe_reference" / "training" / "lenet_sgd"
    for name, cls in [("lenet_sgd_iter_0.caffemodel", caffe_pb2.NetParameter),
                      ("lenet_sgd_iter_300.solverstate", caffe_pb2.SolverState)]:
        data = (folder / name).read_bytes()
        msg = cls()
        msg.ParseFromString(data)
        assert msg.SerializeToString() == data
