"""A NetParameter normalised and wired into a net's layers, blobs and backward flags.

Caffe: src/caffe/net.cpp (Net::Init, FilterNet, StateMeetsRule, AppendBottom, AppendTop,
AppendParam), src/caffe/util/insert_splits.cpp. The build is Caffe's:

1. :func:`filter_net` keeps the layers whose include/exclude rules match the NetState
   (phase, level, stages);
2. :func:`insert_splits` gives every blob consumed by several layers a ``Split`` layer, so
   that the consumers' gradients are summed (Caffe's implicit split);
3. :func:`build` creates the layers in order, allocates their tops (in-place when a top repeats
   the bottom of the same index), sets them up (fillers draw from the global stream in this
   order), registers their params (shared by ``ParamSpec.name``), and works out which layers
   and blobs need backward exactly as Caffe does (loss reachability, ``propagate_down``,
   ``lr_mult: 0``, ``force_backward``).

The first two are pure functions over NetParameter; :func:`build` fills the attributes of a
:class:`caffe_engine.net.Net` (listed in its docstring).
"""
import collections

from .blob import Blob
from .errors import CaffeError
from .layers import batch_norm_chain, create_layer
from .log import g, logger
from .proto import caffe_pb2

#: What a layer's setup raises on parameters or shapes it cannot work with, when no check of
#: its own caught them first (a zero-size division, an axis out of range, a size overflow).
SETUP_FAILURES = (ZeroDivisionError, IndexError, OverflowError, ValueError, MemoryError)


def wrapped_failures(layer):
    """The exception types that ``layer``'s setup, forward or backward turn into the one-line
    CaffeError of :func:`layer_failure`: :data:`SETUP_FAILURES` for the engine's layers, none
    for a layer whose class sets ``own_errors_propagate`` (a Python layer: the user's own
    exception reaches the caller unchanged, as pycaffe's python_layer.hpp lets it)."""
    return () if getattr(type(layer), "own_errors_propagate", False) else SETUP_FAILURES


# --------------------------------------------------------------------------------------------
# NetParameter normalisation: pure functions
# --------------------------------------------------------------------------------------------
def state_meets_rule(state, rule, layer_name=""):
    """Whether NetState ``state`` satisfies NetStateRule ``rule`` (Caffe's StateMeetsRule).

    Logs Caffe's reason when it does not.
    """
    if rule.HasField("phase") and rule.phase != state.phase:
        logger.info("The NetState phase (%d) differed from the phase (%d) specified by a rule "
                    "in layer %s", state.phase, rule.phase, layer_name)
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        logger.info("The NetState level (%d) is below the min_level (%d) specified by a rule "
                    "in layer %s", state.level, rule.min_level, layer_name)
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        logger.info("The NetState level (%d) is above the max_level (%d) specified by a rule "
                    "in layer %s", state.level, rule.max_level, layer_name)
        return False
    stages = set(state.stage)
    for s in rule.stage:
        if s not in stages:
            logger.info("The NetState did not contain stage '%s' specified by a rule in layer %s",
                        s, layer_name)
            return False
    for s in rule.not_stage:
        if s in stages:
            logger.info("The NetState contained a not_stage '%s' specified by a rule in layer %s",
                        s, layer_name)
            return False
    return True


def filter_net(param, state):
    """Return a copy of ``param`` holding only the layers that ``state`` includes.

    A layer with ``include`` rules is kept when any of them is met; otherwise it is kept unless
    an ``exclude`` rule is met. Caffe: Net::FilterNet.

    Raises:
        CaffeError: a layer specifies both include and exclude.
    """
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if len(layer.include) and len(layer.exclude):
            raise CaffeError(f"layer '{layer.name}' specifies both include and exclude rules")
        if len(layer.include):
            keep = any(state_meets_rule(state, r, layer.name) for r in layer.include)
        else:
            keep = not any(state_meets_rule(state, r, layer.name) for r in layer.exclude)
        if keep:
            out.layer.add().CopyFrom(layer)
    return out


def split_layer_name(layer_name, blob_name, blob_index):
    """The name of the Split layer after top ``blob_index`` (``blob_name``) of ``layer_name``
    (Caffe's SplitLayerName)."""
    return f"{blob_name}_{layer_name}_{blob_index}_split"


def split_blob_name(layer_name, blob_name, blob_index, split_index):
    """The name of that Split layer's top ``split_index`` (Caffe's SplitBlobName)."""
    return f"{blob_name}_{layer_name}_{blob_index}_split_{split_index}"


