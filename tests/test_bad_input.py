"""Bad input gets one clear line and a non-zero exit (issue 15, first part): gflags-typed flags,
positive iteration counts, error lines shortened in the middle, a failing snapshot write (full
disk) keeping the previous file, and a killed writer's temporary files cleared.

Oracles: gflags' int32/double parsing (tools/caffe.cpp DEFINE_int32 / DEFINE_double), the
atomic-write contract of docs (the previous file unchanged, nothing half-written).
"""
import errno
import os
import subprocess
import sys

import pytest

from caffe_engine.errors import CaffeError, one_line
from caffe_engine.io import prototxt as pio
from paths import ROOT
from tiny_train import tiny_solver

LENET = str(ROOT / "models/lenet/lenet_train_test.prototxt")


def caffe(*args, cwd=None):
    env = dict(os.environ, GLOG_logtostderr="1")
    return subprocess.run([sys.executable, "-m", "caffe_engine", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


def last_line_error(done):
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args, expected", [
    (("time", "--model", LENET, "--iterations", "99999999999999999999"),
     "illegal value '99999999999999999999' specified for int32 flag 'iterations'"),
    (("time", "--model", LENET, "--iterations=2147483648"), "int32 flag 'iterations'"),
    (("time", "--model", LENET, "--iterations", "-5"), "--iterations must be a positive"),
    (("test", "--model", LENET, "--weights", "w.caffemodel", "--iterations", "0"),
     "--iterations must be a positive"),
    (("time", "--model", LENET, "--level", "-2147483649"), "int32 flag 'level'"),
    (("train", "--solver", "s.prototxt", "--bucket_mb", "-1"), "--bucket_mb must be a positive"),
    (("train", "--solver", "s.prototxt", "--bucket_mb", "nan"), "double flag 'bucket_mb'"),
])
def test_flags_are_typed_and_counts_positive(args, expected, tmp_path):
    line = last_line_error(caffe(*args, cwd=tmp_path))
    assert line.startswith("caffe: ") and expected in line


def test_long_error_lines_keep_their_start_and_end(tmp_path):
    text = "x" * 2000
    short = one_line(f"{text}/start ... {text}/the_end.prototxt: No such file")
    assert len(short) <= 300 and short.startswith("xxx") and short.endswith("No such file")
    assert one_line("first line\nsecond") == "first line"
    deep = tmp_path / ("d" * 200) / ("e" * 200)
    line = last_line_error(caffe("train", "--solver", str(deep / "solver.prototxt"), cwd=tmp_path))
    assert len(line) <= len("caffe: ") + 300
    assert line.startswith("caffe: ") and "solver.prototxt" in line[-80:] and " ... " in line


