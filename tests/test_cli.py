"""The ``caffe`` command: flags as gflags parses them, one-line errors, exit status 1."""
import subprocess
import sys
from pathlib import Path

import pytest

from caffe_engine.cli import UsageError, parse_flags
from cuda_env import cuda_missing

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


# ------------------------------------------------------------------------------------------------
# train: signals, GPU selection, finetuning errors
# ------------------------------------------------------------------------------------------------
import re  # noqa: E402
import signal  # noqa: E402

from tiny_train import caffe, tiny_solver, wait_for  # noqa: E402

TRAINING = ROOT.parent / "shared" / "caffe_reference" / "training"


def test_bool_flags_and_exact_resume_flag():
    _, flags = parse_flags(["train", "--exact_resume"])
    assert flags["exact_resume"] is True
    _, flags = parse_flags(["train", "--noexact_resume"])
    assert flags["exact_resume"] is False
    _, flags = parse_flags(["train", "-exact_resume=false"])
    assert flags["exact_resume"] is False
    with pytest.raises(UsageError, match="illegal value 'maybe'"):
        parse_flags(["train", "--exact_resume=maybe"])


@pytest.mark.parametrize("text,value", [(t, True) for t in ("1", "t", "true", "y", "yes", "YES")]
                         + [(t, False) for t in ("0", "f", "false", "n", "no", "No")])
def test_bool_values_are_gflags_ones(text, value):
    """gflags.cc FlagValue::ParseFrom: 1/t/true/y/yes and 0/f/false/n/no, any case (absl.flags
    refuses y/yes/n/no, one reason the engine keeps its own parser)."""
    assert parse_flags([f"--debug_sync={text}"])[1]["debug_sync"] is value


def test_bad_signal_effect_is_refused(tmp_path):
    tiny_solver(tmp_path)
    r = run("train", "--solver=solver.prototxt", "--sighup_effect=explode", cwd=tmp_path)
    assert r.returncode == 1 and 'Invalid signal effect "explode"' in r.stderr
    assert "Traceback" not in r.stderr


def _signals(tmp_path, args, sequence):
    """Train, sending (signal, wait-for-pattern) pairs in order; returns (returncode, log)."""
    tiny_solver(tmp_path, max_iter=100000)
    proc = caffe(tmp_path, "--solver=solver.prototxt", *args)
    log = []
    try:
        for sig, pattern in sequence:
            log += wait_for(proc, pattern)
            proc.send_signal(sig)
        out = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, "".join(log) + out


def test_sighup_snapshots_and_sigint_stops_by_default(tmp_path):
    code, log = _signals(tmp_path, [], [(signal.SIGHUP, r"Iteration 3 \("),
                                        (signal.SIGINT, r"Snapshotting solver state")])
    assert code == 0, log[-2000:]
    snaps = [int(n) for n in re.findall(r"Snapshotting to binary proto file tiny_iter_(\d+)\.caffemodel", log)]
    # (Both may name one iteration: a stop while testing at the start of the next iteration.)
    assert len(snaps) == 2 and 3 < snaps[0] <= snaps[1]
    # The stop still writes its snapshot, then Solve returns early.
    tail = log[log.index(f"tiny_iter_{snaps[1]}.caffemodel"):]
    assert "Optimization stopped early." in tail and "Optimization Done." in tail
    assert f"Iteration {snaps[1]}, loss" not in tail  # no final forward after a stop
    assert sorted(p.name for p in tmp_path.glob("tiny_iter_*")) == sorted(
        {f"tiny_iter_{n}{e}" for n in snaps for e in (".caffemodel", ".solverstate")})


def test_signal_effects_from_flags(tmp_path):
    code, log = _signals(tmp_path, ["--sigint_effect=none", "--sighup_effect=stop"],
                         [(signal.SIGINT, r"Iteration 3 \("), (signal.SIGHUP, r"Iteration 8 \(")])
    assert code == 0, log[-2000:]
    assert "Optimization stopped early." in log
    snaps = re.findall(r"Snapshotting to binary proto file tiny_iter_(\d+)\.caffemodel", log)
    assert len(snaps) == 1 and int(snaps[0]) > 8


def test_sigint_snapshot_effect_during_test(tmp_path):
    # SIGINT as snapshot: the training goes on; then SIGHUP (stop) while testing interrupts it.
    code, log = _signals(tmp_path, ["--sigint_effect=snapshot", "--sighup_effect=stop"],
                         [(signal.SIGINT, r"Iteration 2 \("), (signal.SIGHUP, r"Iteration 5 \(")])
    assert code == 0, log[-2000:]
    snaps = re.findall(r"Snapshotting to binary proto file tiny_iter_(\d+)\.caffemodel", log)
    assert len(snaps) == 2 and "Optimization stopped early." in log


