"""Bad input gets one clear line and a non-zero exit (issue 15, first part): gflags-typed flags,
positive iteration counts, error lines shortened in the middle, a failing snapshot write (full
disk) keeping the previous file, and a killed writer's temporary files cleared; and what
tests/fuzz/fuzz_cli.py found (an endless iteration deaf to SIGINT, NaN rates raising, error
lines cut at a newline, numbers gflags refuses taken).

Oracles: gflags' int32/double parsing (tools/caffe.cpp DEFINE_int32 / DEFINE_double, gflags.cc
FlagValue::ParseFrom), the atomic-write contract of docs (the previous file unchanged, nothing
half-written), C's double math in Caffe's GetLearningRate and Adam's correction.
"""
import errno
import os
import signal
import subprocess
import sys

import pytest

from caffe_engine.errors import CaffeError, one_line
from caffe_engine.io import prototxt as pio
from paths import ROOT
from tiny_train import caffe as caffe_train
from tiny_train import tiny_solver, wait_for

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
    (("train", "--solver", "s.prototxt", "--bucket_mb", "nan"),
     "--bucket_mb must be a positive size in MiB or auto, got nan"),
    # Found by tests/fuzz/fuzz_cli.py: Python's int() and float() took these, gflags does not.
    (("time", "--model", LENET, "--iterations", "1_000"),
     "illegal value '1_000' specified for int32 flag 'iterations'"),
    (("time", "--model", LENET, "--iterations=2 "), "int32 flag 'iterations'"),
    (("time", "--model", LENET, "--minloglevel=\u0662"), "int32 flag 'minloglevel'"),
])
def test_flags_are_typed_and_counts_positive(args, expected, tmp_path):
    line = last_line_error(caffe(*args, cwd=tmp_path))
    assert line.startswith("caffe: ") and expected in line


def test_int32_flags_take_what_gflags_takes():
    """gflags.cc's strtoll: leading blanks and a sign, or hexadecimal after a leading 0x."""
    from caffe_engine.cli import parse_flags
    for text, value in ((" 7", 7), ("+7", 7), ("-7", -7), ("0x10", 16), ("0X7fffffff", 2**31 - 1)):
        assert parse_flags(["--level", text])[1]["level"] == value


def test_long_error_lines_keep_their_start_and_end(tmp_path):
    text = "x" * 2000
    short = one_line(f"{text}/start ... {text}/the_end.prototxt: No such file")
    assert len(short) <= 300 and short.startswith("xxx") and short.endswith("No such file")
    assert one_line("first line\nsecond\n") == "first line\\nsecond"
    deep = tmp_path / ("d" * 200) / ("e" * 200)
    line = last_line_error(caffe("train", "--solver", str(deep / "solver.prototxt"), cwd=tmp_path))
    assert len(line) <= len("caffe: ") + 300
    assert line.startswith("caffe: ") and "solver.prototxt" in line[-80:] and " ... " in line


def test_a_newline_or_escape_in_a_name_is_shown_escaped_not_cut(tmp_path):
    """Found by tests/fuzz/fuzz_cli.py: a path, flag value or record key holding a newline cut
    the error line at it ('caffe: a', one_line kept the first line) and an escape character
    went raw to the terminal; both are now written as escapes, the line whole."""
    line = last_line_error(caffe("train", "--solver", "a\nb.prototxt", cwd=tmp_path))
    assert line == "caffe: a\\nb.prototxt: cannot read solver prototxt: No such file or directory"
    from caffe_engine.io.lmdb_source import write_lmdb
    write_lmdb(str(tmp_path / "db"), [(b"bad\nkey\x1b[0m", b"\xff not a Datum")])
    net = tmp_path / "net.prototxt"
    net.write_text((ROOT / "models/lenet/lenet_train_test.prototxt").read_text()
                   .replace("data/mnist/mnist_test_lmdb", str(tmp_path / "db"))
                   .replace("data/mnist/mnist_train_lmdb", str(tmp_path / "db")))
    line = last_line_error(caffe("time", "--model", str(net), "--iterations", "1"))
    assert line.startswith("caffe: layer 'mnist' (Data): record 'bad\\nkey\\x1b[0m' of ")
    assert line.endswith("is not a Datum") and line.isprintable()


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


def test_sigint_stops_an_iteration_of_a_huge_iter_size(tmp_path):
    """Found by tests/fuzz/fuzz_cli.py: ``iter_size: 2147483647`` makes one iteration endless,
    and Caffe asks for SIGINT's stop only after the update, so the run never stopped. The stop
    is now asked for between the forward/backward passes too; the unfinished iteration is
    dropped and the stop's snapshot holds the weights of iteration 0."""
    tiny_solver(tmp_path, max_iter=5, extra="iter_size: 2147483647\n")
    proc = caffe_train(tmp_path, "--solver=solver.prototxt")
    try:
        wait_for(proc, r"Test net output #1")      # the passes of iteration 0 start
        proc.send_signal(signal.SIGINT)
        log = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in log, log[-2000:]
    assert "Iteration 0 stopped after " in log and "Optimization stopped early." in log
    assert sorted(p.name for p in tmp_path.glob("tiny_iter_*")) == [
        "tiny_iter_0.caffemodel", "tiny_iter_0.solverstate"]


