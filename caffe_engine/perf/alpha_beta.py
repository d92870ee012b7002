"""Hockney's alpha-beta model of one allreduce, per registered algorithm.

Sending n bytes costs ``alpha + n * beta`` (latency alpha in seconds, inverse bandwidth beta in
seconds per byte). Each algorithm's allreduce of n bytes on P processes then costs
``alpha * A(P) + beta * n * B(P)``:

=========  ==================  ==================  =========================================
algorithm  A(P) (messages)     B(P) (volume)        why
=========  ==================  ==================  =========================================
tree       2 d                 2 d                  FireCaffe eq.: up and down d = ceil(log_k P)
                                                    levels, one buffer per level (unpipelined)
ring       2 (P - 1)           2 (P - 1) / P        reduce-scatter + all-gather
ps         2 (P - 1)           2 (P - 1)            the server's link carries every buffer twice
mpi        2 ceil(log2 P)      2 (P - 1) / P        MPICH's Rabenseifner for long messages
=========  ==================  ==================  =========================================

The formulas are keyed by the names of :mod:`caffe_engine.comm.registry`; a registered algorithm
without one is listed in :data:`NOT_MODELLED` with the reason (tests/perf/test_perf_registry.py
checks that every registered name is in one or the other).

:meth:`AlphaBetaModel.fit` finds alpha and beta per algorithm by least squares (non-negative) on
the rows of ``tools/bench_allreduce.py``'s results.json (``tools/cost_model.py --fit``). At run
time ``--bucket_mb auto`` reads a saved model (``CAFFE_COST_MODEL``,
:func:`caffe_engine.comm.bucket_plan.model_alpha_beta`): this module is the one of the package
that the runtime imports.
"""
import json

import numpy

from ..comm import registry
from ..comm.tree import ceil_log
from ..errors import CaffeError
from .fit import fit_terms, save_json


def _tree(p, branching):
    d = ceil_log(p, branching)
    return 2.0 * d, 2.0 * d


def _ring(p, branching):
    return 2.0 * (p - 1), 2.0 * (p - 1) / p


def _ps(p, branching):
    return 2.0 * (p - 1), 2.0 * (p - 1)


def _mpi(p, branching):
    return 2.0 * ceil_log(p, 2), 2.0 * (p - 1) / p


#: (A(P), B(P)) of each modelled algorithm, keyed by its registry name: function (P, k) for
#: P >= 2 ranks and the tree's branching k.
SHAPE_TERMS = {"tree": _tree, "ring": _ring, "ps": _ps, "mpi": _mpi}

#: Registered algorithms with no A(P), B(P) here, and why.
NOT_MODELLED = {
    "hier": "its cost depends on the node layout: message_cost.allreduce_terms (gpus_per_node) "
            "and schedules.link_schedule (ranks_per_host) model it",
    "nccl": "NCCL chooses its own ring or tree and protocol per call; not modelled",
}

#: The modelled algorithms, in the registry's order (tree, ring, ps, mpi).
ALGORITHMS = tuple(name for name in registry.ALGORITHMS if name in SHAPE_TERMS)


def shape_terms(algorithm, procs, branching=2):
    """(A(P), B(P)) of the table in the module docstring (0, 0 for one process).

    Raises:
        CaffeError: an algorithm without a formula (one line naming the known ones).
    """
    p = int(procs)
    if p <= 1:
        return 0.0, 0.0
    if algorithm not in ALGORITHMS:
        raise CaffeError(f"cost model: unknown algorithm '{algorithm}'; known: "
                         f"{', '.join(ALGORITHMS)}")
    return SHAPE_TERMS[algorithm](p, branching)


class AlphaBetaModel:
    """Per-algorithm alpha (s) and beta (s/byte).

    Args:
        params: {algorithm: {"alpha": seconds, "beta": seconds per byte}}.
        branching: the tree's k.
    """

    def __init__(self, params=None, branching=2):
        self.params = {k: dict(v) for k, v in (params or {}).items()}
        self.branching = branching

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

    def predict(self, algorithm, nbytes, procs):
        """Seconds for one allreduce of ``nbytes`` on ``procs`` processes.

        Raises:
            CaffeError: no parameters for ``algorithm`` in this model.
        """
        if algorithm not in self.params:
            raise CaffeError(f"cost model: no parameters for '{algorithm}' "
                             f"(fitted: {', '.join(sorted(self.params)) or 'none'})")
        A, B = shape_terms(algorithm, procs, self.branching)
        p = self.params[algorithm]
        return p["alpha"] * A + p["beta"] * float(nbytes) * B

    def to_dict(self):
        """{"branching": k, "algorithms": params}: what :meth:`save` writes."""
        return {"branching": self.branching, "algorithms": self.params}

    def save(self, path):
        """Write :meth:`to_dict` as JSON to ``path``."""
        save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save`.

        Raises:
            CaffeError: unreadable or malformed file.
        """
        try:
            with open(path) as f:
                d = json.load(f)
            return cls(d["algorithms"], d.get("branching", 2))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CaffeError(f"cost model '{path}': cannot read it ({exc})") from None


def fit_alpha_beta(results_json, branching=2, stat="seconds"):
    """:meth:`AlphaBetaModel.fit` on a ``tools/bench_allreduce.py`` results.json path."""
    with open(results_json) as f:
        d = json.load(f)
    return AlphaBetaModel.fit(d["rows"] if isinstance(d, dict) else d, branching, stat=stat)
