"""comm/hybrid_cost.py: PCL-DNN's balance equations for one InnerProduct layer, and best_group.

Oracles: the equations of the module docstring worked out by hand on small numbers below (each
term written out in the comments), allreduce_cost's table (A(P), B(P)) and the sizes of
CaffeNet's fc6 (9216 x 4096) on 1 Gbit/s links.
"""
import pytest

from caffe_engine.comm import hybrid_cost as hc
from caffe_engine.comm.allreduce_cost import AlphaBetaModel
from caffe_engine.errors import CaffeError

LINK = hc.Link(alpha=1.0, beta=0.5)
FLOPS = 6.0
GBIT = hc.Link.from_rate(1e9, 50e-6)


def test_data_parallel_by_hand():
    # K 3, N 4, M 2, P 4, ring: C = 6 * 2 * 3 * 4 / 6 = 24; |W| = 4 (3 + 1) 4 = 64 bytes;
    # allreduce = alpha 2 (P - 1) + beta |W| 2 (P - 1) / P = 6 + 0.5 * 64 * 1.5 = 54.
    t = hc.layer_time(3, 4, 2, 4, 1, LINK, "ring", FLOPS)
    assert (t["compute"], t["exchange"], t["allreduce"], t["total"]) == (24, 0, 54, 78)
    assert t["sent_bytes"] == 64 * 1.5
    # 50 s of backward below the layer hide all but 4 s of it.
    t = hc.layer_time(3, 4, 2, 4, 1, LINK, "ring", FLOPS, overlap_s=50)
    assert (t["exposed"], t["total"]) == (4, 28)


def test_hybrid_by_hand():
    # G 2: n_G = 2, C = 6 (2 * 2) 3 * 2 / 6 = 24; E = (G - 1)(4 alpha + 8 beta M (K + n_G))
    # = 4 + 8 * 0.5 * 2 * 5 = 44; the replicas' ring over P / G = 2 ranks: 4 (3 + 1) 2 = 32 bytes,
    # alpha 2 + 0.5 * 32 * 1 = 18.
    t = hc.layer_time(3, 4, 2, 4, 2, LINK, "ring", FLOPS)
    assert (t["compute"], t["exchange"], t["allreduce"], t["total"]) == (24, 44, 18, 86)
    assert t["sent_bytes"] == 2 * 4 * 2 * 5 + 32      # exchange + the ring's 32 * B(2)
    # G = P = 4: n_G = 1, E = 3 (4 + 8 * 0.5 * 2 * 4) = 108, no allreduce.
    t = hc.layer_time(3, 4, 2, 4, 4, LINK, "ring", FLOPS)
    assert (t["compute"], t["exchange"], t["allreduce"], t["total"]) == (24, 108, 0, 132)
    assert hc.best_group(3, 4, 2, 4, LINK, "ring", FLOPS) == 1


def test_uneven_slices_time_the_widest():
    # N 5 over G 2: slices of 3 and 2 columns; the rank with 3 sets the pace.
    assert hc.slice_width(5, 2) == 3
    assert hc.compute_seconds(3, 5, 2, 2, FLOPS) == 6 * 4 * 3 * 3 / 6
    assert hc.weight_bytes(3, 5, 2) == 4 * 4 * 3


def test_allreduce_uses_allreduce_costs_terms():
    # tree at P = 4: A = B = 2 ceil(log2 4) = 4.
    assert hc.allreduce_seconds(100, 4, LINK, "tree") == 1.0 * 4 + 0.5 * 100 * 4
    # hier and nccl (not modelled there) and an option after a colon: as the ring.
    ring = hc.allreduce_seconds(100, 4, LINK, "ring")
    assert hc.allreduce_seconds(100, 4, LINK, "hier:tree") == ring
    assert hc.allreduce_seconds(100, 4, LINK, "nccl") == ring
    assert hc.allreduce_seconds(100, 1, LINK, "ring") == 0


def test_divisors():
    assert hc.divisors(8) == [1, 2, 4, 8]
    assert hc.divisors(6) == [1, 2, 3, 6]
    assert hc.divisors(1) == [1]


