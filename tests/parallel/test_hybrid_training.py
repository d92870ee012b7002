"""PCL-DNN's hybrid InnerProduct layers in training (issue 29): P ranks, each InnerProduct
sliced over groups of G ranks, follow one process with the whole batch; their snapshots are
ordinary Caffe files, resumable at another P and G.

Oracle: one process (no communicator) with the P ranks' batches together, on the same records
(the dealing of tests/parallel/test_training.py: 60 records, a total batch of 12 divisible by
every P in 1..4, so 5 iterations are one epoch and a resumed run, whose data cursor restarts
at record 0 as Caffe's ``--snapshot`` does, reads what the uninterrupted run reads after its
first epoch). Runs under ``mpiexec -n K`` (K = 1..4, tests/parallel/run_all.sh) for every G
dividing K, and without a launcher (G = 1).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.comm.launcher import launched_under_mpi, mpi_module
from caffe_engine.net import TRAIN, Net
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver

ROOT = Path(__file__).resolve().parents[2]
TOTAL_BATCH = 12          # records per iteration over all ranks: one epoch of 60 is 5 iterations

HYBRID_NET = """
name: "tiny_hybrid"
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "%(source)s" batch_size: %(batch)d backend: LMDB } }
layer { name: "data" type: "Data" top: "data" top: "label" include { phase: TEST }
        transform_param { scale: 0.00390625 }
        data_param { source: "%(source)s" batch_size: 6 backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 10 weight_filler { type: "xavier" }
                              bias_filler { type: "constant" value: 0.1 } %(parallel)s } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 6 transpose: true %(parallel)s
                              weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "accuracy" type: "Accuracy" bottom: "ip2" bottom: "label" top: "accuracy"
        include { phase: TEST } }
"""

SOLVER = """
base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed"
max_iter: 1000 display: 0 average_loss: 1 random_seed: 1701
test_iter: 5 test_interval: 100000 test_initialization: false
snapshot_after_train: false iter_size: %(iter_size)d
"""


def _size(world):
    return 1 if world is None else world.Get_size()


def divisors(n):
    return [g for g in range(1, n + 1) if n % g == 0]


@pytest.fixture
def source(tiny_lmdb):
    return tiny_lmdb(seed=29, num_records=60)


def solver_param(source, batch, parallel=None, prefix=None, iter_size=1):
    """The solver; ``parallel``: the layers' ``parallel`` field (None: left at its default)."""
    param = text_format.Parse(SOLVER % {"iter_size": iter_size}, caffe_pb2.SolverParameter())
    field = f'parallel: "{parallel}"' if parallel is not None else ""
    text_format.Parse(HYBRID_NET % {"source": source, "batch": batch, "parallel": field},
                      param.net_param)
    if prefix is not None:
        param.snapshot_prefix = prefix
    return param


def full_weights(net):
    """Every layer's params as full arrays (a hybrid layer's slices gathered: collective)."""
    out = {}
    for name, layer in zip(net.layer_names, net.layers):
        if getattr(layer, "model_parallel", None) is not None:
            out[name] = [backend.to_numpy(a) for a in layer.gather_params()]
        elif layer.blobs:
            out[name] = [backend.to_numpy(b.data).copy() for b in layer.blobs]
    return out


def assert_weights_close(got, want, tol=1e-4):
    assert sorted(got) == sorted(want)
    for name in want:
        for a, b in zip(got[name], want[name]):
            assert a.shape == b.shape, name
            numpy.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=name)


def hybrid_solver(make, source, group, how, prefix=None, iter_size=1):
    """A data-parallel solver of this world with hybrid group size ``group``, declared in the
    prototxt (``how`` "field") or by the ``fc_parallel`` argument (``how`` "flag")."""
    comm = make("tree")
    batch = TOTAL_BATCH // comm.size
    if how == "field":
        return get_solver(solver_param(source, batch, str(group), prefix, iter_size), comm=comm,
                          bucket_mb=0.001, debug_sync=True)
    return get_solver(solver_param(source, batch, None, prefix, iter_size), comm=comm,
                      bucket_mb=0.001, debug_sync=True, fc_parallel=group)


