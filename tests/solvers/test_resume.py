"""Resuming: Caffe's ``--snapshot`` (weights, history, iter, lr step; cursors and random stream
restart) and the engine's ``--exact_resume`` (also cursors and random streams, so that N
iterations straight equal N/2 + stop + resume bit for bit, for every solver type)."""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import SOLVERS, SolverAction, get_solver
from tiny_train import caffe, tiny_solver, wait_for


def losses(records):
    return {int(m.group(1)): m.group(2) for r in records
            for m in [re.match(r"Iteration (\d+)(?: \(.*\))?, loss = (\S+)", r.getMessage())] if m}


def train_split(folder, kind, stop_at, exact, caplog, fmt=""):
    """Train to ``stop_at``, stop, then resume (exactly or as Caffe) to the end."""
    tiny_solver(folder, kind, extra=fmt)
    os.chdir(folder)
    first = get_solver("solver.prototxt")
    first.exact_resume = exact
    first.action_request_function = lambda: SolverAction.STOP if first.iter == stop_at else SolverAction.NONE
    first.solve()
    assert first.iter == stop_at and first.requested_early_exit
    caplog.clear()
    second = get_solver("solver.prototxt")
    second.exact_resume = exact
    ext = ".solverstate.h5" if fmt else ".solverstate"
    second.restore(f"tiny_iter_{stop_at}{ext}")
    second.solve()
    return second, losses(caplog.records)


def files(folder, pattern):
    return {p.name: p.read_bytes() for p in Path(folder).glob(pattern)}


@pytest.fixture
def cwd_back():
    here = os.getcwd()
    yield
    os.chdir(here)


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_exact_resume_equals_the_uninterrupted_run(kind, tmp_path, caplog, cwd_back):
    caplog.set_level("INFO", logger="caffe_engine")
    tiny_solver(tmp_path / "straight", kind)
    os.chdir(tmp_path / "straight")
    get_solver("solver.prototxt").solve()
    straight_losses = losses(caplog.records)
    _, resumed_losses = train_split(tmp_path / "split", kind, 6, True, caplog)
    a, b = files(tmp_path / "straight", "tiny_iter_12.*"), files(tmp_path / "split", "tiny_iter_12.*")
    assert sorted(a) == ["tiny_iter_12.caffemodel", "tiny_iter_12.solverstate"]
    b.pop("tiny_iter_12.solverstate.resume")
    assert a == b, "the resumed run's final snapshot differs from the uninterrupted run's"
    # The printed (smoothed) losses continue too.
    assert {i: v for i, v in straight_losses.items() if i >= 6} == resumed_losses


def test_stop_during_a_test_then_exact_resume_repeats_that_test(tmp_path, caplog, cwd_back):
    caplog.set_level("INFO", logger="caffe_engine")
    tiny_solver(tmp_path / "straight", "SGD")
    os.chdir(tmp_path / "straight")
    get_solver("solver.prototxt").solve()
    straight_tests = [r.getMessage() for r in caplog.records if "Test net output" in r.getMessage()]
    tiny_solver(tmp_path / "split", "SGD")
    os.chdir(tmp_path / "split")
    first = get_solver("solver.prototxt")
    first.exact_resume = True
    calls = []

    def stop_in_second_test_batch():  # asked after update 3 -> 4, then before each test batch
        calls.append(first.iter)
        return SolverAction.STOP if calls.count(4) == 3 else SolverAction.NONE
    first.action_request_function = stop_in_second_test_batch
    caplog.clear()
    first.solve()
    assert "Test interrupted." in caplog.text and first.iter == 4
    before = [r.getMessage() for r in caplog.records if "Test net output" in r.getMessage()]
    second = get_solver("solver.prototxt")
    second.exact_resume = True
    second.restore("tiny_iter_4.solverstate")
    caplog.clear()
    second.solve()
    after = [r.getMessage() for r in caplog.records if "Test net output" in r.getMessage()]
    assert before + after == straight_tests
    assert (tmp_path / "split" / "tiny_iter_12.caffemodel").read_bytes() == \
        (tmp_path / "straight" / "tiny_iter_12.caffemodel").read_bytes()


def test_caffe_resume_restarts_cursors_and_stream(tmp_path, caplog, cwd_back):
    caplog.set_level("INFO", logger="caffe_engine")
    tiny_solver(tmp_path / "straight", "SGD")
    os.chdir(tmp_path / "straight")
    get_solver("solver.prototxt").solve()
    straight = files(tmp_path / "straight", "tiny_iter_12.caffemodel")
    solver, _ = train_split(tmp_path / "split", "SGD", 6, False, caplog)
    assert files(tmp_path / "split", "tiny_iter_12.caffemodel") != straight
    assert not list((tmp_path / "split").glob("*.resume"))
    # Caffe's resume: the cursor restarted at record 0 (6 batches of 16 + 1 final forward).
    assert solver.net.layers[0].cursor.offset == 16 * 7


