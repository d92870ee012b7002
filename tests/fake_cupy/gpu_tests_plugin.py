"""A pytest plugin: the tests marked ``gpu`` (and the ``cuda`` kernel-set params) on the fake CuPy.

    PYTHONPATH=tests .venv/bin/python -m pytest -p fake_cupy.gpu_tests_plugin \
        tests/layers tests/kernels tests/solvers tests/io tests/comm -q

It keeps only the items marked ``gpu``, drops their skip marks for a missing CUDA device, makes
``conftest.CUDA_MISSING`` and every test module's ``cuda_missing`` say nothing is missing, and
installs the fake (``fake_cupy.install``) around each test: a forecast, without a GPU, of the
``pytest`` step of ``tools/gpu_check.sh``. A failure there is a real GPU failure only where the
fake imitates CuPy (see its module docstring); tests that need a subprocess on the GPU
(``tests/test_train_fixture_gpu.py``) still fail, the fake being installed in this process
only.
"""
import sys

import pytest


def pytest_collection_modifyitems(config, items):
    conftest = sys.modules.get("conftest")
    reason = getattr(conftest, "CUDA_MISSING", None)

    def gpu_skip(mark):
        why = str(mark.kwargs.get("reason", ""))
        return mark.name in ("skip", "skipif") and (
            (reason is not None and why == reason) or "CUDA" in why or "driver" in why)

    kept = []
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        item.own_markers = [m for m in item.own_markers if not gpu_skip(m)]
        kept.append(item)
    items[:] = kept
    if conftest is not None:
        conftest.CUDA_MISSING = None


@pytest.fixture(autouse=True)
def _fake_cupy_installed(monkeypatch):
    import fake_cupy
    from caffe_engine import backend
    fake_cupy.install(monkeypatch)
    for module in list(sys.modules.values()):
        if callable(getattr(module, "cuda_missing", None)) and \
                "/tests/" in str(getattr(module, "__file__", "")):
            monkeypatch.setattr(module, "cuda_missing", lambda: None)
    fake_cupy.forget_device_state()
    try:
        yield
    finally:
        backend.set_mode_cpu()
        fake_cupy.forget_device_state()