@pytest.mark.parametrize("how", ["field", "flag"])
def test_hybrid_training_equals_one_process_for_every_group(world, make, source, how):
    size = _size(world)
    ref = get_solver(solver_param(source, TOTAL_BATCH))
    ref.step(6)
    want = full_weights(ref.net)
    want_test = ref.test(0)
    for group in divisors(size):
        par = hybrid_solver(make, source, group, how)
        hybrid = [name for name, layer in zip(par.net.layer_names, par.net.layers)
                  if getattr(layer, "model_parallel", None) is not None]
        assert hybrid == (["ip1", "ip2"] if group > 1 else [])
        if group > 1:      # the slices' shapes: N split over G, transpose: columns
            ip1, ip2 = (par.net.layers[par.net.layer_names.index(n)] for n in ("ip1", "ip2"))
            assert ip1.blobs[0].shape[0] == len(numpy.array_split(range(10), group)[
                ip1.model_parallel.rank])
            assert ip2.blobs[0].shape[0] == 10 and ip2.blobs[0].shape[1] < 6
        par.step(6)
        assert_weights_close(full_weights(par.net), want)
        got_test = par.test(0)      # every rank tests (collective); each equals one process
        for name, value in want_test.items():
            numpy.testing.assert_allclose(got_test[name], value, rtol=1e-4, atol=1e-5)


def test_auto_picks_a_group_per_layer_and_equals_one_process(world, make, source):
    """``auto``: the balance equations choose each layer's G (rank 0's choice, the same on
    every rank); whatever they choose, the run equals one process."""
    ref = get_solver(solver_param(source, TOTAL_BATCH))
    ref.step(6)
    par = hybrid_solver(make, source, "auto", "flag")
    groups = [layer.model_parallel.size if layer.model_parallel is not None else 1
              for layer in par.net.layers if layer.type == "InnerProduct"]
    assert all(_size(world) % g == 0 for g in groups)
    if world is not None:
        assert world.allgather(groups) == [groups] * _size(world)
    par.step(6)
    assert_weights_close(full_weights(par.net), full_weights(ref.net))


def test_hybrid_with_iter_size_equals_one_process(world, make, source):
    """``iter_size`` 2: the layers accumulate their slices' diffs over the passes; the
    replicas' sum is taken once, after the last pass, as the world's."""
    ref = get_solver(solver_param(source, TOTAL_BATCH, iter_size=2))
    ref.step(3)
    par = hybrid_solver(make, source, _size(world), "flag", iter_size=2)
    par.step(3)
    assert_weights_close(full_weights(par.net), full_weights(ref.net))


def _snapshot_groups(size):
    """(G written, G resumed) at this P: written at 2 when P is even, else at P; resumed at
    another divisor."""
    written = 2 if size % 2 == 0 else size
    resumed = size if written != size else 1
    return written, resumed


def test_hybrid_snapshot_is_ordinary_and_resumes_at_another_p_and_g(world, make, source):
    size = _size(world)
    rank = 0 if world is None else world.Get_rank()
    folder = None
    if rank == 0:
        folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"hybrid_snap_{os.getpid()}"
        folder.mkdir(parents=True, exist_ok=True)
    folder = Path(world.bcast(str(folder), root=0)) if world is not None else folder
    try:
        _snapshot_and_resume(world, make, source, size, rank, folder)
    finally:
        if world is not None:
            world.Barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def _snapshot_and_resume(world, make, source, size, rank, folder):
    ref = get_solver(solver_param(source, TOTAL_BATCH))
    ref.step(5)
    at_five = full_weights(ref.net)
    ref.step(5)
    want = full_weights(ref.net)
    written, resumed = _snapshot_groups(size)
    par = hybrid_solver(make, source, written, "flag", prefix=str(folder / "hyb"))
    par.step(5)
    gathered = full_weights(par.net)
    if par.param_slicing is not None or rank == 0:
        par.snapshot()             # every rank gathers, rank 0 writes
    if world is not None:
        world.Barrier()
    model, state = folder / "hyb_iter_5.caffemodel", folder / "hyb_iter_5.solverstate"
    assert model.exists() and state.exists()
    # An ordinary caffemodel: a plain one-process net reads it, the full blobs gathered.
    plain = Net(solver_param(source, TOTAL_BATCH).net_param, TRAIN)
    plain.copy_from(str(model))
    loaded = full_weights(plain)
    for name in gathered:
        for a, b in zip(loaded[name], gathered[name]):
            numpy.testing.assert_array_equal(a, b)
    assert_weights_close(loaded, at_five)
    # Resumed by one process (P = 1): the same weights as the uninterrupted run.
    one = get_solver(solver_param(source, TOTAL_BATCH))
    one.restore(str(state))
    assert one.iter == 5
    one.step(5)
    assert_weights_close(full_weights(one.net), want)
    # Resumed at this P with another G.
    again = hybrid_solver(make, source, resumed, "flag")
    again.restore(str(state))
    again.step(5)
    assert_weights_close(full_weights(again.net), want)


