"""The LeNet main job over an emulated network (issue 16): ``mpiexec`` on 4 emulated hosts joined
by 1 Gbit/s links (tools/netlab.py: network namespaces, MPICH over TCP) trains the main job's
solver, batch 64 per rank, and reaches the one-process test accuracy (>= 0.96 on the 1,000
held-out digits at iteration 1,000; one process gives 0.968, docs/scaling.md).

Slow (about two minutes on 2 cores); skips where labs cannot be made (not root) or MPI is
missing, and must not itself run under mpiexec.
"""
import importlib.util
import os
import re
import sys

import pytest

from caffe_engine.comm.launcher import launched_under_mpi, mpi_module
from paths import ROOT, SHARED

SPEC = importlib.util.spec_from_file_location("netlab", ROOT / "tools" / "netlab.py")
netlab = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(netlab)
OK, WHY = netlab.available()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not OK, reason=f"netlab: {WHY}"),
    pytest.mark.skipif(launched_under_mpi() or mpi_module() is None
                       or not netlab.default_mpiexec(),
                       reason="needs mpiexec and mpi4py, and must not run under mpiexec"),
]


def test_lenet_on_four_hosts_at_one_gigabit_reaches_the_main_jobs_accuracy(tmp_path):
    data = SHARED / "data" / "mnist_5k"
    net = (ROOT / "models/lenet/lenet_train_test.prototxt").read_text() \
        .replace("data/mnist/mnist_train_lmdb", str(data / "mnist_train_lmdb")) \
        .replace("data/mnist/mnist_test_lmdb", str(data / "mnist_test_lmdb"))
    (tmp_path / "net.prototxt").write_text(net)
    solver = (ROOT / "models/lenet/lenet_solver.prototxt").read_text() \
        .replace('"models/lenet/lenet_train_test.prototxt"', f'"{tmp_path / "net.prototxt"}"') \
        .replace('"data/lenet/lenet"', f'"{tmp_path / "lenet"}"')
    (tmp_path / "solver.prototxt").write_text(solver)
    env = dict(os.environ, GLOG_logtostderr="1", OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with netlab.Lab(hosts=4, bandwidth="1gbit") as lab:
        done = lab.mpiexec([sys.executable, "-m", "caffe_engine", "train", "--solver",
                            str(tmp_path / "solver.prototxt")], env=env, timeout=900,
                           capture_output=True, text=True, cwd=tmp_path)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "rank 0 of 4 (tree)" in log, log[-3000:]
    hosts = re.search(r"Ranks: (.*)", log).group(1)
    assert all(f"on h{i}" in hosts for i in range(4)), hosts        # one rank per emulated host
    accuracy = [float(a) for a in re.findall(r"Test net output #0: accuracy = ([0-9.]+)", log)]
    print(f"test accuracy at 500 and 1000: {accuracy}; {hosts}")
    assert "Iteration 1000, Testing net" in log and accuracy[-1] >= 0.96, accuracy
