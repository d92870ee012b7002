"""A rank that fails makes every rank exit non-zero, with a clear message, in seconds (no hang).

These tests start their own ``mpiexec -n 2``; they run only from a plain ``pytest`` (not from a
pytest that mpiexec itself started) and only where mpiexec and mpi4py are installed.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from caffe_engine.comm.launcher import launched_under_mpi, mpi_module

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    launched_under_mpi() or shutil.which("mpiexec") is None or mpi_module() is None,
    reason="needs mpiexec and mpi4py, and must not itself run under mpiexec")

SCRIPT = """
import os, signal, sys, numpy
from caffe_engine.comm import distributed
mode = sys.argv[1]
ctx = distributed.init("tree", timeout=3)
buf = numpy.ones(1000, numpy.float32)
ctx.comm.allreduce_(buf)
if mode == "raise":
    with distributed.guard(ctx):
        if ctx.rank == 1:
            raise RuntimeError("boom")
        ctx.comm.allreduce_(buf)
elif mode == "hang":            # a rank stops talking: the others' watchdog must fire
    if ctx.rank == 1:
        import time
        time.sleep(120)
    ctx.comm.allreduce_(buf)
elif mode == "exit":            # exits without MPI_Abort: the watchdog or mpiexec ends the job
    if ctx.rank == 1:
        sys.exit(3)
    ctx.comm.allreduce_(buf)
elif mode == "kill":
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    ctx.comm.allreduce_(buf)
elif mode == "caffe_error":     # an uncaught CaffeError: the excepthook aborts everyone
    from caffe_engine.errors import CaffeError
    if ctx.rank == 1:
        raise CaffeError("layer 'ip1': bad thing")
    ctx.comm.allreduce_(buf)
print("rank", ctx.rank, "finished", flush=True)
"""


def run_job(mode):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    t0 = time.monotonic()
    proc = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-c", SCRIPT, mode],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


@pytest.mark.parametrize("mode, message", [
    ("raise", "rank 1 of 2 failed: RuntimeError: boom; aborting all ranks"),
    ("caffe_error", "rank 1 of 2 failed: layer 'ip1': bad thing; aborting all ranks"),
    ("hang", "rank 0 of 2: allreduce of 4000 bytes (tree) waited more than 3 s"),
    ("exit", "waited more than 3 s|EXIT CODE: 3"),
    ("kill", "signal 9"),
])
def test_failure_on_one_rank_ends_the_job(mode, message):
    rc, output, seconds = run_job(mode)
    assert rc != 0, output
    assert any(m in output for m in message.split("|")), output
    assert "rank 0 finished" not in output
    assert seconds < 30, f"took {seconds:.1f} s"


def test_a_command_line_error_is_printed_once_not_once_per_rank():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "caffe_engine", "train",
                           "--solver", "models/lenet/lenet_solver.prototxt", "--comm", "bogus"],
                          capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["caffe: --comm: unknown communicator 'bogus' "
                     "(known: tree, ring, ps, mpi, hier, nccl)"], proc.stderr


@pytest.mark.parametrize("cleanup", ["default", "disabled"])
@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_is_named_and_every_process_ends(cleanup, victim, tmp_path):
    """SIGKILL one rank of ``mpiexec -n 2 caffe train`` mid-training: with MPICH's clean-up and
    with ``-disable-auto-cleanup`` every process is gone within 10 s, the output names the dead
    rank in the engine's one line (each rank's supervising parent prints it), and no multi-line MPI
    error stack or traceback is printed."""
    import re
    import signal
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_train import tiny_solver
    solver = tiny_solver(tmp_path, max_iter=100000, extra="test_interval: 100000\nsnapshot: 0\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), GLOG_logtostderr="1")
    flags = ["-disable-auto-cleanup"] if cleanup == "disabled" else []
    proc = subprocess.Popen(["mpiexec", *flags, "-n", "2", sys.executable, "-m", "caffe_engine",
                             "train", "--solver", str(solver)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, before = {}, []
    for line in proc.stdout:
        before.append(line)
        found = re.search(r"Ranks: (.*)", line)
        if found:
            pids = {int(r): int(p) for r, p in re.findall(r"(\d+) pid (\d+)", found.group(1))}
        if pids and re.search(r"Iteration 10\b", line):
            break
    assert len(pids) == 2, "".join(before)[-3000:]
    t0 = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    after = proc.communicate(timeout=60)[0]

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    while any(alive(p) for p in pids.values()) and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    gone = time.monotonic() - t0
    assert proc.returncode != 0 and gone < 10, (gone, after)
    assert f"caffe_engine: rank {victim} of 2 failed: killed by signal 9 (SIGKILL)" in after, after
    assert "error stack" not in after.lower() and "Traceback" not in after, after
