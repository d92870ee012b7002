"""HDF5 solver states (``snapshot_format: HDF5``) go both ways between Caffe and the engine.

Caffe's layout (src/caffe/solvers/sgd_solver.cpp SnapshotSolverStateToHDF5, src/caffe/util/
hdf5.cpp): ``iter`` and ``current_step`` are int32 datasets of shape (1,) (hdf5_save_int makes a
rank-1 dataset of one element), ``learned_net`` a scalar null-terminated fixed-length string
(H5LTmake_dataset_string), ``history/<i>`` float32 datasets. The real file is BVLC Caffe's own
cifar10_quick snapshot from ../shared/realworld/leetonfreestyle__DMSH.
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.io.hdf5_snapshot import load_solver_state_hdf5, save_solver_state_hdf5
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver
from paths import SHARED

h5py = pytest.importorskip("h5py")

CIFAR = SHARED / "realworld" / "leetonfreestyle__DMSH" / "examples" / "cifar10"
REAL_STATE = CIFAR / "cifar10_quick_iter_5000.solverstate.h5"
REAL_MODEL = CIFAR / "cifar10_quick_iter_5000.caffemodel.h5"
SYNTH = SHARED / "data" / "synthetic_cifar"

TINY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 3 weight_filler { type: "uniform" min: -1 max: 1 }
                              bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
DATA = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0], [-0.7, 2.0, 1.5], [2.5, -0.2, 0.0]], np.float32)
LABEL = np.array([0, 2, 1, 2], np.float32)


def tiny_solver(seed=1):
    p = text_format.Parse('type: "SGD" base_lr: 0.1 momentum: 0.9 lr_policy: "step" gamma: 0.5 '
                          'stepsize: 2 max_iter: 10 snapshot_after_train: false',
                          caffe_pb2.SolverParameter())
    p.net_param.CopyFrom(text_format.Parse(TINY, caffe_pb2.NetParameter()))
    p.random_seed = seed
    solver = get_solver(p)
    solver.net.blobs["data"].data[...] = DATA
    solver.net.blobs["label"].data[...] = LABEL
    return solver


def caffe_save_int(f, name, value):
    """hdf5_save_int: H5LTmake_dataset_int(loc, name, rank 1, dims {1}, &value)."""
    f.create_dataset(name, shape=(1,), dtype=np.dtype("=i4"), data=np.array([value], "=i4"))


def caffe_save_string(f, name, value):
    """hdf5_save_string: H5LTmake_dataset_string, a scalar C string of strlen + 1 bytes."""
    raw = value.encode()
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    dset = h5py.h5d.create(f.id, name.encode(), tid, h5py.h5s.create(h5py.h5s.SCALAR))
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw + b"\0", dtype=f"S{len(raw) + 1}"))


def write_caffe_state(path, iteration, learned_net, current_step, history):
    """A .solverstate.h5 as SGDSolver::SnapshotSolverStateToHDF5 writes it, in its order."""
    with h5py.File(path, "w") as f:
        caffe_save_int(f, "iter", iteration)
        caffe_save_string(f, "learned_net", learned_net)
        caffe_save_int(f, "current_step", current_step)
        group = f.create_group("history")
        for i, h in enumerate(history):
            group.create_dataset(str(i), data=np.asarray(h, np.float32))


def write_caffe_model(path, net):
    """A .caffemodel.h5 as Net::ToHDF5 writes it: /data/<layer>/<k> for every layer."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        for name, layer in zip(net.layer_names, net.layers):
            g = data.create_group(name)
            for k, blob in enumerate(layer.blobs):
                g.create_dataset(str(k), data=np.asarray(blob.data, np.float32))


def test_real_caffe_solverstate_reads():
    state = load_solver_state_hdf5(str(REAL_STATE))
    assert state["iter"] == 5000 and state["current_step"] == 0
    assert state["learned_net"] == "examples/cifar10/cifar10_quick_iter_5000.caffemodel.h5"
    assert [h.shape for h in state["history"]] == [
        (32, 3, 5, 5), (32,), (32, 32, 5, 5), (32,), (64, 32, 5, 5), (64,), (64, 1024), (64,),
        (10, 64), (10,)]
    with h5py.File(REAL_STATE, "r") as f:   # the layout this test suite stands for
        assert f["iter"].shape == (1,) and f["current_step"].shape == (1,)
        assert f["learned_net"].shape == () and f["learned_net"].dtype.kind == "S"
        np.testing.assert_array_equal(state["history"][6], f["history/6"][()])


