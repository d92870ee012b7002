"""``--comm nccl`` (caffe_engine/comm/nccl.py) without a GPU: the one-line errors, the choice of
device, and the calls it makes, on a fake CuPy/NCCL (one process: MPI's world of one).

Not verified here (needs GPUs): a real ``ncclAllReduce`` between ranks; tests/parallel's
``test_staged_device_allreduce.py`` has the GPU-marked cases.
"""
import sys
import types

import numpy
import pytest

from caffe_engine.comm import nccl as nccl_module
from caffe_engine.comm.nccl import NCCLCommunicator, choose_device
from caffe_engine.errors import CaffeError
from cuda_env import cuda_missing

NEED = "communicator 'nccl' needs CuPy with NCCL and a CUDA device"




def test_choose_device():
    assert choose_device(2, 4, 4, environ={}) == 2
    assert choose_device(2, 4, 4, environ={"CAFFE_NCCL_DEVICE": "0"}) == 0
    assert choose_device(2, 4, 4, device=3, environ={"CAFFE_NCCL_DEVICE": "0"}) == 3
    assert choose_device(1, 8, 2, environ={"CAFFE_NCCL_DEVICE": "1"}) == 1   # explicit: allowed
    with pytest.raises(CaffeError) as e:
        choose_device(0, 4, 2, environ={})
    assert str(e.value) == ("communicator 'nccl': 4 ranks on this machine but 2 GPU(s); NCCL "
                            "needs one GPU per rank")
    for bad in ("2", "-1", "x"):
        with pytest.raises(CaffeError) as e:
            choose_device(0, 1, 2, environ={"CAFFE_NCCL_DEVICE": bad})
        assert str(e.value) == ("communicator 'nccl': CAFFE_NCCL_DEVICE must be a device id in "
                                f"0..1, got '{bad}'")


def test_without_a_device_the_error_is_one_line():
    pytest.importorskip("mpi4py", exc_type=ImportError)
    missing = cuda_missing()
    if missing is None:
        pytest.skip("a CUDA device is present")
    with pytest.raises(CaffeError) as e:
        NCCLCommunicator()
    msg = str(e.value)
    assert msg.startswith(NEED) and "\n" not in msg, msg


def _install(monkeypatch, cupy=None, nccl=None):
    cuda = types.ModuleType("cupy.cuda")
    cupy_mod = types.ModuleType("cupy")
    cupy_mod.cuda = cuda
    if cupy:
        for k, v in cupy.items():
            setattr(cuda, k, v)
    nccl_mod = types.ModuleType("cupy.cuda.nccl")
    for k, v in (nccl or {}).items():
        setattr(nccl_mod, k, v)
    cuda.nccl = nccl_mod
    monkeypatch.setitem(sys.modules, "cupy", cupy_mod)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", nccl_mod)
    return cupy_mod


def test_load_errors_are_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(CaffeError) as e:
        nccl_module._load_nccl()
    assert str(e.value).startswith(f"{NEED} (pip install -e '.[gpu]'); not available here: "
                                   "ModuleNotFoundError")
    runtime = types.SimpleNamespace(getDeviceCount=lambda: 0)
    _install(monkeypatch, {"runtime": runtime}, {"available": True})
    with pytest.raises(CaffeError) as e:
        nccl_module._load_nccl()
    assert str(e.value) == f"{NEED}; not here: no CUDA device"

    def broken():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected\nmore")
    _install(monkeypatch, {"runtime": types.SimpleNamespace(getDeviceCount=broken)})
    with pytest.raises(CaffeError) as e:
        nccl_module._load_nccl()
    assert str(e.value) == (f"{NEED}; not here: no usable CUDA device (RuntimeError: "
                            "cudaErrorNoDevice: no CUDA-capable device is detected)")
    _install(monkeypatch, {"runtime": types.SimpleNamespace(getDeviceCount=lambda: 2)},
             {"available": False})
    with pytest.raises(CaffeError) as e:
        nccl_module._load_nccl()
    assert str(e.value).startswith(f"{NEED}; this CuPy cannot load NCCL (pip install "
                                   "nvidia-nccl-cu12")


def _bare(device=0):
    """An NCCLCommunicator that skipped its start (for the per-call checks)."""
    comm = NCCLCommunicator.__new__(NCCLCommunicator)
    comm.rank, comm.size, comm.timeout, comm.device = 0, 2, 0, device
    return comm


def test_numpy_buffers_and_bad_ops_are_one_line_errors():
    comm = _bare()
    buf = numpy.zeros(4, numpy.float32)
    for call in (lambda: comm.allreduce_(buf), lambda: comm.allreduce_async_(buf),
                 lambda: comm.bcast_(buf)):
        with pytest.raises(CaffeError) as e:
            call()
        assert str(e.value).startswith("communicator 'nccl': ")
        assert "needs a CuPy array on the GPU, got ndarray (train with --gpu, one GPU per " \
               "rank)" in str(e.value)
    with pytest.raises(CaffeError, match="op must be 'sum' or 'mean'"):
        comm.allreduce_(buf, op="max")
    with pytest.raises(CaffeError, match="root 2 out of range for 2 ranks"):
        comm.bcast_(buf, root=2)


