"""The fake CuPy binds every call to CuPy's recorded signatures, with or without CuPy here.

``tests/fake_cupy/cupy_signatures.json`` is the recording (``record_signatures.py`` writes it
from a real CuPy); these tests show that a call CuPy would refuse raises TypeError through the
fake, that the fake's hand-written APIs take exactly CuPy's parameters and have no attribute
CuPy's classes lack, and, where CuPy is installed, that the recording still matches it.
"""
import inspect
import os
import subprocess
import sys

import numpy
import pytest

import fake_cupy
from fake_cupy import signatures
from fake_cupy.record_signatures import CLASSES, MODULES, canonical

HERE = os.path.dirname(os.path.abspath(__file__))

#: calls real CuPy refuses with TypeError (a NumPy-only or misspelt keyword, a wrong arity);
#: each runs with ``cp`` the fake module and ``a`` a 2x3 float32 device array
WRONG_CALLS = (
    "cp.zeros((2, 3), numpy.float32, like=a)",          # NumPy's like=
    "cp.sum(a, initial=0)",                             # NumPy's initial=
    "cp.maximum(a, a, where=True)",                     # ufunc where=, NumPy only
    "cp.zeros()",                                       # shape missing
    "a.sum(where=True)",                                # ndarray method, NumPy's keyword
    "a.reshape(6, orde='C')",                           # misspelt keyword
    "a.get(None, 'C', None, True, 1)",                  # one argument too many
    "cp.asnumpy(a, copy=True)",
    "cp.RawModule('extern \"C\" __global__ void k() {}')",   # code= is keyword-only
    "cp.cuda.Stream(nonblocking=True)",
    "cp.cuda.Event(blocking=True)",
    "cp.cuda.Device().synchronize(0)",
    "cp.cuda.alloc_pinned_memory()",
    "cp.cuda.get_current_stream().record(cp.cuda.Event(), 0)",
    "cp.cuda.runtime.getDeviceProperties()",
    "cp.random.RandomState(0).uniform(0, 1, 3, numpy.float32, 7)",
)

#: wrong calls that real CuPy refuses with TypeError before it touches a device (so they can
#: be tried on it here, without a GPU), each with ``cp`` a CuPy module and ``h`` a host array
DEVICE_FREE_WRONG_CALLS = (
    "cp.zeros((2, 3), numpy.float32, like=h)",
    "cp.zeros()",
    "cp.asarray(h, like=h)",
    "cp.array(h, like=h)",
    "cp.asnumpy(h, copy=True)",
    "cp.copyto(h, h, 'safe', None, 1)",
    "cp.get_array_module(h, foo=1)",
    "cp.RawModule('extern \"C\" __global__ void k() {}')",
    "cp.RawModule(code='', jitfy=True)",
    "cp.cuda.alloc_pinned_memory()",
    "cp.cuda.get_current_stream(0, 1)",
    "cp.cuda.runtime.getDeviceCount(0)",
    "cp.cuda.runtime.getDeviceProperties()",
    "cp.lib.stride_tricks.as_strided(h, None, None, None)",
    "cp.get_default_memory_pool(0)",
)


@pytest.fixture
def cp(monkeypatch):
    """The fake ``cupy`` installed; CPU mode and a fresh device state after."""
    module = fake_cupy.install(monkeypatch)
    fake_cupy.forget_device_state()
    yield module
    fake_cupy.forget_device_state()


@pytest.mark.parametrize("call", WRONG_CALLS)
def test_a_call_cupy_refuses_raises_type_error(cp, call):
    a = cp.arange(6, dtype=numpy.float32).reshape(2, 3)
    with pytest.raises(TypeError, match=r"cupy\.\S+: .*CuPy \d+\.\d+\.\d+ takes \("):
        eval(call, {"cp": cp, "a": a, "numpy": numpy})   # noqa: S307 - the literals above


@pytest.mark.parametrize("call", DEVICE_FREE_WRONG_CALLS)
def test_the_fake_refuses_them(cp, call):
    h = numpy.zeros(1, numpy.float32)
    with pytest.raises(TypeError, match=r"CuPy \d+\.\d+\.\d+ takes \("):
        eval(call, {"cp": cp, "h": h, "numpy": numpy})   # noqa: S307 - the literals above


@pytest.mark.parametrize("call", DEVICE_FREE_WRONG_CALLS)
def test_the_installed_cupy_refuses_them_too(call):
    """What the recording says CuPy refuses, the installed CuPy refuses (these calls fail on
    their arguments, before any device is touched: no GPU needed)."""
    real = _installed_cupy()
    h = numpy.zeros(1, numpy.float32)
    with pytest.raises(TypeError):
        eval(call, {"cp": real, "h": h, "numpy": numpy})   # noqa: S307 - the literals above


def _installed_cupy():
    """The real CuPy module; the test is skipped where it is not installed."""
    real = pytest.importorskip("cupy", reason="CuPy is not installed: nothing to compare")
    if real.__version__.endswith("-fake"):
        pytest.skip("the fake is installed as cupy")
    return real


