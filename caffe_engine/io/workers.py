"""The data layers' decode workers: one process-wide pool of threads that decode and transform
the records of a batch in parallel.

A data layer's prefetch thread reads its records in order (the cursor, the list, the random
draws: everything that decides *which* pixels a batch holds) and hands the per-record work --
decoding a JPEG or PNG (OpenCV), cropping, mirroring, subtracting the mean (the compiled
transform kernel) -- to :meth:`Workers.run`, whose threads (the calling thread among them)
each take the next record not yet taken. Both OpenCV's decoders and the Numba
kernels release the GIL, so the chunks run on separate cores; each record's result depends on
that record alone, so the batch is the same, bit for bit, for any number of threads.

Threads, not processes: measured on 256x256 JPEGs (``tools/bench_data.py``, ``docs/data.md``),
the Data and ImageData layers load 1.9-2.1x as many images a second with two threads as with
one, the share left under the GIL (parsing the Datum, the per-record Python call) being small;
threads need no shared memory to clean up and no pickling of records. The pool is made on first
use, with ``CAFFE_ENGINE_DATA_THREADS`` threads when set, else one per core this process may
run on (its affinity mask); data-parallel ranks sharing a host each take their share
(:func:`set_threads`). With one thread everything runs on the
caller's thread. The pool's threads are the standard library's (``concurrent.futures``),
joined at interpreter exit.
"""
import concurrent.futures
import os
import threading

from .. import environment
from ..backend import cpu_cores

_lock = threading.Lock()
_state = {"threads": None, "workers": None}


def default_threads():
    """``CAFFE_ENGINE_DATA_THREADS`` when set, else the cores this process may run on.

    Raises:
        CaffeError: the variable is not a positive integer.
    """
    threads = environment.read("CAFFE_ENGINE_DATA_THREADS")
    return cpu_cores() if threads is None else threads


class Workers:
    """A pool of ``threads`` threads (the caller counts as one) running per-record jobs.

    Args:
        threads: threads that work on one batch, >= 1.
    """

    def __init__(self, threads):
        self.threads = max(1, int(threads))
        self._pool = None
        self._pool_pid = None
        self._pool_lock = threading.Lock()

    def _executor(self):
        with self._pool_lock:
            # A forked child has the pool object but none of its threads: it makes its own.
            if self._pool is None or self._pool_pid != os.getpid():
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.threads - 1, thread_name_prefix="caffe-data")
                self._pool_pid = os.getpid()
            return self._pool

    def run(self, job, count):
        """``[job(0), job(1), ..., job(count - 1)]``, computed by the threads together (the
        calling thread too), each taking the next index not yet taken, so that a slow record
        does not hold up a whole share.

        Raises:
            whatever ``job`` raised for the lowest index that failed (every index is still
            run, so which one that is does not depend on the threads' timing).
        """
        results = [None] * count
        helpers = min(self.threads, count) - 1
        if helpers <= 0:
            for i in range(count):
                results[i] = job(i)
            return results
        indices = iter(range(count))     # next() on it is atomic under the GIL
        errors = {}

        def work():
            for i in indices:
                try:
                    results[i] = job(i)
                except BaseException as exc:  # raised below, for the lowest index
                    errors[i] = exc

        pool = self._executor()
        futures = [pool.submit(work) for _ in range(helpers)]
        work()
        for future in futures:
            future.result()
        if errors:
            raise errors[min(errors)]
        return results

    def close(self):
        """Let the pool's threads end (they are made again on the next :meth:`run`)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _forget_in_child():
    """After fork: the parent's locks may have been held by its other threads, its pool's
    threads are not in the child; start afresh."""
    global _lock
    _lock = threading.Lock()
    _state["workers"] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def shared():
    """The process's :class:`Workers` (made on first use with :func:`default_threads`, or the
    count :func:`set_threads` gave)."""
    with _lock:
        if _state["workers"] is None:
            _state["workers"] = Workers(_state["threads"] or default_threads())
        return _state["workers"]


def set_threads(threads):
    """Use ``threads`` data threads from now on (data-parallel ranks sharing a host take their
    share of its cores; benchmarks compare counts). Returns the previous count."""
    with _lock:
        previous = _state["workers"].threads if _state["workers"] else _state["threads"]
        # A loader still holding the old pool finishes its batch with it; its idle threads end
        # when it is collected.
        _state["workers"] = None
        _state["threads"] = max(1, int(threads))
    return previous
