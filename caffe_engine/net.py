"""Net: a NetParameter built for one phase into layers and blobs, run forward and backward.

Caffe: src/caffe/net.cpp, src/caffe/util/insert_splits.cpp. The build is Caffe's:

1. :func:`filter_net` keeps the layers whose include/exclude rules match the NetState
   (phase, level, stages);
2. :func:`insert_splits` gives every blob consumed by several layers a ``Split`` layer, so
   that the consumers' gradients are summed (Caffe's implicit split);
3. layers are created in order, their tops allocated (in-place when a top repeats the bottom of
   the same index), set up (fillers draw from the global stream in this order), params registered
   (shared by ``ParamSpec.name``), and which layers and blobs need backward is worked out exactly
   as Caffe does (loss reachability, ``propagate_down``, ``lr_mult: 0``, ``force_backward``).

Blob data are float32 arrays of the current array module (see ``backend``).
"""
import collections
import itertools
import os

import numpy

from . import backend, diff_sharing
from .blob import Blob
from .errors import CaffeError
from .io import prototxt as pio
from .layers import batch_norm_chain, create_layer
from .log import g, logger
from .proto import caffe_pb2

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST

#: The per-layer moments a hook can run at, each added by the method of its name
#: (:meth:`Net.before_forward` ...; Caffe's Net::Callback points).
HOOK_EVENTS = ("before_forward", "after_forward", "before_backward", "after_backward")


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
    return f"{blob_name}_{layer_name}_{blob_index}_split"


def split_blob_name(layer_name, blob_name, blob_index, split_index):
    return f"{blob_name}_{layer_name}_{blob_index}_split_{split_index}"


