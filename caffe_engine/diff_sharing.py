"""Share the gradient memory of a training net's blobs whose gradients are not live together.

Caffe gives every blob a diff array of its own, so a net's activation gradients take as much
memory as its activations, though a blob's gradient only lives during part of the backward
pass: from the backward of the layer that consumes the blob (which writes it) to the backward of
the layer that produced it (which reads it). Blobs whose gradients live at disjoint times can
hold them in one array. This module works those intervals out from the net's graph and hands
each group of blobs a place in one arena, largest first, where no group live at the same time
lies (:func:`_place`). Where a layer's backward can write its bottom's gradient over its top's
(:meth:`Layer.diff_in_place`, e.g. a 3x3 pad-1 convolution) and nothing else reads the top's
after it, the two are one group (:func:`_merge_in_place`).

What a layer's forward keeps for its backward and no blob holds (pooling's argmax, Caffe's
``max_idx_``: :meth:`Layer.saved_bytes`) goes in the same buffers, live from the layer's
forward to its backward: during forward no gradient is live, so it costs no memory of its own.

Untouched: learnable params' diffs (the solver reads them), diffs of loss tops (they hold the
loss weights), and diffs nobody writes in backward. Blobs that already share a diff array (in
place layers, Reshape/Flatten views) move together. The result is bit for bit the same; only
the gradients of intermediate blobs are no longer all there after ``backward`` (as in
frameworks that free them), which is why only the solver's train net uses it.
"""
import numpy

from . import backend


def _diff_key(array):
    """Where a diff array's memory starts: its buffer and first address (the in-place and
    Reshape views of one diff share it; views of one arena differ by address)."""
    base = array
    while getattr(base, "base", None) is not None:
        base = base.base
    data = array.data
    start = data.ptr if hasattr(data, "ptr") else array.__array_interface__["data"][0]
    return id(base), start


def plan(net, saved=True):
    """Assign shared diff buffers to ``net``'s blobs (see the module docstring) and, with
    ``saved``, place the state the layers keep from forward to backward
    (:meth:`Layer.saved_bytes`) in them too: it lives from the layer's forward to its backward,
    while the gradients live in backward only, so pooling's argmax takes memory the top layers'
    gradients use later (VGG-16 at batch 32: 187 MB). Call it with ``saved`` only before a
    forward from the first layer (what a layer saved in an earlier forward stays where it is).

    Returns:
        int: the float32 elements of gradient (and saved state) memory saved (0 when nothing
        was shared).
    """
    layers = len(net.layers)
    group_of = _structure(net)
    params = {_diff_key(b.diff) for b in net.learnable_params}
    groups = {}          # structural group -> {"blobs": [...], "first": step, "last": step}
    kept = set()
    for blob_id, blob in enumerate(net._blob_list):
        key = group_of[id(blob)]
        if net._blob_loss_weights[blob_id] or _diff_key(blob.diff) in params:
            kept.add(key)
        groups.setdefault(key, {"blobs": [], "first": None, "last": None})
        if blob not in groups[key]["blobs"]:
            groups[key]["blobs"].append(blob)
    # Steps: forward runs layer i at step i; backward runs layer i at step 2 L - 1 - i, reading
    # its tops' diffs and writing its bottoms'.
    for i in range(layers):
        if not net.layer_need_backward[i]:
            continue
        step = 2 * layers - 1 - i
        touched = [b for b in net.top_vecs[i]]
        touched += [b for b, need in zip(net.bottom_vecs[i], net.bottom_need_backward[i])
                    if need]
        for blob in touched:
            group = groups[group_of[id(blob)]]
            group["first"] = step if group["first"] is None else min(group["first"], step)
            group["last"] = step if group["last"] is None else max(group["last"], step)
    _merge_in_place(net, groups, group_of, kept)
    shareable = [g for key, g in groups.items() if g["first"] is not None and key not in kept]
    for g in shareable:
        g["size"] = max(b.count for b in g["blobs"])
    if saved and _may_place_saved(net):
        shareable += _saved_state(net, layers)
    if len(shareable) < 2:
        return 0
    before = sum(g["size"] for g in shareable)
    xp = backend.get_array_module(net._blob_list[0].data)
    total, offsets = _place(shareable)
    arena = xp.zeros(max(total, 1), numpy.float32)
    for g, offset in offsets:
        if "layer" in g:
            g["layer"].keep_saved_in(arena[offset:offset + g["size"]])
        for blob in g.get("blobs", ()):
            blob.diff = arena[offset:offset + blob.count].reshape(blob.shape)
    return before - total