def _count_consumers(param):
    """Who reads what: ``(source_of_bottom, consumers, loss_weight_of_top)``, keyed by
    (layer index, bottom index) and (layer index, top index).

    Raises:
        CaffeError: a bottom names a blob no earlier layer produced.
    """
    last_top = {}                      # blob name -> (layer index, top index)
    source_of_bottom = {}              # (layer, bottom index) -> (layer, top index)
    consumers = collections.Counter()  # (layer, top index) -> number of uses
    loss_weight_of_top = {}
    for i, layer in enumerate(param.layer):
        for j, name in enumerate(layer.bottom):
            if name not in last_top:
                raise CaffeError(f"Unknown bottom blob '{name}' (layer '{layer.name}', bottom index {j})")
            source_of_bottom[(i, j)] = last_top[name]
            consumers[last_top[name]] += 1
        for j, name in enumerate(layer.top):
            last_top[name] = (i, j)
        for j in range(min(len(layer.loss_weight), len(layer.top))):
            top_index = last_top[layer.top[j]]
            loss_weight_of_top[top_index] = layer.loss_weight[j]
            if layer.loss_weight[j]:
                consumers[top_index] += 1
    return source_of_bottom, consumers, loss_weight_of_top


def insert_splits(param):
    """Return a copy of ``param`` with a ``Split`` layer after every top used more than once.

    A top counts once per consuming bottom and once more if it carries a non-zero loss weight.
    Names follow Caffe so that nets and weight files line up. Caffe: InsertSplits.

    Raises:
        CaffeError: a bottom names a blob no earlier layer produced.
    """
    source_of_bottom, consumers, loss_weight_of_top = _count_consumers(param)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    next_split = collections.Counter()
    for i, layer in enumerate(param.layer):
        new = out.layer.add()
        new.CopyFrom(layer)
        for j in range(len(new.bottom)):
            src = source_of_bottom[(i, j)]
            if consumers[src] > 1:
                new.bottom[j] = split_blob_name(param.layer[src[0]].name, new.bottom[j], src[1],
                                                next_split[src])
                next_split[src] += 1
        for j, name in enumerate(new.top):
            count = consumers[(i, j)]
            if count <= 1:
                continue
            weight = loss_weight_of_top.get((i, j), 0.0)
            split = out.layer.add()
            split.name = split_layer_name(layer.name, name, j)
            split.type = "Split"
            split.bottom.append(name)
            for k in range(count):
                split.top.append(split_blob_name(layer.name, name, j, k))
                if weight:
                    split.loss_weight.append(weight if k == 0 else 0.0)
            if weight:
                new.ClearField("loss_weight")
                next_split[(i, j)] += 1
    return out


# --------------------------------------------------------------------------------------------
# Wiring: Net::Init
# --------------------------------------------------------------------------------------------
def build(net, in_param):
    """Build ``in_param`` (its ``state`` already final) into ``net``: Caffe's Net::Init.

    Sets on ``net``: ``name``, ``net_param`` (filtered, splits inserted), ``force_backward``,
    ``layers``, ``layer_names``, ``bottom_vecs`` / ``top_vecs`` (lists of Blobs per layer),
    ``bottom_ids`` / ``top_ids`` (blob indices), ``bottom_need_backward``,
    ``layer_need_backward``, ``blob_names``, ``blob_need_backward``, ``blobs`` (OrderedDict),
    ``params``, ``learnable_params``, ``params_lr``, ``params_weight_decay``, ``inputs``,
    ``outputs``, ``memory_used`` (floats), and the private indices the net runs with.
    ``net.phase`` must be set.

    Raises:
        CaffeError: unknown layer type or bottom, a top produced twice, bad parameters (the
            message names the layer), a shared param whose shape or lr_mult does not match.
    """
    filtered = filter_net(in_param, in_param.state)
    logger.info("Initializing net from parameters: \n%s", filtered)
    param = insert_splits(filtered)
    _start(net, param)
    available = collections.OrderedDict()  # tops no later layer has consumed yet
    for layer_id, lp_in in enumerate(param.layer):
        _append_layer(net, layer_id, lp_in, available)
    logger.info("Memory required for data: %d", net.memory_used * 4)
    share_saved_inputs(net)
    prune_backward(net)
    if net.force_backward:
        _force_backward(net)
    net.outputs = list(available)
    for name in net.outputs:
        logger.info("This network produces output %s", name)
    net.inputs = [t for layer, tops in zip(net.layers, net.top_ids) if layer.type == "Input"
                  for t in (net.blob_names[b] for b in tops)]
    net.blobs = collections.OrderedDict((n, net._blob_list[i]) for i, n in enumerate(net.blob_names))
    net._chains_by_first, net._chains_by_last = batch_norm_chain.find(net)
    net._layer_index = {n: i for i, n in enumerate(net.layer_names)}
    logger.info("Network initialization done.")


