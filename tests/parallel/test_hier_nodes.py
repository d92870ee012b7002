"""The hierarchical allreduce with nodes named by the launcher's environment (``CAFFE_NODE``).

On one real machine every rank shares a host, so these tests start their own ``mpiexec`` with
MPMD segments that give each group of ranks its own ``CAFFE_NODE`` (as tools/netlab.py does for
its emulated hosts): 4 ranks as 2 nodes of 2, and 3 ranks as 2 nodes of 2 and 1. They run only
from a plain ``pytest`` (not from a pytest that mpiexec itself started) and only where mpiexec
and mpi4py are installed.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from caffe_engine.comm.launcher import launched_under_mpi, mpi_module

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    launched_under_mpi() or shutil.which("mpiexec") is None or mpi_module() is None,
    reason="needs mpiexec and mpi4py, and must not itself run under mpiexec")

SCRIPT = """
import hashlib, sys, numpy
from caffe_engine.comm import distributed
ctx = distributed.init(sys.argv[1], timeout=60, chunk_bytes=1024)
comm = ctx.comm
n = 10007
data = ((numpy.arange(n) * 7 + comm.rank * 13) % 101).astype(numpy.float32)
want = sum(((numpy.arange(n) * 7 + r * 13) % 101).astype(numpy.float64) for r in range(comm.size))
buf = data.copy()
comm.allreduce_(buf)
assert (buf == want.astype(numpy.float32)).all(), "wrong sum"
rng = numpy.random.default_rng(comm.rank)
noise = rng.standard_normal(n).astype(numpy.float32)
h = comm.allreduce_async_(noise, op="mean")
h.wait()
digests = comm.allgather_object(hashlib.sha1(noise.tobytes()).hexdigest())
assert len(set(digests)) == 1, digests
print(f"rank {comm.rank} node {comm.node} members {comm.members} leaders {comm.leaders} "
      f"source {comm.node_source} OK", flush=True)
comm.close()
"""


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_")) and k != "CAFFE_NODE"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def mpmd(groups, command):
    """``mpiexec -n a -env CAFFE_NODE h0 CMD : -n b -env CAFFE_NODE h1 CMD ...``."""
    argv = ["mpiexec"]
    for i, count in enumerate(groups):
        if i:
            argv.append(":")
        argv += ["-n", str(count), "-env", "CAFFE_NODE", f"h{i}", *command]
    return argv


@pytest.mark.parametrize("spec", ["hier", "hybrid:tree"])
@pytest.mark.parametrize("groups", [(2, 2), (2, 1)], ids=["4_ranks_2x2", "3_ranks_2+1"])
def test_caffe_node_from_the_launcher_groups_the_ranks(groups, spec):
    proc = subprocess.run(mpmd(groups, [sys.executable, "-c", SCRIPT, spec]),
                          capture_output=True, text=True, timeout=120, env=clean_env(), cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # mpiexec merges the ranks' output, not always at line ends: find the reports anywhere.
    lines = re.findall(r"rank \d+ node .*? OK", proc.stdout)
    size = sum(groups)
    assert len(lines) == size, out
    leaders = [0, groups[0]]
    for r, line in enumerate(sorted(lines, key=lambda t: int(t.split()[1]))):
        node = 0 if r < groups[0] else 1
        members = list(range(groups[0])) if node == 0 else list(range(groups[0], size))
        assert line == (f"rank {r} node {node} members {members} leaders {leaders} "
                        "source CAFFE_NODE OK"), out


def test_caffe_train_with_hier_tree_on_two_named_nodes(tmp_path):
    """``caffe train --comm hier:tree --debug_sync`` on 2 nodes of 2 ranks: trains, every rank
    holds the same weights after every update, exit status 0."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_train import tiny_solver
    solver = tiny_solver(tmp_path, max_iter=6, extra="test_interval: 100\nsnapshot: 0\n"
                         "snapshot_after_train: false\n")
    command = [sys.executable, "-m", "caffe_engine", "train", "--solver", str(solver),
               "--comm", "hier:tree", "--debug_sync"]
    env = clean_env()
    env["GLOG_logtostderr"] = "1"
    proc = subprocess.run(mpmd((2, 2), command), capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Optimization Done" in out, out[-3000:]