def _structure(net):
    """Blob (by ``id``) -> the group of blobs whose diffs are one memory by the net's own
    making (in-place layers, Reshape and Flatten views), worked out from the diff arrays the
    first time and kept on the net: once a plan has placed diffs in an arena, blobs that only
    the plan put in one place (never live together, or an in-place backward's pair) share
    addresses too, and a later plan must not take them for one blob."""
    if net._diff_structure is None:
        keys = {}
        net._diff_structure = {id(b): keys.setdefault(_diff_key(b.diff), len(keys))
                               for b in net._blob_list}
    return net._diff_structure


def _merge_in_place(net, groups, group_of, kept):
    """One buffer for a layer's bottom diff and top diff where the layer's backward computes in
    place (:meth:`Layer.diff_in_place`: one bottom and one top of one shape) and the top diff is
    read by nothing after it, the bottom diff written by nothing before it: the two live
    intervals then only touch at the layer's step. VGG-16 at batch 32: its 3x3 pad-1
    convolutions' gradients pair up, and the arena's peak, conv1_2's backward with 392 MiB of
    top diff beside 392 MiB of bottom diff, drops by the one. Runs of such layers chain into one
    group. ``groups`` (structural group -> blobs and the interval of their diff alone) is
    changed in place; ``group_of`` is :func:`_structure`'s; ``kept`` the groups that keep their
    own arrays."""
    layers = len(net.layers)
    into = {}            # a bottom's group -> the top's group it joins
    for i, layer in enumerate(net.layers):
        bottom, top = net.bottom_vecs[i], net.top_vecs[i]
        if not (net.layer_need_backward[i] and len(bottom) == 1 and len(top) == 1
                and net.bottom_need_backward[i][0] and bottom[0].shape == top[0].shape
                and layer.diff_in_place()):
            continue
        t, b = group_of[id(top[0])], group_of[id(bottom[0])]
        step = 2 * layers - 1 - i
        if (t != b and t not in kept and b not in kept and groups[t]["last"] == step
                and groups[b]["first"] == step):
            into[b] = t
    for b in into:
        t = into[b]
        while t in into:
            t = into[t]
        joined, group = groups[t], groups.pop(b)
        joined["blobs"] += [blob for blob in group["blobs"] if blob not in joined["blobs"]]
        joined["first"] = min(joined["first"], group["first"])
        joined["last"] = max(joined["last"], group["last"])


def _may_place_saved(net):
    """Whether no layer may write a blob's diff in forward (a Python layer is the user's
    code), which would clobber state placed in a shared buffer."""
    return all(layer.type != "Python" for layer in net.layers)


def _saved_state(net, layers):
    """The layers' forward-to-backward state as intervals: from the forward step to the
    backward step (the forward step alone when the layer is not run backward)."""
    items = []
    for i, layer in enumerate(net.layers):
        nbytes = layer.saved_bytes()
        if nbytes:
            last = 2 * layers - 1 - i if net.layer_need_backward[i] else i
            items.append({"layer": layer, "first": i, "last": last, "size": -(-nbytes // 4)})
    return items


#: Floats each placement is rounded up to (64 bytes: every array starts on a cache line).
ALIGN = 16


def _place(items):
    """Offsets in one arena for items live over ``[first, last]`` steps, ``size`` floats each,
    so that no two items live at the same step overlap: largest first, each at the lowest
    offset clear of the items already placed that share a step with it (the greedy-by-size
    placement of memory planners such as TensorFlow Lite's; the arena comes out close to the
    most memory live at any one step).

    Returns:
        (floats the arena needs, [(item, offset)])
    """
    placed = []          # (offset, end, item)
    for g in sorted(items, key=lambda g: (-g["size"], g["first"])):
        size = -(-g["size"] // ALIGN) * ALIGN
        offset = 0
        for lo, hi, other in sorted(placed, key=lambda p: p[0]):
            if other["last"] < g["first"] or g["last"] < other["first"]:
                continue     # never live together
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((offset, offset + size, g))
    total = max((hi for _, hi, _ in placed), default=0)
    return total, [(g, lo) for lo, _, g in placed]


def signature(net):
    """The blob shapes and the layers' saved-state sizes a plan was made for (a reshape that
    changes one reallocates its diff or state)."""
    return (tuple(b.shape for b in net._blob_list),
            tuple(layer.saved_bytes() for layer in net.layers))