@pytest.mark.skipif(cuda_missing() is None, reason="a CUDA device is present")
def test_gpu_without_cupy_is_a_one_line_error(tmp_path):
    """Without CuPy, or with CuPy but no usable device (CI installs CuPy for the NVRTC
    check), GPU flags end in one line naming CuPy and the device."""
    tiny_solver(tmp_path)
    for cmd in (["train", "--solver=solver.prototxt", "--gpu=0"], ["device_query"],
                ["time", "--model=net.prototxt", "--gpu=all"]):
        r = run(*cmd, cwd=tmp_path)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-500:]
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("caffe: ") and "CuPy" in last


def test_finetune_shape_mismatch_names_layer_and_shapes(tmp_path):
    from caffe_engine.net import TRAIN, Net
    tiny_solver(tmp_path)
    other = tmp_path / "other.prototxt"
    other.write_text((tmp_path / "net.prototxt").read_text().replace("num_output: 10", "num_output: 12"))
    Net(str(other), TRAIN).save(tmp_path / "other.caffemodel")
    r = run("train", "--solver=solver.prototxt", "--weights=other.caffemodel", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "'ip'" in last and "12 576" in last and "10 576" in last, last


# ------------------------------------------------------------------------------------------------
# test and time
# ------------------------------------------------------------------------------------------------
def _lenet_copy(tmp_path):
    dest = tmp_path / "x" / "y" / "lenet_sgd"
    dest.mkdir(parents=True)
    for name in ("net.prototxt", "lenet_sgd_iter_300.caffemodel"):
        (dest / name).write_bytes((TRAINING / "lenet_sgd" / name).read_bytes())
    (tmp_path / "data").symlink_to(ROOT.parent / "shared" / "data")
    return dest


def test_caffe_test_reproduces_caffes_final_test_outputs(tmp_path):
    import json
    folder = _lenet_copy(tmp_path)
    r = run("test", "--model=net.prototxt", "--weights=lenet_sgd_iter_300.caffemodel",
            "--iterations=10", cwd=folder)
    assert r.returncode == 0, r.stderr[-2000:]
    msgs = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if "] " in line]
    assert "Running for 10 iterations." in msgs
    assert sum(m.startswith("Batch ") for m in msgs) == 20  # accuracy and loss per batch
    assert msgs[msgs.index("Running for 10 iterations.") + 1].startswith("Batch 0, accuracy = ")
    final = json.loads((TRAINING / "lenet_sgd" / "trajectory.json").read_text())["runs"]["train"]["tests"][-1]
    acc = [m for m in msgs if m.startswith("accuracy = ")]
    loss = [m for m in msgs if m.startswith("loss = ")]
    assert acc == [f"accuracy = {final['outputs']['accuracy']:g}"]
    value = float(re.match(r"loss = (\S+) \(\* 1 = (\S+) loss\)$", loss[0]).group(1))
    assert abs(value - final["outputs"]["loss"]) <= 2e-6 * final["outputs"]["loss"] + 1e-6
    assert any(m.startswith("Loss: ") for m in msgs)


def test_caffe_time_layout(tmp_path):
    folder = _lenet_copy(tmp_path)
    r = run("time", "--model=net.prototxt", "--iterations=2", cwd=folder)
    assert r.returncode == 0, r.stderr[-2000:]
    msgs = [line.split("] ", 1)[1] for line in r.stderr.splitlines() if "] " in line]
    start = msgs.index("*** Benchmark begins ***")
    assert msgs[start - 3:start] == ["Performing Forward", msgs[start - 2], "Performing Backward"]
    assert msgs[start - 2].startswith("Initial loss: ")
    assert msgs[start + 1] == "Testing for 2 iterations."
    assert re.match(r"Iteration: 1 forward-backward time: \S+ ms\.$", msgs[start + 2])
    assert msgs[start + 4] == "Average time per layer: "
    assert re.match(r"     mnist\tforward: \S+ ms\.$", msgs[start + 5])
    assert re.match(r"     mnist\tbackward: \S+ ms\.$", msgs[start + 6])
    assert [m.split(":")[0] for m in msgs[-5:]] == ["Average Forward pass", "Average Backward pass",
                                                    "Average Forward-Backward", "Total Time",
                                                    "*** Benchmark ends ***"]