# --------------------------------------------------------------------------------------------
# The calls, on a fake CuPy with NCCL
# --------------------------------------------------------------------------------------------
class _Flags:
    c_contiguous = True
    writeable = True


class FakeDeviceArray:
    """Poses as a CuPy float32 array on GPU ``device`` (its type's module starts with cupy)."""

    flags = _Flags()

    def __init__(self, arr, device, log):
        self.arr, self.log = arr, log
        self.device = types.SimpleNamespace(id=device)
        self.data = types.SimpleNamespace(ptr=0x1000 + device)

    dtype = property(lambda self: self.arr.dtype)
    size = property(lambda self: self.arr.size)
    nbytes = property(lambda self: self.arr.nbytes)

    def reshape(self, *shape):
        return self

    def __imul__(self, factor):
        assert isinstance(factor, numpy.float32)
        self.log.append(("scale", float(factor)))
        self.arr *= factor
        return self


FakeDeviceArray.__module__ = "cupy._fake"


def _fake_nccl_cupy(monkeypatch, log, count=2):
    class Stream:
        def __init__(self, non_blocking=False, name="own"):
            self.name, self.ptr = name, 7 if name == "own" else 5

        def record(self):
            log.append(("record", self.name))
            return types.SimpleNamespace(done=True, synchronize=lambda: log.append(("sync_ev",)),
                                         stream=self.name)

        def wait_event(self, ev):
            log.append(("wait_event", self.name, ev.stream))

        def synchronize(self):
            log.append(("synchronize", self.name))

        def __enter__(self):
            log.append(("use", self.name))

        def __exit__(self, *exc):
            log.append(("unuse", self.name))

    current = Stream(name="current")

    class Device:
        def __init__(self, i):
            self.i = i

        def use(self):
            log.append(("use_device", self.i))

    class Comm:
        def __init__(self, ndev, uid, rank):
            log.append(("NcclCommunicator", ndev, uid, rank))

        def allReduce(self, send, recv, count, dtype, op, stream):
            log.append(("allReduce", send, recv, count, dtype, op, stream))

        def bcast(self, buf, count, dtype, root, stream):
            log.append(("bcast", buf, count, dtype, root, stream))

        def destroy(self):
            log.append(("destroy",))

    _install(monkeypatch,
             {"runtime": types.SimpleNamespace(getDeviceCount=lambda: count), "Device": Device,
              "Stream": Stream, "get_current_stream": lambda: current},
             {"available": True, "NcclCommunicator": Comm, "get_unique_id": lambda: (1, 2, 3),
              "NCCL_FLOAT32": 32, "NCCL_SUM": 0, "NCCL_UINT8": 8})


def test_nccl_calls_on_a_fake_cupy(monkeypatch):
    MPI = pytest.importorskip("mpi4py.MPI", exc_type=ImportError)
    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("runs in a world of one")
    log = []
    _fake_nccl_cupy(monkeypatch, log)
    monkeypatch.setenv("CAFFE_NCCL_DEVICE", "1")
    comm = NCCLCommunicator(MPI.COMM_WORLD, timeout=0)
    assert (comm.device, comm.local_rank, comm.local_size) == (1, 0, 1)
    assert log[:2] == [("use_device", 1), ("NcclCommunicator", 1, (1, 2, 3), 0)]
    del log[:]
    comm.size = 4                                          # as one rank of four
    a = numpy.arange(6, dtype=numpy.float32)
    buf = FakeDeviceArray(a.copy(), 1, log)
    assert comm.allreduce_(buf, op="mean") is buf
    assert log == [("allReduce", 0x1001, 0x1001, 6, 32, 0, 5), ("use", "current"),
                   ("scale", 0.25), ("unuse", "current"), ("synchronize", "current")]
    assert buf.arr.tobytes() == (a * numpy.float32(0.25)).tobytes()
    del log[:]
    h = comm.allreduce_async_(buf)                         # sum: no scale, on the own stream
    assert log == [("record", "current"), ("wait_event", "own", "current"),
                   ("allReduce", 0x1001, 0x1001, 6, 32, 0, 7), ("record", "own")]
    assert h.done() and h.wait() is buf
    del log[:]
    comm.bcast_(buf, root=3)
    assert log == [("bcast", 0x1001, 24, 8, 3, 5), ("synchronize", "current")]
    with pytest.raises(CaffeError) as e:
        comm.allreduce_(FakeDeviceArray(a.copy(), 0, log))
    assert str(e.value) == ("communicator 'nccl': the allreduce buffer is on GPU 0, this "
                            "rank's NCCL communicator on GPU 1")
    comm.close()
    assert log[-1] == ("destroy",)
    comm.close()                                           # twice: nothing more


def test_no_device_on_a_fake_cupy_starts_no_nccl(monkeypatch):
    MPI = pytest.importorskip("mpi4py.MPI", exc_type=ImportError)
    log = []
    _fake_nccl_cupy(monkeypatch, log, count=0)
    with pytest.raises(CaffeError) as e:
        NCCLCommunicator(MPI.COMM_WORLD, timeout=0)
    assert str(e.value) == f"{NEED}; not here: no CUDA device"
    assert not [x for x in log if x[0] == "NcclCommunicator"]
