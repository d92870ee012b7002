"""A team of threads that runs the parts of a compiled kernel side by side.

Every parallel kernel of the cpu set is a serial Numba function compiled with ``nogil=True``
whose last two arguments are its part and the number of parts, ``fn(*args, t, parts)``;
:meth:`Team.run` calls part 0 on the caller's thread and the others on helper threads, and
returns when all are done. The kernels are compiled once each, serially: Numba's ``prange``
compiled every parallel kernel a second time inside its parallel wrapper (3-4 times the serial
compile time, about 50 s for LeNet's kernels on a fresh machine), and its OpenMP threads
spin after each region on a machine the BLAS and the data thread share.
"""
import os
import threading


class Team:
    """``threads - 1`` helper threads (made on first use, again after a fork).

    Args:
        threads: the number of parts :meth:`run` splits a kernel into (at least 1).
    """

    def __init__(self, threads):
        self.threads = max(1, int(threads))
        self._helpers = None
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        self._helpers = None
        self._lock = threading.Lock()

    def _start(self):
        helpers = []
        for part in range(1, self.threads):
            helper = _Helper(part)
            helper.thread.start()
            helpers.append(helper)
        self._helpers = helpers

    def run(self, fn, *args, parts=None):
        """``fn(*args, t, n)`` for ``t`` in ``range(n)`` (``n = parts`` or :attr:`threads`),
        side by side; raises the first part's exception, after every part has finished."""
        n = self.threads if parts is None else max(1, min(parts, self.threads))
        if n == 1:
            fn(*args, 0, 1)
            return
        with self._lock:
            if self._helpers is None:
                self._start()
            helpers = self._helpers[:n - 1]
            for helper in helpers:
                helper.give(fn, args, n)
            error = None
            try:
                fn(*args, 0, n)
            except BaseException as exc:  # noqa: BLE001 - re-raised after the helpers finish
                error = exc
            for helper in helpers:
                helper_error = helper.finish()
                error = error or helper_error
            if error is not None:
                raise error


class _Helper:
    """One helper thread: waits for a part, runs it, reports."""

    def __init__(self, part):
        self.part = part
        self.job = None
        self.error = None
        self.go = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"caffe_engine-kernels-{part}")

    def give(self, fn, args, parts):
        self.job = (fn, args, parts)
        self.error = None
        self.done.clear()
        self.go.set()

    def finish(self):
        self.done.wait()
        return self.error

    def _loop(self):
        while True:
            self.go.wait()
            self.go.clear()
            fn, args, parts = self.job
            try:
                fn(*args, self.part, parts)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
            self.job = None
            self.done.set()
