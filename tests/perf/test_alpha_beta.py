"""Hockney's alpha-beta model (caffe_engine/perf/alpha_beta.py): the per-algorithm fit on benchmark
rows, its file, and FireCaffe's section-4 formulas (caffe_engine/perf/firecaffe.py).

Oracles: rows made from known alpha and beta by the table's A(P), B(P) (the fit must give them
back); log2 P and P written out by hand.
"""
import json

import pytest

from caffe_engine.errors import CaffeError
from caffe_engine.perf.alpha_beta import ALGORITHMS, AlphaBetaModel, fit_alpha_beta, shape_terms
from caffe_engine.perf.firecaffe import firecaffe_comm_time


# -- fit, predict --------------------------------------------------------------------------------
def synthetic_rows(alpha, beta):
    rows = []
    for alg in ALGORITHMS:
        for p in (2, 4, 8):
            for n in (4096, 1 << 20, 32 << 20):
                a_, b_ = shape_terms(alg, p)
                rows.append({"algorithm": alg, "procs": p, "bytes": n,
                             "seconds": alpha[alg] * a_ + beta[alg] * n * b_})
    return rows


def test_fit_recovers_alpha_beta_and_round_trips(tmp_path):
    alpha = {"tree": 2e-5, "ring": 1e-5, "ps": 3e-5, "mpi": 5e-6}
    beta = {"tree": 1e-9, "ring": 2e-9, "ps": 1.5e-9, "mpi": 3e-10}
    model = AlphaBetaModel.fit(synthetic_rows(alpha, beta))
    for alg in alpha:
        assert model.params[alg]["alpha"] == pytest.approx(alpha[alg], rel=1e-6)
        assert model.params[alg]["beta"] == pytest.approx(beta[alg], rel=1e-6)
    path = tmp_path / "model.json"
    model.save(path)
    again = AlphaBetaModel.load(path)
    assert again.predict("tree", 1 << 20, 16) == pytest.approx(model.predict("tree", 1 << 20, 16))
    assert model.predict("ps", 123, 1) == 0.0
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rows": synthetic_rows(alpha, beta)}))
    assert fit_alpha_beta(results).params["ring"]["beta"] == pytest.approx(2e-9)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CaffeError, match="cannot read"):
        AlphaBetaModel.load(tmp_path / "bad.json")


def test_fit_never_gives_negative_parameters():
    rows = [{"algorithm": "tree", "procs": p, "bytes": n, "seconds": 1e-3 + 1e-12 * n}
            for p in (2, 4) for n in (1, 1 << 20)]
    rows.append({"algorithm": "tree", "procs": 8, "bytes": 1, "seconds": 1e-4})
    m = AlphaBetaModel.fit(rows)
    assert m.params["tree"]["alpha"] >= 0 and m.params["tree"]["beta"] >= 0


def test_tree_grows_with_log_p_and_ps_with_p():
    m = AlphaBetaModel({"tree": {"alpha": 0, "beta": 1e-9},
                                   "ps": {"alpha": 0, "beta": 1e-9}})
    n = 30 << 20
    assert m.predict("tree", n, 128) / m.predict("tree", n, 2) == pytest.approx(7)
    assert m.predict("ps", n, 128) / m.predict("ps", n, 2) == pytest.approx(127)
    assert firecaffe_comm_time("tree", 1e6, 128, 1e9) == pytest.approx(2e-3 * 7)
    assert firecaffe_comm_time("ps", 1e6, 128, 1e9) == pytest.approx(0.128)