def _start(net, param):
    """The empty containers :func:`build` fills."""
    net.name = param.name
    net.net_param = param
    net.force_backward = param.force_backward
    net.layers, net.layer_names = [], []
    net.bottom_vecs, net.top_vecs = [], []
    net.bottom_ids, net.top_ids = [], []
    net.bottom_need_backward, net.layer_need_backward = [], []
    net.blob_names, net._blob_list, net.blob_need_backward = [], [], []
    net._blob_loss_weights = []  # per blob id; pycaffe's dict is the property
    net._blob_index = {}
    net.params = collections.OrderedDict()
    net.learnable_params, net.params_lr, net.params_weight_decay = [], [], []
    net._param_owner = {}  # ParamSpec name -> (layer index, param index)
    net.memory_used = 0


def _append_layer(net, layer_id, lp_in, available):
    """Create layer ``layer_id``, wire its bottoms and tops, set it up, register its params."""
    lp = caffe_pb2.LayerParameter()
    lp.CopyFrom(lp_in)
    if not lp.HasField("phase"):
        lp.phase = net.phase
    if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
        raise CaffeError(f"layer '{lp.name}': propagate_down param must be specified "
                         "either 0 or bottom_size times")
    layer = create_layer(lp, net.phase)
    net.layers.append(layer)
    net.layer_names.append(lp.name)
    logger.info("Creating Layer %s", lp.name)
    bottoms, bottom_ids, bottom_need = _append_bottoms(net, lp, available)
    tops, top_ids = _append_tops(net, layer, lp, available)
    net.bottom_vecs.append(bottoms)
    net.top_vecs.append(tops)
    net.bottom_ids.append(bottom_ids)
    net.top_ids.append(top_ids)
    net.bottom_need_backward.append(bottom_need)
    logger.info("Setting up %s", lp.name)
    setup_layer(layer, lp, bottoms, tops)
    _log_tops(net, layer, tops, top_ids)
    need_backward = any(bottom_need)
    need_backward |= _append_params(net, layer_id, layer, lp, lp_in)
    if layer.blobs:
        net.params[lp.name] = layer.blobs
    net.layer_need_backward.append(need_backward)
    if need_backward:
        for blob_id in top_ids:
            net.blob_need_backward[blob_id] = True


def _append_bottoms(net, lp, available):
    """Caffe's AppendBottom for each bottom: ``(bottoms, bottom_ids, bottom_need_backward)``.

    Raises:
        CaffeError: a bottom that no earlier layer left available.
    """
    bottoms, bottom_ids, bottom_need = [], [], []
    for j, name in enumerate(lp.bottom):
        if name not in available:
            raise CaffeError(f"Unknown bottom blob '{name}' (layer '{lp.name}', bottom index {j})")
        blob_id = net._blob_index[name]
        del available[name]
        logger.info("%s <- %s", lp.name, name)
        need = net.blob_need_backward[blob_id]
        if len(lp.propagate_down):
            need = bool(lp.propagate_down[j])
        bottoms.append(net._blob_list[blob_id])
        bottom_ids.append(blob_id)
        bottom_need.append(need)
    return bottoms, bottom_ids, bottom_need


def _append_tops(net, layer, lp, available):
    """Caffe's AppendTop for each top, then its AutoTopBlobs: ``(tops, top_ids)``.

    Raises:
        CaffeError: a top another layer already produced (not in place).
    """
    tops, top_ids = [], []
    for j, name in enumerate(lp.top):
        if j < len(lp.bottom) and name == lp.bottom[j]:
            logger.info("%s -> %s (in-place)", lp.name, name)
            blob_id = net._blob_index[name]
        elif name in net._blob_index:
            raise CaffeError(f"Top blob '{name}' produced by multiple sources "
                             f"(layer '{lp.name}')")
        else:
            logger.info("%s -> %s", lp.name, name)
            blob_id = _new_blob(net, name)
            net._blob_index[name] = blob_id
        tops.append(net._blob_list[blob_id])
        top_ids.append(blob_id)
        available[name] = True
    if layer.auto_top_blobs:
        # Caffe's AutoTopBlobs: a loss layer declared without its top still gets one,
        # an anonymous "(automatic)" blob that no other layer can consume.
        needed = max(layer.min_top or 0, layer.exact_num_top or 0)
        for _ in range(len(tops), needed):
            logger.info("%s -> (automatic)", lp.name)
            blob_id = _new_blob(net, "(automatic)")
            tops.append(net._blob_list[blob_id])
            top_ids.append(blob_id)
    return tops, top_ids


