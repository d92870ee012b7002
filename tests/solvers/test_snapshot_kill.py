"""SIGKILL at random moments while ``caffe train`` snapshots every iteration: no torn file, the
killed writer's temporaries gone after the next start, and the newest solverstate resumes
(issue 15). Each trial is one process killed after a random delay, then a resume.

Oracle: the atomic-write contract (a snapshot file either parses in full or does not exist
under its name) and Caffe's resume (``--snapshot``: training goes on from the state's iter).
"""
import collections
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from tiny_train import tiny_solver, wait_for

TRIALS = 30


def newest_state(folder):
    states = sorted(folder.glob("tiny_iter_*.solverstate"),
                    key=lambda p: int(re.search(r"_iter_(\d+)", p.name).group(1)))
    return states[-1] if states else None


@pytest.mark.slow
def test_sigkill_while_snapshotting_never_tears_a_file(tmp_path):
    rng = random.Random(15)
    env = dict(os.environ, GLOG_logtostderr="1")
    outcomes = collections.Counter()
    for trial in range(TRIALS):
        folder = tmp_path / f"t{trial}"
        tiny_solver(folder, max_iter=100000, extra="snapshot: 1\ntest_interval: 1000000\ntest_initialization: false\ndisplay: 0\n")
        proc = subprocess.Popen([sys.executable, "-m", "caffe_engine", "train",
                                 "--solver=solver.prototxt"], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(proc, r"Snapshotting to binary proto file")   # start-up over: now at random
        time.sleep(rng.uniform(0.0, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        outcomes["killed"] += 1
        for path in folder.glob("tiny_iter_*"):
            cls = caffe_pb2.SolverState if path.suffix == ".solverstate" else caffe_pb2.NetParameter
            pio.read_binary(str(path), cls())                   # raises on a torn file
        if list(folder.glob(".tmp-*")):
            outcomes["temporaries left by the kill"] += 1
        state = newest_state(folder)
        iteration = pio.read_binary(str(state), caffe_pb2.SolverState()).iter if state else 0
        text = (folder / "solver.prototxt").read_text().replace(
            "max_iter: 100000", f"max_iter: {iteration + 1}")
        (folder / "solver.prototxt").write_text(text)
        resume = [f"--snapshot={state.name}"] if state else []
        done = subprocess.run([sys.executable, "-m", "caffe_engine", "train",
                               "--solver=solver.prototxt", *resume],
                              cwd=folder, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        if state is None:                  # killed while writing the first snapshot
            outcomes["no snapshot yet, started again"] += 1
        else:
            assert f"Resuming from {state.name}" in done.stderr
            outcomes["resumed"] += 1
        assert (folder / f"tiny_iter_{iteration + 1}.solverstate").exists()   # trained on
        assert not list(folder.glob(".tmp-*")), "a killed writer's temporary survived the restart"
    print(dict(outcomes))
    assert outcomes["resumed"] + outcomes["no snapshot yet, started again"] == TRIALS, outcomes
    assert outcomes["resumed"] >= TRIALS // 2, outcomes
