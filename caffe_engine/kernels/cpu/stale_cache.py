"""Numba's on-disk cache of the cpu kernels, dropped when any kernel source changed.

Numba keys each cached kernel on its own source file's time stamp and size only
(``numba/core/caching.py``: the index of ``cache=True``). A kernel that inlines or calls a
function of another module -- every kernel here calls :mod:`.simd`'s intrinsics, and
:mod:`.conv_plan` calls :mod:`.conv`'s kernels -- keeps its old machine code when only that
other module changes, and runs it: after a ``git pull`` or an edit in a source checkout, a
stale compiled kernel computes with the old code without a word. So the set keeps, beside the
cache, the SHA-1 of all its sources; when they differ, the cache files of this folder are
removed before the kernels' modules load, and Numba compiles them again (once).

Only the cache Numba keeps beside the sources (``__pycache__``) is checked: a wheel install
rewrites every source (new time stamps invalidate every kernel), and with ``NUMBA_CACHE_DIR``
set the cache lives elsewhere and is the user's to clear.
"""
import hashlib
import os
from pathlib import Path

from ... import environment

#: The fingerprint file, in the cache folder.
STAMP = "caffe_engine-sources.sha1"


def sources_digest(folder):
    """SHA-1 (hex) of every ``*.py`` in ``folder``, names and contents, in name order."""
    digest = hashlib.sha1()
    for path in sorted(Path(folder).glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def drop_stale_cache(folder):
    """Remove Numba's cache files (``*.nbi``, ``*.nbc``) of ``folder``'s ``__pycache__`` when
    the sources' digest differs from the one stored there, then store the new one. Returns
    True when it removed them. Does nothing with ``NUMBA_CACHE_DIR`` set, or where the folder
    cannot be written (Numba then caches elsewhere). Never raises for file errors: a process
    that loses a race with another one only compiles again."""
    cache = Path(folder) / "__pycache__"
    if environment.raw("NUMBA_CACHE_DIR") or not os.access(folder, os.W_OK):
        return False
    digest = sources_digest(folder)
    stamp = cache / STAMP
    try:
        if stamp.read_text() == digest:
            return False
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        for path in list(cache.glob("*.nbi")) + list(cache.glob("*.nbc")):
            path.unlink(missing_ok=True)
        tmp = cache / f"{STAMP}.{os.getpid()}"
        tmp.write_text(digest)
        os.replace(tmp, stamp)
    except OSError:
        return False
    return True
