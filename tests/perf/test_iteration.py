"""Iteration time and weak-scaling speedup (caffe_engine/perf/iteration.py): compute plus the
gradient allreduce, after backward or bucket by bucket during it. Oracles written out by hand."""
import pytest

from caffe_engine.perf.iteration import iteration_time, predict_speedup, uniform_layers


def test_iteration_time_overlap_hides_communication():
    layers = {"conv1": (0.01, 0.02), "conv2": (0.01, 0.02), "fc": (0.01, 0.02)}
    grads = {"conv1": 4e6, "conv2": 4e6, "fc": 4e6}
    comm = lambda n: n * 1e-9                                        # 4 ms per layer
    plain = iteration_time(layers, grads, comm, overlap=False)
    over = iteration_time(layers, grads, comm, overlap=True, bucket_mb=0)
    assert plain["total"] == pytest.approx(0.03 + 0.06 + 0.012)
    # fc's and conv2's buckets hide behind conv2's and conv1's backward; conv1's is exposed.
    assert over["total"] == pytest.approx(0.03 + 0.06 + 0.004)
    assert over["exposed"] == pytest.approx(0.004)
    s = predict_speedup(layers, grads, lambda n, p: comm(n) * (p > 1), [1, 4])
    assert s[1] == pytest.approx(1.0) and s[4] == pytest.approx(4 * 0.09 / 0.102)
    layers, grads = uniform_layers(0.3, 30e6, num_layers=10)
    assert sum(grads.values()) == pytest.approx(30e6)
    assert sum(f + b for f, b in layers.values()) == pytest.approx(0.3)