def test_sigint_is_raised_between_batches_not_lost_in_a_callback():
    """Found by tests/fuzz/fuzz_cli.py: ``caffe test`` ran on after SIGINT when Python's
    KeyboardInterrupt landed in a weakref callback ("Exception ignored ... KeyboardInterrupt").
    test and time now remember SIGINT and raise it at their next batch or iteration (a second
    SIGINT at once), and give the previous handler back."""
    from caffe_engine.cli import InterruptCheck
    previous = signal.getsignal(signal.SIGINT)
    with InterruptCheck() as interrupt:
        interrupt.check()
        signal.raise_signal(signal.SIGINT)                  # remembered, not raised here
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)              # the second: at once
    assert signal.getsignal(signal.SIGINT) is previous


@pytest.mark.parametrize("command", ["test", "time"])
def test_sigint_ends_a_long_test_or_time_in_one_line(command, tmp_path):
    from paths import SHARED
    net = tmp_path / "net.prototxt"
    net.write_text((ROOT / "models/lenet/lenet_train_test.prototxt").read_text()
                   .replace("data/mnist/", f"{SHARED}/data/mnist_5k/"))
    (tmp_path / "w.caffemodel").write_bytes(b"")
    proc = subprocess.Popen([sys.executable, "-m", "caffe_engine", command, "--model", str(net),
                             "--weights", "w.caffemodel", "--iterations", "2147483647"],
                            cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(proc, r"Batch 3,|Iteration: 3 ")
        proc.send_signal(signal.SIGINT)
        log = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in log
    assert log.strip().splitlines()[-1] == "caffe: interrupted"


@pytest.mark.parametrize("kind, extra, expected", [
    ("SGD", 'lr_policy: "inv"\ngamma: -2147483648\npower: 0.75\n', "Iteration 1, lr = nan"),
    ("SGD", 'lr_policy: "exp"\ngamma: 1e30\n', "Iteration 11, lr = inf"),
    ("Adam", "momentum: 0.9\nmomentum2: 2\n", "Iteration 12, loss = nan"),
    ("Adam", "momentum: 1\nmomentum2: 0.999\n", "Iteration 12, loss = nan"),
])
def test_a_rate_c_makes_nan_or_infinite_trains_on_as_in_caffe(kind, extra, expected, tmp_path):
    """Found by tests/fuzz/fuzz_cli.py: a learning rate policy's pow of a negative base to a
    fractional power or past the largest double, and Adam's correction with momentum2 > 1 or
    momentum 1, raised math's ValueError / OverflowError / ZeroDivisionError (a traceback);
    C's double math gives NaN or an infinity there, and Caffe trains on with it."""
    tiny_solver(tmp_path, kind, max_iter=12, extra=extra)
    done = caffe("train", "--solver", "solver.prototxt", cwd=tmp_path)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert expected in done.stderr and "Warning" not in done.stderr


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


@pytest.mark.parametrize("case, expected", [
    ("undecodable", "record '00000003_a.jpg' of 'db': could not decode the encoded image"),
    ("mismatch", "record '00000002_a.jpg' of 'db' is 20x24, the batch's first record 20x20: "
                 "without crop_size"),
    ("empty", "data_param.source (backend LMDB): LMDB 'db' holds no records"),
])
def test_bad_encoded_data_is_one_line_and_writes_nothing(case, expected, tmp_path):
    """Issue 26: a record that cannot be decoded, a record of another size than the batch's first
    without a crop, an empty database: one line naming the layer (and the record's key and
    database), exit 1, no snapshot."""
    import cv2
    import numpy
    from caffe_engine.io.lmdb_source import write_lmdb
    from caffe_engine.proto import caffe_pb2
    square = cv2.imencode(".jpg", numpy.full((20, 20, 3), 90, numpy.uint8))[1].tobytes()
    wide = cv2.imencode(".jpg", numpy.full((20, 24, 3), 90, numpy.uint8))[1].tobytes()
    odd = {"undecodable": (3, square[:100]), "mismatch": (2, wide)}.get(case)
    items = [] if case == "empty" else [
        (b"%08d_a.jpg" % i, caffe_pb2.Datum(data=odd[1] if i == odd[0] else square, encoded=True)
         .SerializeToString()) for i in range(8)]
    write_lmdb(tmp_path / "db", items)
    (tmp_path / "net.prototxt").write_text(
        'layer { name: "data" type: "Data" top: "data" top: "label" '
        '  data_param { source: "db" batch_size: 4 backend: LMDB } }\n'
        'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
        '  inner_product_param { num_output: 2 } }\n'
        'layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }\n')
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 4\n'
        'snapshot_prefix: "out"\nsolver_mode: CPU\n')
    done = caffe("train", "--solver", "solver.prototxt", cwd=tmp_path)
    assert last_line_error(done).startswith("caffe: layer 'data' (Data): " + expected)
    assert not list(tmp_path.glob("out*"))