def test_side_file_keeps_the_solverstate_caffes(tmp_path, caplog, cwd_back):
    train_split(tmp_path, "Adam", 6, True, caplog)
    state = pio.read_binary("tiny_iter_6.solverstate", caffe_pb2.SolverState())
    assert [f.name for f, _ in state.ListFields()] == ["iter", "learned_net", "history", "current_step"]
    side = json.loads(Path("tiny_iter_6.solverstate.resume").read_text())
    assert side["version"] == 1 and side["iter"] == 6
    assert [e["name"] for e in side["train_net"]][0] == "mnist"
    assert side["train_net"][0]["state"]["cursor"]["offset"] == 6 * 16
    assert side["test_nets"][0][0]["state"]["cursor"]["offset"] == 2 * 50 * 2  # tests at 0 and 4
    assert not list(Path(".").glob(".tmp-*"))


def test_exact_resume_with_hdf5_snapshots(tmp_path, caplog, cwd_back):
    pytest.importorskip("h5py")
    tiny_solver(tmp_path / "straight", "Nesterov", extra="snapshot_format: HDF5\n")
    os.chdir(tmp_path / "straight")
    get_solver("solver.prototxt").solve()
    train_split(tmp_path / "split", "Nesterov", 6, True, caplog, fmt="snapshot_format: HDF5\n")
    assert (tmp_path / "split" / "tiny_iter_6.solverstate.h5.resume").exists()
    from caffe_engine.net import Net
    weights = []
    for where in ("straight", "split"):
        net = Net(str(tmp_path / where / "net.prototxt"), caffe_pb2.TEST)
        net.load_hdf5(str(tmp_path / where / "tiny_iter_12.caffemodel.h5"))
        weights.append(np.array(net.params["ip"][0].data))
    assert np.array_equal(*weights)


def test_missing_or_foreign_side_file_is_one_line_error(tmp_path, caplog, cwd_back):
    train_split(tmp_path, "SGD", 6, False, caplog)
    solver = get_solver("solver.prototxt")
    with pytest.raises(CaffeError, match=r"tiny_iter_6\.solverstate\.resume.*--exact_resume"):
        solver.restore("tiny_iter_6.solverstate", exact_resume=True)
    Path("tiny_iter_6.solverstate.resume").write_text(json.dumps({"version": 99}))
    with pytest.raises(CaffeError, match="unknown format"):
        get_solver("solver.prototxt").restore("tiny_iter_6.solverstate", exact_resume=True)


# ------------------------------------------------------------------------------------------------
# Through the command line, with a real SIGINT stopping the first run at an arbitrary iteration.
# ------------------------------------------------------------------------------------------------
def test_cli_sigint_then_exact_resume_equals_straight_run(tmp_path):
    n = 200
    tiny_solver(tmp_path / "straight", "RMSProp", max_iter=n, extra="display: 25\n")
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "train", "--solver=solver.prototxt"],
                       cwd=tmp_path / "straight", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    split = tmp_path / "split"
    tiny_solver(split, "RMSProp", max_iter=n, extra="display: 25\n")
    proc = caffe(split, "--solver=solver.prototxt", "--exact_resume")
    wait_for(proc, r"Iteration 25 \(")
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, rest[-2000:]
    assert "Optimization stopped early." in rest
    stop = int(re.search(r"Snapshotting solver state to binary proto file tiny_iter_(\d+)\.solverstate", rest).group(1))
    assert 25 < stop < n
    assert (split / f"tiny_iter_{stop}.solverstate.resume").exists()
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "train", "--solver=solver.prototxt",
                        f"--snapshot=tiny_iter_{stop}.solverstate", "--exact_resume"],
                       cwd=split, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Restoring data cursors and random streams from" in r.stderr
    for ext in (".caffemodel", ".solverstate"):
        assert (split / f"tiny_iter_{n}{ext}").read_bytes() == \
            (tmp_path / "straight" / f"tiny_iter_{n}{ext}").read_bytes()


def test_side_file_of_p_ranks_is_resumed_by_p_ranks_only():
    from caffe_engine.errors import CaffeError
    from caffe_engine.solvers.snapshot import RESUME_VERSION, resume_for_rank
    one = {"version": RESUME_VERSION, "iter": 4}
    two = dict(one, ranks=[{"iter": 4, "who": 0}, {"iter": 4, "who": 1}])
    assert resume_for_rank(one, 0, 1, "s.resume") is one
    assert resume_for_rank(two, 1, 2, "s.resume")["who"] == 1
    with pytest.raises(CaffeError, match="written by 2 process.*this run has 3"):
        resume_for_rank(two, 0, 3, "s.resume")
    with pytest.raises(CaffeError, match="written by 1 process.*this run has 2"):
        resume_for_rank(one, 1, 2, "s.resume")
