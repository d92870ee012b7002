"""Every CUDA source of the cuda kernel set compiles with NVRTC for the H100/H200 (sm_90).

Needs CuPy's NVRTC binding and the NVRTC library (``pip install cupy-cuda13x
nvidia-cuda-nvrtc``, what ``.ci/run`` installs), not a GPU: the program is compiled to a cubin
for the named architecture without asking a device. Skipped, with the reason, where those do
not import. Also checks that every kernel a source declares is defined in its text and that
kernel names are unique across sources (the emulator links them into one library).
"""
import re

import pytest

from caffe_engine.kernels.cuda.source import MODULES, all_sources
from cuda_env import nvrtc_missing




def test_every_module_registers_its_source():
    names = [s.name for s in all_sources()]
    assert names == list(MODULES)


def test_declared_kernels_are_defined_once_and_unique():
    seen = set()
    for source in all_sources():
        defined = re.findall(r'extern "C" __global__ void (\w+)\(', source.code)
        assert sorted(defined) == sorted(source.kernels), source.name
        assert not seen & set(defined), f"{source.name}: a kernel name is used twice"
        seen |= set(defined)


@pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
def test_every_cuda_source_compiles_for_sm_90():
    from caffe_engine.kernels.cuda.device import compile_check
    results = compile_check("sm_90")
    assert [name for name, _ in results] == list(MODULES)
    for name, size in results:
        assert size > 1000, f"{name}.cu gave a cubin of {size} bytes"


@pytest.mark.skipif(nvrtc_missing() is not None, reason=str(nvrtc_missing()))
def test_a_broken_source_reports_nvrtc_log():
    from caffe_engine.kernels.cuda.device import compile_check
    from caffe_engine.kernels.cuda.source import Source
    broken = Source("broken", 'extern "C" __global__ void ce_broken(float* x) { x[0] = y; }',
                    ("ce_broken",))
    with pytest.raises(RuntimeError, match='broken.cu.*identifier "y" is undefined'):
        compile_check("sm_90", [broken])