# -- the command line ---------------------------------------------------------------------------
needs_launcher = pytest.mark.skipif(
    launched_under_mpi() or shutil.which("mpiexec") is None or mpi_module() is None,
    reason="needs mpiexec and mpi4py, and must not itself run under mpiexec")


def _caffe(args, ranks=None, cwd=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["GLOG_logtostderr"] = "1"
    cmd = [sys.executable, "-m", "caffe_engine", *args]
    if ranks is not None:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def _one_error_line(done):
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("caffe: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.skipif(launched_under_mpi(), reason="starts its own processes")
@pytest.mark.parametrize("value, expected", [
    ("foo", "--fc_parallel must be data, auto or a group size G >= 1 in digits, got 'foo'"),
    ("0", "--fc_parallel must be data, auto or a group size G >= 1 in digits, got '0'"),
    ("-2", "got '-2'"),
    ("2", "--fc_parallel: group size 2 does not divide the 1 ranks of this run"),
])
def test_fc_parallel_bad_values_are_one_line(tmp_path, value, expected):
    line = _one_error_line(_caffe(["train", "--solver", "s.prototxt", "--fc_parallel", value],
                                  cwd=tmp_path))
    assert expected in line


@needs_launcher
def test_fc_parallel_that_does_not_divide_p_is_one_line_before_training(tmp_path):
    line = _one_error_line(_caffe(["train", "--solver", "s.prototxt", "--fc_parallel", "3"],
                                  ranks=2, cwd=tmp_path))
    assert line == "caffe: --fc_parallel: group size 3 does not divide the 2 ranks of this run"


@needs_launcher
def test_layer_field_that_does_not_divide_p_is_one_line(tmp_path, tiny_lmdb):
    src = tiny_lmdb(seed=3, num_records=60)
    param = solver_param(src, 6, "3")
    param.ClearField("test_iter")
    param.ClearField("test_interval")
    param.max_iter = 1
    (tmp_path / "s.prototxt").write_text(text_format.MessageToString(param))
    done = _caffe(["train", "--solver", "s.prototxt"], ranks=2, cwd=tmp_path)
    assert done.returncode != 0
    assert "layer 'ip1': inner_product_param.parallel: group size 3 does not divide the 2 " \
           "ranks of this run" in done.stderr, done.stderr


CLI_SOLVER = """
net: "net.prototxt"
base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed"
max_iter: 4 display: 1 average_loss: 1 random_seed: 1701
test_iter: 2 test_interval: 2 snapshot: 2 snapshot_prefix: "%(prefix)s"
snapshot_format: %(format)s
"""


@needs_launcher
def test_cli_hybrid_run_tests_snapshots_and_resumes_exactly_with_another_g(tmp_path, tiny_lmdb):
    """``mpiexec -n 2 caffe train --fc_parallel 2 --exact_resume``: every rank tests, rank 0
    snapshots full blobs; resumed at G = 1 (data parallel) from iteration 2 it ends where the
    uninterrupted hybrid run ends (within float32 reordering)."""
    src = tiny_lmdb(seed=5, num_records=60)
    net = solver_param(src, 6).net_param
    (tmp_path / "net.prototxt").write_text(text_format.MessageToString(net))
    for name, fmt in (("a", "BINARYPROTO"), ("b", "BINARYPROTO"), ("h", "HDF5")):
        (tmp_path / f"{name}.prototxt").write_text(CLI_SOLVER % {"prefix": name, "format": fmt})
    done = _caffe(["train", "--solver", "a.prototxt", "--fc_parallel", "2", "--exact_resume"],
                  ranks=2, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hybrid (PCL-DNN) layers: ip1 G=2, ip2 G=2" in done.stderr
    assert "Test net output #1: accuracy = " in done.stderr
    resumed = _caffe(["train", "--solver", "b.prototxt", "--fc_parallel", "data",
                      "--exact_resume", "--snapshot", "a_iter_2.solverstate"],
                     ranks=2, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    plain = Net(net, TRAIN)
    plain.copy_from(str(tmp_path / "a_iter_4.caffemodel"))
    want = full_weights(plain)
    plain.copy_from(str(tmp_path / "b_iter_4.caffemodel"))
    assert_weights_close(full_weights(plain), want)
    # HDF5 snapshots of a hybrid run are full blobs too; another P refuses an exact resume.
    done = _caffe(["train", "--solver", "h.prototxt", "--fc_parallel", "2"], ranks=2,
                  cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plain.copy_from(str(tmp_path / "h_iter_4.caffemodel.h5"))
    other = _caffe(["train", "--solver", "b.prototxt", "--exact_resume", "--snapshot",
                    "a_iter_2.solverstate"], cwd=tmp_path)
    assert "written by 2 process(es), this run has 1" in _one_error_line(other)