def test_caffe_layout_round_trip(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trained = tiny_solver()
    trained.step(3)   # stepsize 2: current_step 1, history non-zero
    assert trained.current_step == 1
    write_caffe_model("tiny_iter_3.caffemodel.h5", trained.net)
    write_caffe_state("tiny_iter_3.solverstate.h5", trained.iter, "tiny_iter_3.caffemodel.h5",
                      trained.current_step, [h.data for h in trained.history])
    resumed = tiny_solver(seed=2)   # other initial weights: the file must replace them
    assert not np.array_equal(resumed.net.params["ip"][0].data, trained.net.params["ip"][0].data)
    resumed.restore("tiny_iter_3.solverstate.h5")
    assert (resumed.iter, resumed.current_step) == (3, 1)
    for a, b in zip(resumed.history + resumed.net.learnable_params,
                    trained.history + trained.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)
    trained.step(2)
    resumed.step(2)
    for a, b in zip(resumed.net.learnable_params, trained.net.learnable_params):
        np.testing.assert_array_equal(a.data, b.data)


def test_engine_writes_caffe_layout(tmp_path):
    solver = tiny_solver()
    solver.step(3)
    path = tmp_path / "x_iter_3.solverstate.h5"
    save_solver_state_hdf5(str(path), 3, "some/dir/x_iter_3.caffemodel.h5", 1, solver.history)
    with h5py.File(path, "r") as f:
        assert list(f) == ["current_step", "history", "iter", "learned_net"]
        for key, value in (("iter", 3), ("current_step", 1)):
            assert f[key].shape == (1,) and f[key].dtype == np.int32 and f[key][0] == value
        s = f["learned_net"]
        tid = s.id.get_type()
        assert s.shape == () and tid.get_class() == h5py.h5t.STRING and not tid.is_variable_str()
        assert tid.get_strpad() == h5py.h5t.STR_NULLTERM
        assert tid.get_size() == len("some/dir/x_iter_3.caffemodel.h5") + 1
        assert s[()] == b"some/dir/x_iter_3.caffemodel.h5"
        assert sorted(f["history"], key=int) == ["0", "1"]
        np.testing.assert_array_equal(f["history/0"][()], solver.history[0].data)


def test_engine_older_scalar_layout_still_reads(tmp_path):
    path = tmp_path / "old.solverstate.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("iter", data=np.int32(7))
        f.create_dataset("current_step", data=np.int32(2))
        caffe_save_string(f, "learned_net", "m.caffemodel.h5")
        f.create_group("history").create_dataset("0", data=np.ones(3, np.float32))
    state = load_solver_state_hdf5(str(path))
    assert (state["iter"], state["current_step"], state["learned_net"]) == (7, 2, "m.caffemodel.h5")
    np.testing.assert_array_equal(state["history"][0], np.ones(3, np.float32))
    with h5py.File(path, "a") as f:   # a variable-length string (h5py's default) reads too
        del f["learned_net"]
        f.create_dataset("learned_net", data="v.caffemodel.h5", dtype=h5py.string_dtype())
    assert load_solver_state_hdf5(str(path))["learned_net"] == "v.caffemodel.h5"


@pytest.mark.parametrize("breakage, message", [
    (lambda f: f.move("history/1", "history/one"), "no numeric dataset .history/1."),
    (lambda f: (f.__delitem__("iter"), f.create_dataset("iter", data=np.array([1, 2], np.int32))),
     "'iter' should be one integer"),
    (lambda f: (f.__delitem__("current_step"), f.create_dataset("current_step", data=np.float32(1))),
     "'current_step' should be one integer"),
])
def test_malformed_state_is_one_line_error(tmp_path, breakage, message):
    path = tmp_path / "bad.solverstate.h5"
    write_caffe_state(path, 3, "m.caffemodel.h5", 0, [np.zeros(2), np.zeros(3)])
    with h5py.File(path, "a") as f:
        breakage(f)
    with pytest.raises(CaffeError, match=message) as info:
        load_solver_state_hdf5(str(path))
    assert str(path) in str(info.value) and "\n" not in str(info.value)


# ------------------------------------------------------------------------------------------------
# Resuming Caffe's real cifar10_quick snapshot (iteration 5000) with `caffe train --snapshot`
# ------------------------------------------------------------------------------------------------
def cifar_folder(tmp_path, with_model=True):
    """A Caffe-style working folder: examples/cifar10/ with the real net, mean and snapshot,
    the synthetic 32x32 colour LMDBs under the names the net reads, and a short solver."""
    folder = tmp_path / "work"
    cifar = folder / "examples" / "cifar10"
    cifar.mkdir(parents=True)
    for name in ("cifar10_quick_train_test.prototxt", "mean.binaryproto",
                 "cifar10_quick_iter_5000.solverstate.h5"):
        shutil.copy(CIFAR / name, cifar / name)
    if with_model:
        shutil.copy(REAL_MODEL, cifar / REAL_MODEL.name)
    os.symlink(SYNTH / "train_lmdb", cifar / "cifar10_train_lmdb")
    os.symlink(SYNTH / "test_lmdb", cifar / "cifar10_test_lmdb")
    (folder / "solver.prototxt").write_text(
        'net: "examples/cifar10/cifar10_quick_train_test.prototxt"\n'
        "test_iter: 1\ntest_interval: 500\nbase_lr: 0.001\nmomentum: 0.9\nweight_decay: 0.004\n"
        'lr_policy: "fixed"\ndisplay: 1\nmax_iter: 5002\nsnapshot_format: HDF5\n'
        'snapshot_prefix: "examples/cifar10/cifar10_quick"\nsolver_mode: CPU\nrandom_seed: 1\n')
    return folder


def run_caffe(folder, *args):
    return subprocess.run([sys.executable, "-m", "caffe_engine", "train", *args], cwd=folder,
                          capture_output=True, text=True, timeout=600)


def test_restore_real_caffe_state_sets_weights_history_and_iter(tmp_path, monkeypatch):
    folder = cifar_folder(tmp_path)
    monkeypatch.chdir(folder)
    solver = get_solver("solver.prototxt")
    solver.restore("examples/cifar10/cifar10_quick_iter_5000.solverstate.h5")
    assert (solver.iter, solver.current_step) == (5000, 0)
    with h5py.File(REAL_MODEL, "r") as f:
        for name in ("conv1", "conv2", "conv3", "ip1", "ip2"):
            for k, blob in enumerate(solver.net.params[name]):
                np.testing.assert_array_equal(blob.data, f[f"data/{name}/{k}"][()])
    with h5py.File(REAL_STATE, "r") as f:
        for i, h in enumerate(solver.history):
            np.testing.assert_array_equal(h.data, f[f"history/{i}"][()])


def test_caffe_train_resumes_real_caffe_hdf5_snapshot_and_back(tmp_path):
    folder = cifar_folder(tmp_path)
    r = run_caffe(folder, "--solver", "solver.prototxt", "--snapshot",
                  "examples/cifar10/cifar10_quick_iter_5000.solverstate.h5")
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stderr
    assert "Iteration 5000, Testing net (#0)" in log
    order = [log.index(s) for s in ("Iteration 5000 (", "Iteration 5001 (", "Iteration 5002, loss")]
    assert order == sorted(order)
    assert "Iteration 4999" not in log and "Iteration 0 " not in log
    # The engine's own snapshot at 5002 is in Caffe's layout ...
    state = folder / "examples" / "cifar10" / "cifar10_quick_iter_5002.solverstate.h5"
    with h5py.File(state, "r") as f:
        assert f["iter"].shape == (1,) and f["iter"][0] == 5002
        assert f["learned_net"][()] == b"examples/cifar10/cifar10_quick_iter_5002.caffemodel.h5"
    # ... and resumes in turn.
    solver = folder / "solver.prototxt"
    solver.write_text(solver.read_text().replace("max_iter: 5002", "max_iter: 5003"))
    r = run_caffe(folder, "--solver", "solver.prototxt", "--snapshot", str(state.relative_to(folder)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Iteration 5002 (" in r.stderr and "Iteration 5003, loss" in r.stderr


def test_missing_learned_net_is_one_line_error(tmp_path):
    folder = cifar_folder(tmp_path, with_model=False)
    r = run_caffe(folder, "--solver", "solver.prototxt", "--snapshot",
                  "examples/cifar10/cifar10_quick_iter_5000.solverstate.h5")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "learned_net 'examples/cifar10/cifar10_quick_iter_5000.caffemodel.h5' does not exist" in last
    assert "cifar10_quick_iter_5000.solverstate.h5" in last


def test_learned_net_is_opened_relative_to_the_working_directory(tmp_path, monkeypatch):
    # As Caffe: the name stored in the state is used as written, not beside the state file.
    folder = cifar_folder(tmp_path)
    monkeypatch.chdir(folder)
    solver = get_solver("solver.prototxt")
    state = folder / "examples" / "cifar10" / "cifar10_quick_iter_5000.solverstate.h5"
    monkeypatch.chdir(folder / "examples")
    with pytest.raises(CaffeError, match="run from the folder the snapshot was taken in"):
        solver.restore(str(state))
