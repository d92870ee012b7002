"""pycaffe scripts run on the engine unedited: ``import caffe`` is the engine (the ``caffe``
package installed beside ``caffe_engine``).

Each script in tests/pycaffe_scripts/ is written as a pycaffe user writes one (Caffe's
tutorials: classification, net surgery, a Python training loop, NetSpec, fine-tuning, feature
extraction, Python layers, a hand-written solver) and asserts on the numbers it computes. Here
each runs in a fresh interpreter, in its own temporary working directory, and must exit 0 and
print OK. ``CAFFE_SHARED`` tells the scripts where shared/ is.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from golden import SHARED

SCRIPTS = Path(__file__).resolve().parent / "pycaffe_scripts"
RUNNABLE = sorted(p.name for p in SCRIPTS.glob("*.py") if p.name != "pylayers.py")
TIMEOUT_S = 120


def test_there_are_enough_scripts():
    assert len(RUNNABLE) >= 8, RUNNABLE


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.py")))
def test_script_is_written_for_pycaffe(name):
    """Each script imports pycaffe's name, ``caffe``, and never names ``caffe_engine``."""
    lines = (SCRIPTS / name).read_text().splitlines()
    assert "import caffe" in lines
    assert not [line for line in lines if "caffe_engine" in line]


@pytest.mark.parametrize("name", RUNNABLE)
def test_script_runs(name, tmp_path):
    env = dict(os.environ, CAFFE_SHARED=str(SHARED), PYTHONDONTWRITEBYTECODE="1",
               MPLBACKEND="Agg")
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, str(SCRIPTS / name)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} ran over {TIMEOUT_S} s")
    took = time.perf_counter() - started
    report = f"{name} (exit {proc.returncode}, {took:.1f} s)\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    assert proc.stdout.rstrip().splitlines()[-1].startswith("OK"), report
