"""Upgrading legacy net and solver definitions on read, as Caffe does.

Caffe: src/caffe/util/upgrade_proto.cpp (master). A NetParameter goes through, in this order,
each step only when its ``net_needs_*`` test says so (Caffe's UpgradeNetAsNeeded):

1. **V0 -> V1** (``layers { layer { type: "conv" ... } }``): ``padding`` layers are folded into
   the ``pad`` of the conv/pool layer that consumes them, then each V0 layer becomes a
   V1LayerParameter: the type string maps to the V1 enum, and the flat per-layer fields
   (``num_output``, ``kernelsize``, ``meanfile`` ...) move into their ``*_param`` message.
2. **Data transformation** (V1 DATA / IMAGE_DATA / WINDOW_DATA layers): ``scale``,
   ``mean_file``, ``crop_size`` and ``mirror`` in the data layer's own parameter move to
   ``transform_param``.
3. **V1 -> V2** (``layers { type: CONVOLUTION }`` -> ``layer { type: "Convolution" }``): enum
   types become strings, ``blobs_lr`` / ``weight_decay`` / ``param`` (names) /
   ``blob_share_mode`` become ``param { lr_mult decay_mult name share_mode }``, include/exclude,
   loss weights, blobs and every ``*_param`` are carried over.
4. **Input fields**: net-level ``input`` with ``input_shape`` or ``input_dim`` becomes an
   ``Input`` layer named ``input`` placed first; ``input`` alone (old .caffemodel files) is
   simply dropped.
5. **BatchNorm**: a ``BatchNorm`` layer declaring exactly three ``param`` specs (the old way of
   freezing its statistics) gets ``lr_mult: 0`` and ``decay_mult: 0`` on all three, other
   fields (names for sharing) kept.

A solver's ``solver_type`` enum becomes the ``type`` string (UpgradeSolverAsNeeded); when a
solver file is read for training, ``snapshot_prefix`` is also defaulted
(UpgradeSnapshotPrefixProperty).

Caffe's log lines are written to the engine's logger with the same text and severity and can be
collected with the ``notes`` argument. Where Caffe aborts (an unknown V0 layer type, a padding
layer feeding anything but one conv/pool input, a net with both ``layer`` and ``layers``
entries), :class:`CaffeError` is raised; where Caffe logs an error and continues ("had one or
more problems"), so do we and the ``*_as_needed`` functions return False.
"""
import os

from ..errors import CaffeError
from ..log import logger
from ..proto import caffe_pb2

_V1 = caffe_pb2.V1LayerParameter
_V0 = caffe_pb2.V0LayerParameter

_SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}

#: V1 layer type enum -> V2 type string (Caffe's UpgradeV1LayerType).
V1_TYPE_NAMES = {
    _V1.NONE: "", _V1.ABSVAL: "AbsVal", _V1.ACCURACY: "Accuracy", _V1.ARGMAX: "ArgMax",
    _V1.BNLL: "BNLL", _V1.CONCAT: "Concat", _V1.CONTRASTIVE_LOSS: "ContrastiveLoss",
    _V1.CONVOLUTION: "Convolution", _V1.DECONVOLUTION: "Deconvolution", _V1.DATA: "Data",
    _V1.DROPOUT: "Dropout", _V1.DUMMY_DATA: "DummyData", _V1.EUCLIDEAN_LOSS: "EuclideanLoss",
    _V1.ELTWISE: "Eltwise", _V1.EXP: "Exp", _V1.FLATTEN: "Flatten", _V1.HDF5_DATA: "HDF5Data",
    _V1.HDF5_OUTPUT: "HDF5Output", _V1.HINGE_LOSS: "HingeLoss", _V1.IM2COL: "Im2col",
    _V1.IMAGE_DATA: "ImageData", _V1.INFOGAIN_LOSS: "InfogainLoss",
    _V1.INNER_PRODUCT: "InnerProduct", _V1.LRN: "LRN", _V1.MEMORY_DATA: "MemoryData",
    _V1.MULTINOMIAL_LOGISTIC_LOSS: "MultinomialLogisticLoss", _V1.MVN: "MVN",
    _V1.POOLING: "Pooling", _V1.POWER: "Power", _V1.RELU: "ReLU", _V1.SIGMOID: "Sigmoid",
    _V1.SIGMOID_CROSS_ENTROPY_LOSS: "SigmoidCrossEntropyLoss", _V1.SILENCE: "Silence",
    _V1.SOFTMAX: "Softmax", _V1.SOFTMAX_LOSS: "SoftmaxWithLoss", _V1.SPLIT: "Split",
    _V1.SLICE: "Slice", _V1.TANH: "TanH", _V1.WINDOW_DATA: "WindowData",
    _V1.THRESHOLD: "Threshold",
}