@pytest.mark.parametrize("m", [1, 2, 8, 32])
@pytest.mark.parametrize("procs", [2, 4, 8])
def test_caffenet_fc6_small_batch_on_1gbit_goes_model_parallel(m, procs):
    assert hc.best_group(9216, 4096, m, procs, GBIT, "ring", 20e9) == procs
    assert hc.best_group(9216, 4096, m, procs, GBIT, "tree", 20e9) == procs


def test_huge_batch_or_free_link_stays_data_parallel():
    assert hc.best_group(9216, 4096, 1_000_000, 8, GBIT, "ring", 20e9) == 1
    assert hc.best_group(9216, 4096, 8, 8, hc.Link(0.0, 0.0), "ring", 20e9) == 1
    assert hc.best_group(9216, 4096, 8, 8, hc.Link.from_rate(float("inf")), "ring", 20e9) == 1
    assert hc.best_group(9216, 4096, 8, 1, GBIT, "ring", 20e9) == 1


def test_latency_alone_favours_fewer_messages():
    # No bandwidth cost: the exchange's 4 (G - 1) messages against the ring's 2 (P - 1):
    # G = 2 costs 4 + the ring of 4 replicas 6 = 10 alphas, G = 4 12 + 2, G = 8 28, data
    # parallel 14.
    link = hc.Link(1e-3, 0.0)
    totals = {g: hc.layer_time(4096, 4096, 8, 8, g, link, "ring", 1e30)["total"]
              for g in hc.divisors(8)}
    assert totals == pytest.approx({1: 14e-3, 2: 10e-3, 4: 14e-3, 8: 28e-3})
    assert hc.best_group(4096, 4096, 8, 8, link, "ring", 1e30) == 2


def test_link_constructors():
    assert hc.Link.from_rate(1e9, 50e-6, 20e-6) == pytest.approx((70e-6, 8e-9))
    a, b = hc.allreduce_terms("ring", 4)
    assert hc.Link.from_allreduce(LINK.alpha * a, LINK.beta * b, "ring", 4) == LINK
    assert hc.Link.from_allreduce(1.0, 1.0, "ring", 1) == (0.0, 0.0)
    model = AlphaBetaModel({"ring": {"alpha": 2e-5, "beta": 1e-9}})
    assert hc.Link.from_model(model, "ring") == (2e-5, 1e-9)
    assert hc.Link.from_model(model, "hier") == (2e-5, 1e-9)
    with pytest.raises(CaffeError, match="no parameters for 'mpi' nor 'ring'"):
        hc.Link.from_model(AlphaBetaModel({"tree": {"alpha": 1, "beta": 1}}), "mpi")


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="G dividing P"):
        hc.layer_time(3, 4, 2, 6, 4, LINK, "ring", FLOPS)
    with pytest.raises(ValueError):
        hc.layer_time(3, 4, 0, 4, 1, LINK, "ring", FLOPS)


@pytest.mark.parametrize("transpose", [False, True])
def test_gemm_rate_times_the_layers_own_product(transpose, monkeypatch):
    """``--fc_parallel auto``'s compute rate: the layer's kernel set multiplies an (M, K)
    input by the layer's own weights (N, K), or (K, N) with ``transpose``."""
    import caffe
    from caffe_engine import kernels
    from caffe_engine.comm import hybrid_train
    from caffe_engine.net_spec import NetSpec, layers as L
    ns = NetSpec()
    ns.data = L.Input(shape=dict(dim=[4, 3, 2, 2]))
    ns.ip = L.InnerProduct(ns.data, num_output=5, transpose=transpose)
    net = caffe.Net(ns.to_proto(), caffe.TEST)
    layer = net.layers[list(net._layer_names).index("ip")]
    seen = []
    ks = kernels.for_array(layer.blobs[0].data)
    real = ks.matmul

    def spy(a, b, c, **kw):
        seen.append((a.shape, b is layer.blobs[0].data, c.shape, kw))
        return real(a, b, c, **kw)
    monkeypatch.setattr(type(ks), "matmul", staticmethod(spy))
    rate = hybrid_train._gemm_flops(layer, 7)
    assert rate > 0
    assert seen[0] == ((7, 12), True, (7, 5), {"trans_b": not transpose})
    assert len(seen) == 4
