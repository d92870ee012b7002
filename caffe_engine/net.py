"""Net: a NetParameter built for one phase into layers and blobs, run forward and backward.

Caffe: src/caffe/net.cpp. :class:`Net` keeps net.cpp's job: it is built (the normalisation and
wiring are :mod:`caffe_engine.graph`'s: filter by NetState, insert splits, create and set up
the layers, work out need-backward), it runs (forward/backward over a range of layers, the
summed loss, ``update``, ``reshape``), and it calls per-layer hooks (Caffe's
``Net::Callback``). Its weights are read and written by :mod:`caffe_engine.io.weights`, and
pycaffe's conveniences (``forward(**inputs)``, ``forward_all``, the name dictionaries ...) are
the :class:`caffe_engine.pycaffe_net.PycaffeNet` it inherits.

Blob data are float32 arrays of the current array module (see ``backend``).
"""
import os

import numpy

from . import backend, diff_sharing, graph, memory
from .errors import CaffeError
from .io import prototxt as pio
from .io import weights as weights_io
from .log import logger
from .proto import caffe_pb2
from .pycaffe_net import PycaffeNet

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST

#: The per-layer moments a hook can run at, each added by the method of its name
#: (:meth:`Net.before_forward` ...; Caffe's Net::Callback points).
HOOK_EVENTS = ("before_forward", "after_forward", "before_backward", "after_backward")


class Net(PycaffeNet):
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
        weights: optional ``.caffemodel`` (or HDF5) path whose params are copied in by
            layer name. The positional order is pycaffe's: model, phase, level, stages, weights.

    Attributes:
        blobs: OrderedDict blob name -> Blob, in creation order.
        params: OrderedDict layer name -> list of param Blobs, for layers that have params.
        layers: list of Layer objects; ``layer_names`` their names.
        inputs / outputs: names of the net's input blobs (Input layers' tops) and output blobs
            (tops nobody consumes).
        blob_loss_weights, top_names, bottom_names, layer_dict: pycaffe's OrderedDicts (see
            :class:`~caffe_engine.pycaffe_net.PycaffeNet`); ``_blob_loss_weights`` is the list
            by blob index. The rest of the graph is listed in :func:`caffe_engine.graph.build`.
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
        self._hooks = []            # (event, callback) in registration order; see _add_hook
        self._hooks_of = dict.fromkeys(HOOK_EVENTS, ())
        self._blind_hooks = set()   # ids of callbacks that look at no blob (sees_blobs=False)
        self._empty_warned = set()  # (input, shape) already named by _warn_empty_inputs
        self._diff_plan = None      # see share_diff_memory
        self._diff_structure = None  # diff_sharing's blob groups, found at its first plan
        memory.hold_mmap_threshold()
        graph.build(self, param)
        if weights:
            self.copy_from(weights)

    # -- running -----------------------------------------------------------------------------
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
        if start == 0 and self._diff_plan is not None:
            shapes = diff_sharing.signature(self)
            if self._diff_plan != shapes:
                diff_sharing.plan(self, saved=True)
                self._diff_plan = shapes
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
                except graph.SETUP_FAILURES as exc:
                    raise graph.layer_failure(chain.batch_norm, chain.bottom, "forward",
                                              exc) from None
                i = chain.last
                continue
            for hook in before:
                hook(i)
            layer, bottom, top = self.layers[i], self.bottom_vecs[i], self.top_vecs[i]
            try:
                layer.reshape(bottom, top)
                layer.forward(bottom, top)
            except graph.wrapped_failures(layer) as exc:
                raise graph.layer_failure(layer, bottom, "forward", exc) from None
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
        train net), and what layers keep from forward to backward with them. Params' and loss
        tops' diffs keep their own memory; intermediate blobs' diffs are no longer all
        meaningful after ``backward``."""
        self._diff_plan = ()

    def backward_from_to(self, start=None, end=0):
        """Run backward from layer index ``start`` (default last) down to ``end`` (inclusive)."""
        if self._diff_plan is not None:
            shapes = diff_sharing.signature(self)
            if self._diff_plan not in (shapes, ("diffs only", shapes)):
                # a reshape since the forward: what forward saved stays where it is, and the
                # next forward from the first layer plans both again
                diff_sharing.plan(self, saved=False)
                self._diff_plan = ("diffs only", shapes)
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
                except graph.SETUP_FAILURES as exc:
                    raise graph.layer_failure(chain.batch_norm, chain.bottom, "backward",
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
                except graph.wrapped_failures(self.layers[i]) as exc:
                    raise graph.layer_failure(self.layers[i], self.bottom_vecs[i], "backward",
                                              exc) from None
            for hook in after:
                hook(i)

    def forward_loss(self, to_host=True):
        """Forward the whole net and return the loss (Caffe's Net::Forward): a float32 scalar,
        or with ``to_host`` False the unread device value (see :meth:`forward_from_to`)."""
        return self.forward_from_to(0, len(self.layers) - 1, to_host=to_host)

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

    def reshape(self):
        """Re-run every layer's ``reshape`` in order (Caffe's Net::Reshape), e.g. after
        ``net.blobs['data'].reshape(...)``."""
        self._warn_empty_inputs()
        for layer, bottom, top in zip(self.layers, self.bottom_vecs, self.top_vecs):
            layer.reshape(bottom, top)

    def _warn_empty_inputs(self):
        """One WARNING per input shape with a zero dimension (pycaffe's ``blob.reshape(0,
        ...)``): Caffe runs such a net and computes nothing, and so does this one."""
        for name in self.inputs:
            shape = self.blobs[name].shape
            if 0 in shape and (name, shape) not in self._empty_warned:
                self._empty_warned.add((name, shape))
                logger.warning("input blob '%s' has a zero dimension %s: the net computes "
                               "nothing", name, shape)

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

    # -- weights (Caffe's net.cpp names; the work is caffe_engine.io.weights') -------------------
    def copy_from(self, source):
        """Copy params by layer name from a ``.caffemodel``, an HDF5 weights file (whatever its
        name) or a NetParameter (Caffe's CopyTrainedLayersFrom; pycaffe's ``copy_from``).

        Returns:
            list of the layer names copied, in source order.

        Raises:
            CaffeError: see :func:`caffe_engine.io.weights.copy_from`.
        """
        return weights_io.copy_from(self, source)

    def share_trained_layers_with(self, other):
        """Make this net's params view ``other``'s, by layer name (Caffe's
        ShareTrainedLayersWith; :func:`caffe_engine.io.weights.share_trained_layers_with`)."""
        weights_io.share_trained_layers_with(self, other)

    def to_proto(self, write_diff=False):
        """The net as a NetParameter with every layer's param blobs (Caffe's Net::ToProto)."""
        return weights_io.to_proto(self, write_diff)

    def save(self, path, write_diff=False):
        """Write the weights as a binary ``.caffemodel`` (atomically; pycaffe's ``save``)."""
        weights_io.save(self, path, write_diff)
