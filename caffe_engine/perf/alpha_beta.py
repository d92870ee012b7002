"""Hockney's alpha-beta model of one allreduce, fitted per registered algorithm.

The formulas ``alpha * A(P) + beta * n * B(P)`` of each algorithm, and reading and predicting
from a fitted model, are the runtime's (``--bucket_mb auto``):
:mod:`caffe_engine.comm.allreduce_cost` (the table of A(P), B(P) is there; its names are
re-exported here for the models and their tests). This module adds the offline half:
:meth:`AlphaBetaModel.fit` finds alpha and beta per algorithm by least squares (non-negative) on
the rows of ``tools/bench_allreduce.py``'s results.json (``tools/cost_model.py --fit``), and
:meth:`AlphaBetaModel.save` writes the file the runtime reads.
"""
import json

import numpy

from ..comm import allreduce_cost
from ..comm.allreduce_cost import shape_terms
from .fit import fit_terms, save_json

#: The runtime's table (:mod:`caffe_engine.comm.allreduce_cost`), named here beside the fit.
ALGORITHMS, NOT_MODELLED, SHAPE_TERMS = (allreduce_cost.ALGORITHMS, allreduce_cost.NOT_MODELLED,
                                         allreduce_cost.SHAPE_TERMS)


class AlphaBetaModel(allreduce_cost.AlphaBetaModel):
    """Per-algorithm alpha (s) and beta (s/byte): :class:`caffe_engine.comm.allreduce_cost.
    AlphaBetaModel` (``predict``, ``to_dict``, ``load``), fitted and written here.

    Args:
        params: {algorithm: {"alpha": seconds, "beta": seconds per byte}}.
        branching: the tree's k.
    """

    @classmethod
    def fit(cls, rows, branching=2, relative=True, stat="seconds"):
        """Fit alpha, beta per algorithm on benchmark rows.

        Args:
            rows: iterable of {"algorithm", "procs", "bytes", "seconds"} (results.json "rows").
            relative: weight each row by 1 / seconds (fits relative error, so the 4 KiB rows
                count as much as the 64 MiB ones).
            stat: the row's time to fit: "seconds" (median) or "min_seconds" (fastest
                repetition, steadier on a shared machine).

        Returns:
            AlphaBetaModel. Rows with procs <= 1 are ignored.

        Raises:
            CaffeError: a row of an algorithm without a formula.
        """
        by_alg = {}
        for r in rows:
            if int(r["procs"]) > 1:
                by_alg.setdefault(r["algorithm"], []).append(r)
        params = {}
        for alg, rs in by_alg.items():
            terms = [shape_terms(alg, r["procs"], branching) for r in rs]
            a = numpy.array([[A, B * r["bytes"]] for (A, B), r in zip(terms, rs)], float)
            t = numpy.array([r.get(stat, r["seconds"]) for r in rs], float)
            alpha, beta = fit_terms(a, t, relative)
            params[alg] = {"alpha": float(alpha), "beta": float(beta)}
        return cls(params, branching)

    def save(self, path):
        """Write :meth:`to_dict` as JSON to ``path`` (what :meth:`load` reads)."""
        save_json(self.to_dict(), path)


def fit_alpha_beta(results_json, branching=2, stat="seconds"):
    """:meth:`AlphaBetaModel.fit` on a ``tools/bench_allreduce.py`` results.json path."""
    with open(results_json) as f:
        d = json.load(f)
    return AlphaBetaModel.fit(d["rows"] if isinstance(d, dict) else d, branching, stat=stat)
