"""The start-up line naming the kernel set and NumPy's BLAS (caffe_engine/kernels/__init__.py
``describe_cpu``, logged by ``caffe train/test/time`` after ``Use CPU.``): a BLAS running a
kernel below the host's AVX-512 is called out, with the variable that forced it."""
import os
import subprocess
import sys

import pytest

from caffe_engine import kernels

threadpoolctl = pytest.importorskip("threadpoolctl")


def fake_info(arch, threads=1):
    return [{"user_api": "blas", "internal_api": "openblas", "version": "0.3.31",
             "num_threads": threads, "architecture": arch,
             "filepath": "/x/numpy.libs/libscipy_openblas64_.so"},
            {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2,
             "filepath": "/x/libgomp.so"}]


@pytest.mark.parametrize("arch, host_avx512, forced, expected", [
    ("SkylakeX", True, None, "openblas 0.3.31 (kernel SkylakeX, 1 thread)"),
    ("Haswell", True, "Haswell",
     "openblas 0.3.31 (kernel Haswell, 1 thread, below this CPU's AVX-512: "
     "OPENBLAS_CORETYPE=Haswell is set)"),
    ("Haswell", True, None, "openblas 0.3.31 (kernel Haswell, 1 thread, below this CPU's AVX-512)"),
    ("Haswell", False, None, "openblas 0.3.31 (kernel Haswell, 1 thread)"),
])
def test_blas_phrase_calls_out_a_kernel_below_the_host(monkeypatch, arch, host_avx512, forced,
                                                       expected):
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: fake_info(arch))
    monkeypatch.setattr(kernels, "_host_has_avx512", lambda: host_avx512)
    if forced:
        monkeypatch.setenv("OPENBLAS_CORETYPE", forced)
    else:
        monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert kernels.blas_description() == expected


def test_the_line_names_the_set_in_use_and_numpys_blas():
    previous = kernels.use("reference")
    try:
        line = kernels.describe_cpu()
    finally:
        kernels.use(previous)
    assert line.startswith("reference (array code); NumPy's BLAS: ")
    if "cpu" in kernels.available():
        line = kernels.get("cpu").describe()
        assert line.startswith("cpu (Numba ") and "floats a vector" in line


def test_caffe_time_logs_it_after_use_cpu(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 '
                   'dim: 3 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                   'inner_product_param { num_output: 2 } }\n')
    r = subprocess.run([sys.executable, "-m", "caffe_engine", "time", "--model", str(net),
                        "--iterations", "1"], capture_output=True, text=True,
                       env=dict(os.environ, GLOG_logtostderr="1"))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split("] ", 1)[-1] for line in r.stderr.splitlines()]
    at = lines.index("Use CPU.")
    assert lines[at + 1].startswith("CPU kernels: ") and "NumPy's BLAS: " in lines[at + 1]
