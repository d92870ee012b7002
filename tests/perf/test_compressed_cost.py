"""caffe_engine/perf/compressed.py (compressed_allreduce_time, compressed_schedule): the sum of
one bucket under --comm_compress none|fp16|topk|gtopk on per-host links. Synthetic numbers only.

Oracles: closed forms written out by hand from compress.py's schedules (binary heap tree, both
children at once; all-to-all for topk), with alpha = 1 ms and beta = 1 ns/byte.
"""
import math

import pytest

from caffe_engine.perf.compressed import compressed_allreduce_time, compressed_schedule
from caffe_engine.perf.link_model import LinkModel
from caffe_engine.errors import CaffeError

ALPHA, BETA = 1e-3, 1e-9
MODEL = LinkModel(ALPHA, BETA)
N = 4 * 1_000_000        # 1,000,000 floats


def test_none_is_the_dense_algorithm_unchanged():
    for p in (2, 4, 8):
        assert compressed_allreduce_time("none", N, p, MODEL) == MODEL.predict("tree", N, p, 1)
        assert compressed_allreduce_time("none", N, p, MODEL, algorithm="ring") == \
            MODEL.predict("ring", N, p, 1)
    assert compressed_allreduce_time("none", N, 1, MODEL) == 0.0
    assert compressed_allreduce_time("gtopk", N, 1, MODEL) == 0.0


def test_gtopk_p8_is_six_steps_of_k_entries():
    # P = 8: levels 0; 1 2; 3 4 5 6; 7. Up: level 3 (7 -> 3, one child), level 2 (3,4 -> 1 and
    # 5,6 -> 2: two children into each parent's link), level 1 (1,2 -> 0: two). Down the same.
    k = math.ceil(0.001 * 1_000_000)
    m = 8 * k
    want = 2 * (ALPHA + m * BETA) + 4 * (ALPHA + 2 * m * BETA)
    assert compressed_allreduce_time("gtopk", N, 8, MODEL, 0.001) == pytest.approx(want)
    # Shi et al.'s 2 log2(P) (alpha + 8 k beta) is a lower bound of it, 1 child per step.
    assert want >= 6 * (ALPHA + m * BETA)


def test_gtopk_p4_and_p2():
    m = 8 * 10_000        # density 0.01
    # P = 4: 3 -> 1 (one child), then 1,2 -> 0 (two); down the same.
    assert compressed_allreduce_time("gtopk", N, 4, MODEL, 0.01) == pytest.approx(
        2 * (ALPHA + m * BETA) + 2 * (ALPHA + 2 * m * BETA))
    assert compressed_allreduce_time("gtopk", N, 2, MODEL, 0.01) == pytest.approx(
        2 * (ALPHA + m * BETA))


def test_fp16_is_the_same_tree_with_half_the_bytes_and_no_chunks():
    m = N / 2
    assert compressed_allreduce_time("fp16", N, 8, MODEL) == pytest.approx(
        2 * (ALPHA + m * BETA) + 4 * (ALPHA + 2 * m * BETA))


def test_topk_is_one_all_to_all():
    for p in (2, 4, 8):
        m = 8 * 1000
        assert compressed_allreduce_time("topk", N, p, MODEL, 0.001) == pytest.approx(
            (p - 1) * ALPHA + (p - 1) * m * BETA)


def test_sparse_beats_dense_on_slow_links_and_grows_with_density():
    slow = LinkModel(1.7e-3, 8.2e-8)          # about 100 Mbit/s
    n = 4 * 5_824_522
    dense = compressed_allreduce_time("none", n, 8, slow)
    g = [compressed_allreduce_time("gtopk", n, 8, slow, d) for d in (0.001, 0.01, 0.1)]
    assert g[0] < g[1] < g[2] < dense
    assert dense / g[0] > 100


def test_unknown_method():
    with pytest.raises(CaffeError, match="method must be one of"):
        compressed_schedule("zip", N, 4)
