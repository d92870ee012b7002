"""One allreduce as ``alpha_eff + beta_eff * n``: the per-message cost the DAG (:mod:`.dag`) takes.

Hockney's model with each algorithm's A(P), B(P)
(:func:`caffe_engine.comm.allreduce_cost.shape_terms`: tree, ring, ps, mpi, any P), or the
hierarchical allreduce below. On the emulated network, the link model's
schedules give the same pair (:meth:`.link_model.LinkModel.message_terms`).
"""
from ..comm.allreduce_cost import shape_terms

#: Seconds per message: our tree's fitted alpha on shared memory (docs/bench_allreduce_model.json,
#: docs/scaling.md "Cost model"), i.e. our software's cost per message on a fast link.
DEFAULT_ALPHA = 20.7e-6


def _intra_terms(intra, k, alpha_intra, beta_intra):
    """(alpha_eff, beta_eff) of hier's two intra-node phases on K ranks (see
    :func:`allreduce_terms`)."""
    if k == 1:
        return 0.0, 0.0
    if intra == "chain":
        return 2 * (k - 1) * alpha_intra, 2 * beta_intra
    if intra == "lanes":
        return 2 * alpha_intra, 2 * (k - 1) / k * beta_intra
    if intra == "leader":
        return 2 * (k - 1) * alpha_intra, 2 * (k - 1) * beta_intra
    raise ValueError(f"intra must be 'chain', 'lanes' or 'leader', not {intra!r}")


def allreduce_terms(algorithm, procs, alpha, beta, gpus_per_node=1, alpha_intra=None,
                    beta_intra=0.0, intra="chain", branching=2):
    """(alpha_eff s, beta_eff s/byte): one allreduce of n bytes on ``procs`` ranks costs
    ``alpha_eff + beta_eff * n``.

    ``tree``, ``ring``, ``ps``, ``mpi``: ``alpha * A(P)``, ``beta * B(P)`` of
    :func:`~caffe_engine.comm.allreduce_cost.shape_terms` (the tree is FireCaffe's section-4
    formula, 2 ceil(log_k P) unpipelined hops; the ring 2 (P - 1) steps of n/P).

    ``hier`` (Jia et al. 2018, "hierarchical all-reduce"; docs/scaling.md, "Hierarchical
    allreduce"): N = ceil(P / K) nodes of K = ``gpus_per_node`` ranks; reduce within each node to
    its leader, ring allreduce among the N leaders (2 (N - 1) steps of n/N over the network,
    ``alpha``/``beta``), broadcast within the node (``alpha_intra``/``beta_intra``, default
    ``alpha`` and free). The two intra-node phases cost, each:

    * ``intra="chain"``: a pipelined chain (NCCL's reduce and broadcast), (K - 1) alpha_intra +
      n beta_intra;
    * ``intra="lanes"``: our hier.py's default for one chunk, a reduce-scatter (and an
      all-gather) in which every rank sends and receives K - 1 slices of n/K at once,
      alpha_intra + (K - 1)/K n beta_intra;
    * ``intra="leader"``: the leader receives the K - 1 buffers one after another (hier.py with
      ``lanes=1``, the paper's single leader, for one chunk), (K - 1)(alpha_intra + n
      beta_intra).

    Returns (0, 0) for one rank.

    Raises:
        CaffeError: an algorithm without a formula
            (:func:`~caffe_engine.comm.allreduce_cost.shape_terms`).
        ValueError: an unknown ``intra``.
    """
    p = int(procs)
    if p <= 1:
        return 0.0, 0.0
    if algorithm != "hier":
        a, b = shape_terms(algorithm, p, branching)
        return alpha * a, beta * b
    k = max(1, min(int(gpus_per_node), p))
    n = -(-p // k)
    a_l = alpha if alpha_intra is None else alpha_intra
    intra_a, intra_b = _intra_terms(intra, k, a_l, beta_intra)
    ring_a, ring_b = (2 * (n - 1) * alpha, 2 * (n - 1) / n * beta) if n > 1 else (0.0, 0.0)
    return intra_a + ring_a, intra_b + ring_b