def _new_blob(net, name):
    """Append an empty blob named ``name``; return its index."""
    blob_id = len(net._blob_list)
    net._blob_list.append(Blob(()))
    net.blob_names.append(name)
    net.blob_need_backward.append(False)
    net._blob_loss_weights.append(0.0)
    return blob_id


def _log_tops(net, layer, tops, top_ids):
    """Record each top's loss weight and size, with Caffe's "Top shape" lines."""
    for j, blob_id in enumerate(top_ids):
        net._blob_loss_weights[blob_id] = layer.loss(j)
        logger.info("Top shape: %s (%d)", " ".join(str(d) for d in tops[j].shape),
                    tops[j].count)
        if layer.loss(j):
            logger.info("    with loss weight %s", g(layer.loss(j)))
        net.memory_used += tops[j].count


def _append_params(net, layer_id, layer, lp, lp_in):
    """Register the layer's params (lr_mult / decay_mult, sharing by name); return whether one
    of them needs backward.

    Raises:
        CaffeError: more ParamSpecs than param blobs, or a shared param that does not match.
    """
    if len(lp_in.param) > len(layer.blobs):
        raise CaffeError(f"layer '{lp.name}': too many params specified "
                         f"({len(lp_in.param)} for {len(layer.blobs)} param blobs)")
    # As in Caffe, whether a param needs backward is read from the net's own copy of
    # the layer parameters, while lr/decay bookkeeping reads the layer's copy after
    # setup (BatchNorm adds lr_mult: 0 specs for its statistics in setup).
    need_backward = False
    layer.param_propagate_down = []
    for k in range(len(layer.blobs)):
        net_spec = lp_in.param[k] if k < len(lp_in.param) else caffe_pb2.ParamSpec()
        need = net_spec.lr_mult != 0
        need_backward |= need
        layer.param_propagate_down.append(need)
        spec = lp.param[k] if k < len(lp.param) else caffe_pb2.ParamSpec()
        _append_param(net, layer_id, k, spec)
    return need_backward


def _append_param(net, layer_id, k, spec):
    """Caffe's AppendParam: param ``k`` of layer ``layer_id`` is learnable on its own, or (a
    ``spec.name`` seen before) a view of its owner's arrays.

    Raises:
        CaffeError: the owner's shape differs (STRICT) or its count does (PERMISSIVE), or an
            explicit lr_mult differs from the owner's.
    """
    layer = net.layers[layer_id]
    blob = layer.blobs[k]
    name = spec.name
    if not name or name not in net._param_owner:
        if name:
            net._param_owner[name] = (layer_id, k)
        net.learnable_params.append(blob)
        net.params_lr.append(spec.lr_mult)
        net.params_weight_decay.append(spec.decay_mult)
        return
    owner_layer, owner_k = net._param_owner[name]
    owner = net.layers[owner_layer].blobs[owner_k]
    strict = spec.share_mode != caffe_pb2.ParamSpec.PERMISSIVE
    if (strict and owner.shape != blob.shape) or owner.count != blob.count:
        raise CaffeError(f"Cannot share param '{name}' owned by layer '{net.layer_names[owner_layer]}' "
                         f"with layer '{net.layer_names[layer_id]}'; shape mismatch. "
                         f"Owner shape is {owner.shape}; sharing layer shape is {blob.shape}")
    # The sharer views the owner's arrays (reshaped in PERMISSIVE mode).
    blob.data = owner.data.reshape(blob.shape)
    blob.diff = owner.diff.reshape(blob.shape)
    owner_index = net.learnable_params.index(owner)
    if spec.HasField("lr_mult"):
        if net.params_lr[owner_index] != spec.lr_mult and _explicit_lr(net, owner_layer, owner_k):
            raise CaffeError(f"Shared param '{name}' has mismatched lr_mult.")
        net.params_lr[owner_index] = spec.lr_mult
    if spec.HasField("decay_mult"):
        net.params_weight_decay[owner_index] = spec.decay_mult


