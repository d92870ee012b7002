"""``--bucket_mb auto`` (comm/bucket_plan.AutoBuckets): the MG-WFBP plan is tried against the
buckets in use on whole iterations and only kept when it is faster; a lost trial calibrates the
per-message cost. A real Net, a fake communicator of two identical ranks and a fake clock whose
iteration time depends on the number of buckets in use (the oracle: which plan must win)."""
import logging

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.comm import bucket_plan
from caffe_engine.comm.buckets import GradientSync
from caffe_engine.net import TRAIN, Net
from caffe_engine.proto import caffe_pb2
from tiny_nets import IP_NET

MS = 1e-3


class FakeComm:
    """Two ranks with identical data: rank 0's value is everyone's, the mean changes nothing."""
    name, rank, size = "fake", 0, 2

    def allgather_object(self, value):
        return [value, value]

    def allreduce_async_(self, buf, op="mean"):
        class Handle:
            def wait(self):
                return None
        return Handle()


class Clock:
    """perf_counter that moves 1 ms per reading (so every layer's backward takes 1 ms) plus
    what the test adds for an iteration."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        self.now += MS
        return self.now


def run(monkeypatch, iteration_ms, iterations=40):
    """Train-loop stand-in: on_start, forward/backward while the planner measures, then the
    iteration's cost from ``iteration_ms(number of buckets in use)``."""
    clock = Clock()
    monkeypatch.setattr(bucket_plan, "time", clock)
    # alpha 0.1 ms, beta 10 us/byte: with 1 ms per layer, ip2 (72 bytes) sent alone overlaps
    # ip1's backward, so the model's plan is one bucket per layer (2) against the 1 in use.
    monkeypatch.setattr(bucket_plan, "measure_alpha_beta", lambda comm: (0.1 * MS, 1e-5))
    rng.set_random_seed(7)
    net = Net(text_format.Parse(IP_NET, caffe_pb2.NetParameter()), TRAIN)
    net.blobs["data"].data[...] = numpy.ones((4, 6), numpy.float32)
    sync = GradientSync(net, FakeComm(), bucket_mb=25)
    assert len(sync.buckets) == 1
    log = logging.getLogger("test_auto_buckets")
    planner = bucket_plan.AutoBuckets(net, sync, FakeComm(), log=log, trial_iters=3)
    used = []
    for it in range(iterations):
        planner.on_start(it)
        if planner.timer.armed:
            net.forward()
            net.backward()
        used.append(len(sync.buckets))
        clock.now += iteration_ms(len(sync.buckets)) * MS
    return planner, sync, used


def test_a_plan_that_loses_in_training_is_not_kept_and_alpha_is_calibrated(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="test_auto_buckets")
    planner, sync, used = run(monkeypatch, lambda k: 100 + 30 * (k - 1))
    # measured 1..5, planned at 6: the plan has 2 buckets; 6 iterations alternate 2, 1, 2, ...
    assert used[:6] == [1] * 6 and used[6:12] == [2, 1, 2, 1, 2, 1]
    assert [t[0] for t in planner.trials] == ["in use", "MG-WFBP"]
    seconds = {label: s for label, _, s in planner.trials}
    assert seconds["MG-WFBP"] - seconds["in use"] == pytest.approx(30 * MS, abs=2 * MS)
    # the calibrated alpha (~31 ms) merges both layers: that is the plan in use, no third trial
    assert used[12:] == [1] * (len(used) - 12) and len(sync.buckets) == 1
    assert planner.plan_info == [(3, 1, 4 * (15 + 3 + 30 + 5))]
    text = caplog.text
    assert "tried, median iteration: in use (1 bucket(s))" in text
    assert "MG-WFBP (2 bucket(s))" in text
    assert "(kept: in use)" in text


def test_a_plan_that_wins_in_training_is_kept(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="test_auto_buckets")
    planner, sync, used = run(monkeypatch, lambda k: 100 - 30 * (k - 1))
    assert used[6:12] == [2, 1, 2, 1, 2, 1] and used[12:] == [2] * (len(used) - 12)
    assert [len(b) for b in planner.trials[1][1]] == [2, 2]     # ip2's weight+bias, ip1's
    assert [(f, l) for f, l, _ in planner.plan_info] == [(3, 3), (1, 1)]
    assert "(kept: MG-WFBP)" in caplog.text


def test_calibrated_alpha_charges_what_the_model_missed_to_the_extra_messages():
    class Planner:      # what calibrated_alpha reads: 2 gradient layers of 100 bytes, 1 ms each
        alpha, beta = 1 * MS, 0.0
        layer_seconds = {0: 1 * MS, 1: 1 * MS}

        class sync:
            ready_layers = [1, 1, 0]

        class net:
            learnable_params = [type("B", (), {"count": 20})(), type("B", (), {"count": 5})(),
                                type("B", (), {"count": 25})()]
            layers = [0, 1]
    few, many = [[0, 1, 2]], [[0, 1], [2]]
    # predicted: merged ends at 2 + 1 = 3 ms, split at max(1 + 1, 2) + 1 = 3 ms: no difference;
    # measured: split 8 ms slower -> alpha + 8 ms
    assert bucket_plan.calibrated_alpha(Planner, few, many, 0.100, 0.108) == \
        pytest.approx(9 * MS)
    # a faster split never lowers alpha
    assert bucket_plan.calibrated_alpha(Planner, few, many, 0.100, 0.090) == pytest.approx(MS)


def test_a_cost_model_without_the_algorithm_s_formula_means_measuring(tmp_path):
    from caffe_engine.perf.alpha_beta import AlphaBetaModel
    path = str(tmp_path / "model.json")
    AlphaBetaModel({"ring": {"alpha": 1e-3, "beta": 1e-9}}).save(path)
    alpha, beta = bucket_plan.model_alpha_beta(path, "ring", 4)
    assert alpha == pytest.approx(6e-3) and beta == pytest.approx(1e-9 * 2 * 3 / 4)
    assert bucket_plan.model_alpha_beta(path, "hier", 4) is None     # node layout unknown
