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
