"""PCL-DNN's hybrid InnerProduct layers in a data-parallel run: choice, slicing, gradients, snapshots.

Das et al., "Distributed deep learning using synchronous stochastic gradient descent"
(arXiv:1602.06709), section 3.3 (hybrid parallelism): the P ranks form P / G groups of G
consecutive ranks; inside a group each rank holds a slice of a fully connected layer's output
neurons and the group exchanges activations and output gradients (the layer does that:
``InnerProductLayer.set_model_parallel``, :mod:`caffe_engine.layers.model_parallel`); across
groups the slices are data parallel. This module is the training side, driven by
:class:`~.data_parallel.DataParallel`:

- which InnerProduct layers are hybrid, with which G (:func:`choose_groups`): the layer's
  engine-only ``inner_product_param.parallel`` ("data", "auto" or G; default "data"), or the
  ``--fc_parallel`` flag for every layer; ``auto`` asks the balance equations
  (:func:`.hybrid_cost.best_group`) with the measured link and GEMM rate, rank 0 deciding;
- the slicing (:class:`HybridLayers`): after rank 0's full weights are broadcast, each hybrid
  layer of the train net and the same-named layers of the test nets get their group's
  collectives (:class:`.model_parallel.HybridGroups`); the nets' ``learnable_params`` /
  ``params`` then hold the slices, the test nets share the train net's slices (Caffe's
  ShareTrainedLayersWith), and the solver's history (made after ``on_nets_ready``) has the
  slices' shapes;
- the gradients: the slices are kept out of the world allreduce; their diffs are summed over the
  P / G replicas of the slice (``HybridGroups.replicas``, launched from the same after-backward
  hook as the world buckets) and scaled by 1 / P: each rank's loss is normalised by its own
  batch, so this is the mean over P ranks that data parallelism takes (G = P: no weight
  traffic at all);
- the full blobs (:meth:`HybridLayers.full_view`): for a snapshot or a restore the solver asks
  for them (``solver.param_slicing``, a collective on every rank); the layers and the history
  then hold gathered full blobs, so ``.caffemodel`` / ``.solverstate`` are ordinary Caffe
  files, and a restore at any P and G slices what it read.
"""
import contextlib
import re
import time

import numpy

from .. import backend, environment, kernels
from ..blob import Blob
from ..errors import CaffeError
from ..layers import model_parallel as mp
from .buckets import GradientSync

f32 = numpy.float32
_DIGITS = re.compile(r"[0-9]+")


def parse_parallel(value, where):
    """A ``parallel`` setting: ``"data"`` -> 1, ``"auto"``, or G written in digits -> int G.

    Args:
        value: the text (the layer's field or ``--fc_parallel``).
        where: names the setting in the message.

    Returns:
        int G >= 1, or the string ``"auto"``.

    Raises:
        CaffeError: anything else, G = 0 included (one line).
    """
    text = str(value)
    if text == "data":
        return 1
    if text == "auto":
        return "auto"
    if _DIGITS.fullmatch(text) and int(text) >= 1:
        return int(text)
    raise CaffeError(f"{where} must be data, auto or a group size G >= 1 in digits, got "
                     f"'{text[:40]}'")


def check_divides(group, world_size, where):
    """Raise unless group size ``group`` divides ``world_size`` (PCL-DNN's P / G groups).

    Raises:
        CaffeError: one line naming ``where``.
    """
    if group != "auto" and int(world_size) % int(group):
        raise CaffeError(f"{where}: group size {group} does not divide the {world_size} "
                         f"ranks of this run")


def _layer_shape(net, index):
    """(K, N, M) of InnerProduct layer ``index``: inputs, outputs, bottom rows on this rank."""
    layer = net.layers[index]
    ip = layer.param.inner_product_param
    bottom = net.bottom_vecs[index][0]
    axis = bottom.canonical_axis(ip.axis)
    return bottom.count_range(axis), int(ip.num_output), bottom.count_range(0, axis)


def _gemm_flops(layer, m, reps=3):
    """FLOP/s of InnerProduct ``layer``'s forward product on this rank: its kernel set's
    ``matmul`` of an (M, K) float32 input by its own weights, on the weights' device (CuPy's
    GEMM on a GPU run), median of ``reps`` runs after one untimed."""
    weight = layer.blobs[0].data
    xp = backend.get_array_module(weight)
    transpose = layer.param.inner_product_param.transpose
    k, n = weight.shape if transpose else weight.shape[::-1]
    x, y = xp.ones((m, k), f32), xp.empty((m, n), f32)
    ks = kernels.for_array(weight)
    runs = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        ks.matmul(x, weight, y, trans_b=not transpose)
        float(y[0, 0])              # the product has finished (a device sync on a GPU)
        runs.append(time.perf_counter() - t0)
    return 2.0 * m * k * n / max(float(numpy.median(runs[1:])), 1e-9)


