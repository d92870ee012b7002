"""Hockney's alpha-beta cost of one allreduce, per registered algorithm, and the fitted model file
that ``--bucket_mb auto`` reads (``CAFFE_COST_MODEL``, :func:`.bucket_plan.model_alpha_beta`).

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

The formulas are keyed by the names of :mod:`.registry`; a registered algorithm without one is
listed in :data:`NOT_MODELLED` with the reason (tests/perf/test_perf_registry.py checks that every
registered name is in one or the other).

This is the half of the model the runtime runs: the formulas, reading a fitted model and
predicting from it. Fitting it on ``tools/bench_allreduce.py``'s rows and writing the file is
offline work, :mod:`caffe_engine.perf.alpha_beta` (``tools/cost_model.py --fit``), which builds
on this module; the communicator package imports nothing of :mod:`caffe_engine.perf`.
"""
import json

from ..errors import CaffeError
from . import registry
from .tree import ceil_log


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
    """Per-algorithm alpha (s) and beta (s/byte), as read from a fitted model file.

    :class:`caffe_engine.perf.alpha_beta.AlphaBetaModel` adds the fit and the writer.

    Args:
        params: {algorithm: {"alpha": seconds, "beta": seconds per byte}}.
        branching: the tree's k.
    """

    def __init__(self, params=None, branching=2):
        self.params = {k: dict(v) for k, v in (params or {}).items()}
        self.branching = branching

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
        """{"branching": k, "algorithms": params}: the model file's content."""
        return {"branching": self.branching, "algorithms": self.params}

    @classmethod
    def load(cls, path):
        """Read a model file (:meth:`caffe_engine.perf.alpha_beta.AlphaBetaModel.save`).

        Raises:
            CaffeError: unreadable or malformed file.
        """
        try:
            with open(path) as f:
                d = json.load(f)
            return cls(d["algorithms"], d.get("branching", 2))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CaffeError(f"cost model '{path}': cannot read it ({exc})") from None