def _explicit_lr(net, layer_id, k):
    lp = net.layers[layer_id].param
    return k < len(lp.param) and lp.param[k].HasField("lr_mult")


def share_saved_inputs(net):
    """An in-place Scale right after the BatchNorm whose top it reads (ResNet's BatchNorm +
    Scale pairs) keeps no copy of its input: it reads the BatchNorm's ``x_norm``, which holds
    the same values (Caffe keeps both; ResNet-50 at batch 32: 1.3 GB). Nothing pycaffe can
    see changes, nor any result."""
    for i in range(1, len(net.layers)):
        layer, before = net.layers[i], net.layers[i - 1]
        if (layer.type == "Scale" and before.type == "BatchNorm"
                and net.bottom_ids[i] == net.top_ids[i] == net.top_ids[i - 1][:1]):
            layer.share_input(lambda bn=before: bn.x_norm)


def prune_backward(net):
    """Drop backward for layers that do not lead to a loss or whose tops need no gradient
    (the second half of Caffe's Net::Init, walking the layers from the last)."""
    under_loss, skip = set(), set()
    for i in range(len(net.layers) - 1, -1, -1):
        layer = net.layers[i]
        contributes = False
        skip_down = True
        for j, blob_id in enumerate(net.top_ids[i]):
            name = net.blob_names[blob_id]
            if layer.loss(j) or name in under_loss:
                contributes = True
            if name not in skip:
                skip_down = False
            if contributes and not skip_down:
                break
        if net.layer_need_backward[i] and skip_down:
            net.layer_need_backward[i] = False
            net.bottom_need_backward[i] = [False] * len(net.bottom_ids[i])
        if not contributes:
            net.layer_need_backward[i] = False
        logger.info("%s %s backward computation.", net.layer_names[i],
                    "needs" if net.layer_need_backward[i] else "does not need")
        for j, blob_id in enumerate(net.bottom_ids[i]):
            name = net.blob_names[blob_id]
            if contributes:
                under_loss.add(name)
            else:
                net.bottom_need_backward[i][j] = False
            if not net.bottom_need_backward[i][j]:
                skip.add(name)


def _force_backward(net):
    """``force_backward: true``: every layer runs backward, every bottom its layer allows."""
    for i, layer in enumerate(net.layers):
        net.layer_need_backward[i] = True
        for j, blob_id in enumerate(net.bottom_ids[i]):
            need = net.bottom_need_backward[i][j] or layer.allow_force_backward(j)
            net.bottom_need_backward[i][j] = need
            net.blob_need_backward[blob_id] = net.blob_need_backward[blob_id] or need
        layer.param_propagate_down = [True] * len(layer.blobs)


# --------------------------------------------------------------------------------------------
# Layer failures as one line
# --------------------------------------------------------------------------------------------
def setup_layer(layer, lp, bottoms, tops):
    """``layer.setup``, with every failure one CaffeError line naming the layer and its type.

    Raises:
        CaffeError: the layer's own message prefixed with the layer when it lacks it, or the
            failure's type and message for an error no check of the layer anticipated (a
            Python layer's own exceptions propagate unchanged: :func:`wrapped_failures`).
    """
    where = f"layer '{lp.name}' ({lp.type})"
    try:
        layer.setup(bottoms, tops)
    except CaffeError as exc:
        if lp.name and f"'{lp.name}'" not in str(exc) and f"{lp.name}:" not in str(exc):
            raise CaffeError(f"{where}: {exc}") from None
        raise
    except wrapped_failures(layer) as exc:
        raise layer_failure(layer, bottoms, "set up", exc, lp) from None


def layer_failure(layer, bottoms, what, exc, lp=None):
    """A CaffeError line for ``exc`` raised while ``layer`` ran ``what`` (set up, forward,
    backward): the layer's name and type, its bottom shapes, and the failure."""
    lp = lp if lp is not None else layer.param
    shapes = ", ".join(str(tuple(b.shape)) for b in bottoms) or "no bottoms"
    return CaffeError(f"layer '{lp.name}' ({lp.type}): cannot {what} with these parameters and "
                      f"bottom shapes ({shapes}): {type(exc).__name__}: {exc}")