def _link(comm):
    """The Hockney link of ``comm``: ``CAFFE_COST_MODEL``'s file, else measured (collective)."""
    from .hybrid_cost import Link
    path = environment.read("CAFFE_COST_MODEL")
    if path:
        from .allreduce_cost import AlphaBetaModel
        return Link.from_model(AlphaBetaModel.load(path), comm.name.split(":")[0])
    from .bucket_plan import measure_alpha_beta
    alpha, beta = measure_alpha_beta(comm)
    return Link.from_allreduce(alpha, beta, comm.name, comm.size)


def choose_groups(net, comm, override=None):
    """The group size of each InnerProduct layer of ``net`` that is hybrid in this run.

    Reads each layer's ``inner_product_param.parallel`` (default "data"), or ``override``
    (``--fc_parallel``) for every layer. ``auto``: :func:`.hybrid_cost.best_group` for the
    layer's K, N and M with the link (``CAFFE_COST_MODEL``'s file, else measured: collective)
    and this rank's GEMM rate; rank 0's choices are then everybody's (collective: the link's
    measure and one allgather). Without ``auto`` nothing is communicated: the caller checks
    that every rank chose alike (:func:`.distributed.check_same_config`).

    Args:
        net: the train Net (built, its bottoms shaped).
        comm: the world communicator (``size``, ``name``, ``allgather_object``...).
        override: None, or the flag's text.

    Returns:
        dict layer name -> G, for the layers with G > 1 only (empty for one rank).

    Raises:
        CaffeError: a bad setting, or G not dividing P (one line naming the layer or flag).
    """
    size = comm.size
    where_flag = "--fc_parallel"
    settings = {}
    for i, layer in enumerate(net.layers):
        if layer.type != "InnerProduct":
            continue
        name = net.layer_names[i]
        where = where_flag if override is not None else \
            f"layer '{name}': inner_product_param.parallel"
        value = override if override is not None else layer.param.inner_product_param.parallel
        group = parse_parallel(value, where)
        if size > 1 or override is not None:      # one process ignores the layers' field
            check_divides(group, size, where)
        settings[name] = (i, group)
    if size == 1:
        return {}
    chosen = {}
    link = None
    auto = any(group == "auto" for _, group in settings.values())
    for name, (i, group) in settings.items():
        if group == "auto":
            from .hybrid_cost import best_group, divisors
            link = _link(comm) if link is None else link      # collective: every rank
            if comm.rank != 0:
                continue            # rank 0's choice is everybody's (the allgather below)
            k, n, m = _layer_shape(net, i)
            group = best_group(k, n, m, size, link, comm.name, _gemm_flops(net.layers[i], m))
            if group > n:       # a slice per rank needs N >= G
                group = max(g for g in divisors(size) if g <= n)
        if group > 1:
            chosen[name] = int(group)
    return comm.allgather_object(chosen)[0] if auto else chosen


class ParamSubset:
    """A net seen through some of its learnable params (for :class:`~.buckets.GradientSync`,
    the bucket planner and the sync check): ``learnable_params`` is the subset, everything else
    is the net's."""

    def __init__(self, net, params):
        self._net = net
        self.learnable_params = list(params)

    def __getattr__(self, name):
        return getattr(self._net, name)


def _replace_params(net, index, old_blobs):
    """After layer ``index`` of ``net`` swapped its blobs for slices: the net's
    ``learnable_params`` and ``params`` hold the new Blobs (same positions)."""
    layer = net.layers[index]
    for old, new in zip(old_blobs, layer.blobs):
        for k, blob in enumerate(net.learnable_params):
            if blob is old:
                net.learnable_params[k] = new
    net.params[net.layer_names[index]] = layer.blobs


def _slice_layer(net, index, collectives):
    """``set_model_parallel`` on layer ``index`` of ``net`` and the net's lists updated.

    Raises:
        CaffeError: a param shared by name (``param { name: ... }``): its sharers would keep
            the full blob.
    """
    layer = net.layers[index]
    shared = [spec.name for spec in layer.param.param if spec.name]
    if shared:
        raise CaffeError(f"layer '{net.layer_names[index]}': a hybrid InnerProduct cannot share "
                         f"its params by name ('{shared[0]}'); make it parallel: \"data\"")
    old = list(layer.blobs)
    layer.set_model_parallel(collectives)
    _replace_params(net, index, old)


