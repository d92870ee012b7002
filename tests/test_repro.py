"""Same seed, same numbers: tools/repro_check.py against real Caffe, and the engine's determinism.

The LeNet fixture (shared/caffe_reference/training/lenet_sgd) is copied to ``tmp/x/y/lenet_sgd``
with ``tmp/data`` linking to shared/data, as the fixtures' README prescribes. One full engine
run of it (300 iterations, about 20 s on a quiet machine) is shared by the tests marked slow;
the tool's own logic is tested on Caffe's log against altered copies of itself (fast).
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "repro_check.py"
TRAINING = ROOT.parent / "shared" / "caffe_reference" / "training"
CASE = TRAINING / "lenet_sgd"
CAFFE_LOG = CASE / "caffe.log"

from caffe_engine.tools.training_log import parse_log  # noqa: E402


def repro(*args, cwd=None, timeout=900):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def copy_case(root, case="lenet_sgd"):
    dest = root / "x" / "y" / case
    shutil.copytree(TRAINING / case, dest)
    for f in dest.rglob("*"):
        f.chmod(0o644)
    if not (root / "data").exists():
        (root / "data").symlink_to(TRAINING.parent.parent / "data")
    return dest


def altered_log(tmp_path, iteration, factor):
    """A copy of Caffe's lenet_sgd log with the smoothed loss of ``iteration`` times ``factor``."""
    pattern = re.compile(rf"(\] Iteration {iteration} \([^)]*\), loss = )(\S+)")
    lines, hits = [], 0
    for line in CAFFE_LOG.read_text().splitlines(keepends=True):
        m = pattern.search(line)
        if m:
            hits += 1
            line = line[:m.start(2)] + f"{float(m.group(2)) * factor:.6g}" + line[m.end(2):]
        lines.append(line)
    assert hits == 1
    out = tmp_path / f"caffe_altered_{iteration}.log"
    out.write_text("".join(lines))
    return out


# ---------------------------------------------------------------- the tool's logic (fast)

def test_help():
    r = repro("--help")
    assert r.returncode == 0
    for flag in ("--log", "--caffemodel", "--engine-log", "--tol", "--until"):
        assert flag in r.stdout


def test_identical_logs_agree(tmp_path):
    r = repro(CASE / "solver.prototxt", "--log", CAFFE_LOG, "--engine-log", CAFFE_LOG)
    assert r.returncode == 0, r.stderr
    assert "first iteration beyond 0.0001: none" in r.stdout
    assert "lr: identical at every logged iteration" in r.stdout


def test_altered_loss_at_iteration_10_is_named(tmp_path):
    """(b) one smoothed loss changed by 1% at iteration 10: exit 1 naming iteration 10."""
    bad = altered_log(tmp_path, 10, 1.01)
    r = repro(CASE / "solver.prototxt", "--log", bad, "--engine-log", CAFFE_LOG)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "iteration 10:" in err[0], r.stderr
    assert "first iteration beyond 0.0001: 10" in r.stdout
    # A 1% change is still within --tol 0.02.
    assert repro(CASE / "solver.prototxt", "--log", bad, "--engine-log", CAFFE_LOG,
                 "--tol", "0.02").returncode == 0


def test_until_reports_but_does_not_check_later_iterations(tmp_path):
    bad = altered_log(tmp_path, 250, 1.01)
    r = repro(CASE / "solver.prototxt", "--log", bad, "--engine-log", CAFFE_LOG, "--until", "200")
    assert r.returncode == 0, r.stderr
    assert "first iteration beyond 0.0001: 250" in r.stdout
    assert "(beyond, not checked)" in r.stdout
    assert repro(CASE / "solver.prototxt", "--log", bad, "--engine-log", CAFFE_LOG,
                 "--until", "250").returncode == 1


