"""The engine's GPU path on the CPU, through a fake CuPy (``tests/fake_cupy``).

The fake's arrays refuse what CuPy refuses (implicit conversion to NumPy, host arrays mixed
into device operations, NumPy-only functions), count every host sync, and run the cuda kernel
set's CUDA sources through ``RawModule`` with the emulator's g++ shim, checking each launch
against the kernel's C signature. With it installed as ``cupy`` (``fake_gpu_mode``),
``set_mode_gpu()`` succeeds and the whole GPU path runs: blobs on "device" arrays, the cuda
kernel set through ``CupyDevice``, the Data layer's pinned staging, Dropout's device stream, the
deferred checks. What the fake cannot show is listed in its module docstring.
"""
import re

import numpy
import pytest

import fake_cupy
import golden
from caffe_engine import backend, kernels, rng
from caffe_engine.io import prototxt as pio
from caffe_engine.solvers import get_solver
from paths import TRAINING
from tiny_train import lenet_solver



@pytest.fixture
def fake_gpu_mode(monkeypatch):
    """GPU mode on the fake CuPy; yields the fake ``cupy`` module. CPU mode again after."""
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    if compiler_missing():
        pytest.skip(compiler_missing())
    cupy = fake_cupy.install(monkeypatch)
    fake_cupy.forget_device_state()
    assert backend.gpu_missing() is None
    assert backend.set_mode_gpu()
    fake_cupy.reset_stats()
    try:
        yield cupy
    finally:
        backend.set_mode_cpu()
        fake_cupy.forget_device_state()


# -- the fake itself ------------------------------------------------------------------------------
def test_fake_refuses_what_cupy_refuses(fake_gpu_mode):
    cp = fake_gpu_mode
    a = cp.arange(6, dtype=numpy.float32).reshape(2, 3)
    assert backend.get_array_module(a) is cp and type(a).__module__ == "cupy"
    with pytest.raises(TypeError, match="Implicit conversion"):
        numpy.asarray(a)
    with pytest.raises(TypeError):
        numpy.zeros((2, 3), numpy.float32)[...] = a
    with pytest.raises(TypeError, match="Unsupported type"):
        a + numpy.ones(3, numpy.float32)
    with pytest.raises(TypeError, match="Unsupported type"):
        cp.maximum(a, numpy.zeros((), numpy.float32))
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        a[...] = numpy.ones((2, 3), numpy.float32)
    with pytest.raises(AttributeError):
        a.ctypes
    # NumPy's namespace dispatches to the fake, as CuPy's __array_function__ does
    assert type(numpy.sum(a)) is cp.ndarray
    assert type(a.sum()) is cp.ndarray and type(a[0, 0]) is cp.ndarray
    assert fake_cupy.syncs() == 0
    assert float(a.sum()) == 15.0 and a.get().shape == (2, 3) and cp.asnumpy(a).size == 6
    assert fake_cupy.syncs() == 3


def test_fake_raw_module_checks_launches(fake_gpu_mode):
    from caffe_engine.kernels.cuda import neuron
    from caffe_engine.kernels.cuda.device import CupyDevice
    cp = fake_gpu_mode
    device = CupyDevice()
    x = cp.asarray(numpy.array([-1, 2, -3, 4], numpy.float32))
    y = cp.empty(4, numpy.float32)
    kernels.get("cuda").relu_forward(x, y, 0.0)
    assert y.get().tolist() == [0, 2, 0, 4]
    kernel = device.function(neuron.SOURCE, neuron.SOURCE.kernels[0])
    with pytest.raises(TypeError):
        kernel((1,), (512,), (4, x, y, 0.0))          # Python scalars: CuPy passes long long


# -- LeNet ----------------------------------------------------------------------------------------
def _train(iters, display, **fields):
    """Per-iteration losses, the fake's syncs per iteration (callback to callback), the
    solver."""
    solver = lenet_solver(display, **fields)
    losses, marks = [], []
    solver.add_callback(lambda: marks.append(fake_cupy.syncs()),
                        lambda: losses.append(solver.net.blobs["loss"].data.copy()))
    solver._step(iters)
    marks.append(fake_cupy.syncs())
    solver.step(0)
    values = [float(backend.host_scalar(v)) for v in losses]
    return values, [b - a for a, b in zip(marks, marks[1:])], solver


LENET_ITERS = 6
VARIANTS = {"sgd": {}, "clip": {"clip_gradients": 0.5}, "larc": {"larc": True}}


def _cpu_losses(fields):
    backend.set_mode_cpu()
    previous = kernels.use("reference")
    try:
        return _train(LENET_ITERS, 3, **fields)[0]
    finally:
        kernels.use(previous)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lenet_trains_on_the_fake_gpu_like_the_cpu(variant, fake_gpu_mode):
    """LeNet (the lenet_sgd fixture, batch 16) on the fake GPU: the cuda kernel set through
    RawModule, the Data layer's pinned staging, the device losses. The losses match the CPU
    reference set's within float32 tolerance, and the iterations that display nothing read
    nothing back (counted by the fake, so reads outside ``backend``'s helpers count too)."""
    fields = VARIANTS[variant]
    backend.set_mode_cpu()
    expected = _cpu_losses(fields)
    assert backend.set_mode_gpu()
    fake_cupy.reset_stats()
    values, per_iter, solver = _train(LENET_ITERS, 3, **fields)
    assert type(solver.net.blobs["data"].data) is fake_gpu_mode.ndarray
    sites = fake_cupy.stats["sync_sites"]
    quiet = [n for i, n in enumerate(per_iter) if i % 3 != 0]     # 0 and 3 display
    assert quiet == [0] * len(quiet), (per_iter, sites)
    assert max(per_iter) <= 4, (per_iter, sites)
    assert fake_cupy.stats["launches"] > 0
    # the one pointer of another type: transform's unread mean placeholder (mean_kind 0)
    assert fake_cupy.stats["pointer_mismatches"] <= {("ce_transform_uint8", 4, "int32", "float")}
    numpy.testing.assert_allclose(values, expected, rtol=2e-5, atol=2e-6)


