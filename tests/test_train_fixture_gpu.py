"""The LeNet training fixture (``lenet_sgd``) trained on the cuda kernel set: in GPU mode
(``caffe train --gpu=0``), and on the CPU through the emulator (``CAFFE_ENGINE_KERNELS=
cuda-emulated``: the same CUDA sources and plans, run serially; marked slow).

The CPU run (``test_train_fixture.py``) follows Caffe's loss curve closely; on the GPU the
kernels sum in other orders, so this checks the fixture README's tolerances ("What to match, and
how closely", ``shared/caffe_reference/training/README.md``), as ``test_training_cases.py``
applies them:

* exact: the printed ``lr`` of every iteration, the iterations displayed and tested, the
  snapshot names;
* iteration 0's loss within 1e-5 relative (no rounding order matters yet);
* the smoothed loss within 1e-4 relative for at least half as many iterations as Caffe's own
  two BLAS variants stay within 1e-4 of the reference (the smaller of the two), then within
  max(3%, 1.25 x the variants' largest difference);
* every test output within 0.005 (accuracy) / 0.01 (loss); the final weights within
  max(20%, 1.5 x the variants' largest distance) of each blob's largest weight (the README:
  Caffe's own variants end "up to 20%" apart for SGD).

The GPU case is skipped with the reason where CuPy or a CUDA device is missing (the
``gpu_mode`` fixture).
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from caffe_engine.io.blobproto import proto_to_array
from caffe_engine.proto import caffe_pb2
from paths import TRAINING, copy_training_case



def _parse(log):
    losses = {int(m.group(1)): float(m.group(2))
              for m in re.finditer(r"Iteration (\d+) \([^)]*\), loss = (\S+)", log)}
    lrs = {int(m.group(1)): float(m.group(2))
           for m in re.finditer(r"Iteration (\d+), lr = (\S+)", log)}
    tests = re.findall(r"Test net output #\d+: (\w+) = (\S+)", log)
    return losses, lrs, tests


def _load(path, cls):
    msg = cls()
    msg.ParseFromString(Path(path).read_bytes())
    return msg


def _emulator_missing():
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    return compiler_missing()


@pytest.mark.parametrize("where", [
    pytest.param("gpu", marks=pytest.mark.gpu),
    # the cuda set's CUDA sources run serially on the CPU (CAFFE_ENGINE_KERNELS=cuda-emulated):
    # the kernels and plans of the GPU run, without CuPy; about 0.3 s an iteration, so slow
    pytest.param("cuda-emulated", marks=[
        pytest.mark.slow,
        pytest.mark.skipif(_emulator_missing() is not None, reason=str(_emulator_missing()))]),
])
def test_lenet_sgd_on_the_cuda_kernels_follows_caffes_curve(where, tmp_path, request):
    folder = copy_training_case("lenet_sgd", tmp_path)
    flags, env = [], dict(os.environ)
    if where == "gpu":
        request.getfixturevalue("gpu_mode")
        flags.append("--gpu=0")
    else:
        env["CAFFE_ENGINE_KERNELS"] = "cuda-emulated"
    run = subprocess.run([sys.executable, "-m", "caffe_engine", "train",
                          "--solver=solver.prototxt", *flags], cwd=folder, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    log = run.stderr
    assert "no usable GPU" not in log and "using the CPU" not in log
    ref_all = json.loads((folder / "trajectory.json").read_text())["runs"]["train"]
    ref = ref_all["iterations"]
    losses, lrs, tests = _parse(log)
    its = ref["iter"]
    assert sorted(losses) == its
    assert [lrs[i] for i in its] == ref["lr"]
    mine = np.array([losses[i] for i in its])
    theirs = np.array(ref["smoothed_loss"])
    rel = np.abs(mine - theirs) / np.abs(theirs)
    variants = [ref_all[v] for v in ("blas_order_variant", "blas_threads_variant")]
    assert rel[0] < 1e-5
    bound = min(v["first_iter_smoothed_loss_rel_diff_above_1e-4"] for v in variants) // 2
    assert rel[:bound].max() < 1e-4, \
        f"left Caffe's curve at iteration {int(np.argmax(rel > 1e-4))}, need >= {bound}"
    assert rel.max() < max(0.03, 1.25 * max(v["smoothed_loss_rel_diff_max"] for v in variants))
    assert len(tests) == 2 * len(ref_all["tests"])
    for k, t in enumerate(ref_all["tests"]):
        acc, loss = float(tests[2 * k][1]), float(tests[2 * k + 1][1])
        assert abs(acc - t["outputs"]["accuracy"]) <= 0.005
        assert abs(loss - t["outputs"]["loss"]) <= 0.01
    assert sorted(p.name for p in folder.glob("lenet_sgd_iter_*")) == sorted(ref_all["snapshots"])
    # the README: Caffe's own variants end with "final weights by up to 20% of their largest
    # value" for SGD (here the threads variant 0.125 on ip1's bias; the reference set, Caffe's
    # order in NumPy, lands at 0.125 too, the cuda set on the emulator at 0.19)
    limit = max(0.2, 1.5 * max(v["final_weights_max_abs_diff_over_max_abs"] for v in variants))
    model = _load(folder / "lenet_sgd_iter_300.caffemodel", caffe_pb2.NetParameter)
    caffe_model = _load(TRAINING / "lenet_sgd" / "lenet_sgd_iter_300.caffemodel",
                        caffe_pb2.NetParameter)
    for mine_layer, their_layer in zip(model.layer, caffe_model.layer):
        for bm, bt in zip(mine_layer.blobs, their_layer.blobs):
            wm, wt = proto_to_array(bm), proto_to_array(bt)
            assert np.abs(wm - wt).max() <= limit * np.abs(wt).max(), mine_layer.name
