"""A really full disk during a snapshot (issue 15): ``caffe train`` snapshots into a small tmpfs;
the first snapshot fits, the second does not. The run must end with one ``caffe: ...`` line naming
the file and ENOSPC, exit non-zero, keep the first snapshot whole (it still resumes) and leave no
temporary file behind.

The tmpfs is mounted in a private mount namespace (``unshare --mount``), so nothing outside the
test's process ever sees it and it disappears with the process. Needs root (or a kernel that
allows it); skips with the reason otherwise.
"""
import os
import shutil
import subprocess
import sys

import pytest

from paths import ROOT
from tiny_train import tiny_solver


def can_mount_tmpfs(folder):
    if shutil.which("unshare") is None:
        return False, "unshare(1) is not installed"
    done = subprocess.run(["unshare", "--mount", "sh", "-c",
                           f"mount -t tmpfs -o size=64k tmpfs '{folder}'"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return False, "cannot mount a tmpfs here: " + (done.stderr.strip() or "not permitted")
    return True, ""


def test_enospc_in_the_second_snapshot_is_one_line_and_the_first_survives(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    ok, why = can_mount_tmpfs(disk)
    if not ok:
        pytest.skip(why)
    # One snapshot of the tiny net (weights and momentum: 2 x 23 KiB) fits in 80 KiB; two do not.
    solver = tiny_solver(tmp_path, max_iter=4,
                         extra=f'snapshot: 2\nsnapshot_prefix: "{disk}/tiny"\ntest_interval: 100\n')
    env = dict(os.environ, GLOG_logtostderr="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    script = (f"mount -t tmpfs -o size=80k tmpfs '{disk}' && "
              f"'{sys.executable}' -m caffe_engine train --solver '{solver}'; rc=$?; "
              f"ls -a '{disk}'; "
              f"'{sys.executable}' -c 'import sys; from caffe_engine.solvers import get_solver; "
              f"s = get_solver(sys.argv[1]); s.restore(sys.argv[2]); print(\"resumed at\", s.iter)' "
              f"'{solver}' '{disk}/tiny_iter_2.solverstate'; exit $rc")
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("caffe: ") and "No space left on device" in last, last
    assert f"{disk}/tiny_iter_4" in last, last
    listing = done.stdout.split()
    assert "tiny_iter_2.caffemodel" in listing and "tiny_iter_2.solverstate" in listing, listing
    assert not [name for name in listing if name.startswith(".tmp-")], listing
    assert "resumed at 2" in done.stdout, done.stdout


@pytest.mark.parametrize("where", ["under_a_file", "missing_dir", "read_only"])
def test_a_snapshot_that_cannot_be_written_is_refused_at_start_in_one_line(where, tmp_path):
    """The rest of the family: the prefix under a regular file (ENOTDIR), in a directory that
    does not exist (ENOENT), on a read-only mount (EROFS; root ignores permission bits, so a
    read-only tmpfs stands in for EACCES). As Caffe's CheckSnapshotWritePermissions, the solver
    tries a file there before the first iteration and refuses with Caffe's message."""
    target = {"under_a_file": tmp_path / "file" / "tiny", "missing_dir": tmp_path / "no" / "tiny",
              "read_only": tmp_path / "disk" / "tiny"}[where]
    (tmp_path / "file").write_text("a file, not a directory")
    (tmp_path / "disk").mkdir()
    solver = tiny_solver(tmp_path, max_iter=2,
                         extra=f'snapshot: 2\nsnapshot_prefix: "{target}"\ntest_interval: 100\n')
    env = dict(os.environ, GLOG_logtostderr="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    train = [sys.executable, "-m", "caffe_engine", "train", "--solver", str(solver)]
    if where == "read_only":
        ok, why = can_mount_tmpfs(tmp_path / "disk")
        if not ok:
            pytest.skip(why)
        train = ["unshare", "--mount", "sh", "-c",
                 f"mount -t tmpfs -o ro,size=64k tmpfs '{tmp_path / 'disk'}' && exec \"$@\"",
                 "sh", *train]
    done = subprocess.run(train, capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"caffe: Cannot write to snapshot prefix '{target}'. Make sure that the "
                    "directory exists and is writable."), last
    assert "Iteration 0" not in done.stderr
