"""BLAS threads are shared among the ranks on one host (issue 6: 2 LeNet ranks with 2 OpenBLAS
threads each on 2 cores ran 5x slower than with one each).

Runs under ``mpiexec -n K`` (every rank calls the collective split) and without a launcher.
"""

import pytest

from caffe_engine.backend import cpu_cores
from caffe_engine.comm import distributed

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads():
    pools = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    return pools[0]["num_threads"] if pools else None


def test_ranks_on_one_host_split_the_cores(make, monkeypatch):
    comm = make("tree")
    for var in distributed._THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    before = _blas_threads()
    with threadpoolctl.threadpool_limits(limits=before, user_api="blas"):  # restored afterwards
        got = distributed.share_cores(comm)
        if comm.size == 1:
            assert got is None
            assert _blas_threads() == before
        else:
            # mpiexec on one machine: every rank is local.
            assert got == max(1, cpu_cores() // comm.size)
            assert _blas_threads() == got


def test_a_user_setting_is_left_alone(make, monkeypatch):
    comm = make("tree")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    before = _blas_threads()
    assert distributed.share_cores(comm) is None  # the split still ran on every rank
    assert _blas_threads() == before
