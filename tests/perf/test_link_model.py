"""The link model of caffe_engine/perf (schedules.py, link_model.py, link_report.py): each
algorithm's schedule on per-host links, one alpha and one beta fitted for all algorithms.
Synthetic data only (no timing).

Oracles: the closed forms written out by hand from ring.py, ps.py, tree.py and hier.py (e.g. the
ring's 2 (P - 1) steps of n/P; the tree's first chunk up and down hop by hop, k chunks through a
parent's link), and round trips of fit -> predict on rows made by the model itself.
"""
import json

import pytest

from caffe_engine.perf.link_model import LinkModel
from caffe_engine.perf.link_report import link_report
from caffe_engine.perf.schedules import (LINK_ALGORITHMS, link_schedule, link_terms, linear_terms,
                                         parse_algorithm)
from caffe_engine.errors import CaffeError

MIB = 1 << 20


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 16])
def test_ring_and_ps_terms_are_the_classic_formulas(p):
    n = 8 * MIB
    a, b = link_terms("ring", n, p)
    assert a == 2 * (p - 1)
    assert b == pytest.approx(2 * (p - 1) * n / p)
    a, b = link_terms("ps", n, p)
    assert a == 2 * (p - 1)                       # P - 1 receives, then P - 1 sends posted
    assert b == pytest.approx(2 * (p - 1) * n)    # everything through the server's link


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_mpi_is_rabenseifner(p):
    n = 8 * MIB
    a, b = link_terms("mpi", n, p)
    assert a == 2 * (p.bit_length() - 1)
    assert b == pytest.approx(2 * (p - 1) / p * n)


def test_mpi_for_a_non_power_of_two_adds_the_fold():
    n = 8 * MIB
    a, b = link_terms("mpi", n, 6)             # pof2 = 4: n out, Rabenseifner on 4, n back
    assert a == 2 + 2 * 2
    assert b == pytest.approx(2 * n + 2 * 3 / 4 * n)


def test_tree_one_chunk_is_hop_by_hop():
    n = 2 * MIB                                   # one chunk: up the tree, then down
    assert link_terms("tree", n, 2) == (2, pytest.approx(2 * n))
    # P = 4: 3 -> 1 (n), then 1 and 2 -> 0 share 0's link in (2n); the same down.
    assert link_terms("tree", n, 4) == (4, pytest.approx(6 * n))
    # P = 8: 7 -> 3 (n), 3, 4 -> 1 and 5, 6 -> 2 (2n), 1, 2 -> 0 (2n); the same down.
    assert link_terms("tree", n, 8) == (6, pytest.approx(10 * n))


def test_tree_many_chunks_follows_the_lagged_schedule():
    c = 4 * MIB
    # P = 2, 8 chunks, lag 3: chunks 0-3 stream up (4c), then chunks 4-7 each a round trip
    # (2c), chunks 4-7 stream down (4c): 16c in all, 16 messages.
    assert link_terms("tree", 8 * c, 2) == (16, pytest.approx(16 * c))
    # P = 8, 8 chunks, lag 7 = all of them: U = D = 5c, then 7 more chunks at 2c each way.
    a, b = link_terms("tree", 8 * c, 8)
    assert b == pytest.approx(2 * (5 * c + 7 * 2 * c))
    assert a == 2 * 3 + 2 * 7
    # A longer lag never slows it; lag 0 makes every chunk a round trip.
    assert link_terms("tree", 8 * c, 2, lag=0)[1] == pytest.approx(8 * 2 * c)
    # Smaller chunks do not help this schedule: 32 chunks of 1 MiB at P = 8 stream the first
    # 8 (10 + 7 x 4 MiB) and pay a round trip (10 MiB) for each of the other 24.
    assert link_terms("tree", 32 * MIB, 8, chunk_bytes=MIB)[1] == pytest.approx(
        (10 + 7 * 4 + 24 * 10) * MIB)


