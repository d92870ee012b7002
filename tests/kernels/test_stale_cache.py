"""kernels/cpu/stale_cache.py: Numba's cache files go when any source of the folder changes."""
import os

import pytest

from caffe_engine.kernels.cpu import stale_cache


def _folder(tmp_path):
    (tmp_path / "simd.py").write_text("A = 1\n")
    (tmp_path / "pool.py").write_text("from .simd import A\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("pool.f-1.py311.nbi", "pool.f-1.py311.1.nbc", "pool.cpython-311.pyc"):
        (cache / name).write_bytes(b"x")
    return cache


def test_cache_dropped_once_then_kept_until_a_source_changes(tmp_path, monkeypatch):
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    cache = _folder(tmp_path)
    assert stale_cache.drop_stale_cache(tmp_path)             # no stamp yet: dropped
    assert sorted(p.name for p in cache.iterdir()) == [stale_cache.STAMP,
                                                       "pool.cpython-311.pyc"]
    (cache / "pool.f-1.py311.nbi").write_bytes(b"y")         # Numba caches again
    assert not stale_cache.drop_stale_cache(tmp_path)         # same sources: kept
    assert (cache / "pool.f-1.py311.nbi").exists()
    (tmp_path / "simd.py").write_text("A = 2\n")              # only the callee changes
    assert stale_cache.drop_stale_cache(tmp_path)
    assert not (cache / "pool.f-1.py311.nbi").exists()
    assert (cache / stale_cache.STAMP).read_text() == stale_cache.sources_digest(tmp_path)


def test_numba_cache_dir_is_the_users(tmp_path, monkeypatch):
    cache = _folder(tmp_path)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert not stale_cache.drop_stale_cache(tmp_path)
    assert (cache / "pool.f-1.py311.nbi").exists()


def test_digest_covers_names_and_contents(tmp_path):
    (tmp_path / "a.py").write_text("x")
    first = stale_cache.sources_digest(tmp_path)
    os.rename(tmp_path / "a.py", tmp_path / "b.py")
    assert stale_cache.sources_digest(tmp_path) != first


def test_the_kernel_sets_folder_is_stamped():
    folder = os.path.dirname(stale_cache.__file__)
    stamp = os.path.join(folder, "__pycache__", stale_cache.STAMP)
    if not os.access(folder, os.W_OK) or os.environ.get("NUMBA_CACHE_DIR"):
        pytest.skip("the kernel set's folder is not where Numba caches here")
    with open(stamp) as f:
        assert f.read() == stale_cache.sources_digest(folder)
