"""MG-WFBP bucket planning (comm/bucket_plan.py): the planner's grouping is the best of every way
to cut the layers into consecutive messages, under the alpha-beta model, on random instances;
the extremes behave as the model says. Oracle: brute force over all 2^(L-1) partitions."""
import itertools
import random

import pytest

from caffe_engine.comm import bucket_plan as bp


def partitions(n):
    for cuts in itertools.product([0, 1], repeat=n - 1):
        groups, current = [], [0]
        for i, cut in enumerate(cuts, start=1):
            if cut:
                groups.append(current)
                current = [i]
            else:
                current.append(i)
        groups.append(current)
        yield groups


def instance(rng):
    n = rng.randint(1, 8)
    backward = [rng.uniform(0, 1) * rng.choice([0.01, 1, 10]) for _ in range(n)]
    nbytes = [rng.randint(1, 1000) for _ in range(n)]
    return backward, nbytes, rng.choice([0, 0.01, 0.5, 5]), rng.choice([1e-5, 1e-3, 1e-2])


def test_the_plan_is_the_best_partition_and_never_worse_than_the_merge_rule_or_fixed_sizes():
    rng = random.Random(2026)
    greedy_worse = 0
    for _ in range(300):
        backward, nbytes, alpha, beta = instance(rng)
        args = (backward, nbytes, alpha, beta)
        plan = bp.simulate(bp.optimal_groups(*args), *args)[1]
        best = min(bp.simulate(p, *args)[1] for p in partitions(len(backward)))
        assert plan == pytest.approx(best, rel=1e-12, abs=1e-12)
        greedy = bp.simulate(bp.merge_rule_groups(*args), *args)[1]
        assert plan <= greedy + 1e-12
        greedy_worse += greedy > plan + 1e-9
        for cap in (1, 500, 2000, 10 ** 9):
            assert plan <= bp.simulate(bp.size_groups(nbytes, cap), *args)[1] + 1e-12
    assert greedy_worse > 0      # the comparison is not vacuous: the rule alone can lose


def test_start_up_cost_merges_everything_and_bandwidth_cost_keeps_layers_apart():
    backward, nbytes = [1.0] * 6, [100] * 6
    # A huge alpha: one message is best.
    assert bp.optimal_groups(backward, nbytes, alpha=100.0, beta=1e-6) == [[0, 1, 2, 3, 4, 5]]
    # No alpha and messages shorter than a layer's backward: each layer sent as it finishes.
    groups = bp.optimal_groups(backward, nbytes, alpha=0.0, beta=1e-3)
    assert groups == [[0], [1], [2], [3], [4], [5]]
    backward_end, comm_end = bp.simulate(groups, backward, nbytes, 0.0, 1e-3)
    assert backward_end == 6.0 and comm_end == pytest.approx(6.1)


def test_layer_plan_maps_layers_to_param_buckets_in_launch_order():
    # 5 layers; params 0,1 on layer 1, param 2 on layer 3 (param-less layers 0, 2, 4).
    ready, counts = [1, 1, 3], [10, 5, 1000]
    seconds = {4: 0.5, 3: 1.0, 2: 0.2, 1: 1.0, 0: 0.1}
    buckets, info = bp.layer_plan(ready, counts, seconds, 5, alpha=100.0, beta=0.0)
    assert buckets == [[2, 0, 1]] and info == [(3, 1, 4 * 1015)]
    buckets, info = bp.layer_plan(ready, counts, seconds, 5, alpha=0.0, beta=1e-9)
    assert buckets == [[2], [0, 1]] and info == [(3, 3, 4000), (1, 1, 60)]