def test_ps_grows_linearly_and_the_tree_slowly():
    m = LinkModel(alpha=0.0, beta=1e-9)
    n = 2 * MIB
    ps = [m.predict("ps", n, p) for p in (2, 4, 8, 16)]
    tree = [m.predict("tree", n, p) for p in (2, 4, 8, 16)]
    assert [t / ps[0] for t in ps] == pytest.approx([1, 3, 7, 15])
    assert [t / tree[0] for t in tree] == pytest.approx([1, 3, 5, 7])   # 2 + 4 (d - 1) hops


def test_fit_recovers_one_alpha_and_beta_for_all_algorithms(tmp_path):
    truth = LinkModel(alpha=80e-6, beta=8.4e-9)
    lab = {"hosts": 0, "ranks_per_host": 1, "link": 1e9, "intra": "shm"}
    rows = [{"algorithm": a, "procs": p, "bytes": n, "seconds": truth.predict(a, n, p),
             "netlab": dict(lab, hosts=p)}
            for a in LINK_ALGORITHMS for p in (2, 4, 8) for n in (4096, MIB, 32 * MIB)]
    # rows the fit must leave out: another topology, P = 1, an algorithm it does not model
    rows.append({"algorithm": "ring", "procs": 8, "bytes": MIB, "seconds": 9.0,
                 "netlab": dict(lab, ranks_per_host=4)})
    rows.append({"algorithm": "ring", "procs": 1, "bytes": MIB, "seconds": 9.0})
    rows.append({"algorithm": "hier", "procs": 8, "bytes": MIB, "seconds": 9.0})
    model = LinkModel.fit(rows)
    assert model.alpha == pytest.approx(80e-6, rel=1e-6)
    assert model.beta == pytest.approx(8.4e-9, rel=1e-6)
    assert "36 rows" in model.source
    two = LinkModel.fit(rows, procs=[2], algorithms=["ring", "ps"])
    assert two.beta == pytest.approx(8.4e-9, rel=1e-6)
    assert "ps, ring at P = 2" in two.source
    path = tmp_path / "links.json"
    model.save(path)
    again = LinkModel.load(path)
    assert again.predict("tree", 32 * MIB, 8) == pytest.approx(truth.predict("tree", 32 * MIB, 8))
    report = link_report(model, rows[:3])
    assert "| tree | 2 | 2 x 1 | 4 KiB |" in report and "| 1.00 |" in report
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CaffeError, match="cannot read"):
        LinkModel.load(tmp_path / "bad.json")


def test_fit_refuses_mixed_link_rates_and_nothing():
    row = {"algorithm": "ring", "procs": 2, "bytes": MIB, "seconds": 0.01,
           "netlab": {"ranks_per_host": 1, "link": 1e9}}
    other = dict(row, netlab={"ranks_per_host": 1, "link": 1e10})
    with pytest.raises(CaffeError, match="several link rates"):
        LinkModel.fit([row, other])
    with pytest.raises(CaffeError, match="no rows"):
        LinkModel.fit([row], procs=[4])


def test_fit_is_never_negative():
    rows = [{"algorithm": "ring", "procs": 2, "bytes": n, "seconds": 1e-3}
            for n in (4096, MIB, 32 * MIB)]
    m = LinkModel.fit(rows)
    assert m.alpha >= 0 and m.beta >= 0