def test_a_failing_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "lenet_iter_10.caffemodel"
    pio.write_atomic(str(target), b"previous snapshot")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pio.os, "fsync", full_disk)
    with pytest.raises(CaffeError) as info:
        pio.write_atomic(str(target), b"new snapshot")
    message = str(info.value)
    assert "\n" not in message and str(target) in message and "No space left" in message
    assert target.read_bytes() == b"previous snapshot"
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_full_disk_during_snapshot_is_one_line_and_the_previous_snapshot_stays(tmp_path,
                                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver_path = tiny_solver(tmp_path, max_iter=4)
    from caffe_engine.solvers import get_solver
    solver = get_solver(str(solver_path))
    solver.step(2)
    solver.snapshot()
    first = (tmp_path / "tiny_iter_2.caffemodel").read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(pio.os, "fsync", full_disk)
    solver.step(2)
    with pytest.raises(CaffeError, match="No space left on device"):
        solver.snapshot()
    assert (tmp_path / "tiny_iter_2.caffemodel").read_bytes() == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_temporaries_a_killed_run_left_are_removed_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver_path = tiny_solver(tmp_path, max_iter=2)
    stale = [tmp_path / ".tmp-tiny_iter_6.caffemodel.k3j2", tmp_path / ".tmp-tiny_iter_6.solverstate.x"]
    other = tmp_path / ".tmp-other_iter_6.caffemodel.k3j2"      # another prefix's: not ours
    for path in stale + [other]:
        path.write_bytes(b"half a snapshot")
    from caffe_engine.solvers import get_solver
    get_solver(str(solver_path))
    assert not any(p.exists() for p in stale) and other.exists()


# -- shapes and sizes: refused before anything is allocated, naming the layer -------------------
INPUT_NET = ('name: "n"\nlayer {{ name: "in" type: "Input" top: "data" input_param {{ {shape} }} }}\n'
             'layer {{ name: "conv" type: "Convolution" bottom: "data" top: "c" '
             'convolution_param {{ {conv} weight_filler {{ type: "xavier" }} }} }}\n')


@pytest.mark.parametrize("shape, conv, expected", [
    ("shape { }", "num_output: 4 kernel_size: 3", "layer 'conv' (Convolution)"),
    ("shape { dim: 2 dim: -2 dim: 8 dim: 8 }", "num_output: 4 kernel_size: 3",
     "layer 'in' (Input): blob dimensions must be non-negative"),
    ("shape { dim: 100000 dim: 100000 dim: 1 dim: 1 }", "num_output: 4 kernel_size: 1",
     "blob size exceeds INT_MAX"),
    ("shape { dim: 2 dim: 3 dim: 8 dim: 8 }", "num_output: 4 kernel_size: 3 pad: 1000000",
     "layer 'conv' (Convolution): blob size exceeds INT_MAX"),
    ("shape { dim: 2 dim: 3 dim: 8 dim: 8 }", "num_output: 4000000000 kernel_size: 3",
     "layer 'conv' (Convolution): blob size exceeds INT_MAX"),
    ("shape { dim: 2 dim: 3 dim: 8 dim: 8 }", "num_output: 4 kernel_size: 3 stride: 2147483647",
     "layer 'conv' (Convolution)"),
    ("shape { dim: 2 dim: 0 dim: 8 dim: 8 }", "num_output: 4 kernel_size: 3",
     "layer 'conv' (Convolution)"),
    ("shape { dim: 0 dim: 3 dim: 8 dim: 8 }", "num_output: 4 kernel_size: 3",
     "layer 'conv' (Convolution)"),
])
def test_shapes_and_sizes_are_one_line_naming_the_layer(shape, conv, expected, tmp_path):
    model = tmp_path / "net.prototxt"
    model.write_text(INPUT_NET.format(shape=shape, conv=conv))
    line = last_line_error(caffe("time", "--model", str(model), "--iterations", "1"))
    assert line.startswith("caffe: ") and expected in line


def test_a_blob_larger_than_memory_is_refused_with_its_size(monkeypatch):
    from caffe_engine import blob
    monkeypatch.setattr(blob, "available_bytes", lambda: 10 ** 9)
    with pytest.raises(CaffeError, match=r"needs 2000000000 bytes .* 1000000000 bytes"):
        blob.Blob((250000000,))
    assert blob.Blob((1000,)).count == 1000


def test_test_iter_zero_logs_no_outputs_instead_of_failing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver_path = tiny_solver(tmp_path, max_iter=1, extra="test_iter: 0\n")
    done = caffe("train", "--solver", str(solver_path), cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "Testing net (#0)" in done.stderr and "Test net output" not in done.stderr


# -- the prototxt parser as strict as Caffe's C++ TextFormat::Parse -----------------------------
@pytest.mark.parametrize("text, expected", [
    ('layer { name: "c" type: "Convolution" convolution_param { num_output: 4 num_output: 6 } }',
     'should not have multiple "num_output" fields'),
    ('layer { name: "conv\\q1" type: "ReLU" }', "Invalid escape sequence in string literal."),
    ('layer { name: "a\x00b" type: "ReLU" }', "Invalid control characters encountered in text."),
    ('layer { name: "a" type: "ReLU" }\n\x07', "Invalid control characters encountered in text."),
    ('input: "data" input_dim: 1 input_dim: 1 input_dim: 2 input_dim: 2\n'
     'input_shape { dim: 1 dim: 1 dim: 2 dim: 2 }\n',
     "Must specify either input_shape OR deprecated input_dim, not both."),
])
def test_prototxt_parser_refuses_what_caffes_refuses(text, expected, tmp_path):
    model = tmp_path / "net.prototxt"
    model.write_bytes(text.encode("utf-8"))
    line = last_line_error(caffe("time", "--model", str(model), "--iterations", "1"))
    assert line.startswith(f"caffe: {model}") and expected in line


def test_escapes_caffe_accepts_still_parse():
    from caffe_engine.proto import caffe_pb2
    msg = pio.parse_text('name: "a\\000b\\x41\\n\\t\\"\\\\" # a comment with \\q\n',
                         caffe_pb2.NetParameter())
    assert msg.name == 'a\x00bA\n\t"\\'


# -- storage ------------------------------------------------------------------------------------
def test_a_truncated_lmdb_is_refused_before_any_read(tmp_path):
    """Half of data.mdb: LMDB would SIGBUS on the first page past the end; the header's page
    count against the file's length refuses it first, naming the file."""
    import shutil
    from paths import SHARED
    copy = tmp_path / "mnist_test_lmdb"
    shutil.copytree(SHARED / "data/mnist_5k/mnist_test_lmdb", copy)
    data = copy / "data.mdb"
    data.chmod(0o644)
    os.truncate(data, data.stat().st_size // 2)
    net = tmp_path / "net.prototxt"
    net.write_text((ROOT / "models/lenet/lenet_train_test.prototxt").read_text()
                   .replace("data/mnist/mnist_test_lmdb", str(copy))
                   .replace("data/mnist/mnist_train_lmdb", str(copy)))
    (tmp_path / "w.caffemodel").write_bytes(b"")
    done = caffe("test", "--model", str(net), "--weights", str(tmp_path / "w.caffemodel"),
                 "--iterations", "1000", cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-2000:]
    line = last_line_error(done)
    assert "is truncated" in line and str(data) in line
