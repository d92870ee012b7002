"""tools/compression_check.py without MPI or training: reading a 4-rank log (tests, traffic lines,
the compression named on the start line), the bytes averaged over the run, the must-show check
at and around its thresholds, the commands and the solver files they name.

Oracles: logs written by hand in the engine's format (their lines copied from real runs), and
accuracies chosen on either side of each threshold.
"""
import importlib.util
import os

from caffe_engine.io import prototxt
from paths import ROOT

SPEC = importlib.util.spec_from_file_location("compression_check",
                                              ROOT / "tools" / "compression_check.py")
cc = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(cc)

LOG = """\
I20261202 07:17:55.1 10693 data_parallel.py:150] Data parallel: rank 0 of 4 (tree), 1 gradient \
bucket(s) of at most 25 MB, records dealt to mnist, gradients compressed: gtopk, density 0.001, \
error feedback on (k = 432 of 431080 values)
I20261202 07:17:56.0 10693 solver.py:300] Solving LeNet
I20261202 07:17:57.0 10693 solver.py:602] Iteration 0, Testing net (#0)
I20261202 07:17:57.5 10693 solver.py:551]     Test net output #0: accuracy = 0.07
I20261202 07:17:57.5 10693 solver.py:551]     Test net output #1: loss = 2.31 (* 1 = 2.31 loss)
I20261202 07:17:57.7 10693 solver.py:240] Iteration 0 (0 iter/s, 0.5s/100 iters), loss = 2.3
I20261202 07:17:57.7 10693 sgd.py:95] Iteration 0, lr = 0.01
I20261202 07:18:14.1 10693 data_parallel.py:233] Iteration 100, gradient traffic (gtopk): 6912 \
bytes sent per iteration by the busiest rank (this rank 6912, mean 5184 over 4 ranks); a dense \
ring allreduce sends 2586480
I20261202 07:18:14.2 10693 solver.py:602] Iteration 100, Testing net (#0)
I20261202 07:18:14.8 10693 solver.py:551]     Test net output #0: accuracy = 0.93
I20261202 07:18:14.8 10693 solver.py:551]     Test net output #1: loss = 0.25 (* 1 = 0.25 loss)
I20261202 07:18:15.0 10693 solver.py:240] Iteration 100 (7 iter/s, 14s/100 iters), loss = 0.2
I20261202 07:18:29.0 10693 data_parallel.py:233] Iteration 200, gradient traffic (gtopk): 7000 \
bytes sent per iteration by the busiest rank (this rank 7000, mean 5000 over 4 ranks); a dense \
ring allreduce sends 2586480
I20261202 07:18:29.1 10693 solver.py:602] Iteration 200, Testing net (#0)
I20261202 07:18:29.5 10693 solver.py:551]     Test net output #0: accuracy = 0.951
I20261202 07:18:29.5 10693 solver.py:551]     Test net output #1: loss = 0.15 (* 1 = 0.15 loss)
I20261202 07:18:29.6 10693 solver.py:450] Optimization Done.
"""


def test_parse_run_reads_tests_traffic_and_compression():
    r = cc.parse_run(LOG)
    assert r["points"] == [[0, 0.07, 2.31], [100, 0.93, 0.25], [200, 0.951, 0.15]]
    assert r["compression"] == "gtopk, density 0.001, error feedback on (k = 432 of 431080 values)"
    assert r["last_train_loss"] == 0.2
    assert r["finished"]
    assert [t["busiest"] for t in r["traffic"]] == [6912, 7000]
    assert r["traffic"][0] == {"iteration": 100, "method": "gtopk", "busiest": 6912,
                               "mean": 5184.0, "ranks": 4, "dense_ring": 2586480}
    assert cc.bytes_per_iteration(r) == (6956.0, 5092.0, 2586480)
    assert cc.accuracy_at(r, 100) == 0.93 and cc.accuracy_at(r, 500) is None


def test_dense_log_has_no_traffic_and_an_unfinished_log_says_so():
    dense = "\n".join(line for line in LOG.splitlines()
                      if "gradient traffic" not in line and "Optimization" not in line)
    dense = dense.replace(", gradients compressed: gtopk, density 0.001, error feedback on "
                          "(k = 432 of 431080 values)", "")
    r = cc.parse_run(dense)
    assert r["compression"] == "none" and r["traffic"] == [] and not r["finished"]
    assert cc.bytes_per_iteration(r) is None
    assert len(r["points"]) == 3


def runs(**final):
    """variant -> record whose last test point is (1000, accuracy)."""
    return {v: {"points": [[500, 0.5, 1.0], [1000, acc, 0.1]]} for v, acc in final.items()}


def test_check_passes_at_the_thresholds_and_fails_beyond():
    good = runs(dense=0.968, fp16=0.963, topk=0.9, gtopk=0.958, gtopk_noef=0.947)
    assert cc.check(good) == []          # 1 point, 0.5 point, and a gap of 1.1 points: all hold
    assert cc.check(runs(dense=0.968, gtopk=0.978)) == []           # within, either side
    fails = cc.check(runs(dense=0.968, fp16=0.962, gtopk=0.957, gtopk_noef=0.948))
    assert len(fails) == 3
    assert fails[0].startswith("gtopk ends at 0.9570, not within 1 point of dense 0.9680")
    assert fails[1].startswith("fp16 ends at 0.9620, not within 0.5 point")
    assert fails[2].startswith("gtopk_noef ends at 0.9480, not visibly")
    assert cc.check(runs(gtopk=0.96, gtopk_noef=0.959), visible_gap=0.0) == []
    assert cc.check(runs(gtopk=0.96, gtopk_noef=0.96), visible_gap=0.0) != []
    assert cc.check(runs(dense=0.9, fp16=0.99)) != []          # fp16 too high is not "within"


def test_check_flags_missing_tests_and_unequal_lengths():
    r = runs(dense=0.968, fp16=0.968)
    r["fp16"]["points"][-1][0] = 900
    assert any("different iterations" in m for m in cc.check(r))
    assert cc.check({"dense": {"points": []}}) == ["dense: no test output"]


def test_commands_name_the_solver_files_and_their_blocks():
    assert cc.command("gtopk", 4, "mpiexec", "py") == [
        "mpiexec", "-n", "4", "py", "-m", "caffe_engine", "train",
        "--solver=" + os.path.join("models", "lenet_compressed", "solver_gtopk.prototxt")]
    blocks = {}
    for v in cc.VARIANTS:
        param = prototxt.read_solver_param(str(ROOT / cc.solver_path(v)))
        assert (param.max_iter, param.test_interval, param.random_seed) == (1000, 100, 1701)
        assert param.net == "models/lenet/lenet_train_test.prototxt"
        blocks[v] = (param.HasField("comm_param"), param.comm_param.compress,
                     round(param.comm_param.density, 7), param.comm_param.error_feedback)
    assert blocks == {"dense": (False, "none", 0.001, True),
                      "fp16": (True, "fp16", 0.001, True),
                      "topk": (True, "topk", 0.001, True),
                      "gtopk": (True, "gtopk", 0.001, True),
                      "gtopk_noef": (True, "gtopk", 0.001, False)}
