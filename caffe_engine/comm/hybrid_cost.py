"""PCL-DNN's balance equations for one InnerProduct layer: data parallel against hybrid, and G.

Das et al., "Distributed deep learning using synchronous stochastic gradient descent"
(arXiv:1602.06709), section 3 ("Optimizing communication"): 3.1 data parallelism, 3.2 model
parallelism, 3.3 hybrid parallelism. A layer is split the way whose communication costs least
against its computation; data and model parallelism are the two ends of the hybrid (group size
G = 1 and G = P). They time the data flow of :mod:`caffe_engine.layers.model_parallel` (the
layer) and :mod:`.hybrid_train` (the run); docs/scaling.md, "Hybrid parallelism for fully
connected layers (PCL-DNN)", has them with the knobs and the measurements.

Notation (one layer, one iteration, float32 = 4 bytes): P ranks, G ranks per group (G divides
P), M rows of the bottom on one rank (its batch), K = inputs, N = outputs (``num_output``),
n_G = ceil(N / G) the widest output slice, |W| = 4 (K + 1) N bytes of weights and bias,
``flops`` the FLOP/s one rank's GEMMs run at. The link is Hockney's: a message of b bytes
costs ``alpha + b * beta`` (:class:`Link`); an allreduce of b bytes on p ranks with the run's
algorithm costs ``alpha A(p) + beta b B(p)`` (:func:`.allreduce_cost.shape_terms`: tree,
ring, ps, mpi; ``hier`` and ``nccl``, which it does not model, are timed as the ring: one rank
per host, ``hier`` is the ring among leaders).

Compute (forward Y = X W^T, backward dW = dY^T X and dX = dY W: three GEMMs of 2 M K N FLOPs)::

    C(G) = 6 * (G M) * K * n_G / flops          (= 6 M K N / flops when G divides N)

Data parallelism (G = 1; section 3.1): every rank sends its weight gradient through the
allreduce, which may overlap the backward compute still to come below the layer (``overlap_s``;
the engine sends a bucket once backward has passed its lowest layer)::

    T_data = C(1) + max(0, alpha A(P) + beta |W| B(P) - overlap_s)

Hybrid with group size G (section 3.3; 3.2's model parallelism is G = P): each of the P / G
groups is model parallel over its G ranks and data parallel with the other groups. On the
critical path, each collective over the G ranks of the group, ring / pairwise (G - 1 steps; a
rank sends and receives the same bytes, the link is full duplex)::

    allgather of X (forward)            (G - 1) (alpha + beta 4 M K)
    all-to-all of Y (forward)           (G - 1) (alpha + beta 4 M n_G)
    all-to-all of dY (backward)         (G - 1) (alpha + beta 4 M n_G)
    reduce-scatter of dX (backward)     (G - 1) (alpha + beta 4 M K)
    E(G) = (G - 1) (4 alpha + 8 beta M (K + n_G))

and off it, the replicas' allreduce of the slice (4 (K + 1) n_G bytes over P / G ranks; none at
G = P), which overlaps like the data-parallel one::

    T_hybrid(G) = C(G) + E(G) + max(0, alpha A(P/G) + beta 4 (K + 1) n_G B(P/G) - overlap_s)

Why hybrid wins for fully connected layers: the ring's data-parallel bytes, about 2 |W| = 8 K N,
do not shrink with the batch, while E(G) is about 8 (G - 1) M (K + N / G) bytes and the
replicas' allreduce 8 K N / G: for CaffeNet's fc6 (K = 9216, N = 4096) at M = 8 and P = G = 8
that is 4.6 MB against 302 MB. PCL-DNN's condition for a fully connected layer (section 3.2,
kernel and feature map 1 x 1), model parallelism pays when ``ofm * (2 - overlap) > minibatch``,
is the same comparison with alpha = 0: weights against activations.
:func:`best_group` evaluates T over the divisors of P and keeps the fastest (ties: the smaller G,
so a free link keeps data parallelism).
"""
import math
from collections import namedtuple

from ..errors import CaffeError
from .allreduce_cost import ALGORITHMS, shape_terms

#: Bytes of one float32 value.
FLOAT_BYTES = 4


class Link(namedtuple("Link", "alpha beta")):
    """Hockney's link: a message of b bytes costs ``alpha + b * beta`` seconds.

    Attributes:
        alpha: seconds per message (wire latency plus the software's cost per message).
        beta: seconds per byte, one direction (8 / payload bits per second).

    A plain ``(alpha, beta)`` tuple works wherever a Link is taken. ``--bucket_mb auto`` measures
    the same two numbers (:func:`.bucket_plan.measure_alpha_beta`, per allreduce: convert with
    :meth:`from_allreduce`) or reads them from the fitted cost model file (:meth:`from_model`).
    """
    __slots__ = ()

    @classmethod
    def from_rate(cls, bits_per_s, latency_s=0.0, overhead_s=0.0):
        """A link of ``bits_per_s`` payload, ``latency_s`` one-way delay plus ``overhead_s``
        software cost per message (an infinite rate gives beta = 0)."""
        beta = 0.0 if math.isinf(float(bits_per_s)) else 8.0 / float(bits_per_s)
        return cls(float(latency_s) + float(overhead_s), beta)

    @classmethod
    def from_allreduce(cls, alpha_eff, beta_eff, algorithm, procs, branching=2):
        """The link behind one measured allreduce ``alpha_eff + beta_eff * b`` of ``algorithm``
        on ``procs`` ranks (what :func:`.bucket_plan.measure_alpha_beta` returns): divided by
        A(P) and B(P). One rank: a free link."""
        a, b = allreduce_terms(algorithm, procs, branching)
        return cls(alpha_eff / a if a else 0.0, beta_eff / b if b else 0.0)

    @classmethod
    def from_model(cls, model, algorithm):
        """The link of ``algorithm`` in a fitted :class:`.allreduce_cost.AlphaBetaModel`
        (the ring's parameters for an algorithm it has none for).

        Raises:
            CaffeError: the model has neither.
        """
        name = algorithm if algorithm in model.params else "ring"
        if name not in model.params:
            raise CaffeError(f"cost model: no parameters for '{algorithm}' nor 'ring'")
        p = model.params[name]
        return cls(float(p["alpha"]), float(p["beta"]))