def test_bad_input_exits_2(tmp_path):
    r = repro(CASE / "solver.prototxt", "--log", tmp_path / "nope.log", "--engine-log", CAFFE_LOG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    empty = tmp_path / "empty.log"
    empty.write_text("I1129 08:37:31.425395 29493 caffe.cpp:197] Use CPU.\n")
    r = repro(CASE / "solver.prototxt", "--log", empty, "--engine-log", CAFFE_LOG)
    assert r.returncode == 2 and "no 'Iteration N" in r.stderr
    r = repro(tmp_path / "missing_solver.prototxt", "--log", CAFFE_LOG)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    r = repro(CASE / "solver.prototxt", "--log", CAFFE_LOG, "--engine-log", CAFFE_LOG,
              "--caffemodel", tmp_path / "none.caffemodel")
    assert r.returncode == 2


# ---------------------------------------------------------------- the engine against Caffe

@pytest.fixture(scope="module")
def lenet_run(tmp_path_factory):
    """One engine run of the lenet_sgd fixture through repro_check (--until 20)."""
    root = tmp_path_factory.mktemp("repro")
    folder = copy_case(root)
    engine_log = root / "engine.log"
    snaps = root / "engine_snapshots"
    r = repro(folder / "solver.prototxt", "--until", "20", "--save-engine-log", engine_log,
              "--keep", snaps, cwd=folder)
    return folder, r, engine_log, snaps


@pytest.mark.slow
def test_lenet_agrees_with_caffe_until_20(lenet_run):
    """(a) the engine tracks Caffe's smoothed loss within 1e-4 to iteration 20 (in fact ~84)."""
    folder, r, engine_log, snaps = lenet_run
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "within 0.0001 relative up to iteration 20" in r.stderr
    # Caffe's snapshots next to the solver were compared, not overwritten.
    assert (folder / "lenet_sgd_iter_300.caffemodel").read_bytes() == \
        (CASE / "lenet_sgd_iter_300.caffemodel").read_bytes()
    assert (snaps / "lenet_sgd_iter_300.caffemodel").exists()
    assert "lenet_sgd_iter_300.caffemodel:" in r.stdout and "ip2" in r.stdout
    m = re.search(r"first iteration beyond 0.0001: (\d+|none)", r.stdout)
    assert m and (m.group(1) == "none" or int(m.group(1)) > 40), m
    # The fast path on the saved log gives the same verdict and report.
    r2 = repro(folder / "solver.prototxt", "--until", "20", "--engine-log", engine_log,
               "--caffemodel", CASE / "lenet_sgd_iter_300.caffemodel", cwd=folder)
    assert r2.returncode == 0, r2.stderr
    assert "lenet_sgd_iter_300.caffemodel: the engine wrote no snapshot" in r2.stdout
    # The whole run is not within 1e-4 (nor is Caffe against itself): exit 1, naming it.
    r3 = repro(folder / "solver.prototxt", "--engine-log", engine_log, cwd=folder)
    if m.group(1) != "none":
        assert r3.returncode == 1 and f"iteration {m.group(1)}:" in r3.stderr


def _train(folder, solver_text, name):
    solver = folder / name
    solver.write_text(solver_text)
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "train", f"--solver={name}"],
                       cwd=folder, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stderr


def _numbers(log):
    p = parse_log(log)
    return {k: p[k] for k in ("iterations", "lr", "train_outputs", "tests", "final_forward")}


def test_same_seed_same_numbers_other_seed_other_weights(tmp_path):
    """(c) two runs with one seed: identical numbers and snapshots; another seed: other weights."""
    folder = copy_case(tmp_path)
    base = (folder / "solver.prototxt").read_text()
    # 20 iterations, tests on one batch of 100 digits (at 0 and 20): a few seconds per run.
    base = base.replace("test_iter: 10", "test_iter: 1")
    short = base.replace("max_iter: 300", "max_iter: 20")
    assert short != base and "test_iter: 1\n" in base
    logs, snaps = [], []
    for k in range(2):
        text = short.replace('snapshot_prefix: "lenet_sgd"', f'snapshot_prefix: "run{k}"')
        logs.append(_train(folder, text, f"solver_run{k}.prototxt"))
        snaps.append([(folder / f"run{k}_iter_20.{ext}").read_bytes() for ext in ("caffemodel", "solverstate")])
    assert _numbers(logs[0]) == _numbers(logs[1])
    assert len(_numbers(logs[0])["iterations"]) == 20
    assert snaps[0][0] == snaps[1][0]
    # The .solverstate names its .caffemodel (run0_... vs run1_...); the rest is the same.
    assert snaps[0][1].replace(b"run0", b"run1") == snaps[1][1]
    # Initial weights (max_iter 0): seed 1701 gives Caffe's bytes, seed 1702 other weights.
    init = base.replace("max_iter: 300", "max_iter: 0")
    for seed, prefix in ((1701, "same"), (1702, "other")):
        text = init.replace("random_seed: 1701", f"random_seed: {seed}") \
                   .replace('snapshot_prefix: "lenet_sgd"', f'snapshot_prefix: "{prefix}"')
        _train(folder, text, f"solver_{prefix}.prototxt")
    caffe0 = (CASE / "lenet_sgd_iter_0.caffemodel").read_bytes()
    assert (folder / "same_iter_0.caffemodel").read_bytes() == caffe0
    assert (folder / "other_iter_0.caffemodel").read_bytes() != caffe0
