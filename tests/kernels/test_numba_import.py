"""What start-up imports: the cpu kernels without SciPy's linear algebra, and ``caffe train``
without the heavy packages it never uses (SciPy's linalg, PyTorch, OpenCV, h5py)."""
import subprocess
import sys

import pytest

from tiny_train import tiny_solver

pytest.importorskip("numba")

#: Packages a CPU ``caffe train`` of a Data-layer net must not import (a top-level ``scipy`` is
#: allowed: Numba itself imports it to check its version).
HEAVY = ("scipy.linalg", "torch", "cv2", "h5py", "PIL")


def _python(code, cwd=None):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_cpu_kernels_import_numba_without_scipy_linalg():
    """numba.np.arraymath is loaded with its BLAS probe deferred, and answers as the probe would;
    a kernel that does use a BLAS still gets it (imported when it is compiled)."""
    out = _python(
        "import importlib.util, sys\n"
        "import numpy as np\n"
        "import caffe_engine.kernels.cpu\n"
        "from numba.np import arraymath\n"
        "print('scipy.linalg' in sys.modules, 'scipy.linalg.cython_blas' in sys.modules)\n"
        "print(arraymath._HAVE_BLAS == (importlib.util.find_spec('scipy') is not None))\n"
        "if importlib.util.find_spec('scipy') is not None:\n"
        "    from numba import njit\n"
        "    f = njit(lambda a, b: (np.dot(a, b), np.correlate(a, b)[0]))\n"
        "    print(f(np.arange(4.0), np.ones(4)))\n"
        "else:\n"
        "    print((6.0, 6.0))\n")
    lines = out.splitlines()
    assert lines[0] == "False False"
    assert lines[1] == "True"
    assert lines[2] == "(6.0, 6.0)"


def test_caffe_train_imports_nothing_heavy(tmp_path):
    tiny_solver(tmp_path, max_iter=2)
    out = _python(
        "import sys\n"
        "from caffe_engine.cli import main\n"
        "assert main(['train', '--solver=solver.prototxt']) == 0\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n", cwd=tmp_path)
    assert out.splitlines()[-1] == "[]"
