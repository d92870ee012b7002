"""Shi et al.'s DAG model (caffe_engine/perf/dag.py and the settings it is checked against):
schedules, costs, tools/dag_model.py's tables."""
import os
import random
import subprocess
import sys

import pytest

from caffe_engine.perf import dag, firecaffe, four_minutes, message_cost, profiles
from caffe_engine.perf.alpha_beta import shape_terms

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _random_net(rng, layers):
    backward = [rng.uniform(1e-4, 5e-3) for _ in range(layers)]
    nbytes = [rng.choice([4e3, 1e5, 2e6, 1e7]) for _ in range(layers)]
    return backward, nbytes


def test_one_layer_is_backward_plus_comm():
    for mode in ("none", "wfbp", "mgwfbp", "mgwfbp_rule", "buckets25"):
        it = dag.iteration(0.01, [0.02], [1e6], 1e-3, 2e-9, mode)
        assert it["total"] == pytest.approx(0.01 + 0.02 + 1e-3 + 2e-9 * 1e6)
        assert it["messages"] == 1


def test_no_overlap_is_the_sum():
    rng = random.Random(1)
    backward, nbytes = _random_net(rng, 7)
    alpha, beta = 5e-4, 1e-9
    it = dag.iteration(0.003, backward, nbytes, alpha, beta, "none")
    assert it["total"] == pytest.approx(0.003 + sum(backward) + alpha + beta * sum(nbytes))
    assert it["exposed"] == pytest.approx(alpha + beta * sum(nbytes))


def test_wfbp_never_beats_optimal_mgwfbp():
    rng = random.Random(2)
    for _ in range(200):
        backward, nbytes = _random_net(rng, rng.randint(1, 9))
        alpha, beta = rng.choice([1e-6, 1e-4, 1e-3, 1e-2]), rng.choice([1e-10, 1e-9, 1e-8])
        opt = dag.iteration(0.0, backward, nbytes, alpha, beta, "mgwfbp")["total"]
        for mode in ("wfbp", "none", "mgwfbp_rule", "buckets25"):
            assert dag.iteration(0.0, backward, nbytes, alpha, beta, mode)["total"] >= opt - 1e-12


def test_mgwfbp_merges_when_alpha_dominates():
    backward, nbytes = [1e-4] * 10, [1e3] * 10
    assert dag.iteration(0, backward, nbytes, 1e-2, 1e-12, "mgwfbp")["messages"] < 10
    assert dag.iteration(0, backward, nbytes, 1e-2, 1e-12, "wfbp")["messages"] == 10


def test_monotonic_in_bandwidth():
    rng = random.Random(3)
    backward, nbytes = _random_net(rng, 8)
    for mode in ("none", "wfbp", "mgwfbp"):
        times = [dag.iteration(0.001, backward, nbytes, 1e-4, 8 / bw, mode)["total"]
                 for bw in (1e9, 1e10, 1e11)]
        assert times[0] >= times[1] >= times[2]
        assert times[0] > times[2]


def test_allreduce_terms_match_cost_model_and_hier():
    a, b = message_cost.allreduce_terms("ring", 16, 1e-5, 1e-9)
    A, B = shape_terms("ring", 16)
    assert (a, b) == pytest.approx((1e-5 * A, 1e-9 * B))
    # hier on one rank per node is the leaders' ring alone
    assert message_cost.allreduce_terms("hier", 16, 1e-5, 1e-9, gpus_per_node=1) == \
        pytest.approx((a, b))
    # 4 nodes of 8: 2 (K - 1) intra alphas + 2 (N - 1) ring alphas; chain: 2 n beta_intra
    a, b = message_cost.allreduce_terms("hier", 32, 1e-5, 1e-9, 8, 2e-6, 1e-10, intra="chain")
    assert a == pytest.approx(2 * 7 * 2e-6 + 2 * 3 * 1e-5)
    assert b == pytest.approx(2 * 1e-10 + 2 * 3 / 4 * 1e-9)
    a, b = message_cost.allreduce_terms("hier", 32, 1e-5, 1e-9, 8, 2e-6, 1e-10, intra="leader")
    assert b == pytest.approx(2 * 7 * 1e-10 + 2 * 3 / 4 * 1e-9)
    # hier.py's lanes: one reduce-scatter and one all-gather of 7/8 n each inside the node
    a, b = message_cost.allreduce_terms("hier", 32, 1e-5, 1e-9, 8, 2e-6, 1e-10, intra="lanes")
    assert a == pytest.approx(2 * 2e-6 + 2 * 3 * 1e-5)
    assert b == pytest.approx(2 * 7 / 8 * 1e-10 + 2 * 3 / 4 * 1e-9)
    with pytest.raises(ValueError, match="intra must be"):
        message_cost.allreduce_terms("hier", 32, 1e-5, 1e-9, 8, intra="star")
    assert message_cost.allreduce_terms("hier", 1, 1e-5, 1e-9, 8) == (0.0, 0.0)


def test_shapes_profile_params_agree_with_caffe():
    path = os.path.join(profiles.SHAPES, firecaffe.FIRECAFFE["NiN"]["shapes"])
    if not os.path.exists(path):
        pytest.skip("shared/realworld not present")
    prof = profiles.shapes_profile(path)
    assert prof.params == 7595176                      # Caffe's param_count_total for NiN
    assert sum(prof.bwd_share) + prof.fwd_share == pytest.approx(1.0)
    assert prof.fwd_share == pytest.approx(1 / 3, abs=0.02)   # backward ~ 2x forward


def _run(*args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "dag_model.py"), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_cli_firecaffe_has_128_and_published():
    if not os.path.isdir(profiles.SHAPES):
        pytest.skip("shared/realworld not present")
    text = _run("--firecaffe", "--bandwidths", "2.5e9")
    rows = [line for line in text.splitlines() if line.startswith("| GoogLeNet | 128 ")]
    assert rows and all("47x" in r for r in rows)
    assert any(line.startswith("| NiN | 128 ") and "39x" in line for line in text.splitlines())
    assert "WFBP" in text and "MG-WFBP" in text


def test_cli_four_minutes_has_published_throughput():
    if not os.path.isdir(profiles.SHAPES):
        pytest.skip("shared/realworld not present")
    text = _run("--four-minutes")
    resnet = f"{four_minutes.published_throughput('ResNet-50'):,.0f}"
    alexnet = f"{four_minutes.published_throughput('AlexNet'):,.0f}"
    assert resnet in text and alexnet in text
    assert any(line.startswith("| ResNet-50 | 2048 ") and "hier" in line
               for line in text.splitlines())


def test_cli_netlab_table_runs():
    text = _run("--netlab")
    assert "| cifar10_quick | 8 " in text and "| nin_cifar10 | 4 " in text
