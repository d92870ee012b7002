"""Shi et al.'s DAG view of one synchronous-SGD iteration: WFBP, MG-WFBP, no overlap, buckets.

Shi, Wang, Chu and Li, "A DAG model of synchronous stochastic gradient descent in distributed
deep learning" (arXiv:1805.03812), and Shi, Chu and Li, "MG-WFBP: efficient data communication
for distributed synchronous SGD algorithms" (arXiv:1811.11141; its problem formulation, read
here from the abstract and introduction only, section numbers not checked): an iteration is a
DAG of tasks. Forward runs first (one task); then the per-layer backward tasks run in sequence,
last layer first; the communication task of a layer (or of a merged group of layers) starts when
the backward task of its lowest layer has ended *and* the previous communication task has ended
(one message on the wire at a time); the update waits for the last one. So

    iteration time = forward + max(end of backward, end of the last communication)

and the schedules differ only in how the layers are grouped into messages:

* ``none``     no overlap: one message of every gradient after the whole backward (FireCaffe,
               Caffe's P2PSync);
* ``wfbp``     wait-free backpropagation: one message per layer with params (Poseidon's WFBP,
               the baseline MG-WFBP compares against);
* ``mgwfbp``   merged-gradient WFBP: the grouping whose last message ends first, solved exactly
               (:func:`caffe_engine.comm.bucket_plan.optimal_groups`; the paper's
               theorem-based merge rule is ``mgwfbp_rule``,
               :func:`caffe_engine.comm.bucket_plan.merge_rule_groups`);
* ``bucketsX`` fixed-size buckets of X MiB (what ``--bucket_mb X`` does,
               :func:`caffe_engine.comm.bucket_plan.size_groups`).

The timing of a grouping is :func:`caffe_engine.comm.bucket_plan.simulate` (the planner
``--bucket_mb auto`` runs); this package supplies its inputs: the per-layer backward seconds and
gradient sizes (:mod:`.profiles`) and the per-message cost ``alpha_eff + beta_eff * bytes``
(:func:`.message_cost.allreduce_terms`, or :meth:`.link_model.LinkModel.message_terms` on the
emulated network).
"""
from ..comm.bucket_plan import merge_rule_groups, optimal_groups, simulate, size_groups

MODES = ("none", "wfbp", "mgwfbp", "mgwfbp_rule", "buckets25")

#: Column titles of the modes in docs/scaling.md's tables.
MODE_NAMES = {"none": "no overlap", "buckets25": "25 MiB buckets", "wfbp": "WFBP",
              "mgwfbp": "MG-WFBP (messages)", "mgwfbp_rule": "MG-WFBP merge rule"}


def groups_for(mode, backward_s, nbytes, alpha, beta):
    """The messages of ``mode`` (see the module docstring): lists of positions in backward
    order, via :mod:`caffe_engine.comm.bucket_plan`.

    Raises:
        ValueError: an unknown mode.
    """
    n = len(backward_s)
    if mode == "none":
        return [list(range(n))] if n else []
    if mode == "wfbp":
        return [[k] for k in range(n)]
    if mode == "mgwfbp":
        return optimal_groups(backward_s, nbytes, alpha, beta)
    if mode == "mgwfbp_rule":
        return merge_rule_groups(backward_s, nbytes, alpha, beta)
    if mode.startswith("buckets"):
        return size_groups(nbytes, int(float(mode[len("buckets"):]) * (1 << 20)))
    raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")


def iteration(forward_s, backward_s, nbytes, alpha, beta, mode="mgwfbp"):
    """One iteration on the DAG (MG-WFBP's model): forward, then backward layer by layer with
    each message starting when its lowest layer's backward and the previous message have ended.

    Args:
        forward_s: seconds of the whole forward pass.
        backward_s: seconds of backward of each layer with params, in backward order (last
            layer first).
        nbytes: gradient bytes of each of those layers.
        alpha, beta: per-message seconds and per-byte seconds of one allreduce (alpha_eff and
            beta_eff of :func:`.message_cost.allreduce_terms`).
        mode: "none", "wfbp", "mgwfbp", "mgwfbp_rule" or "bucketsX" (X MiB).

    Returns:
        dict: forward, backward, comm_end (from the start of backward), messages, exposed
        (communication not hidden behind backward), total (seconds).
    """
    groups = groups_for(mode, backward_s, nbytes, alpha, beta)
    bwd, comm_end = simulate(groups, backward_s, nbytes, alpha, beta)
    end = max(bwd, comm_end)
    return {"forward": float(forward_s), "backward": bwd, "comm_end": comm_end,
            "messages": len(groups), "exposed": end - bwd, "total": float(forward_s) + end}


def speedup(profile, per_image_s, batch, procs, terms, mode, bytes_per_element=4):
    """Weak-scaling speedup ``P * T(1) / T(P)`` (T(1): compute alone) and the iteration.

    Args:
        profile: a :class:`.profiles.Profile`.
        per_image_s: training compute (forward + backward) per image, seconds.
        batch: images per GPU per iteration.
        procs: P.
        terms: (alpha_eff, beta_eff) of one allreduce at P.
        mode: as :func:`iteration`.
        bytes_per_element: gradient precision (4: fp32, 2: fp16).

    Returns:
        (speedup, the :func:`iteration` dict).
    """
    f, b = profile.seconds(per_image_s, batch)
    it = iteration(f, b, profile.nbytes(bytes_per_element), terms[0], terms[1], mode)
    return procs * (f + sum(b)) / it["total"], it
