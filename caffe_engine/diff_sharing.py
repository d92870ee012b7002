"""Share the gradient memory of a training net's blobs whose gradients are not live together.

Caffe gives every blob a diff array of its own, so a net's activation gradients take as much
memory as its activations, though a blob's gradient only lives during part of the backward
pass: from the backward of the layer that consumes the blob (which writes it) to the backward of
the layer that produced it (which reads it). Blobs whose gradients live at disjoint times can
hold them in one array. This module works those intervals out from the net's graph and hands
each group of blobs a place in one arena, largest first, where no group live at the same time
lies (:func:`_place`).

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
    Reshape views of one diff share it). The address matters once a plan has put the diffs in
    one arena: they all have its buffer then, and a later plan must still tell them apart."""
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
            group = groups[_diff_key(blob.diff)]
            group["first"] = step if group["first"] is None else min(group["first"], step)
            group["last"] = step if group["last"] is None else max(group["last"], step)
    shareable = [g for key, g in groups.items()
                 if g["first"] is not None and key not in params and key not in persistent]
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
