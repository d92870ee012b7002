"""Non-negative least squares of a model's two unknowns (alpha, beta), and the models' files.

Both models (:class:`.alpha_beta.AlphaBetaModel`, :class:`.link_model.LinkModel`) predict a time
as ``alpha * A + beta * B`` with A and B known per benchmark row; :func:`fit_terms` finds
alpha, beta >= 0 for measured times.
"""
import json

import numpy


def nnls2(a, b):
    """Least squares ``a @ x ~ b`` with x >= 0 for two unknowns (tries the faces).

    Args:
        a: (rows, 2) float array.
        b: (rows,) float array.

    Returns:
        (2,) float array x >= 0 with the smallest squared residual of the candidates: the
        unconstrained solution when it is non-negative, each unknown alone, and zero.
    """
    best = None
    candidates = []
    x, *_ = numpy.linalg.lstsq(a, b, rcond=None)
    if (x >= 0).all():
        candidates.append(x)
    for j in range(a.shape[1]):
        col = a[:, j]
        denom = float(col @ col)
        if denom > 0:
            xj = max(0.0, float(col @ b) / denom)
            x1 = numpy.zeros(a.shape[1])
            x1[j] = xj
            candidates.append(x1)
    candidates.append(numpy.zeros(a.shape[1]))
    for x in candidates:
        r = float(numpy.sum((a @ x - b) ** 2))
        if best is None or r < best[0]:
            best = (r, x)
    return best[1]


def fit_terms(terms, seconds, relative=True):
    """(alpha, beta) >= 0 with ``seconds ~ alpha * A + beta * B``.

    Args:
        terms: (rows, 2) float array of (A, B) per row.
        seconds: (rows,) float array, the measured times.
        relative: weight each row by 1 / seconds (fits relative error, so the 4 KiB rows count
            as much as the 64 MiB ones); False: plain least squares.
    """
    w = 1.0 / numpy.maximum(seconds, 1e-9) if relative else numpy.ones_like(seconds)
    return nnls2(terms * w[:, None], seconds * w)


def save_json(obj, path):
    """Write a model's parameters as indented, key-sorted JSON (the files the models load)."""
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