def test_nodes_topology_counts_the_host_links_only_where_ranks_leave_the_host():
    m = LinkModel(alpha=0.0, beta=8e-9, beta_intra=0.0)
    n = 32 * MIB
    # flat ring on 2 hosts x 4 ranks: two of the 8 neighbours cross, n/8 per step each way
    assert m.predict("ring", n, 8, 4) == pytest.approx(14 * n / 8 * 8e-9)
    # hier: the leaders' ring of 2 per 4 MiB chunk, the intra-node link free
    assert m.predict("hier", n, 8, 4) == pytest.approx(8 * 2 * (2 * MIB) * 8e-9)
    assert m.predict("hier", n, 8, 4) < m.predict("ring", n, 8, 4) < m.predict("tree", n, 8, 4)
    assert m.predict("hier,lanes=1", n, 8, 4) == pytest.approx(m.predict("hier", n, 8, 4))
    # slow intra-node paths, the paper's single leader (lanes=1): the leader takes in (and sends
    # out) 3 chunks per chunk: first chunk in, 8 chunks at 3 chunks' time each (more than the
    # leaders' 2 MiB exchanges), last out
    slow = LinkModel(alpha=0.0, beta=8e-9, beta_intra=8e-9)
    assert slow.predict("hier,lanes=1", n, 8, 4) == pytest.approx(
        (3 + 8 * 3 + 3) * 4 * MIB * 8e-9)
    # four lanes: every rank sends and receives 3 slices of 1 MiB per chunk in the
    # reduce-scatter and again in the all-gather (6 MiB per chunk on its intra paths, more than
    # the 4 lanes' 4 x 2 x 0.5 MiB on the host link): 3 + 8 x 6 + 3 MiB
    assert slow.predict("hier", n, 8, 4) == pytest.approx((3 + 8 * 6 + 3) * MIB * 8e-9)
    assert slow.predict("hier", n, 8, 4) < slow.predict("hier,lanes=1", n, 8, 4)
    assert parse_algorithm("hier:tree,lanes=2") == ("hier", {"inter": "tree", "lanes": 2})
    with pytest.raises(CaffeError, match="options are key=integer"):
        parse_algorithm("hier,lanes=two")
    # the flat ring's intra steps cost each rank n/8 in and out: as much as its host links
    assert slow.predict("ring", n, 8, 4) == pytest.approx(m.predict("ring", n, 8, 4))
    # one rank per host: hier is its leaders' algorithm chunk by chunk
    assert m.predict("hier", n, 8, 1) == pytest.approx(8 * m.predict("ring", 4 * MIB, 8))
    assert m.predict("hier:tree", 4 * MIB, 8, 1) == pytest.approx(m.predict("tree", 4 * MIB, 8))
    a, b = link_terms("hier", n, 8)
    assert (a, b) == (8 * 14, pytest.approx(8 * 14 * 4 * MIB / 8))
    with pytest.raises(CaffeError, match="not linear"):         # leaders and members both busy
        linear_terms(link_schedule("hier", n, 8, 4), "inter", "hier")
    with pytest.raises(CaffeError, match="unknown algorithm"):
        m.predict("nccl", n, 8)


def test_fit_intra_on_one_host_rows():
    truth = LinkModel(alpha=1e-3, beta=8e-9, alpha_intra=30e-6, beta_intra=0.7e-9)
    rows = [{"algorithm": a, "procs": 4, "bytes": n, "seconds": truth.predict(a, n, 4, 4),
             "netlab": {"hosts": 1, "ranks_per_host": 4}}
            for a in ("ring", "hier", "tree") for n in (MIB, 4 * MIB, 32 * MIB)]
    model = LinkModel(alpha=1e-3, beta=8e-9).fit_intra(rows)
    assert model.alpha_intra == pytest.approx(30e-6, rel=1e-6)
    assert model.beta_intra == pytest.approx(0.7e-9, rel=1e-6)
    assert "intra-node: 9 one-host rows (hier, ring, tree at P = 4)" in model.source
    with pytest.raises(CaffeError, match="no one-host rows"):
        model.fit_intra([dict(r, netlab={"hosts": 2}) for r in rows])


def test_one_process_costs_nothing():
    m = LinkModel(alpha=1e-3, beta=1e-9)
    for a in LINK_ALGORITHMS + ("hier",):
        assert m.predict(a, MIB, 1) == 0.0
    assert json.loads(json.dumps(m.to_dict()))["alpha"] == 1e-3
