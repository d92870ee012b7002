"""Iteration time and weak-scaling speedup: compute plus the gradient allreduce.

Forward + backward compute per worker (measured, e.g. by ``caffe time``: a mapping layer name
-> (forward s, backward s) in layer order) plus the gradient allreduce: after backward (no
overlap: one allreduce of every gradient), or overlapped with backward bucket by bucket
(:mod:`caffe_engine.comm.buckets`: a bucket is sent when backward has finished its lowest layer;
one bucket on the wire at a time). Speedup on P workers at a fixed per-worker batch (weak
scaling, the way FireCaffe and Caffe's multi-GPU count it, per epoch): ``S(P) = P * T(1) / T(P)``
with T(1) = compute alone. ``tools/scaling_check.py`` predicts its runs with it.
"""
from ..comm.buckets import plan_buckets


def _layers(layer_times):
    items = list(layer_times.items()) if hasattr(layer_times, "items") else list(layer_times)
    return [(name, float(t[0]), float(t[1])) for name, t in items]


def _overlapped_end(layers, counts, comm_time, bucket_mb):
    """(end of the last bucket's allreduce from the start of backward, allreduce seconds in all)
    when each bucket is sent as soon as backward has finished its lowest layer."""
    # Backward runs the layers last to first; layer i's gradients are final when it is done.
    done_at, t = {}, 0.0
    for i in range(len(layers) - 1, -1, -1):
        t += layers[i][2]
        done_at[i] = t
    with_params = [i for i in range(len(layers)) if counts[i] > 0]
    groups = plan_buckets([counts[i] for i in with_params], with_params,
                          int(float(bucket_mb) * (1 << 20)))
    wire_free, comm_sum = 0.0, 0.0
    for group in groups:
        layer_ids = [with_params[k] for k in group]
        ready = done_at[min(layer_ids)]
        nbytes = 4 * sum(counts[i] for i in layer_ids)
        c = comm_time(nbytes)
        comm_sum += c
        wire_free = max(wire_free, ready) + c
    return wire_free, comm_sum


def iteration_time(layer_times, param_bytes, comm_time, overlap=False, bucket_mb=25.0):
    """Seconds of one training iteration on one worker of P.

    Args:
        layer_times: {layer name: (forward s, backward s)} in layer order (or a list of pairs).
        param_bytes: {layer name: bytes of that layer's param gradients} (missing: 0).
        comm_time: function bytes -> seconds of one allreduce at this P (0 for P = 1).
        overlap: reduce buckets during backward (True) or everything after it (False).
        bucket_mb: bucket cap for the overlapped schedule (as
            :class:`caffe_engine.comm.buckets.GradientSync`).

    Returns:
        dict: forward, backward, comm (the allreduce time in total), exposed (the part of it not
        hidden behind backward), total.
    """
    layers = _layers(layer_times)
    fwd = sum(f for _, f, _ in layers)
    bwd = sum(b for _, _, b in layers)
    total_bytes = sum(float(param_bytes.get(n, 0)) for n, _, _ in layers)
    if not overlap:
        comm = comm_time(total_bytes) if total_bytes else 0.0
        return {"forward": fwd, "backward": bwd, "comm": comm, "exposed": comm,
                "total": fwd + bwd + comm}
    counts = [float(param_bytes.get(n, 0)) / 4 for n, _, _ in layers]
    wire_free, comm_sum = _overlapped_end(layers, counts, comm_time, bucket_mb)
    end = max(bwd, wire_free)
    return {"forward": fwd, "backward": bwd, "comm": comm_sum, "exposed": end - bwd,
            "total": fwd + end}


def predict_speedup(layer_times, param_bytes, comm_time_at, procs, overlap=False, bucket_mb=25.0):
    """Weak-scaling speedup ``P * T(1) / T(P)`` for each P in ``procs``.

    Args:
        comm_time_at: function (bytes, P) -> seconds, e.g.
            ``lambda n, p: model.predict("tree", n, p)``.

    Returns:
        {P: speedup}
    """
    layers = _layers(layer_times)
    t1 = sum(f + b for _, f, b in layers)
    out = {}
    for p in procs:
        it = iteration_time(layer_times, param_bytes, lambda n, p=p: comm_time_at(n, p),
                            overlap=overlap, bucket_mb=bucket_mb)
        out[p] = p * t1 / it["total"] if it["total"] > 0 else float(p)
    return out


def uniform_layers(total_compute_s, gradient_bytes, num_layers=20, backward_share=2 / 3):
    """A synthetic net for what-if studies: ``num_layers`` layers of equal compute and equal
    gradient size, backward taking ``backward_share`` of the compute (about 2/3 in CNNs).

    Returns:
        (layer_times, param_bytes) for :func:`iteration_time`.
    """
    f = total_compute_s * (1 - backward_share) / num_layers
    b = total_compute_s * backward_share / num_layers
    names = [f"layer{i}" for i in range(num_layers)]
    return ({n: (f, b) for n in names}, {n: gradient_bytes / num_layers for n in names})
