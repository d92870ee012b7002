"""One bucket's sum under ``--comm_compress`` (caffe_engine/comm/compress.py) on the link model.

docs/compression.md, "The prediction", compares it with the measured runs;
``tools/scaling_check.py --link_model`` adds the selection's CPU time.
"""
from ..comm.compress import ENTRY_BYTES, METHODS, k_for
from ..comm.tree import tree_children, tree_depth, tree_level
from ..errors import CaffeError
from .schedules import link_schedule, stage


def compressed_schedule(method, nbytes, procs, density=0.001, branching=2, algorithm="tree",
                        **options):
    """The :func:`.schedules.link_schedule` of one bucket's sum of ``nbytes`` (float32
    gradients) under ``--comm_compress method``, one rank per host.

    - ``none``: the dense allreduce ``algorithm``'s own schedule (default tree).
    - ``fp16``: the binary heap tree, whole bucket per message (no chunk pipelining): up, level
      by level from the deepest, each parent receiving its children's n/2 bytes at once through
      its link in; then down, each parent sending to its children at once through its link out.
      2 depth stages.
    - ``gtopk``: the same tree with a sparse set of 8 k bytes per message (k = ceil(density *
      n/4), ``compress.k_for``): 2 depth stages of alpha + (children) 8 k beta. (Shi et al.'s
      form 2 log2(P) (alpha + 8 k beta) counts one message per step.)
    - ``topk``: one all-to-all stage: every rank sends its 8 k bytes to the P - 1 others and
      receives theirs; (P - 1) 8 k bytes through every link each way, P - 1 alphas.

    The selection's CPU time is not in it (see tools/scaling_check.py --link_model).

    Raises:
        CaffeError: an unknown method.
    """
    if method not in METHODS:
        raise CaffeError(f"compressed schedule: method must be one of {', '.join(METHODS)}, "
                         f"got '{method}'")
    p = int(procs)
    if p <= 1:
        return []
    if method == "none":
        return link_schedule(algorithm, nbytes, p, 1, branching, **options)
    count = int(nbytes) // 4
    if method == "topk":
        m = ENTRY_BYTES * k_for(count, density)
        return [(1, stage([(s, d, m) for s in range(p) for d in range(p) if s != d], 1,
                          messages=p - 1))]
    m = float(nbytes) / 2 if method == "fp16" else ENTRY_BYTES * k_for(count, density)
    edges = [(child, r) for r in range(p) for child in tree_children(r, p, branching)]
    d = tree_depth(p, branching)
    up = [stage([(ch, par, m) for ch, par in edges if tree_level(ch, branching) == lvl], 1)
          for lvl in range(d, 0, -1)]
    down = [stage([(par, ch, m) for ch, par in edges if tree_level(ch, branching) == lvl], 1)
            for lvl in range(1, d + 1)]
    return [(1, s) for s in up + down]


def compressed_allreduce_time(method, nbytes, procs, model, density=0.001, algorithm="tree"):
    """Seconds for one bucket's sum of ``nbytes`` on ``procs`` ranks, one per host, under
    ``--comm_compress method`` with the links of ``model`` (a
    :class:`.link_model.LinkModel`): :func:`compressed_schedule` timed by
    :meth:`~.link_model.LinkModel.schedule_time`. ``none`` is
    ``model.predict(algorithm, nbytes, procs, 1)``. Communication only: no selection CPU time,
    no overlap with backward."""
    if method == "none":
        return model.predict(algorithm, nbytes, procs, 1) if int(procs) > 1 else 0.0
    return model.schedule_time(compressed_schedule(method, nbytes, procs, density,
                                                   model.branching))
