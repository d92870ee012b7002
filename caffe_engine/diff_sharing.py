"""Share the gradient memory of a training net's blobs whose gradients are not live together.

Caffe gives every blob a diff array of its own, so a net's activation gradients take as much
memory as its activations, though a blob's gradient only lives during part of the backward
pass: from the backward of the layer that consumes the blob (which writes it) to the backward of
the layer that produced it (which reads it). Blobs whose gradients live at disjoint times can
hold them in one array. This module works those intervals out from the net's graph and hands
each group of blobs one buffer, best fit, largest first (an interval-graph colouring).

Untouched: learnable params' diffs (the solver reads them), diffs of loss tops (they hold the
loss weights), and diffs nobody writes in backward. Blobs that already share a diff array (in
place layers, Reshape/Flatten views) move together. The result is bit for bit the same; only
the gradients of intermediate blobs are no longer all there after ``backward`` (as in
frameworks that free them), which is why only the solver's train net uses it.
"""
import numpy

from . import backend


def _diff_key(array):
    """The memory a diff array lives in (views of one buffer share it)."""
    base = array
    while getattr(base, "base", None) is not None:
        base = base.base
    return id(base)


def plan(net):
    """Assign shared diff buffers to ``net``'s blobs (see the module docstring).

    Returns:
        int: the float32 elements of gradient memory saved (0 when nothing was shared).
    """
    layers = len(net.layers)
    params = {_diff_key(b.diff) for b in net.learnable_params}
    groups = {}          # diff memory -> {"blobs": [...], "first": step, "last": step}
    persistent = set()
    for blob_id, blob in enumerate(net._blob_list):
        key = _diff_key(blob.diff)
        if net._blob_loss_weights[blob_id]:
            persistent.add(key)
        groups.setdefault(key, {"blobs": [], "first": None, "last": None})
        if blob not in groups[key]["blobs"]:
            groups[key]["blobs"].append(blob)
    # backward step s runs layer layers - 1 - s: it reads its tops' diffs, writes its bottoms'
    for i in range(layers):
        if not net.layer_need_backward[i]:
            continue
        step = layers - 1 - i
        touched = [b for b in net.top_vecs[i]]
        touched += [b for b, need in zip(net.bottom_vecs[i], net.bottom_need_backward[i])
                    if need]
        for blob in touched:
            group = groups[_diff_key(blob.diff)]
            group["first"] = step if group["first"] is None else min(group["first"], step)
            group["last"] = step if group["last"] is None else max(group["last"], step)
    shareable = [g for key, g in groups.items()
                 if g["first"] is not None and key not in params and key not in persistent]
    if len(shareable) < 2:
        return 0
    before = 0
    for g in shareable:
        g["size"] = max(b.count for b in g["blobs"])
        before += g["size"]
    xp = backend.get_array_module(shareable[0]["blobs"][0].diff)
    # Greedy interval colouring: by first step; a group takes the smallest free buffer that
    # fits (else the largest free one, grown), buffers freed after their group's last step.
    buffers = []         # [size, free_from_step]
    assignment = []
    for g in sorted(shareable, key=lambda g: (g["first"], -g["size"])):
        free = [k for k, (size, until) in enumerate(buffers) if until < g["first"]]
        fitting = [k for k in free if buffers[k][0] >= g["size"]]
        if fitting:
            k = min(fitting, key=lambda k: buffers[k][0])
        elif free:
            k = max(free, key=lambda k: buffers[k][0])
            buffers[k][0] = g["size"]
        else:
            k = len(buffers)
            buffers.append([g["size"], -1])
        buffers[k][1] = g["last"]
        assignment.append((g, k))
    arrays = [xp.zeros(max(size, 1), numpy.float32) for size, _ in buffers]
    for g, k in assignment:
        for blob in g["blobs"]:
            blob.diff = arrays[k][:blob.count].reshape(blob.shape)
    return before - sum(size for size, _ in buffers)


def signature(net):
    """The blob shapes a plan was made for (a reshape that changes one reallocates its diff)."""
    return tuple(b.shape for b in net._blob_list)