def insert_splits(param):
    """Return a copy of ``param`` with a ``Split`` layer after every top used more than once.

    A top counts once per consuming bottom and once more if it carries a non-zero loss weight.
    Names follow Caffe so that nets and weight files line up. Caffe: InsertSplits.

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
# Net
# --------------------------------------------------------------------------------------------
class Net:
    """A built net: layers, blobs and learnable params for one phase.

    Args:
        model: a prototxt path, or a caffe_pb2.NetParameter.
        phase: ``TRAIN`` or ``TEST`` (pycaffe's legacy ``Net(model, weights, phase)`` works too).
        level, stages: the NetState level and stages. For a prototxt path these follow
            Caffe's ``Net(param_file, phase, level, stages)`` (src/caffe/net.cpp), as pycaffe's
            ``caffe.Net`` and ``caffe test``/``caffe time`` use it: the file's ``state``
            keeps its stages, ``stages`` are added to them, and its ``level`` is replaced by
            ``level`` (default 0), so a file's ``state { level: 2 }`` is ignored unless
            ``level=2`` is passed. For a NetParameter its ``state`` is kept, with ``level``
            (if non-zero) and ``stages`` (if given) replacing its own (the solver passes its
            merged train/test state this way).
        weights: optional ``.caffemodel`` (or ``.h5``) path whose params are copied in by
            layer name. The positional order is pycaffe's: model, phase, level, stages, weights.

    Attributes:
        blobs: OrderedDict blob name -> Blob, in creation order.
        params: OrderedDict layer name -> list of param Blobs, for layers that have params.
        layers: list of Layer objects; ``layer_names`` their names.
        inputs / outputs: names of the net's input blobs (Input layers' tops) and output blobs
            (tops nobody consumes).
        blob_loss_weights, top_names, bottom_names, layer_dict: pycaffe's OrderedDicts (see
            the pycaffe surface section); ``_blob_loss_weights`` is the list by blob index.
        hooks: the per-layer hooks, ``(event, callback)`` in the order added (one list for
            the four :data:`HOOK_EVENTS`).

    Raises:
        CaffeError: unreadable file, unknown layer type or bottom, bad parameters, weight
            mismatch; the message names the file or layer.
    """

    def __init__(self, model, phase=None, level=0, stages=None, weights=None, **kwargs):
        # pycaffe's order is (network_file, phase, level=0, stages=None, weights=None); its
        # legacy constructor is Net(network_file, pretrained_file, phase).
        if isinstance(phase, (str, os.PathLike)):
            if weights is not None:
                raise TypeError("Net(model, weights, phase) takes no weights= keyword as well")
            weights, phase, level = phase, level, 0
        phase = kwargs.pop("phase", phase)
        if kwargs:
            raise TypeError(f"unexpected arguments: {', '.join(kwargs)}")
        if phase not in (TRAIN, TEST):
            raise CaffeError(f"phase must be caffe_engine.TRAIN or caffe_engine.TEST, got {phase!r}")
        if isinstance(model, caffe_pb2.NetParameter):
            param = caffe_pb2.NetParameter()
            param.CopyFrom(model)
            self.source = "<NetParameter>"
        else:
            param = pio.read_net_param(str(model))
            self.source = str(model)
        state = caffe_pb2.NetState()
        state.CopyFrom(param.state)
        state.phase = phase
        if isinstance(model, caffe_pb2.NetParameter):
            # A NetParameter keeps its own state unless level / stages are given.
            if level:
                state.level = level
            if stages:
                del state.stage[:]
                state.stage.extend(stages)
        else:
            # Caffe's Net(param_file, phase, level, stages), which pycaffe's Net() and the caffe
            # tool's test/time call: the phase is set, the given stages are added to the file's
            # own, and the level is set (0 unless given), whatever the file's state says.
            state.level = int(level or 0)
            state.stage.extend(stages or [])
        param.state.CopyFrom(state)
        self.phase = phase
        self._init(param)
        if weights:
            self.copy_from(weights)

    # -- construction ----------------------------------------------------------------------
    def _init(self, in_param):
        filtered = filter_net(in_param, in_param.state)
        logger.info("Initializing net from parameters: \n%s", filtered)
        param = insert_splits(filtered)
        self.name = param.name
        self.net_param = param
        self.force_backward = param.force_backward
        self.layers, self.layer_names = [], []
        self.bottom_vecs, self.top_vecs = [], []
        self.bottom_ids, self.top_ids = [], []
        self.bottom_need_backward, self.layer_need_backward = [], []
        self.blob_names, self._blob_list, self.blob_need_backward = [], [], []
        self._blob_loss_weights = []  # per blob id; pycaffe's dict is the property
        self._blob_index = {}
        self.params = collections.OrderedDict()
        self.learnable_params, self.params_lr, self.params_weight_decay = [], [], []
        self._param_owner = {}  # ParamSpec name -> (layer index, param index)
        available = collections.OrderedDict()
        self.memory_used = 0
        self._hooks = []            # (event, callback) in registration order; see _add_hook
        self._hooks_of = dict.fromkeys(HOOK_EVENTS, ())
        self._blind_hooks = set()   # ids of callbacks that look at no blob (sees_blobs=False)
        self._empty_warned = set()  # (input, shape) already named by _warn_empty_inputs
        self._diff_plan = None      # see share_diff_memory

        for layer_id, lp_in in enumerate(param.layer):
            lp = caffe_pb2.LayerParameter()
            lp.CopyFrom(lp_in)
            if not lp.HasField("phase"):
                lp.phase = self.phase
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise CaffeError(f"layer '{lp.name}': propagate_down param must be specified "
                                 "either 0 or bottom_size times")
            layer = create_layer(lp, self.phase)
            self.layers.append(layer)
            self.layer_names.append(lp.name)
            logger.info("Creating Layer %s", lp.name)
            bottoms, bottom_ids, bottom_need = [], [], []
            need_backward = False
            for j, name in enumerate(lp.bottom):
                if name not in available:
                    raise CaffeError(f"Unknown bottom blob '{name}' (layer '{lp.name}', bottom index {j})")
                blob_id = self._blob_index[name]
                del available[name]
                logger.info("%s <- %s", lp.name, name)
                need = self.blob_need_backward[blob_id]
                if len(lp.propagate_down):
                    need = bool(lp.propagate_down[j])
                bottoms.append(self._blob_list[blob_id])
                bottom_ids.append(blob_id)
                bottom_need.append(need)
                need_backward |= need
            tops, top_ids = [], []
            for j, name in enumerate(lp.top):
                if j < len(lp.bottom) and name == lp.bottom[j]:
                    logger.info("%s -> %s (in-place)", lp.name, name)
                    blob_id = self._blob_index[name]
                elif name in self._blob_index:
                    raise CaffeError(f"Top blob '{name}' produced by multiple sources "
                                     f"(layer '{lp.name}')")
                else:
                    logger.info("%s -> %s", lp.name, name)
                    blob_id = len(self._blob_list)
                    self._blob_list.append(Blob(()))
                    self.blob_names.append(name)
                    self.blob_need_backward.append(False)
                    self._blob_loss_weights.append(0.0)
                    self._blob_index[name] = blob_id
                tops.append(self._blob_list[blob_id])
                top_ids.append(blob_id)
                available[name] = True
            if layer.auto_top_blobs:
                # Caffe's AutoTopBlobs: a loss layer declared without its top still gets one,
                # an anonymous "(automatic)" blob that no other layer can consume.
                needed = max(layer.min_top or 0, layer.exact_num_top or 0)
                for _ in range(len(tops), needed):
                    logger.info("%s -> (automatic)", lp.name)
                    blob_id = len(self._blob_list)
                    self._blob_list.append(Blob(()))
                    self.blob_names.append("(automatic)")
                    self.blob_need_backward.append(False)
                    self._blob_loss_weights.append(0.0)
                    tops.append(self._blob_list[blob_id])
                    top_ids.append(blob_id)
            self.bottom_vecs.append(bottoms)
            self.top_vecs.append(tops)
            self.bottom_ids.append(bottom_ids)
            self.top_ids.append(top_ids)
            self.bottom_need_backward.append(bottom_need)

            logger.info("Setting up %s", lp.name)
            _setup_layer(layer, lp, bottoms, tops)
            for j, blob_id in enumerate(top_ids):
                self._blob_loss_weights[blob_id] = layer.loss(j)
                logger.info("Top shape: %s (%d)", " ".join(str(d) for d in tops[j].shape),
                            tops[j].count)
                if layer.loss(j):
                    logger.info("    with loss weight %s", g(layer.loss(j)))
                self.memory_used += tops[j].count
            # Params: lr_mult / decay_mult and sharing by name (Caffe's AppendParam).
            if len(lp_in.param) > len(layer.blobs):
                raise CaffeError(f"layer '{lp.name}': too many params specified "
                                 f"({len(lp_in.param)} for {len(layer.blobs)} param blobs)")
            # As in Caffe, whether a param needs backward is read from the net's own copy of
            # the layer parameters, while lr/decay bookkeeping reads the layer's copy after
            # setup (BatchNorm adds lr_mult: 0 specs for its statistics in setup).
            layer.param_propagate_down = []
            for k in range(len(layer.blobs)):
                net_spec = lp_in.param[k] if k < len(lp_in.param) else caffe_pb2.ParamSpec()
                need = net_spec.lr_mult != 0
                need_backward |= need
                layer.param_propagate_down.append(need)
                spec = lp.param[k] if k < len(lp.param) else caffe_pb2.ParamSpec()
                self._append_param(layer_id, k, spec)
            if layer.blobs:
                self.params[lp.name] = layer.blobs
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for blob_id in top_ids:
                    self.blob_need_backward[blob_id] = True
        logger.info("Memory required for data: %d", self.memory_used * 4)
        self._share_saved_inputs()

        self._prune_backward()
        if self.force_backward:
            for i, layer in enumerate(self.layers):
                self.layer_need_backward[i] = True
                for j, blob_id in enumerate(self.bottom_ids[i]):
                    need = self.bottom_need_backward[i][j] or layer.allow_force_backward(j)
                    self.bottom_need_backward[i][j] = need
                    self.blob_need_backward[blob_id] = self.blob_need_backward[blob_id] or need
                layer.param_propagate_down = [True] * len(layer.blobs)

        self.outputs = list(available)
        for name in self.outputs:
            logger.info("This network produces output %s", name)
        self.inputs = [t for layer, tops in zip(self.layers, self.top_ids) if layer.type == "Input"
                       for t in (self.blob_names[b] for b in tops)]
        self.blobs = collections.OrderedDict((n, self._blob_list[i]) for i, n in enumerate(self.blob_names))
        self._chains_by_first, self._chains_by_last = batch_norm_chain.find(self)
        self._layer_index = {n: i for i, n in enumerate(self.layer_names)}
        logger.info("Network initialization done.")

    def _share_saved_inputs(self):
        """An in-place Scale right after the BatchNorm whose top it reads (ResNet's BatchNorm +
        Scale pairs) keeps no copy of its input: it reads the BatchNorm's ``x_norm``, which holds
        the same values (Caffe keeps both; ResNet-50 at batch 32: 1.3 GB). Nothing pycaffe can
        see changes, nor any result."""
        for i in range(1, len(self.layers)):
            layer, before = self.layers[i], self.layers[i - 1]
            if (layer.type == "Scale" and before.type == "BatchNorm"
                    and self.bottom_ids[i] == self.top_ids[i] == self.top_ids[i - 1][:1]):
                layer.share_input(lambda bn=before: bn.x_norm)

    def _append_param(self, layer_id, k, spec):
        layer = self.layers[layer_id]
        blob = layer.blobs[k]
        name = spec.name
        if not name or name not in self._param_owner:
            if name:
                self._param_owner[name] = (layer_id, k)
            self.learnable_params.append(blob)
            self.params_lr.append(spec.lr_mult)
            self.params_weight_decay.append(spec.decay_mult)
            return
        owner_layer, owner_k = self._param_owner[name]
        owner = self.layers[owner_layer].blobs[owner_k]
        strict = spec.share_mode != caffe_pb2.ParamSpec.PERMISSIVE
        if (strict and owner.shape != blob.shape) or owner.count != blob.count:
            raise CaffeError(f"Cannot share param '{name}' owned by layer '{self.layer_names[owner_layer]}' "
                             f"with layer '{self.layer_names[layer_id]}'; shape mismatch. "
                             f"Owner shape is {owner.shape}; sharing layer shape is {blob.shape}")
        # The sharer views the owner's arrays (reshaped in PERMISSIVE mode).
        blob.data = owner.data.reshape(blob.shape)
        blob.diff = owner.diff.reshape(blob.shape)
        owner_index = self.learnable_params.index(owner)
        if spec.HasField("lr_mult"):
            if self.params_lr[owner_index] != spec.lr_mult and self._explicit_lr(owner_layer, owner_k):
                raise CaffeError(f"Shared param '{name}' has mismatched lr_mult.")
            self.params_lr[owner_index] = spec.lr_mult
        if spec.HasField("decay_mult"):
            self.params_weight_decay[owner_index] = spec.decay_mult

    def _explicit_lr(self, layer_id, k):
        lp = self.layers[layer_id].param
        return k < len(lp.param) and lp.param[k].HasField("lr_mult")

    def _prune_backward(self):
        """Drop backward for layers that do not lead to a loss or whose tops need no gradient."""
        under_loss, skip = set(), set()
        for i in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[i]
            contributes = False
            skip_down = True
            for j, blob_id in enumerate(self.top_ids[i]):
                name = self.blob_names[blob_id]
                if layer.loss(j) or name in under_loss:
                    contributes = True
                if name not in skip:
                    skip_down = False
                if contributes and not skip_down:
                    break
            if self.layer_need_backward[i] and skip_down:
                self.layer_need_backward[i] = False
                self.bottom_need_backward[i] = [False] * len(self.bottom_ids[i])
            if not contributes:
                self.layer_need_backward[i] = False
            logger.info("%s %s backward computation.", self.layer_names[i],
                        "needs" if self.layer_need_backward[i] else "does not need")
            for j, blob_id in enumerate(self.bottom_ids[i]):
                name = self.blob_names[blob_id]
                if contributes:
                    under_loss.add(name)
                else:
                    self.bottom_need_backward[i][j] = False
                if not self.bottom_need_backward[i][j]:
                    skip.add(name)

    # -- running -----------------------------------------------------------------------------
    def _layer_index_of(self, name):
        if name not in self._layer_index:
            raise CaffeError(f"unknown layer '{name}'")
        return self._layer_index[name]

    def forward_from_to(self, start=0, end=None, to_host=True):
        """Run layers ``start``..``end`` (indices, inclusive) forward; return the summed loss.

        Args:
            to_host: True: the loss as a ``numpy.float32`` (on the GPU one host read, after
                which the checks the layers deferred are raised: ``backend.raise_deferred``).
                False: the loss where the blobs are, unread -- a ``numpy.float32`` on the CPU,
                a 0-d float32 CuPy array on the GPU (the solver's loop, which reads it once per
                display); deferred checks stay pending.

        The loss is ``sum_j <top_j, diff_j>`` over the loss tops in layer order, accumulated in
        float32 from 0 (Caffe's Net::ForwardFromTo).
        """
        loss = self._forward_loss_on_device(start, end)
        if not to_host:
            return loss
        loss = backend.host_scalar(loss)
        backend.raise_deferred()
        return loss

    def _forward_loss_on_device(self, start, end):
        end = len(self.layers) - 1 if end is None else end
        loss = None
        before, after = self._hooks_of["before_forward"], self._hooks_of["after_forward"]
        i = start - 1
        while i < end:
            i += 1
            chain = self._chains_by_first.get(i)
            if chain is not None and chain.last <= end and not before and not after:
                try:
                    chain.forward()
                except _SETUP_FAILURES as exc:
                    raise _layer_failure(chain.batch_norm, chain.bottom, "forward",
                                         exc) from None
                i = chain.last
                continue
            for hook in before:
                hook(i)
            layer, bottom, top = self.layers[i], self.bottom_vecs[i], self.top_vecs[i]
            try:
                layer.reshape(bottom, top)
                layer.forward(bottom, top)
            except _SETUP_FAILURES as exc:
                raise _layer_failure(layer, bottom, "forward", exc) from None
            for hook in after:
                hook(i)
            for j, blob in enumerate(top):
                if layer.loss(j):
                    xp = backend.get_array_module(blob.data)
                    term = xp.vdot(blob.data.ravel(), blob.diff.ravel())
                    # float32 from 0 as Caffe's ``Dtype loss = 0``: 0 + x first, device value
                    # on the left so that a CuPy term is never added to a NumPy scalar.
                    loss = term + numpy.float32(0) if loss is None else loss + term
        return numpy.float32(0) if loss is None else loss

    def share_diff_memory(self):
        """From the next backward on, let blobs whose gradients are not live at the same time
        share diff memory (see :mod:`caffe_engine.diff_sharing`; the solver does this for its
        train net). Params' and loss tops' diffs keep their own memory; intermediate blobs'
        diffs are no longer all meaningful after ``backward``."""
        self._diff_plan = ()

    def backward_from_to(self, start=None, end=0):
        """Run backward from layer index ``start`` (default last) down to ``end`` (inclusive)."""
        if self._diff_plan is not None and self._diff_plan != diff_sharing.signature(self):
            diff_sharing.plan(self)
            self._diff_plan = diff_sharing.signature(self)
        start = len(self.layers) - 1 if start is None else start
        before, after = self._hooks_of["before_backward"], self._hooks_of["after_backward"]
        i = start + 1
        while i > end:
            i -= 1
            chain = self._chains_by_last.get(i)
            if (chain is not None and chain.first >= end and chain.backward_together
                    and all(id(hook) in self._blind_hooks for hook in before + after)):
                for hook in before:
                    hook(i)
                try:
                    chain.backward()
                except _SETUP_FAILURES as exc:
                    raise _layer_failure(chain.batch_norm, chain.bottom, "backward",
                                         exc) from None
                for k in range(i, chain.first - 1, -1):
                    if k != i:
                        for hook in before:
                            hook(k)
                    for hook in after:
                        hook(k)
                i = chain.first
                continue
            for hook in before:
                hook(i)
            if self.layer_need_backward[i]:
                try:
                    self.layers[i].backward(self.top_vecs[i], self.bottom_need_backward[i],
                                            self.bottom_vecs[i])
                except _SETUP_FAILURES as exc:
                    raise _layer_failure(self.layers[i], self.bottom_vecs[i], "backward",
                                         exc) from None
            for hook in after:
                hook(i)

    def forward_loss(self, to_host=True):
        """Forward the whole net and return the loss (Caffe's Net::Forward): a float32 scalar,
        or with ``to_host`` False the unread device value (see :meth:`forward_from_to`)."""
        return self.forward_from_to(0, len(self.layers) - 1, to_host=to_host)

    # -- per-layer hooks (Caffe's Net::Callback; pycaffe's names) --------------------------------
    def before_forward(self, callback, sees_blobs=True):
        """Call ``callback(layer_index)`` before each layer's forward, in layer order, from the
        next pass on (pycaffe's ``net.before_forward``; Caffe's ``add_before_forward``).

        Args:
            callback: called with the layer index (int).
            sees_blobs: False for a hook that reads no blob and no layer state (see
                :meth:`after_backward`).

        Raises:
            CaffeError: ``callback`` is not callable.
        """
        self._add_hook("before_forward", callback, sees_blobs)

    def after_forward(self, callback, sees_blobs=True):
        """Call ``callback(layer_index)`` after each layer's forward (pycaffe's
        ``net.after_forward``); as :meth:`before_forward`."""
        self._add_hook("after_forward", callback, sees_blobs)

    def before_backward(self, callback, sees_blobs=True):
        """Call ``callback(layer_index)`` before each layer's backward, in backward order,
        whether or not the layer needs one (pycaffe's ``net.before_backward``); as
        :meth:`after_backward`."""
        self._add_hook("before_backward", callback, sees_blobs)

    def after_backward(self, callback, sees_blobs=True):
        """Call ``callback(layer_index)`` after each layer's backward, in backward order,
        whether or not the layer needs one (pycaffe's ``net.after_backward``; Caffe's
        ``add_after_backward``, where the gradient buckets of :mod:`caffe_engine.comm.buckets`
        launch their allreduce).

        Args:
            callback: called with the layer index (int).
            sees_blobs: False for a hook that reads no blob and no layer state, only the
                params of finished layers (the engine's gradient buckets and backward timer):
                then a BatchNorm+Scale+ReLU chain (:mod:`caffe_engine.layers.batch_norm_chain`)
                still runs backward as one, the hooks called for its last layer around it and
                for the others after it. Any hook that may see blobs keeps every layer apart
                (and any forward hook keeps the chain's forward apart).

        Hooks of one event run in the order they were added. A hook added while a pass runs
        takes effect from the next pass.

        Raises:
            CaffeError: ``callback`` is not callable.
        """
        self._add_hook("after_backward", callback, sees_blobs)

    def _add_hook(self, event, callback, sees_blobs):
        if not callable(callback):
            raise CaffeError(f"net hook: the {event} callback must be callable, got "
                             f"{type(callback).__name__}")
        self._hooks.append((event, callback))
        if not sees_blobs:
            self._blind_hooks.add(id(callback))
        self._hooks_of = {e: tuple(cb for ev, cb in self._hooks if ev == e) for e in HOOK_EVENTS}

    @property
    def hooks(self):
        """The per-layer hooks, ``(event, callback)`` in the order added (a tuple)."""
        return tuple(self._hooks)

    def forward_backward(self, to_host=True):
        """One forward and one backward pass; returns the float32 loss (with ``to_host``
        False the unread device value, see :meth:`forward_from_to`)."""
        loss = self.forward_loss(to_host=to_host)
        self.backward_from_to()
        return loss

    def clear_param_diffs(self):
        """Zero every learnable param's diff (start of each solver iteration)."""
        for blob in self.learnable_params:
            blob.diff[...] = 0

    def update(self):
        """``data -= diff`` for every learnable param (Caffe's Net::Update)."""
        for blob in self.learnable_params:
            blob.data -= blob.diff

    # -- weights -----------------------------------------------------------------------------
    def copy_from(self, source):
        """Copy params by layer name from a ``.caffemodel``, a ``.caffemodel.h5`` or a
        NetParameter (Caffe's CopyTrainedLayersFrom / CopyTrainedLayersFromHDF5).

        Layers absent from the source keep their values; source layers absent here are ignored
        (logged). With several layers of one name here, Caffe's two readers differ and so does
        this one: a ``.caffemodel`` source layer goes into the *first* of them (Caffe searches
        ``layer_names_``), an HDF5 one into the *last* (Caffe looks it up in
        ``layer_names_index_``, filled in layer order); the others keep their initial values,
        and a WARNING line names the layer. A ``.caffemodel``'s legacy 4-D shapes equal the
        target padded with leading 1s (Blob::ShapeEquals); an HDF5 file's must match exactly,
        and may leave out a param this net shares from another layer.

        Returns:
            list of the layer names copied, in source order.

        Raises:
            CaffeError: unreadable file, wrong number of blobs, a missing HDF5 dataset, or a
                shape mismatch naming the layer, the param and both shapes.
        """
        from .io.blobproto import proto_shape, proto_to_array
        hdf5 = not isinstance(source, caffe_pb2.NetParameter) and str(source).endswith(".h5")
        if hdf5:
            from .io.hdf5_weights import read_hdf5_weights
            where = str(source)
            records = read_hdf5_weights(where)
            index = {name: i for i, name in enumerate(self.layer_names)}        # last wins
        else:
            if isinstance(source, caffe_pb2.NetParameter):
                param, where = source, "<NetParameter>"
            else:
                where = str(source)
                param = pio.read_binary(where, caffe_pb2.NetParameter(), "caffemodel")
                from .io.upgrade import upgrade_net
                upgrade_net(param, where)
            records = [(layer.name, dict(enumerate(layer.blobs))) for layer in param.layer]
            index = self.first_layer_index()
        if not records:
            logger.warning("%s holds no layers: no weights copied (Caffe goes on as well)", where)
        copied, warned = [], set()
        for name, blobs in records:
            i = index.get(name)
            if i is None:
                logger.info("Ignoring source layer %s", name)
                continue
            if name not in warned:
                warned.add(name)
                self.warn_duplicate_layer_name(name, i, where)
            target = self.layers[i].blobs
            if len(blobs) > len(target) or (not hdf5 and len(blobs) != len(target)):
                raise CaffeError(f"{where}: Incompatible number of blobs for layer {name} "
                                 f"(source {len(blobs)}, target {len(target)})")
            logger.debug("Copying source layer %s #blobs=%d", name, len(blobs))
            for k, blob in enumerate(target):
                if k not in blobs:
                    if self.param_is_shared_view(i, k):
                        continue
                    raise CaffeError(f"{where}: Incompatible number of blobs for layer {name} "
                                     f"(param {k} missing)")
                src = blobs[k]
                if hdf5:
                    shape, values = tuple(src.shape), src
                else:
                    shape, values = proto_shape(src, blob.shape), None
                if shape != tuple(blob.shape):
                    raise CaffeError(f"{where}: Cannot copy param {k} weights from layer '{name}'; "
                                     f"shape mismatch. Source param shape is {_shape_str(shape)}; "
                                     f"target param shape is {_shape_str(blob.shape)}")
                if values is None:
                    values = proto_to_array(src, what=f"{where}: layer {name} param {k}")
                blob.data[...] = backend.get_array_module(blob.data).asarray(
                    values.reshape(blob.shape))
            copied.append(name)
        return copied

    def param_is_shared_view(self, layer_index, k):
        """Whether param ``k`` of layer ``layer_index`` is a view of another layer's param
        (``param { name: ... }`` sharing; only the owner's values are stored in HDF5)."""
        lp = self.layers[layer_index].param
        if k >= len(lp.param) or not lp.param[k].name:
            return False
        owner = getattr(self, "_param_owner", {}).get(lp.param[k].name)
        return owner is not None and owner != (layer_index, k)

    def to_proto(self, write_diff=False):
        """The net as a NetParameter with every layer's param blobs (Caffe's Net::ToProto)."""
        from .io.blobproto import blob_to_proto
        param = caffe_pb2.NetParameter(name=self.name)
        for layer in self.layers:
            lp = param.layer.add()
            lp.CopyFrom(layer.param)
            lp.ClearField("blobs")
            for blob in layer.blobs:
                blob_to_proto(blob, lp.blobs.add(), write_diff)
        return param

    def save(self, path, write_diff=False):
        """Write the weights as a binary ``.caffemodel`` (atomically)."""
        pio.write_binary(str(path), self.to_proto(write_diff))

    def first_layer_index(self):
        """dict layer name -> index of the first layer of that name (the target Caffe's
        CopyTrainedLayersFrom and ShareTrainedLayersWith find by searching ``layer_names_``)."""
        first = {}
        for i, name in enumerate(self.layer_names):
            first.setdefault(name, i)
        return first

    def warn_duplicate_layer_name(self, name, target, where):
        """Log one WARNING when several layers here are named ``name`` and weights from
        ``where`` go into layer ``target`` only; the others keep their values."""
        same = [i for i, n in enumerate(self.layer_names) if n == name]
        if len(same) > 1:
            others = ", ".join(str(i) for i in same if i != target)
            logger.warning("Net %s has %d layers named '%s' (layers %s): weights from %s go into "
                           "layer %d only; layer(s) %s keep their initial values", self.name,
                           len(same), name, ", ".join(map(str, same)), where, target, others)

    def share_trained_layers_with(self, other):
        """Make this net's params view ``other``'s, by layer name (Caffe's ShareTrainedLayersWith).

        As Caffe, each of ``other``'s layers is shared into the first layer here with its name,
        in order (so with repeated names the first layer here views ``other``'s last one, and a
        later layer of the same name keeps its own values).
        """
        first = self.first_layer_index()
        for name, layer in zip(other.layer_names, other.layers):
            src_blobs = layer.blobs
            if not src_blobs:
                continue
            i = first.get(name)
            if i is None:
                continue
            target = self.layers[i].blobs
            if len(target) != len(src_blobs):
                raise CaffeError(f"Incompatible number of blobs for layer {name}")
            for t, s in zip(target, src_blobs):
                if t.shape != s.shape:
                    raise CaffeError(f"Cannot share param weights from layer '{name}'; shape mismatch. "
                                     f"Source param shape is {_shape_str(s.shape)}; "
                                     f"target param shape is {_shape_str(t.shape)}")
                t.data = s.data

    # -- the pycaffe surface ------------------------------------------------------------------
    # python/caffe/pycaffe.py and _caffe.cpp: what ``import caffe_engine as caffe`` scripts use.

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Forward pass, as pycaffe's ``Net.forward``.

        Args:
            blobs: names of blobs whose data to return besides the outputs.
            start, end: layer names to start at / stop after (inclusive); default the first and
                the last layer.
            **kwargs: input blob name -> array copied into that blob first. When given, the
                names must be exactly the net's :attr:`inputs` and each array's first axis the
                blob's batch size (pycaffe's checks).

        Returns:
            dict blob name -> the blob's data array (the live array, not a copy), for the
            net's outputs (or, with ``end``, that layer's tops) and ``blobs``.

        Raises:
            CaffeError: unknown layer or blob name, inputs that do not match, wrong batch size.
        """
        blobs = list(blobs or [])
        start_ind = 0 if start is None else self._layer_index_of(start)
        if end is None:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + blobs)
        else:
            end_ind = self._layer_index_of(end)
            outputs = set(self.top_names_of(end) + blobs)
        self._check_blob_names(outputs)
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise CaffeError(f"Input blob arguments {sorted(kwargs)} do not match "
                                 f"net inputs {self.inputs}.")
            for name, value in kwargs.items():
                self._fill(name, value, "data", "Input")
        self._warn_empty_inputs()
        self._forward(start_ind, end_ind)
        return {name: self.blobs[name].data for name in outputs}

    def _warn_empty_inputs(self):
        """One WARNING per input shape with a zero dimension (pycaffe's ``blob.reshape(0,
        ...)``): Caffe runs such a net and computes nothing, and so does this one."""
        for name in self.inputs:
            shape = self.blobs[name].shape
            if 0 in shape and (name, shape) not in self._empty_warned:
                self._empty_warned.add((name, shape))
                logger.warning("input blob '%s' has a zero dimension %s: the net computes "
                               "nothing", name, shape)

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Backward pass, as pycaffe's ``Net.backward``.

        Args:
            diffs: names of blobs whose diff to return besides the inputs'.
            start, end: layer names to start at / stop after (inclusive), going down; default
                the last and the first layer.
            **kwargs: output blob name -> array copied into that blob's diff first. When
                given, the names must be exactly the net's :attr:`outputs`.

        Returns:
            dict blob name -> the blob's diff array, for the net's inputs (or, with ``end``,
            that layer's bottoms) and ``diffs``.

        Raises:
            CaffeError: unknown layer or blob name, diffs that do not match, wrong batch size.
        """
        diffs = list(diffs or [])
        start_ind = len(self.layers) - 1 if start is None else self._layer_index_of(start)
        if end is None:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        else:
            end_ind = self._layer_index_of(end)
            outputs = set(self.bottom_names_of(end) + diffs)
        self._check_blob_names(outputs)
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise CaffeError(f"Top diff arguments {sorted(kwargs)} do not match "
                                 f"net outputs {self.outputs}.")
            for name, value in kwargs.items():
                self._fill(name, value, "diff", "Diff")
        self._backward(start_ind, end_ind)
        return {name: self.blobs[name].diff for name in outputs}

    def _check_blob_names(self, names):
        unknown = sorted(n for n in names if n not in self.blobs)
        if unknown:
            raise CaffeError(f"unknown blob(s) {', '.join(unknown)} (net '{self.name}')")

    def _fill(self, name, value, field, what):
        blob = self.blobs[name]
        value = numpy.asarray(value) if not hasattr(value, "shape") else value
        if value.ndim == 0 or not blob.shape or value.shape[0] != blob.shape[0]:
            raise CaffeError(f"{what} '{name}' is not batch sized: got shape {tuple(value.shape)}, "
                             f"blob shape {blob.shape}")
        target = getattr(blob, field)
        target[...] = backend.get_array_module(target).asarray(value)

    def _forward(self, start, end):
        """pycaffe's ``Net._forward(start_ind, end_ind)``: run layers by index; return the loss."""
        return float(self.forward_from_to(start, end))

    def _backward(self, start, end):
        """pycaffe's ``Net._backward(start_ind, end_ind)``: backward from ``start`` down to ``end``."""
        self.backward_from_to(start, end)

    def forward_all(self, blobs=None, **kwargs):
        """Forward any number of items in batches of the net's batch size (pycaffe's).

        Args:
            blobs: extra blob names to collect, as in :meth:`forward`.
            **kwargs: input blob name -> array of any length N (all the same N). The last
                batch is padded with zeros; the padding's outputs are dropped.

        Returns:
            dict blob name -> NumPy array of N items (copies).

        Raises:
            CaffeError: no inputs given, or inputs of different lengths.
        """
        if not kwargs:
            raise CaffeError("forward_all needs the input arrays as keyword arguments "
                             f"(net inputs: {self.inputs})")
        all_outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        for batch in self._batch(kwargs):
            outs = self.forward(blobs=blobs, **batch)
            for name, data in outs.items():
                all_outs[name].extend(backend.to_numpy(data).copy())
        return self._unpad(all_outs, _first_length(kwargs))

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """Forward and backward in batches (pycaffe's ``forward_backward_all``).

        Args:
            blobs, diffs: extra blob names whose data / diffs to collect.
            **kwargs: input blob name -> array (fed forward) and output blob name -> array
                (fed as top diffs backward); nets with data layers may give neither.

        Returns:
            (all_blobs, all_diffs): dicts blob name -> NumPy array of N items.
        """
        all_outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        all_diffs = {name: [] for name in set(self.inputs + list(diffs or []))}
        forward_batches = self._batch({k: kwargs[k] for k in self.inputs if k in kwargs})
        backward_batches = self._batch({k: kwargs[k] for k in self.outputs if k in kwargs})
        for fb, bb in itertools.zip_longest(forward_batches, backward_batches, fillvalue={}):
            for name, data in self.forward(blobs=blobs, **fb).items():
                all_outs[name].extend(backend.to_numpy(data).copy())
            for name, diff in self.backward(diffs=diffs, **bb).items():
                all_diffs[name].extend(backend.to_numpy(diff).copy())
        n = _first_length(kwargs) if kwargs else None
        return self._unpad(all_outs, n), self._unpad(all_diffs, n)

    def _batch(self, arrays):
        """Yield dicts of batch-sized slices of ``arrays``; the last one zero-padded (pycaffe's)."""
        if not arrays:
            return
        num = _first_length(arrays)
        batch_size = next(iter(self.blobs.values())).shape[0]
        for i in range(0, num - num % batch_size, batch_size):
            yield {name: arrays[name][i:i + batch_size] for name in arrays}
        remainder = num % batch_size
        if remainder:
            padded = {}
            for name, values in arrays.items():
                values = numpy.asarray(values)
                padding = numpy.zeros((batch_size - remainder,) + values.shape[1:], values.dtype)
                padded[name] = numpy.concatenate([values[-remainder:], padding])
            yield padded

    @staticmethod
    def _unpad(collected, n):
        out = {name: numpy.asarray(values) for name, values in collected.items()}
        if n is not None:
            out = {name: values[:n] for name, values in out.items()}
        return out

    def reshape(self):
        """Re-run every layer's ``reshape`` in order (Caffe's Net::Reshape), e.g. after
        ``net.blobs['data'].reshape(...)``."""
        self._warn_empty_inputs()
        for layer, bottom, top in zip(self.layers, self.bottom_vecs, self.top_vecs):
            layer.reshape(bottom, top)

    def share_with(self, other):
        """pycaffe's ``net.share_with(other)``: view ``other``'s params by layer name."""
        self.share_trained_layers_with(other)

    def save_hdf5(self, path, write_diff=False):
        """Write the weights as a ``.caffemodel.h5`` (pycaffe's ``save_hdf5``)."""
        from .io.hdf5_snapshot import save_net_hdf5
        save_net_hdf5(self, str(path), write_diff)

    def load_hdf5(self, path):
        """Copy weights from a ``.caffemodel.h5`` by layer name (pycaffe's ``load_hdf5``; see
        :meth:`copy_from`). Returns the layer names copied."""
        path = str(path)
        if not path.endswith(".h5"):
            raise CaffeError(f"{path}: load_hdf5 reads .h5 weights files")
        return self.copy_from(path)

    def set_input_arrays(self, data, labels):
        """Feed a MemoryData first layer (pycaffe's ``Net.set_input_arrays``).

        Raises:
            CaffeError: the first layer is not MemoryData.
        """
        if not self.layers or self.layers[0].type != "MemoryData":
            raise CaffeError("set_input_arrays may only be called if the first layer is a MemoryDataLayer")
        self.layers[0].set_input_arrays(data, labels)

    @property
    def blob_loss_weights(self):
        """OrderedDict blob name -> loss weight (pycaffe's ``net.blob_loss_weights``)."""
        return _LossWeights(zip(self.blob_names, self._blob_loss_weights))

    @property
    def layer_dict(self):
        """OrderedDict layer name -> layer (pycaffe's ``net.layer_dict``)."""
        return collections.OrderedDict(zip(self.layer_names, self.layers))

    @property
    def top_names(self):
        """OrderedDict layer name -> list of its top blob names (pycaffe's)."""
        return collections.OrderedDict(
            (name, [self.blob_names[b] for b in ids]) for name, ids in zip(self.layer_names, self.top_ids))

    @property
    def bottom_names(self):
        """OrderedDict layer name -> list of its bottom blob names (pycaffe's)."""
        return collections.OrderedDict(
            (name, [self.blob_names[b] for b in ids]) for name, ids in zip(self.layer_names, self.bottom_ids))

    @property
    def _layer_names(self):
        return list(self.layer_names)

    @property
    def _blob_names(self):
        return list(self.blob_names)

    @property
    def _blobs(self):
        return list(self._blob_list)

    @property
    def _inputs(self):
        return [self._blob_index[n] for n in self.inputs]

    @property
    def _outputs(self):
        return [self._blob_index[n] for n in self.outputs]

    def _top_ids(self, i):
        return list(self.top_ids[i])

    def _bottom_ids(self, i):
        return list(self.bottom_ids[i])

    def top_names_of(self, layer_name):
        return [self.blob_names[b] for b in self.top_ids[self._layer_index_of(layer_name)]]

    def bottom_names_of(self, layer_name):
        return [self.blob_names[b] for b in self.bottom_ids[self._layer_index_of(layer_name)]]


class _LossWeights(collections.OrderedDict):
    """pycaffe's ``blob_loss_weights`` dict (name -> weight); an int key still reads the weight
    of the blob with that index, for callers written against the earlier list."""

    def __missing__(self, key):
        if isinstance(key, (int, numpy.integer)) and not isinstance(key, bool):
            return list(self.values())[key]
        raise KeyError(key)


def _first_length(arrays):
    lengths = {name: len(values) for name, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise CaffeError(f"input arrays differ in length: {lengths}")
    return next(iter(lengths.values()))


def _shape_str(shape):
    return " ".join(str(d) for d in shape) + f" ({int(numpy.prod(shape)) if shape else 1})"


#: What a layer's setup raises on parameters or shapes it cannot work with, when no check of
#: its own caught them first (a zero-size division, an axis out of range, a size overflow).
_SETUP_FAILURES = (ZeroDivisionError, IndexError, OverflowError, ValueError, MemoryError)


def _setup_layer(layer, lp, bottoms, tops):
    """``layer.setup``, with every failure one CaffeError line naming the layer and its type.

    Raises:
        CaffeError: the layer's own message prefixed with the layer when it lacks it, or the
            failure's type and message for an error no check of the layer anticipated.
    """
    where = f"layer '{lp.name}' ({lp.type})"
    try:
        layer.setup(bottoms, tops)
    except CaffeError as exc:
        if lp.name and f"'{lp.name}'" not in str(exc) and f"{lp.name}:" not in str(exc):
            raise CaffeError(f"{where}: {exc}") from None
        raise
    except _SETUP_FAILURES as exc:
        raise _layer_failure(layer, bottoms, "set up", exc, lp) from None


def _layer_failure(layer, bottoms, what, exc, lp=None):
    """A CaffeError line for ``exc`` raised while ``layer`` ran ``what`` (set up, forward,
    backward): the layer's name and type, its bottom shapes, and the failure."""
    lp = lp if lp is not None else layer.param
    shapes = ", ".join(str(tuple(b.shape)) for b in bottoms) or "no bottoms"
    return CaffeError(f"layer '{lp.name}' ({lp.type}): cannot {what} with these parameters and "
                      f"bottom shapes ({shapes}): {type(exc).__name__}: {exc}")
