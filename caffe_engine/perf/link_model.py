"""The model of a network: one alpha and one beta of the links, the same for every algorithm.

The algorithms differ only in their schedules (:mod:`.schedules`): a stage costs its messages'
alphas plus the bytes of its busiest link times beta; ranks on one host reach each other
through their own copies instead (``alpha_intra``, ``beta_intra``). :meth:`LinkModel.fit` fits
the two on the one-rank-per-host rows of ``tools/bench_allreduce.py --netlab``,
:meth:`LinkModel.fit_intra` the intra-node pair on one-host rows; :mod:`.link_report` prints
measured against predicted. docs/scaling.md, "On an emulated network", has the fits.
"""
import json

import numpy

from ..errors import CaffeError
from .fit import fit_terms, save_json
from .schedules import (COMPOSED_SCHEDULES, LINK_ALGORITHMS, TREE_CHUNK_BYTES, link_schedule,
                        link_terms, linear_terms, parse_algorithm)


def human_bytes(nbytes):
    """``33554432`` -> ``"32 MiB"``."""
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes / div:g} {unit}"
    return f"{int(nbytes)} B"


def _fit_rows(rows, procs, algorithms, min_bytes):
    """The rows :meth:`LinkModel.fit` uses (one rank per host, P > 1, a flat algorithm).

    Raises:
        CaffeError: no usable row, or rows of several link rates.
    """
    use = []
    for r in rows:
        lab = r.get("netlab") or {}
        if int(r["procs"]) <= 1 or int(lab.get("ranks_per_host", 1)) != 1:
            continue
        if procs is not None and int(r["procs"]) not in set(procs):
            continue
        if algorithms is not None and r["algorithm"] not in set(algorithms):
            continue
        if r["bytes"] < min_bytes or r["algorithm"] not in LINK_ALGORITHMS:
            continue
        use.append(r)
    if not use:
        raise CaffeError("link model: no rows to fit (one rank per host, P > 1, "
                         f"algorithms {', '.join(LINK_ALGORITHMS)}, at least {min_bytes} "
                         "bytes)")
    rates = {(r.get("netlab") or {}).get("link") for r in use}
    if len(rates) > 1:
        raise CaffeError(f"link model: rows of several link rates {sorted(map(str, rates))};"
                         " fit each on its own")
    return use


def _rows_summary(use):
    """``"tree, ring at P = 2, 4"``: the algorithms and P of fitted rows."""
    return (f"{', '.join(sorted({r['algorithm'] for r in use}))} at P = "
            f"{', '.join(str(p) for p in sorted({int(r['procs']) for r in use}))}")


