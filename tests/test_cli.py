"""The ``caffe`` command: flags as gflags parses them, one-line errors, exit status 1."""
import subprocess
import sys
from pathlib import Path

import pytest

from caffe_engine.cli import UsageError, parse_flags

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "caffe_engine", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_flag_forms_of_gflags():
    pos, flags = parse_flags(["train", "--solver=s.prototxt", "--weights", "w.caffemodel",
                              "-level", "2", "-stage=a,b", "--iterations=7"])
    assert pos == ["train"]
    assert (flags["solver"], flags["weights"], flags["level"], flags["stage"], flags["iterations"]) == \
        ("s.prototxt", "w.caffemodel", 2, "a,b", 7)


@pytest.mark.parametrize("argv,match", [
    (["train", "--bogus=1"], "unknown command line flag 'bogus'"),
    (["train", "--level=x"], "illegal value 'x'"),
    (["train", "--solver"], "missing its argument"),
])
def test_bad_flags(argv, match):
    with pytest.raises(UsageError, match=match):
        parse_flags(argv)


def test_unknown_action_prints_usage_and_exits_1():
    r = run("fly")
    assert r.returncode == 1
    assert "usage: caffe <command> <args>" in r.stderr and "unknown action: fly" in r.stderr


def test_weights_and_snapshot_together_is_refused():
    r = run("train", "--solver=s.prototxt", "--weights=a", "--snapshot=b")
    assert r.returncode == 1 and "not both" in r.stderr


def test_malformed_prototxt_gives_file_line_column_and_no_traceback(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text('name: "x"\nlayer {\n  name: "a"\n  typo: "ReLU"\n}\n')
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 1\n'
                      'snapshot_after_train: false\n')
    r = run("train", f"--solver={solver}")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"caffe: {net}:4:3:") and "typo" in last


def test_malformed_solver_and_missing_file(tmp_path):
    solver = tmp_path / "solver.prototxt"
    solver.write_text("base_lr: 0.1\nmax_iter: ten\n")
    r = run("train", f"--solver={solver}")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"caffe: {solver}:2:")
    r = run("train", "--solver=does/not/exist.prototxt")
    assert r.returncode == 1 and "does/not/exist.prototxt" in r.stderr and "Traceback" not in r.stderr


def test_unknown_layer_type_names_layer_and_known_types(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
                   'layer { name: "odd" type: "Frobnicate" bottom: "x" top: "y" }\n')
    r = run("time", f"--model={net}", "--iterations=1")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "layer 'odd': unknown layer type 'Frobnicate'" in r.stderr and "Convolution" in r.stderr
