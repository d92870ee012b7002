"""glibc's mmap threshold held from the first net on (caffe_engine/memory.py): freed arrays of
a few MiB leave the RSS instead of staying on the heap."""
import os

import numpy
import pytest

from caffe_engine import memory
from caffe_engine.process import state


def _rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def test_the_threshold_is_held_once_per_process(monkeypatch):
    monkeypatch.setattr(state, "mmap_threshold", None)
    monkeypatch.setenv("CAFFE_ENGINE_MMAP_THRESHOLD", str(8 << 20))
    held = memory.hold_mmap_threshold()
    if held == 0:
        pytest.skip("not glibc on Linux: nothing to hold")
    assert held == 8 << 20 and state.mmap_threshold == held
    monkeypatch.setenv("CAFFE_ENGINE_MMAP_THRESHOLD", str(1 << 20))
    assert memory.hold_mmap_threshold() == held          # asked once, kept


def test_zero_leaves_glibc_as_it_is(monkeypatch):
    monkeypatch.setattr(state, "mmap_threshold", None)
    monkeypatch.setenv("CAFFE_ENGINE_MMAP_THRESHOLD", "0")
    assert memory.hold_mmap_threshold() == 0


def test_freed_arrays_under_32_mib_leave_the_rss(monkeypatch):
    """With glibc's sliding threshold, freeing a 24 MiB block lifts it to 24 MiB, and a 16 MiB
    array made and freed after that stays resident on the heap; held at 4 MiB it is unmapped."""
    monkeypatch.setattr(state, "mmap_threshold", None)
    monkeypatch.delenv("CAFFE_ENGINE_MMAP_THRESHOLD", raising=False)
    if memory.hold_mmap_threshold() == 0 or not os.path.exists("/proc/self/statm"):
        pytest.skip("not glibc on Linux")
    big = numpy.ones(6 << 20, numpy.float32)             # 24 MiB, mapped and unmapped
    del big
    before = _rss_mib()
    for _ in range(4):
        a = numpy.ones(4 << 20, numpy.float32)           # 16 MiB, touched
        b = numpy.ones(4 << 20, numpy.float32)
        del a, b
    assert _rss_mib() - before < 8