def test_a_launch_with_a_wrong_keyword_raises_type_error(cp):
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    if compiler_missing():
        pytest.skip(compiler_missing())
    source = 'extern "C" __global__ void k(float* y) { y[0] = 1.0f; }'
    kernel = cp.RawModule(code=source).get_function("k")
    y = cp.zeros(1, numpy.float32)
    with pytest.raises(TypeError, match=r"cupy\.RawKernel\.__call__: .*shared_memory"):
        kernel((1,), (1,), (y,), shared_memory=0)
    kernel((1,), (1,), (y,), shared_mem=0, stream=cp.cuda.get_current_stream())
    assert y.get().tolist() == [1.0]


def test_names_cupy_lacks_are_missing(cp):
    a = cp.zeros(3, numpy.float32)
    for name in ("busday_count", "is_busday", "fromregex"):
        assert hasattr(numpy, name)
        assert not hasattr(cp, name), name
    for name in ("ctypes", "itemset", "_astype"):
        with pytest.raises(AttributeError):
            getattr(a, name)
    assert not hasattr(cp.cuda, "get_default_memory_pool")
    assert not hasattr(cp.cuda.Event(), "query")


def test_strict_without_cupy_installed():
    """In a process where ``import cupy`` fails, the fake refuses the same calls: it reads
    only the recording, never the installed CuPy."""
    script = (
        "import sys, numpy, pytest\n"
        "sys.modules['cupy'] = None\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "import fake_cupy\n"
        "with pytest.MonkeyPatch.context() as mp:\n"
        "    cp = fake_cupy.install(mp)\n"
        "    a = cp.arange(6, dtype=numpy.float32).reshape(2, 3)\n"
        "    refused = 0\n"
        f"    for call in {WRONG_CALLS!r}:\n"
        "        try:\n"
        "            eval(call)\n"
        "        except TypeError as exc:\n"
        "            refused += 'CuPy' in str(exc)\n"
        "    print(refused, hasattr(cp, 'busday_count'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(len(WRONG_CALLS)), "False"], out.stdout


def test_the_fakes_own_apis_take_cupys_parameters():
    """Every hand-written API of the fake has exactly the recorded parameters (so a call CuPy
    accepts is one the fake accepts too), and every recorded one is imitated."""
    assert sorted(signatures.RECORDED["imitated"]) == \
        sorted(k for k in signatures.IMITATIONS if not k.startswith("ndarray."))
    for key, fn in signatures.IMITATIONS.items():
        sig = inspect.signature(fn)
        method = next(iter(sig.parameters), None) == "self"
        assert canonical(sig, method) == signatures.text_of(key), key


def test_the_fakes_classes_have_no_attribute_cupys_lack():
    fakes = {"cuda.Device": fake_cupy._Device, "cuda.Stream": fake_cupy._Stream,
             "cuda.Event": fake_cupy._Event, "cuda.MemoryPool": fake_cupy._MemoryPool,
             "random.RandomState": fake_cupy.RandomState, "RawModule": fake_cupy.RawModule,
             "RawKernel": fake_cupy.RawKernel}
    assert sorted(fakes) == sorted(CLASSES)
    for key, cls in fakes.items():
        extra = {n for n in vars(cls) if not n.startswith("_")} - \
            set(signatures.class_attributes(key))
        assert not extra, (key, extra)
    extra = {n for n in vars(fake_cupy.ndarray) if not n.startswith("_")} - \
        set(signatures.RECORDED["ndarray"])
    assert not extra, extra


def test_the_fakes_modules_have_no_name_cupys_lack(cp):
    modules = {"cupy": cp, "cuda": cp.cuda, "cuda.runtime": cp.cuda.runtime,
               "random": cp.random, "lib": cp.lib, "lib.stride_tricks": cp.lib.stride_tricks,
               "cupyx": sys.modules["cupyx"]}
    assert sorted(modules) == sorted(MODULES)
    for key, module in modules.items():
        extra = {n for n in vars(module) if not n.startswith("_")} - \
            set(signatures.module_attributes(key))
        assert not extra, (key, extra)


def test_the_recording_matches_the_installed_cupy():
    """Where CuPy is installed, every recorded name still exists with the recorded signature
    (names CuPy added since are simply not served by the fake). On a mismatch, regenerate:
    ``python tests/fake_cupy/record_signatures.py``."""
    _installed_cupy()
    from fake_cupy.record_signatures import record
    now = record()
    stale = []
    for table in ("module", "ndarray", "imitated"):
        for key, text in signatures.RECORDED[table].items():
            if key not in now[table]:
                stale.append(f"{table} {key}: gone from CuPy {now['cupy_version']}")
            elif now[table][key] != text:
                stale.append(f"{table} {key}: recorded {text}, CuPy {now['cupy_version']} "
                             f"has {now[table][key]}")
    for table in ("classes", "modules"):
        for key, names in signatures.RECORDED[table].items():
            gone = set(names) - set(now[table][key])
            if gone:
                stale.append(f"{table} {key}: {sorted(gone)} gone")
    assert not stale, (f"the recording (CuPy {signatures.VERSION}) differs from the installed "
                       "CuPy; regenerate it:\n" + "\n".join(stale))