#: V0 layer type string -> V1 layer type enum (Caffe's UpgradeV0LayerType).
V0_TYPES = {
    "accuracy": _V1.ACCURACY, "bnll": _V1.BNLL, "concat": _V1.CONCAT, "conv": _V1.CONVOLUTION,
    "data": _V1.DATA, "dropout": _V1.DROPOUT, "euclidean_loss": _V1.EUCLIDEAN_LOSS,
    "flatten": _V1.FLATTEN, "hdf5_data": _V1.HDF5_DATA, "hdf5_output": _V1.HDF5_OUTPUT,
    "im2col": _V1.IM2COL, "images": _V1.IMAGE_DATA, "infogain_loss": _V1.INFOGAIN_LOSS,
    "innerproduct": _V1.INNER_PRODUCT, "lrn": _V1.LRN,
    "multinomial_logistic_loss": _V1.MULTINOMIAL_LOGISTIC_LOSS, "pool": _V1.POOLING,
    "relu": _V1.RELU, "sigmoid": _V1.SIGMOID, "softmax": _V1.SOFTMAX,
    "softmax_loss": _V1.SOFTMAX_LOSS, "split": _V1.SPLIT, "tanh": _V1.TANH,
    "window_data": _V1.WINDOW_DATA,
}

# V0 field -> {V0 layer type: (V1 sub-message, field in it)}. Fields marked with a leading "+"
# are repeated in the target (appended), others set. A V0 field set on a layer type not listed
# is reported as Caffe does ("Unknown parameter X for layer type Y") and makes the upgrade
# incomplete. ``None`` as the type key: any layer type (transformation fields).
_V0_FIELDS = {
    "num_output": {"conv": ("convolution_param", "num_output"),
                   "innerproduct": ("inner_product_param", "num_output")},
    "biasterm": {"conv": ("convolution_param", "bias_term"),
                 "innerproduct": ("inner_product_param", "bias_term")},
    "weight_filler": {"conv": ("convolution_param", "weight_filler"),
                      "innerproduct": ("inner_product_param", "weight_filler")},
    "bias_filler": {"conv": ("convolution_param", "bias_filler"),
                    "innerproduct": ("inner_product_param", "bias_filler")},
    "pad": {"conv": ("convolution_param", "+pad"), "pool": ("pooling_param", "pad")},
    "kernelsize": {"conv": ("convolution_param", "+kernel_size"),
                   "pool": ("pooling_param", "kernel_size")},
    "group": {"conv": ("convolution_param", "group")},
    "stride": {"conv": ("convolution_param", "+stride"), "pool": ("pooling_param", "stride")},
    "pool": {"pool": ("pooling_param", "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {"data": ("data_param", "source"), "hdf5_data": ("hdf5_data_param", "source"),
               "images": ("image_data_param", "source"),
               "window_data": ("window_data_param", "source"),
               "infogain_loss": ("infogain_loss_param", "source")},
    "scale": {None: ("transform_param", "scale")},
    "meanfile": {None: ("transform_param", "mean_file")},
    "batchsize": {"data": ("data_param", "batch_size"),
                  "hdf5_data": ("hdf5_data_param", "batch_size"),
                  "images": ("image_data_param", "batch_size"),
                  "window_data": ("window_data_param", "batch_size")},
    "cropsize": {None: ("transform_param", "crop_size")},
    "mirror": {None: ("transform_param", "mirror")},
    "rand_skip": {"data": ("data_param", "rand_skip"),
                  "images": ("image_data_param", "rand_skip")},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", "new_height")},
    "new_width": {"images": ("image_data_param", "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {"window_data": ("window_data_param", "fg_threshold")},
    "det_bg_threshold": {"window_data": ("window_data_param", "bg_threshold")},
    "det_fg_fraction": {"window_data": ("window_data_param", "fg_fraction")},
    "det_context_pad": {"window_data": ("window_data_param", "context_pad")},
    "det_crop_mode": {"window_data": ("window_data_param", "crop_mode")},
    "hdf5_output_param": {"hdf5_output": ("hdf5_output_param", None)},
}
# Caffe's messages name a few fields differently from the V0 field.
_V0_FIELD_LABEL = {"shuffle_images": "shuffle"}

#: V1 data layer type -> its parameter field, for the transformation-field upgrade.
_DATA_LAYER_PARAMS = {_V1.DATA: "data_param", _V1.IMAGE_DATA: "image_data_param",
                      _V1.WINDOW_DATA: "window_data_param"}
_TRANSFORM_FIELDS = ("scale", "mean_file", "crop_size", "mirror")

#: Every ``*_param`` message of V1LayerParameter; each is copied to the same field of
#: LayerParameter (Caffe's UpgradeV1LayerParameter copies exactly these).
_V1_PARAM_FIELDS = tuple(f.name for f in _V1.DESCRIPTOR.fields
                         if f.name.endswith("_param") and f.message_type is not None)


class _Log:
    """Caffe's log lines for one upgrade: sent to the logger and kept in ``notes`` if given."""

    def __init__(self, notes):
        self.notes = notes

    def _emit(self, level, message):
        logger.log(level, "%s", message, stacklevel=3)
        if self.notes is not None:
            self.notes.append(message)

    def info(self, message):
        self._emit(20, message)

    def warning(self, message):
        self._emit(30, message)

    def error(self, message):
        self._emit(40, message)


# --------------------------------------------------------------------------------------------
# What needs upgrading
# --------------------------------------------------------------------------------------------
def net_needs_v0_to_v1_upgrade(param):
    """Whether any ``layers`` entry holds a V0 ``layer`` (Caffe's NetNeedsV0ToV1Upgrade)."""
    return any(v1.HasField("layer") for v1 in param.layers)


def net_needs_v1_to_v2_upgrade(param):
    """Whether the net uses the V1 ``layers`` field at all (NetNeedsV1ToV2Upgrade)."""
    return len(param.layers) > 0


def net_needs_data_upgrade(param):
    """Whether a V1 data layer keeps transformation fields in its own parameter."""
    for v1 in param.layers:
        field = _DATA_LAYER_PARAMS.get(v1.type)
        if field and v1.HasField(field):
            sub = getattr(v1, field)
            if any(sub.HasField(f) for f in _TRANSFORM_FIELDS):
                return True
    return False


def net_needs_input_upgrade(param):
    """Whether the net declares net-level ``input`` fields (NetNeedsInputUpgrade)."""
    return len(param.input) > 0


def net_needs_batch_norm_upgrade(param):
    """Whether a BatchNorm layer declares exactly three param specs (NetNeedsBatchNormUpgrade)."""
    return any(lp.type == "BatchNorm" and len(lp.param) == 3 for lp in param.layer)


def net_needs_upgrade(param):
    """Whether any of the net upgrades applies (Caffe's NetNeedsUpgrade)."""
    return (net_needs_v0_to_v1_upgrade(param) or net_needs_v1_to_v2_upgrade(param)
            or net_needs_data_upgrade(param) or net_needs_input_upgrade(param)
            or net_needs_batch_norm_upgrade(param))


def needs_upgrade(param):
    """Whether a NetParameter or SolverParameter uses deprecated syntax."""
    if isinstance(param, caffe_pb2.SolverParameter):
        return solver_needs_type_upgrade(param)
    return net_needs_upgrade(param)


def solver_needs_type_upgrade(param):
    """Whether the solver uses the ``solver_type`` enum (SolverNeedsTypeUpgrade)."""
    return param.HasField("solver_type")


# --------------------------------------------------------------------------------------------
# V0 -> V1
# --------------------------------------------------------------------------------------------
def upgrade_v0_padding_layers(param):
    """A copy of ``param`` with every V0 ``padding`` layer folded into its consumer's ``pad``.

    The consumer must be a conv or pool layer with one bottom, and the padding layer must have
    one bottom and one top (Caffe's UpgradeV0PaddingLayers).

    Raises:
        CaffeError: a bottom no earlier layer or input produced, or padding feeding anything
            else.
    """
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layers[:]
    last_top = {name: -1 for name in param.input}
    for i, conn in enumerate(param.layers):
        v0 = conn.layer
        if v0.type != "padding":
            out.layers.add().CopyFrom(conn)
        for j, blob in enumerate(conn.bottom):
            if blob not in last_top:
                raise CaffeError(f"Unknown blob input {blob} to layer {j}")
            source_index = last_top[blob]
            if source_index == -1:
                continue
            source = param.layers[source_index]
            if source.layer.type != "padding":
                continue
            if v0.type not in ("conv", "pool"):
                raise CaffeError(f"Padding layer input to non-convolutional / non-pooling "
                                 f"layer type {v0.type}")
            if len(conn.bottom) != 1:
                raise CaffeError("Conv Layer takes a single blob as input.")
            if len(source.bottom) != 1:
                raise CaffeError("Padding Layer takes a single blob as input.")
            if len(source.top) != 1:
                raise CaffeError("Padding Layer produces a single blob as output.")
            target = out.layers[len(out.layers) - 1]
            target.layer.pad = source.layer.pad
            target.bottom[j] = source.bottom[0]
        for blob in conn.top:
            last_top[blob] = i
    return out


def upgrade_v0_layer(connection, log=None):
    """One V0 layer (a V1LayerParameter holding ``layer``) as a V1LayerParameter.

    Returns:
        (V1LayerParameter, fully_compatible).

    Raises:
        CaffeError: unknown V0 layer type.
    """
    log = log or _Log(None)
    out = _V1()
    out.bottom.extend(connection.bottom)
    out.top.extend(connection.top)
    ok = True
    if not connection.HasField("layer"):
        return out, ok
    v0 = connection.layer
    if v0.HasField("name"):
        out.name = v0.name
    kind = v0.type
    if v0.HasField("type"):
        if kind not in V0_TYPES:
            raise CaffeError(f"Unknown layer name: {kind}")
        out.type = V0_TYPES[kind]
    for bp in v0.blobs:
        out.blobs.add().CopyFrom(bp)
    out.blobs_lr.extend(v0.blobs_lr)
    out.weight_decay.extend(v0.weight_decay)
    for field, targets in _V0_FIELDS.items():
        if not v0.HasField(field):
            continue
        target = targets.get(None) or targets.get(kind)
        if target is None:
            log.error(f"Unknown parameter {_V0_FIELD_LABEL.get(field, field)} "
                      f"for layer type {kind}")
            ok = False
            continue
        message_name, target_field = target
        value = getattr(v0, field)
        sub = getattr(out, message_name)
        if field == "pool":
            value = {_V0.MAX: caffe_pb2.PoolingParameter.MAX,
                     _V0.AVE: caffe_pb2.PoolingParameter.AVE,
                     _V0.STOCHASTIC: caffe_pb2.PoolingParameter.STOCHASTIC}.get(value)
            if value is None:
                log.error(f"Unknown pool method {getattr(v0, field)}")
                ok = False
                continue
        if target_field is None:                      # a whole message
            sub.CopyFrom(value)
        elif target_field.startswith("+"):            # repeated scalar
            getattr(sub, target_field[1:]).append(value)
        elif hasattr(value, "CopyFrom"):              # sub-message (fillers)
            getattr(sub, target_field).CopyFrom(value)
        else:
            setattr(sub, target_field, value)
    return out, ok


def upgrade_v0_net(param, log=None):
    """The V0 net ``param`` as a V1 net (Caffe's UpgradeV0Net).

    Only the name, the layers, ``input``, ``input_dim`` and ``force_backward`` are carried over,
    as Caffe does.

    Returns:
        (NetParameter, fully_compatible).
    """
    padded = upgrade_v0_padding_layers(param)
    out = caffe_pb2.NetParameter()
    if padded.HasField("name"):
        out.name = padded.name
    ok = True
    for conn in padded.layers:
        layer, layer_ok = upgrade_v0_layer(conn, log)
        out.layers.add().CopyFrom(layer)
        ok &= layer_ok
    out.input.extend(padded.input)
    out.input_dim.extend(padded.input_dim)
    if padded.HasField("force_backward"):
        out.force_backward = padded.force_backward
    return out, ok


# --------------------------------------------------------------------------------------------
# Data transformation fields
# --------------------------------------------------------------------------------------------
def upgrade_net_data_transformation(param):
    """Move V1 data layers' scale/mean_file/crop_size/mirror into ``transform_param`` (in place)."""
    for v1 in param.layers:
        field = _DATA_LAYER_PARAMS.get(v1.type)
        if field is None:
            continue
        sub = getattr(v1, field)
        for name in _TRANSFORM_FIELDS:
            if sub.HasField(name):
                setattr(v1.transform_param, name, getattr(sub, name))
                sub.ClearField(name)
    return param


# --------------------------------------------------------------------------------------------
# V1 -> V2
# --------------------------------------------------------------------------------------------
def upgrade_v1_layer(v1, log=None):
    """One V1LayerParameter as a LayerParameter (Caffe's UpgradeV1LayerParameter).

    Returns:
        (LayerParameter, fully_compatible).
    """
    log = log or _Log(None)
    out = caffe_pb2.LayerParameter()
    ok = True
    out.bottom.extend(v1.bottom)
    out.top.extend(v1.top)
    if v1.HasField("name"):
        out.name = v1.name
    for rule in v1.include:
        out.include.add().CopyFrom(rule)
    for rule in v1.exclude:
        out.exclude.add().CopyFrom(rule)
    if v1.HasField("type"):
        if v1.type not in V1_TYPE_NAMES:
            raise CaffeError(f"Unknown V1LayerParameter layer type: {v1.type}")
        out.type = V1_TYPE_NAMES[v1.type]
    for bp in v1.blobs:
        out.blobs.add().CopyFrom(bp)

    def spec(i):
        while len(out.param) <= i:
            out.param.add()
        return out.param[i]

    for i, name in enumerate(v1.param):
        spec(i).name = name
    for i, mode in enumerate(v1.blob_share_mode):
        spec(i).share_mode = (caffe_pb2.ParamSpec.PERMISSIVE if mode == _V1.PERMISSIVE
                              else caffe_pb2.ParamSpec.STRICT)
    for i, lr in enumerate(v1.blobs_lr):
        spec(i).lr_mult = lr
    for i, decay in enumerate(v1.weight_decay):
        spec(i).decay_mult = decay
    out.loss_weight.extend(v1.loss_weight)
    for field in _V1_PARAM_FIELDS:
        if v1.HasField(field):
            getattr(out, field).CopyFrom(getattr(v1, field))
    if v1.HasField("layer"):
        log.error("Input NetParameter has V0 layer -- ignoring.")
        ok = False
    return out, ok


def upgrade_v1_net(param, log=None, path="<net>"):
    """The V1 net ``param`` (``layers``) as a V2 net (``layer``); Caffe's UpgradeV1Net.

    Everything but the layers is kept.

    Returns:
        (NetParameter, fully_compatible).

    Raises:
        CaffeError: ``param`` has ``layer`` entries beside its ``layers`` (a net mixing both
            formats), naming ``path``; Caffe master's UpgradeV1Net refuses it with LOG(FATAL)
            (older Caffe dropped the ``layer`` entries with an error and went on).
    """
    log = log or _Log(None)
    ok = True
    if len(param.layer):
        raise CaffeError(f"{path}: Refusing to upgrade inconsistent NetParameter input; the "
                         f"definition includes both 'layer' and 'layers' fields "
                         f"({len(param.layer)} 'layer', {len(param.layers)} 'layers'). Manually "
                         f"switch the definition to 'layer' format to continue.")
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layers[:]
    del out.layer[:]
    for i, v1 in enumerate(param.layers):
        layer, layer_ok = upgrade_v1_layer(v1, log)
        out.layer.add().CopyFrom(layer)
        if not layer_ok:
            log.error(f"Upgrade of input layer {i} failed.")
            ok = False
    return out, ok


# --------------------------------------------------------------------------------------------
# Input fields, BatchNorm
# --------------------------------------------------------------------------------------------
def upgrade_net_input(param):
    """Turn net-level input declarations into a leading ``Input`` layer (in place).

    ``input`` with ``input_shape`` (one per input) or ``input_dim`` (four per input) becomes a
    layer ``input`` of type ``Input`` at position 0; ``input`` alone, as old .caffemodel files
    carry it, is just removed (Caffe's UpgradeNetInput).

    Raises:
        CaffeError: the number of shapes or dims does not match the inputs (Caffe would read
            past the end of the list), or both ``input_shape`` and ``input_dim`` are given
            (Caffe's Net::Init of the input-field era refused that: "Must specify either
            input_shape OR deprecated input_dim, not both."; the later upgrade silently
            ignores the dims).
    """
    names = list(param.input)
    shapes = list(param.input_shape)
    dims = list(param.input_dim)
    if shapes and dims:
        raise CaffeError("Must specify either input_shape OR deprecated input_dim, not both.")
    if shapes or dims:
        layer = caffe_pb2.LayerParameter(name="input", type="Input")
        if shapes and len(shapes) < len(names):
            raise CaffeError(f"net declares {len(names)} input(s) but {len(shapes)} input_shape(s)")
        if not shapes and len(dims) < 4 * len(names):
            raise CaffeError(f"net declares {len(names)} input(s) but {len(dims)} input_dim "
                             "values (4 per input expected)")
        for i, name in enumerate(names):
            layer.top.append(name)
            shape = layer.input_param.shape.add()
            if shapes:
                shape.CopyFrom(shapes[i])
            else:
                shape.dim.extend(dims[4 * i:4 * i + 4])
        old = list(param.layer)
        del param.layer[:]
        param.layer.extend([layer] + old)
    param.ClearField("input")
    param.ClearField("input_shape")
    param.ClearField("input_dim")
    return param


def upgrade_net_batch_norm(param):
    """Zero lr_mult and decay_mult of BatchNorm layers that declare three param specs (in place).

    Caffe's UpgradeNetBatchNorm (master): the specs are kept (with their names, for sharing);
    only their multipliers become 0, since the statistics are not learned by the solver.
    """
    for lp in param.layer:
        if lp.type == "BatchNorm" and len(lp.param) == 3:
            for spec in lp.param:
                spec.lr_mult = 0.0
                spec.decay_mult = 0.0
    return param


# --------------------------------------------------------------------------------------------
# The whole net
# --------------------------------------------------------------------------------------------
def upgrade_net_as_needed(param, path="<net>", notes=None):
    """Apply every needed upgrade to NetParameter ``param`` in place (UpgradeNetAsNeeded).

    Args:
        param: caffe_pb2.NetParameter, read from ``path`` (named in the log lines).
        notes: optional list receiving Caffe's log lines, in order.

    Returns:
        True if every upgrade was complete; False if Caffe would have reported problems
        ("continuing anyway").

    Raises:
        CaffeError: where Caffe aborts (see module docstring).
    """
    log = _Log(notes)
    ok = True
    if net_needs_v0_to_v1_upgrade(param):
        log.info(f"Attempting to upgrade input file specified using deprecated "
                 f"V0LayerParameter: {path}")
        upgraded, step_ok = upgrade_v0_net(param, log)
        param.CopyFrom(upgraded)
        if not step_ok:
            ok = False
            log.error("Warning: had one or more problems upgrading V0NetParameter to "
                      "NetParameter (see above); continuing anyway.")
        else:
            log.info("Successfully upgraded file specified using deprecated V0LayerParameter")
        log.warning("Note that future Caffe releases will not support V0NetParameter; use "
                    "./build/tools/upgrade_net_proto_text for prototxt and "
                    "./build/tools/upgrade_net_proto_binary for model weights upgrade this "
                    "and any other net protos to the new format.")
    if net_needs_data_upgrade(param):
        log.info(f"Attempting to upgrade input file specified using deprecated "
                 f"transformation parameters: {path}")
        upgrade_net_data_transformation(param)
        log.info("Successfully upgraded file specified using deprecated data transformation "
                 "parameters.")
        log.warning("Note that future Caffe releases will only support transform_param "
                    "messages for transformation fields.")
    if net_needs_v1_to_v2_upgrade(param):
        log.info(f"Attempting to upgrade input file specified using deprecated "
                 f"V1LayerParameter: {path}")
        upgraded, step_ok = upgrade_v1_net(param, log, path)
        param.CopyFrom(upgraded)
        if not step_ok:
            ok = False
            log.error("Warning: had one or more problems upgrading V1LayerParameter (see "
                      "above); continuing anyway.")
        else:
            log.info("Successfully upgraded file specified using deprecated V1LayerParameter")
    if net_needs_input_upgrade(param):
        log.info(f"Attempting to upgrade input file specified using deprecated input fields: "
                 f"{path}")
        try:
            upgrade_net_input(param)
        except CaffeError as exc:
            raise CaffeError(f"{path}: {exc}") from None
        log.info("Successfully upgraded file specified using deprecated input fields.")
        log.warning("Note that future Caffe releases will only support input layers and not "
                    "input fields.")
    if net_needs_batch_norm_upgrade(param):
        log.info(f"Attempting to upgrade batch norm layers using deprecated params: {path}")
        upgrade_net_batch_norm(param)
        log.info("Successfully upgraded batch norm layers using deprecated params.")
    return ok


def upgrade_net(param, path="<net>", notes=None):
    """Upgrade a NetParameter read from ``path`` in place and return it (see
    :func:`upgrade_net_as_needed`; problems Caffe continues past are logged, not raised)."""
    upgrade_net_as_needed(param, path, notes)
    return param


# --------------------------------------------------------------------------------------------
# Solver
# --------------------------------------------------------------------------------------------
def upgrade_solver_type(param, log=None):
    """Replace the ``solver_type`` enum by the ``type`` string, in place (UpgradeSolverType).

    Returns:
        False (with Caffe's warning) when there was nothing to upgrade.

    Raises:
        CaffeError: both ``solver_type`` and ``type`` are given, which Caffe refuses.
    """
    log = log or _Log(None)
    if param.HasField("solver_type") and param.HasField("type"):
        raise CaffeError("Failed to upgrade solver: old solver_type field (enum) and new type "
                         "field (string) cannot be both specified in solver proto text.")
    if not param.HasField("solver_type"):
        log.error("Warning: solver type already up to date. ")
        return False
    param.type = _SOLVER_TYPE_NAMES[param.solver_type]
    param.ClearField("solver_type")
    return True


def upgrade_solver_as_needed(param, path="<solver>", notes=None):
    """Apply the solver upgrades in place (Caffe's UpgradeSolverAsNeeded); returns success."""
    log = _Log(notes)
    ok = True
    if solver_needs_type_upgrade(param):
        log.info(f"Attempting to upgrade input file specified using deprecated 'solver_type' "
                 f"field (enum)': {path}")
        if not upgrade_solver_type(param, log):
            ok = False
            log.error("Warning: had one or more problems upgrading SolverType (see above).")
        else:
            log.info("Successfully upgraded file specified using deprecated 'solver_type' "
                     "field (enum) to 'type' field (string).")
            log.warning("Note that future Caffe releases will only support 'type' field "
                        "(string) for a solver's type.")
    return ok


def upgrade_solver(param, path="<solver>", notes=None):
    """Upgrade a SolverParameter read from ``path`` for use (in place) and return it.

    The ``solver_type`` upgrade, then the ``snapshot_prefix`` default (Caffe's
    ReadSolverParamsFromTextFileOrDie).

    Raises:
        CaffeError: both ``solver_type`` and ``type`` are given.
    """
    upgrade_solver_as_needed(param, path, notes)
    upgrade_snapshot_prefix(param, path, notes)
    return param


def upgrade_snapshot_prefix(param, path, notes=None):
    """Default ``snapshot_prefix`` as Caffe does (UpgradeSnapshotPrefixProperty).

    Unset: the solver file's path without extension. A directory: that directory joined with
    the solver file's stem.
    """
    log = _Log(notes)
    stem = os.path.splitext(path)[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = stem
        log.info(f"snapshot_prefix was not specified and is set to {param.snapshot_prefix}")
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, os.path.basename(stem))
        log.info(f"snapshot_prefix was a directory and is replaced to {param.snapshot_prefix}")
    return param
