"""Numba, imported without the SciPy linear algebra its BLAS probe would load.

Its own module so that the kernel sets (``kernels/cpu``) and the choice of set
(``kernels/__init__``) both import it without importing each other.
"""
import importlib.util
import sys

#: What ``numba.np.arraymath`` imports when it is imported, to see whether a BLAS is there.
_BLAS_PROBE = "scipy.linalg.cython_blas"


def import_numba():
    """``numba``, imported with ``numba.np.arraymath`` but not SciPy's linear algebra.

    Numba imports ``numba.np.arraymath`` when it first compiles or loads a cached kernel, and
    that module probes for a BLAS by importing ``scipy.linalg.cython_blas``, which imports all
    of ``scipy.linalg``: 0.1-0.2 s of every start-up where SciPy is installed, for the BLAS
    that no kernel of the engine uses. So arraymath is imported here with that probe failing
    at once, and its answer is then set to what the probe would have found (SciPy importable):
    a kernel that does use a BLAS (``np.dot`` in a user's njit code) still imports it, when it
    is compiled (Numba's ``ensure_blas``). Numba's behaviour is unchanged; only the import is
    deferred.

    Raises:
        ImportError: Numba cannot be imported.
    """
    import numba
    if "numba.np.arraymath" in sys.modules or _BLAS_PROBE in sys.modules:
        return numba
    sys.modules[_BLAS_PROBE] = None        # "import scipy.linalg.cython_blas" fails at once
    try:
        from numba.np import arraymath
    finally:
        if _BLAS_PROBE in sys.modules and sys.modules[_BLAS_PROBE] is None:
            del sys.modules[_BLAS_PROBE]
    if isinstance(getattr(arraymath, "_HAVE_BLAS", None), bool):
        arraymath._HAVE_BLAS = importlib.util.find_spec("scipy") is not None
    return numba
