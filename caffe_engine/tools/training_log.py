"""The numbers of a Caffe-format training log: smoothed losses, lr, train and test outputs,
clipping, multistep changes, snapshots.

Caffe: the log lines of src/caffe/solver.cpp and src/caffe/solvers/sgd_solver.cpp (glog
format). Used by ``caffe_repro_check`` and tools/compare_training.py.
"""
import os
import re

_ITER = re.compile(r"\] Iteration (\d+) \([^)]*\), loss = (\S+)")
_FINAL = re.compile(r"\] Iteration (\d+), loss = (\S+)")
_LR = re.compile(r"\] Iteration (\d+), lr = (\S+)")
_TRAIN_OUT = re.compile(r"\]     Train net output #\d+: (\S+) = (\S+)")
_TESTING = re.compile(r"\] Iteration (\d+), Testing net \(#(\d+)\)")
_TEST_OUT = re.compile(r"\]     Test net output #\d+: (\S+) = (\S+)")
_CLIP = re.compile(r"\] Gradient clipping: scaling down gradients \(L2 norm (\S+) > \S+\) by scale factor (\S+)")
_MULTISTEP = re.compile(r"\] MultiStep Status: Iteration (\d+), step = (\d+)")
_SNAP = re.compile(r"\] Snapshotting (?:solver state )?to (?:binary proto|HDF5) file (\S+)")


def parse_log(text):
    """The numbers of a Caffe-format training log.

    Returns:
        dict: ``iterations`` {iter: smoothed loss}, ``lr`` {iter: lr}, ``train_outputs``
        {iter: {blob: value}}, ``tests`` [{iter, net, outputs}], ``final_forward`` (iter, loss)
        or None, ``clipping`` [iter], ``multistep`` [(iter, step)], ``snapshots`` [file name].
    """
    out = {"iterations": {}, "lr": {}, "train_outputs": {}, "tests": [], "final_forward": None,
           "clipping": [], "multistep": [], "snapshots": []}
    current_iter, current_test = None, None
    for line in text.splitlines():
        m = _ITER.search(line)
        if m:
            current_iter, current_test = int(m.group(1)), None
            out["iterations"][current_iter] = float(m.group(2))
            out["train_outputs"][current_iter] = {}
            continue
        m = _TRAIN_OUT.search(line)
        if m and current_iter is not None:
            out["train_outputs"][current_iter][m.group(1)] = float(m.group(2))
            continue
        m = _LR.search(line)
        if m:
            out["lr"][int(m.group(1))] = float(m.group(2))
            continue
        m = _TESTING.search(line)
        if m:
            current_test = {"iter": int(m.group(1)), "net": int(m.group(2)), "outputs": {}}
            out["tests"].append(current_test)
            continue
        m = _TEST_OUT.search(line)
        if m and current_test is not None:
            current_test["outputs"][m.group(1)] = float(m.group(2))
            continue
        m = _CLIP.search(line)
        if m:
            out["clipping"].append(current_iter)
            continue
        m = _MULTISTEP.search(line)
        if m:
            out["multistep"].append((int(m.group(1)), int(m.group(2))))
            continue
        m = _SNAP.search(line)
        if m:
            out["snapshots"].append(os.path.basename(m.group(1)))
            continue
        m = _FINAL.search(line)
        if m:
            out["final_forward"] = (int(m.group(1)), float(m.group(2)))
    return out