class SlicedParam:
    """One sliced learnable param of the train net: ``layer``, ``which`` ("weight" | "bias"),
    ``index`` in ``net.learnable_params``, its ``groups`` (:class:`HybridGroups`)."""

    def __init__(self, layer, which, index, groups):
        self.layer, self.which, self.index, self.groups = layer, which, index, groups

    @property
    def transpose(self):
        return bool(self.layer.param.inner_product_param.transpose)

    def gather(self, part):
        """The full array of ``part`` (this rank's slice, data/diff/history; collective over
        the group)."""
        return mp.gather_param(self.groups.collectives, backend.to_numpy(part),
                               self.transpose, self.which)

    def slice(self, full):
        """This rank's slice of the full array ``full`` (float32 ndarray)."""
        group = self.groups.collectives
        return mp.slice_param(numpy.asarray(full, f32), self.layer.full_num_output,
                              group.size, group.rank, self.transpose, self.which)


class HybridLayers:
    """The hybrid InnerProduct layers of one data-parallel solver: groups, slices, gradient sync
    over the replicas, full views; the solver's ``param_slicing``.

    Built in :meth:`~.data_parallel.DataParallel.on_nets_ready` (collective: every rank builds
    the same groups in the same order), after rank 0's full weights were broadcast and before
    the solver makes its history.

    Args:
        solver: the solver (its ``net`` and ``test_nets`` built).
        comm: the world communicator.
        chosen: layer name -> G > 1 (:func:`choose_groups`), the same on every rank.
        bucket_mb: the replicas' gradient bucket cap in MiB (as the world's; "auto": 25).

    Attributes:
        groups: G -> :class:`~.model_parallel.HybridGroups`.
        sliced: the :class:`SlicedParam` of the train net, in ``learnable_params`` order.
        plain: the train net seen through its unsliced params (:class:`ParamSubset`): what the
            world allreduce and its planner get.
        syncs: G -> :class:`~.buckets.GradientSync` (op "sum") of that G's slices over
            ``groups[G].replicas``.

    Raises:
        CaffeError: a hybrid layer sharing params by name; what the layers refuse.
    """

    def __init__(self, solver, comm, chosen, bucket_mb=25.0):
        from .model_parallel import HybridGroups
        net = solver.net
        self.size = comm.size
        self.groups = {g: HybridGroups(comm, g) for g in sorted(set(chosen.values()))}
        for i, name in enumerate(net.layer_names):
            if name in chosen:
                _slice_layer(net, i, self.groups[chosen[name]].collectives)
        self.sliced = []
        for i, name in enumerate(net.layer_names):
            if name in chosen:
                for j, blob in enumerate(net.layers[i].blobs):
                    k = next(k for k, b in enumerate(net.learnable_params) if b is blob)
                    self.sliced.append(SlicedParam(net.layers[i], "weight" if j == 0 else "bias",
                                                   k, self.groups[chosen[name]]))
        self.sliced.sort(key=lambda sp: sp.index)
        self._slice_test_nets(solver, chosen)
        sliced_ids = {sp.index for sp in self.sliced}
        self.plain = ParamSubset(net, [b for k, b in enumerate(net.learnable_params)
                                       if k not in sliced_ids])
        mb = 25.0 if bucket_mb == "auto" else bucket_mb
        self.syncs = {g: GradientSync(self._subset(net, g), groups.replicas, bucket_mb=mb,
                                      op="sum") for g, groups in self.groups.items()}
        net.after_backward(self.on_layer_backward_done, sees_blobs=False)

    def close(self):
        """Free the groups' and replicas' communicators (collective over the world)."""
        for groups in self.groups.values():
            groups.close()
        self.groups = {}

    def _subset(self, net, group):
        """The train net seen through the slices of the layers of group size ``group``."""
        return ParamSubset(net, [net.learnable_params[sp.index] for sp in self.sliced
                                 if sp.groups.collectives.size == group])

    def _slice_test_nets(self, solver, chosen):
        """The test nets' layers of the hybrid layers' names sliced alike, then sharing the
        train net's slices (test outputs equal one process's)."""
        for test_net in solver.test_nets:
            for i, name in enumerate(test_net.layer_names):
                if name in chosen and test_net.layers[i].type == "InnerProduct":
                    _slice_layer(test_net, i, self.groups[chosen[name]].collectives)
            test_net.share_trained_layers_with(solver.net)

    def describe(self, net):
        """``ip1 G=2, ip2 G=4``: the hybrid layers for the summary line."""
        names = {id(sp.layer): sp for sp in self.sliced}
        return ", ".join(f"{name} G={names[id(layer)].groups.collectives.size}"
                         for name, layer in zip(net.layer_names, net.layers)
                         if id(layer) in names)

    # -- every iteration ------------------------------------------------------------------
    def on_layer_backward_done(self, layer_index):
        """Launch the replicas' buckets backward has finished (after-backward hook)."""
        for sync in self.syncs.values():
            sync.on_layer_backward_done(layer_index)

    def begin(self):
        """Arm the replicas' buckets for the last pass of the iteration."""
        for sync in self.syncs.values():
            sync.begin()

    def finish(self, net):
        """The slices' diffs summed over their replicas and scaled by 1 / P (the mean over the
        P ranks, each rank's loss being normalised by its own batch; PCL-DNN section 3.3)."""
        for sync in self.syncs.values():
            sync.finish()
        scale = f32(1.0 / self.size)
        for sp in self.sliced:
            net.learnable_params[sp.index].diff *= scale

    def check_in_sync(self, net, iteration=None):
        """``--debug_sync`` for the slices: bitwise equal within each slice's replicas."""
        from . import distributed
        for group, groups in self.groups.items():
            distributed.check_params_in_sync(self._subset(net, group), groups.replicas,
                                             iteration=iteration)

    # -- full blobs (snapshots and restores) ------------------------------------------------
    def _gather_all(self, solver):
        """Full arrays of every slice: data (and diff with ``snapshot_diff``) per sliced param,
        and the history's (collective, in the same order on every rank)."""
        net = solver.net
        with_diff = bool(solver.param.snapshot_diff)
        data, diff = [], []
        for sp in self.sliced:
            blob = net.learnable_params[sp.index]
            data.append(sp.gather(blob.data))
            diff.append(sp.gather(blob.diff) if with_diff else None)
        history = getattr(solver, "history", None) or []
        n = len(net.learnable_params)
        hist = {}
        for s in range(len(history) // n if n else 0):
            for sp in self.sliced:
                hist[s * n + sp.index] = sp.gather(history[s * n + sp.index].data)
        return data, diff, hist

    @staticmethod
    def _full_blob(data, diff=None):
        blob = Blob(data.shape)
        blob.data[...] = data
        if diff is not None:
            blob.diff[...] = diff
        return blob

    @contextlib.contextmanager
    def full_view(self, solver, write_back=False):
        """Within the block the train net's hybrid layers hold full Blobs (gathered) and so does
        ``solver.history``: a snapshot writes ordinary Caffe files; a restore reads into full
        blobs. With ``write_back`` the full values are sliced back into this rank's blobs (in
        place: the test nets sharing them see them) when the block ends. Collective: every
        rank enters it at the same point.

        Shapes: full weight (N, K) ((K, N) with ``transpose``), bias (N,); float32.
        """
        data, diff, hist = self._gather_all(solver)
        layers = {}
        for sp, full, full_diff in zip(self.sliced, data, diff):
            blobs = layers.setdefault(id(sp.layer), (sp.layer, list(sp.layer.blobs)))[1]
            j = 0 if sp.which == "weight" else 1
            blobs[j] = self._full_blob(full, full_diff)
        saved_blobs = {key: layer.blobs for key, (layer, _) in layers.items()}
        history = getattr(solver, "history", None)
        saved_history = list(history) if history is not None else None
        for layer, blobs in layers.values():
            layer.blobs = blobs
        for k, full in hist.items():
            history[k] = self._full_blob(full)
        try:
            yield
            if write_back:
                self._write_back(solver, layers, saved_blobs, saved_history)
        finally:
            for key, (layer, _) in layers.items():
                layer.blobs = saved_blobs[key]
            if history is not None:
                history[:] = saved_history

    def _write_back(self, solver, layers, saved_blobs, saved_history):
        """Slice the full blobs of :meth:`full_view` into this rank's blobs and history."""
        n = len(solver.net.learnable_params)
        for sp in self.sliced:
            layer, full_blobs = layers[id(sp.layer)]
            j = 0 if sp.which == "weight" else 1
            target = saved_blobs[id(sp.layer)][j]
            xp = backend.get_array_module(target.data)
            target.data[...] = xp.asarray(sp.slice(backend.to_numpy(full_blobs[j].data)))
            if saved_history is not None:
                for s in range(len(saved_history) // n):
                    h = saved_history[s * n + sp.index]
                    full = backend.to_numpy(solver.history[s * n + sp.index].data)
                    h.data[...] = backend.get_array_module(h.data).asarray(sp.slice(full))
