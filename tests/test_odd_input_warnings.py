"""Odd input found by a fuzzer (issue 28): a solver state whose ``learned_net`` is not UTF-8 (a
flipped bit) is one line naming the file, and five inputs Caffe accepts and runs on -- weights
from an empty file, a negative ``iter`` in a solver state, a ``device_id`` in CPU mode, a
negative ``test_iter``, an input blob with a zero dimension through the Python API -- still run,
with one WARNING line naming the odd value.

Oracles: Caffe's behaviour (Solver::Restore takes ``iter`` as stored, CopyTrainedLayersFrom an
empty NetParameter copies nothing, CPU mode never reads ``device_id``, Solver::Test loops
``test_iter`` times, Blob accepts a zero dimension); protobuf's wire format for the flipped bit.
"""
import logging
import os
import subprocess
import sys

import numpy
from google.protobuf import text_format

from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2
from tiny_train import tiny_solver


def caffe(*args, cwd):
    env = dict(os.environ, GLOG_logtostderr="1")
    return subprocess.run([sys.executable, "-m", "caffe_engine", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


def warnings_of(done):
    return [line.split("] ", 1)[1] for line in done.stderr.splitlines()
            if line.startswith("W") and "] " in line]


def snapshot(folder):
    """A tiny run's weights and solver state (iter 2) in ``folder``."""
    solver = tiny_solver(folder, max_iter=2, extra="test_interval: 100\n")
    done = caffe("train", "--solver", str(solver), cwd=folder)
    assert done.returncode == 0, done.stderr[-2000:]
    return solver, folder / "tiny_iter_2.solverstate"


def test_a_solver_state_whose_learned_net_is_not_utf8_is_one_line(tmp_path):
    solver, state_file = snapshot(tmp_path)
    state = caffe_pb2.SolverState.FromString(state_file.read_bytes())
    name = state.learned_net.encode()
    raw = state_file.read_bytes()
    assert raw.count(name) == 1
    damaged = tmp_path / "damaged.solverstate"
    damaged.write_bytes(raw.replace(name, b"\xff" + name[1:]))       # one byte's bits flipped
    done = caffe("train", "--solver", str(solver), "--snapshot", str(damaged), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"caffe: {damaged}: learned_net is not UTF-8 text"), line


def test_a_negative_iter_in_a_solver_state_resumes_with_a_warning(tmp_path):
    solver, state_file = snapshot(tmp_path)
    state = caffe_pb2.SolverState.FromString(state_file.read_bytes())
    state.iter = -3
    odd = tmp_path / "odd.solverstate"
    odd.write_bytes(state.SerializeToString())
    done = caffe("train", "--solver", str(solver), "--snapshot", str(odd), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    odd_lines = [w for w in warnings_of(done) if "iter -3 is negative" in w]
    assert odd_lines == [f"{odd}: iter -3 is negative; training resumes from it as Caffe does"]
    assert "Iteration -3" in done.stderr or "Iteration 0" in done.stderr


def test_weights_from_an_empty_file_copy_nothing_with_a_warning(tmp_path):
    solver = tiny_solver(tmp_path, max_iter=1, extra="test_interval: 100\n")
    done = caffe("train", "--solver", str(solver), "--weights", "/dev/null", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "/dev/null holds no layers: no weights copied (Caffe goes on as well)" in \
        warnings_of(done)


def test_a_device_id_in_cpu_mode_is_ignored_with_a_warning(tmp_path):
    solver = tiny_solver(tmp_path, max_iter=1, extra="test_interval: 100\ndevice_id: 2000000000\n")
    done = caffe("train", "--solver", str(solver), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "solver device_id 2000000000 is ignored: training runs on the CPU" in \
        warnings_of(done)
    plain = caffe("train", "--solver", str(tiny_solver(tmp_path / "plain", max_iter=1,
                                                       extra="test_interval: 100\n")),
                  cwd=tmp_path / "plain")
    assert not [w for w in warnings_of(plain) if "device_id" in w]


def test_a_negative_test_iter_tests_nothing_with_a_warning(tmp_path):
    solver = tiny_solver(tmp_path, max_iter=2, extra="test_iter: -4\ntest_interval: 1\n")
    done = caffe("train", "--solver", str(solver), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [w for w in warnings_of(done) if "test_iter" in w] == [
        "solver: test_iter -4 (test net #0) is negative; that test runs no iteration, as in Caffe"]
    assert "Testing net (#0)" in done.stderr and "Test net output" not in done.stderr


NET = """
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
"""


def test_a_zero_dimension_through_the_python_api_runs_with_one_warning(caplog):
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), caffe_pb2.TEST)
    net.blobs["data"].reshape(0, 3)
    with caplog.at_level(logging.WARNING, logger="caffe_engine"):
        net.reshape()
        out = net.forward()
        net.forward()
    assert out["ip"].shape == (0, 4)
    named = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert named == ["input blob 'data' has a zero dimension (0, 3): the net computes nothing"]
    caplog.clear()
    net.blobs["data"].reshape(2, 3)
    net.blobs["data"].data[...] = numpy.ones((2, 3), numpy.float32)
    with caplog.at_level(logging.WARNING, logger="caffe_engine"):
        net.reshape()
        assert net.forward()["ip"].shape == (2, 4)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
