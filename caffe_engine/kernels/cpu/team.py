"""A team of threads that runs the parts of a compiled kernel side by side.

Every parallel kernel of the cpu set is a serial Numba function compiled with ``nogil=True``
whose last two arguments are its part and the number of parts, ``fn(*args, t, parts)``;
:meth:`Team.run` calls part 0 on the caller's thread and the others on helper threads, and
returns when all are done. The kernels are compiled once each, serially: Numba's ``prange``
compiled every parallel kernel a second time inside its parallel wrapper (3-4 times the serial
compile time, about 50 s for LeNet's kernels on a fresh machine), and its OpenMP threads
spin after each region on a machine the BLAS and the data thread share.

Hand-offs: waking a sleeping thread through an event took 40-70 us a call on the development
machine (a 2-vCPU VM), about 2 ms of LeNet's 21 ms iteration (some 40 kernel calls). So a
helper that has just finished a part, and the caller waiting for the helpers, first poll a
counter for ``spin`` seconds without the GIL (:func:`spin_until`: atomic loads and the CPU's
pause hint), and only then sleep on the event: kernels called in quick succession, as in a
training iteration, hand off in a few microseconds, and an idle team costs no CPU.
"""
import os
import platform
import threading
import time

import numpy
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


@intrinsic
def _load_acquire(typingctx, counters, index):
    """``counters[index]`` (int64) read with an atomic acquire load: LLVM may not hoist it out
    of a polling loop."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(array.data, [args[1]]), "acquire", 8)
    return types.int64(counters, types.int64), codegen


@intrinsic
def _pause(typingctx):
    """The CPU's spin-wait hint (x86 ``pause``; nothing elsewhere)."""
    def codegen(context, builder, signature, args):
        if _X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(
                ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.void(), codegen


@intrinsic
def _store_release(typingctx, counters, index, value):
    """``counters[index] = value`` (int64) with an atomic release store."""
    def codegen(context, builder, signature, args):
        array = context.make_array(signature.args[0])(context, builder, args[0])
        builder.store_atomic(args[2], builder.gep(array.data, [args[1]]), "release", 8)
        return context.get_dummy_value()
    return types.void(counters, types.int64, types.int64), codegen


@njit(cache=True, nogil=True)
def report_and_spin(counters, done, given, polls):
    """``counters[1] = done`` (released without the GIL, so that the caller polling it never
    waits for the GIL behind this thread), then :func:`spin_until` ``counters[0] == given``."""
    _store_release(counters, 1, done)
    return spin_until(counters, 0, given, polls)


@njit(cache=True, nogil=True)
def spin_until(counters, index, value, polls):
    """Poll ``counters[index]`` (int64 array) until it equals ``value``: True, or False after
    ``polls`` polls. Runs without the GIL."""
    for _ in range(polls):
        if _load_acquire(counters, index) == value:
            return True
        _pause()
    return False


def _polls_per_second():
    """How fast :func:`spin_until` polls on this CPU (measured: ``pause`` costs 10-140 cycles
    depending on the microarchitecture)."""
    counters = numpy.zeros(1, numpy.int64)
    spin_until(counters, 0, 1, 10)   # compile / load from the cache
    polls = 20000
    start = time.perf_counter()
    spin_until(counters, 0, 1, polls)
    return polls / max(time.perf_counter() - start, 1e-6)


class Team:
    """``threads - 1`` helper threads (made on first use, again after a fork).

    Args:
        threads: the number of parts :meth:`run` splits a kernel into (at least 1).
        spin: seconds a thread polls for the next hand-off before it sleeps (0: sleep at once).
    """

    def __init__(self, threads, spin=100e-6):
        self.threads = max(1, int(threads))
        self.spin = max(0.0, float(spin))
        self._polls = 0
        self._helpers = None
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        self._helpers = None
        self._lock = threading.Lock()

    def _start(self):
        self._polls = int(self.spin * _polls_per_second()) if self.spin > 0 else 0
        helpers = []
        for part in range(1, self.threads):
            helper = _Helper(part, self._polls)
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
                helper_error = helper.finish(self._polls)
                error = error or helper_error
            if error is not None:
                raise error


class _Helper:
    """One helper thread: waits for a part, runs it, reports.

    ``counters[0]`` counts the jobs given, ``counters[1]`` the jobs finished; each side polls
    the other's counter (:func:`spin_until`) before it sleeps on its event. An event is set for
    every hand-off, so a sleeper always wakes; a poller that saw the counter clears it."""

    def __init__(self, part, polls):
        self.part = part
        self.polls = polls
        self.job = None
        self.error = None
        self.counters = numpy.zeros(2, numpy.int64)
        self.go = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True,
                                       name=f"caffe_engine-kernels-{part}")

    def give(self, fn, args, parts):
        self.job = (fn, args, parts)
        self.error = None
        self.done.clear()
        self.go.set()
        self.counters[0] += 1   # after the event: a poller that sees it finds the event set

    def finish(self, polls):
        if polls:
            spin_until(self.counters, 1, self.counters[0], polls)
        self.done.wait()
        return self.error

    def _loop(self):
        given = 0
        while True:
            given += 1
            # report the previous job (none at first) and poll for the next without the GIL
            report_and_spin(self.counters, given - 1, given, self.polls)
            self.go.wait()
            self.go.clear()
            fn, args, parts = self.job
            try:
                fn(*args, self.part, parts)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
            self.job = None
            self.done.set()