def allreduce_terms(algorithm, procs, branching=2):
    """(A(p), B(p)) of ``algorithm`` (:func:`.allreduce_cost.shape_terms`); hier, nccl and
    names without a formula as the ring; an option after a colon is ignored."""
    name = algorithm.split(":")[0] if algorithm else "ring"
    return shape_terms(name if name in ALGORITHMS else "ring", procs, branching)


def allreduce_seconds(nbytes, procs, link, algorithm="ring", branching=2):
    """``alpha A(p) + beta nbytes B(p)``: one allreduce on ``procs`` ranks (0 for one)."""
    alpha, beta = link
    a, b = allreduce_terms(algorithm, procs, branching)
    return alpha * a + beta * float(nbytes) * b


def divisors(world_size):
    """The group sizes G that divide P, ascending (``[1]`` for P <= 1)."""
    p = max(1, int(world_size))
    return [g for g in range(1, p + 1) if p % g == 0]


def slice_width(n, group):
    """n_G = ceil(N / G): the widest output slice (np.array_split's first slices)."""
    return -(-int(n) // int(group))


def compute_seconds(k, n, m, group, flops):
    """C(G) = 6 (G M) K n_G / flops: forward and both backward GEMMs of the widest slice."""
    return 6.0 * int(group) * m * k * slice_width(n, group) / float(flops)


def exchange_seconds(k, n, m, group, link):
    """E(G) = (G - 1) (4 alpha + 8 beta M (K + n_G)): the group's four collectives (module
    docstring), all on the critical path; 0 for G = 1."""
    alpha, beta = link
    g = int(group)
    return (g - 1) * (4.0 * alpha + 2.0 * FLOAT_BYTES * beta * m * (k + slice_width(n, g)))


def weight_bytes(k, n, group=1):
    """Bytes of the weight and bias slice one rank holds: 4 (K + 1) n_G."""
    return FLOAT_BYTES * (int(k) + 1) * slice_width(n, group)


def layer_time(k, n, m, world_size, group, link, algorithm, flops, overlap_s=0.0,
               branching=2):
    """T(G) of one InnerProduct layer on one rank, per iteration (module docstring).

    Args:
        k, n, m: inputs K, outputs N, rows M of the bottom on one rank.
        world_size: P. group: G, a divisor of P (1: data parallelism).
        link: a :class:`Link` (or ``(alpha, beta)``). algorithm: the run's ``--comm``.
        flops: FLOP/s of one rank's GEMMs. overlap_s: backward seconds below the layer that its
            weight-gradient allreduce can hide behind (0: none).

    Returns:
        dict of seconds: compute, exchange (critical path), allreduce (the weight gradients'),
        exposed (its part not hidden), total; and sent_bytes, the bytes one rank sends per
        iteration for this layer (exchange plus allreduce, the ring's B(p) for the allreduce's).

    Raises:
        ValueError: G does not divide P, or a non-positive size or rate.
    """
    p, g = int(world_size), int(group)
    if min(k, n, m, p, g) < 1 or p % g or float(flops) <= 0:
        raise ValueError(f"hybrid cost: want K, N, M, P, G >= 1 with G dividing P and flops > 0"
                         f" (K {k}, N {n}, M {m}, P {p}, G {g}, flops {flops})")
    replicas = p // g
    compute = compute_seconds(k, n, m, g, flops)
    exchange = exchange_seconds(k, n, m, g, link)
    wbytes = weight_bytes(k, n, g)
    allreduce = allreduce_seconds(wbytes, replicas, link, algorithm, branching)
    exposed = max(0.0, allreduce - float(overlap_s))
    sent = (2.0 * (g - 1) * FLOAT_BYTES * m * (k + slice_width(n, g))
            + wbytes * allreduce_terms(algorithm, replicas, branching)[1])
    return {"group": g, "compute": compute, "exchange": exchange, "allreduce": allreduce,
            "exposed": exposed, "total": compute + exchange + exposed, "sent_bytes": sent}


def best_group(k, n, m, world_size, link, algorithm, flops, overlap_s=0.0, branching=2):
    """The group size G among the divisors of P with the smallest :func:`layer_time` total
    (ties: the smaller G); 1 (data parallelism) for one process.

    Args: as :func:`layer_time` (``algorithm`` may carry an option: ``"hier:tree"``).

    Returns:
        int G, a divisor of ``world_size``.
    """
    if int(world_size) <= 1:
        return 1
    times = [(layer_time(k, n, m, world_size, g, link, algorithm, flops, overlap_s,
                         branching)["total"], g) for g in divisors(world_size)]
    best = min(t for t, _ in times)
    return min(g for t, g in times if t <= best * (1 + 1e-12))