def test_device_query_on_the_fake_gpu(fake_gpu_mode):
    """``caffe device_query`` reads only keys CuPy's getDeviceProperties has on CUDA."""
    from caffe_engine import cli
    assert cli.main(["device_query", "--gpu", "0"]) == 0


# -- Dropout --------------------------------------------------------------------------------------
def test_mlp_dropout_trains_on_the_fake_gpu(fake_gpu_mode, tmp_path, monkeypatch):
    from paths import copy_training_case
    case = copy_training_case("mlp_dropout", tmp_path)
    monkeypatch.chdir(case)
    param = pio.read_solver_param("solver.prototxt")
    param.max_iter = 4
    param.display = 2
    param.test_interval = 2
    param.test_iter[0] = 2
    param.snapshot_after_train = False
    solver = get_solver(param)
    solver.solve()
    types = {layer.type for layer in solver.net.layers}
    assert "Dropout" in types
    loss = float(backend.host_scalar(solver.net.blobs["loss"].data))
    assert numpy.isfinite(loss)


# -- the command line: each training fixture, snapshots, resume, fine-tuning, test, time ---
CASES = sorted(p.name for p in TRAINING.iterdir() if (p / "solver.prototxt").exists())
#: the cases every run checks (SGD, and the one with iter_size, clipping and L1); the other
#: solvers and data cases (about 3 s each) run with the slow tests
QUICK = {"lenet_sgd", "lenet_itersize_clip_l1"}
CASE_PARAMS = [pytest.param(c, marks=[] if c in QUICK else [pytest.mark.slow]) for c in CASES]


def _edit_solver(path, **fields):
    text = path.read_text()
    for key, value in fields.items():
        text, n = re.subn(rf"^{key}:.*$", f"{key}: {value}", text, flags=re.M)
        if not n:
            text += f"{key}: {value}\n"
    path.write_text(text)


def _weights(path):
    from caffe_engine.io.blobproto import proto_to_array
    from caffe_engine.proto import caffe_pb2
    net = caffe_pb2.NetParameter()
    net.ParseFromString(path.read_bytes())
    return {f"{layer.name}/{i}": proto_to_array(blob) for layer in net.layer
            for i, blob in enumerate(layer.blobs)}


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_caffe_train_on_the_fake_gpu(case, fake_gpu_mode, tmp_path, monkeypatch):
    """``caffe train --gpu 0`` on a copy of each training fixture (4 iterations, a test and a
    snapshot every 2), then resumed from the iteration-2 solverstate, fine-tuned from the
    caffemodel, ``caffe test`` and ``caffe time``: all on the fake GPU. The snapshot's weights
    are those of the same run on the CPU with the ``cuda-emulated`` kernel set (the same CUDA
    sources and NumPy products), bit for bit: the GPU path's own logic (device losses, staging,
    deferred checks, the solvers' device scalars) changes nothing. Not for Dropout: its device
    mask is another stream's."""
    from caffe_engine import cli
    from paths import copy_training_case
    folder = copy_training_case(case, tmp_path / "gpu")
    cpu = copy_training_case(case, tmp_path / "cpu")
    for f in (folder, cpu):
        _edit_solver(f / "solver.prototxt", max_iter=4, test_interval=2, test_iter=2,
                     snapshot=2, display=2)
    monkeypatch.chdir(folder)
    gpu = ["--gpu", "0"]
    assert cli.main(["train", "--solver", "solver.prototxt", *gpu]) == 0
    state = next(folder.glob("*_iter_2.solverstate"))
    model = next(folder.glob("*_iter_4.caffemodel"))
    got = _weights(model)
    assert cli.main(["train", "--solver", "solver.prototxt", *gpu, "--snapshot",
                     str(state)]) == 0
    assert cli.main(["train", "--solver", "solver.prototxt", *gpu, "--weights",
                     str(model)]) == 0
    assert cli.main(["test", "--model", "net.prototxt", "--weights", str(model), *gpu,
                     "--iterations", "2"]) == 0
    assert cli.main(["time", "--model", "net.prototxt", *gpu, "--iterations", "2"]) == 0
    if "dropout" in case:
        return
    backend.set_mode_cpu()
    monkeypatch.chdir(cpu)
    previous = kernels.use("cuda-emulated")     # the same CUDA sources, on NumPy arrays
    try:
        assert cli.main(["train", "--solver", "solver.prototxt"]) == 0
    finally:
        kernels.use(previous)
    want = _weights(next(cpu.glob("*_iter_4.caffemodel")))
    assert sorted(got) == sorted(want)
    for key in want:
        numpy.testing.assert_array_equal(got[key], want[key], err_msg=key)


# -- every golden layer case ----------------------------------------------------------------------
def test_every_golden_case_on_the_fake_gpu(fake_gpu_mode):
    """As ``test_every_case_in_gpu_mode`` (tests/layers/test_layers_golden.py) on the fake,
    in the exact RNG mode: the Dropout TRAIN cases hold Caffe's host mt19937 masks, which a
    device stream (curand on a GPU, the fake's MT19937 here) does not draw."""
    previous = rng.set_exact_rng(True)
    try:
        ran, problems = golden.check_every_case()
    finally:
        rng.set_exact_rng(previous)
    assert ran > 100 and not problems, f"{len(problems)} problems:\n" + "\n".join(problems)
