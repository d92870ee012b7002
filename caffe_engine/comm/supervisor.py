"""Name a rank that a signal killed: each rank of an ``mpiexec`` job runs under a small parent.

A process killed by SIGKILL (by a user, or by the kernel's out-of-memory killer) cannot say
anything, and MPICH's launcher names only a PID in its banner — or, when rank 0 dies under
``-disable-auto-cleanup``, kills the others at once and names nothing (measured here: the launcher
sent SIGKILL to the survivor 30-60 ms after the kill, before its peer watch could print, in 4 of
19 runs). So under a launcher with more than one rank, the ``caffe`` command forks before it
initialises MPI: the child does the work, the parent only waits. When the child ends by a
signal the parent prints

    caffe_engine: rank R of P failed: killed by signal 9 (SIGKILL); aborting all ranks

and then ends by the same signal, so the launcher sees what it would have seen (its banner's
``EXIT CODE: 9``) and cleans up as it would have; the survivors' peer watch
(:mod:`.peer_watch`) ends them in any case. Any other end of the child is passed on unchanged.

The parent ignores the signals a launcher or a terminal sends to the whole process group
(SIGINT, SIGHUP, SIGUSR1, SIGTERM to the group reach the child directly); a SIGTERM sent to the
parent alone is passed on to the child. The child dies with the parent (``PR_SET_PDEATHSIG``),
so killing the PID the launcher shows still ends the rank. ``CAFFE_SUPERVISE=0`` turns it off.
"""
import ctypes
import os
import signal
import sys

from .. import environment
from .launcher import launched_under_mpi, launcher_rank_size

#: Set in the child's environment; also tells the peer watch that the parent reports signals.
CHILD_VAR = "CAFFE_SUPERVISED"
_PR_SET_PDEATHSIG = 1
_GROUP_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def wanted(environ=None):
    """Whether this process should fork a supervised child: under an MPI launcher with more
    than one rank, not already the child, MPI not imported yet, not turned off by
    ``CAFFE_SUPERVISE=0``. (The ``caffe`` command asks only when it is the program itself.)"""
    if environment.read(CHILD_VAR, environ) or not environment.read("CAFFE_SUPERVISE", environ):
        return False
    if "mpi4py.MPI" in sys.modules:     # never fork a process that may have started MPI
        return False
    return launched_under_mpi(environ) and launcher_rank_size(environ)[1] > 1


def supervised():
    """Whether this process is the supervised child (its parent reports a death by signal)."""
    return environment.read(CHILD_VAR)


def describe_signal(number):
    """``"signal 9 (SIGKILL)"`` for a signal number."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def run():
    """Fork; in the child return (it goes on to do the work), in the parent wait and exit.

    Never returns in the parent: it exits with the child's status, or by the child's signal
    after printing one line naming this rank.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        environment.export(CHILD_VAR, "1")
        _die_with_parent()
        return
    for sig in _GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: _forward(pid, signal.SIGTERM))
    status = _wait(pid)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        rank, size = launcher_rank_size()
        sys.stderr.write(f"caffe_engine: rank {rank} of {size} failed: killed by "
                         f"{describe_signal(number)}; aborting all ranks\n")
        sys.stderr.flush()
        if number not in (signal.SIGKILL, signal.SIGSTOP):   # those cannot be handled
            signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _wait(pid):
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return 0
        except InterruptedError:
            continue


def _forward(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _die_with_parent():
    """Ask the kernel to SIGKILL this child when its parent dies (Linux prctl; else nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:           # the parent died before the prctl
        os._exit(1)


__all__ = ["wanted", "supervised", "run", "describe_signal", "CHILD_VAR"]