class LinkModel:
    """One alpha and one beta for the links, the same for every algorithm; the algorithms
    differ only in their schedules (:func:`.schedules.link_schedule`).

    Args:
        alpha: seconds per message (latency and per-message software cost) between hosts.
        beta: seconds per byte on a host link, one direction (8 / bits per s of payload).
        alpha_intra, beta_intra: the same within a host (the nodes topology's loopback, or
            shared memory); default: alpha and 0 (free).
        ranks_per_host: ranks r // ranks_per_host share a host (when predict is not told).
        branching, chunk_bytes, lag: the tree communicator's options.
        source: free text saying what the parameters were fitted on.
    """

    def __init__(self, alpha, beta, alpha_intra=None, beta_intra=0.0, ranks_per_host=1,
                 branching=2, chunk_bytes=TREE_CHUNK_BYTES, lag=None, source=""):
        self.alpha, self.beta = float(alpha), float(beta)
        self.alpha_intra = self.alpha if alpha_intra is None else float(alpha_intra)
        self.beta_intra = float(beta_intra)
        self.ranks_per_host = int(ranks_per_host)
        self.branching, self.chunk_bytes, self.lag = int(branching), int(chunk_bytes), lag
        self.source = source

    def stage_time(self, stage):
        """``messages * alpha + max(inter * beta, intra * beta_intra)`` (alpha_intra for a stage
        that stays within the hosts)."""
        alpha = self.alpha if stage["inter"] > 0 or stage["intra"] <= 0 else self.alpha_intra
        return (stage["messages"] * alpha
                + max(stage["inter"] * self.beta, stage["intra"] * self.beta_intra))

    def schedule(self, algorithm, nbytes, procs, ranks_per_host=None):
        """:func:`.schedules.link_schedule` with this model's tree options (and hosts)."""
        rph = self.ranks_per_host if ranks_per_host is None else ranks_per_host
        return link_schedule(algorithm, nbytes, procs, rph, self.branching, self.chunk_bytes,
                             self.lag)

    def schedule_time(self, schedule):
        """Seconds of a :func:`.schedules.link_schedule` list."""
        total = 0.0
        for count, stage in schedule:
            if "max" in stage:
                total += count * max([self.schedule_time(s) for s in stage["max"]] or [0.0])
            else:
                total += count * self.stage_time(stage)
        return total

    def predict(self, algorithm, nbytes, procs, ranks_per_host=None):
        """Seconds for one allreduce of ``nbytes`` on ``procs`` ranks (ranks r //
        ranks_per_host share a host; default: the model's)."""
        return self.schedule_time(self.schedule(algorithm, nbytes, procs, ranks_per_host))

    def message_terms(self, algorithm, procs, nbytes=1 << 20):
        """(alpha_eff s, beta_eff s/byte) of one allreduce of ``algorithm`` on ``procs`` ranks,
        one per host: the schedule's alphas and bytes in series at ``nbytes`` (linear in n while
        a message is one tree chunk, 4 MiB); (0, 0) for one rank. What the DAG
        (:func:`.dag.iteration`) takes as a message's cost."""
        if procs <= 1:
            return 0.0, 0.0
        a, b = link_terms(algorithm, nbytes, procs, self.branching, self.chunk_bytes, self.lag)
        return self.alpha * a, self.beta * b / nbytes

    @classmethod
    def fit(cls, rows, procs=None, algorithms=None, min_bytes=0, stat="seconds", relative=True,
            **options):
        """Least squares (non-negative; relative error by default) of one alpha and one beta
        on benchmark rows of one-rank-per-host labs with one link rate.

        Args:
            rows: results.json "rows" (with ``"netlab"`` settings, or plain).
            procs, algorithms: use only the rows of these P / algorithms (default: all).
            min_bytes: use only the rows of at least this many bytes (on netlab's links a
                message below ~1 MiB partly rides the token bucket's burst, and with more
                ranks than cores a small one waits for the scheduler, not for the link).
            stat: "seconds" (median of the repetitions) or "min_seconds".
            **options: ``branching``, ``chunk_bytes``, ``lag`` of the tree (and the model).

        Raises:
            CaffeError: no usable row, or rows of several link rates.
        """
        use = _fit_rows(rows, procs, algorithms, min_bytes)
        keys = ("branching", "chunk_bytes", "lag")
        sched = {k: options[k] for k in keys if k in options}
        terms = numpy.array([link_terms(r["algorithm"], r["bytes"], r["procs"], **sched)
                             for r in use], float)
        t = numpy.array([r.get(stat, r["seconds"]) for r in use], float)
        alpha, beta = fit_terms(terms, t, relative)
        source = (f"{len(use)} rows: {_rows_summary(use)}, "
                  f"{human_bytes(min(r['bytes'] for r in use))}.."
                  f"{human_bytes(max(r['bytes'] for r in use))} ({stat})")
        return cls(alpha, beta, source=source, **options)

    def fit_intra(self, rows, algorithms=None, min_bytes=0, stat="seconds", relative=True):
        """Fit ``alpha_intra`` and ``beta_intra`` (in place; returns self) on the rows of runs
        with every rank on one host (``"netlab"``: hosts 1), e.g. tools/bench_allreduce.py
        --netlab --procs 4 --ranks-per-host 4: the intra-node paths alone, as the machine runs
        them (on 2 cores, 4 ranks share them).

        Raises:
            CaffeError: no such row.
        """
        known = LINK_ALGORITHMS + tuple(COMPOSED_SCHEDULES)
        use = [r for r in rows
               if int(r["procs"]) > 1 and int((r.get("netlab") or {}).get("hosts", 0)) == 1
               and r["bytes"] >= min_bytes
               and parse_algorithm(r["algorithm"])[0] in known
               and (algorithms is None or r["algorithm"] in set(algorithms))]
        if not use:
            raise CaffeError("link model: no one-host rows to fit the intra-node paths on")
        terms = [linear_terms(self.schedule(r["algorithm"], r["bytes"], r["procs"],
                                            r["procs"]), "intra", r["algorithm"])
                 for r in use]
        terms = numpy.array(terms, float)
        t = numpy.array([r.get(stat, r["seconds"]) for r in use], float)
        self.alpha_intra, self.beta_intra = (float(v) for v in fit_terms(terms, t, relative))
        self.source += ("; " if self.source else "") + (
            f"intra-node: {len(use)} one-host rows ({_rows_summary(use)})")
        return self

    def to_dict(self):
        """The constructor's arguments: what :meth:`save` writes."""
        return {"alpha": self.alpha, "beta": self.beta, "alpha_intra": self.alpha_intra,
                "beta_intra": self.beta_intra, "ranks_per_host": self.ranks_per_host,
                "branching": self.branching, "chunk_bytes": self.chunk_bytes, "lag": self.lag,
                "source": self.source}

    def save(self, path):
        """Write :meth:`to_dict` as JSON to ``path``."""
        save_json(self.to_dict(), path)

    @classmethod
    def load(cls, path):
        """Read a model written by :meth:`save` (CaffeError when unreadable)."""
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError) as exc:
            raise CaffeError(f"link model '{path}': cannot read it ({exc})") from None
