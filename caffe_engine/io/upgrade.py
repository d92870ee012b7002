"""Upgrading legacy net and solver definitions on read, as Caffe does.

Caffe: src/caffe/util/upgrade_proto.cpp. Handled here: net-level ``input``/``input_shape``/
``input_dim`` become an ``Input`` layer (UpgradeNetInput); the solver's ``solver_type`` enum
becomes the ``type`` string (UpgradeSolverType). V0/V1 layer syntax is reported as not yet
supported with a one-line error (a later change adds it).
"""
from ..errors import CaffeError
from ..proto import caffe_pb2

_SOLVER_TYPE_NAMES = {
    caffe_pb2.SolverParameter.SGD: "SGD",
    caffe_pb2.SolverParameter.NESTEROV: "Nesterov",
    caffe_pb2.SolverParameter.ADAGRAD: "AdaGrad",
    caffe_pb2.SolverParameter.RMSPROP: "RMSProp",
    caffe_pb2.SolverParameter.ADADELTA: "AdaDelta",
    caffe_pb2.SolverParameter.ADAM: "Adam",
}


def upgrade_net_input(param):
    """Move deprecated net-level input declarations into a leading ``Input`` layer (in place)."""
    if not param.input:
        return param
    layer = caffe_pb2.LayerParameter(name="input", type="Input")
    shapes = list(param.input_shape)
    dims = list(param.input_dim)
    for i, name in enumerate(param.input):
        layer.top.append(name)
        shape = layer.input_param.shape.add()
        if shapes:
            shape.CopyFrom(shapes[i] if len(shapes) > 1 else shapes[0])
        elif dims:
            shape.dim.extend(dims[4 * i:4 * i + 4])
    old = list(param.layer)
    del param.layer[:]
    param.layer.extend([layer] + old)
    param.ClearField("input")
    param.ClearField("input_shape")
    param.ClearField("input_dim")
    return param


def upgrade_net(param, path="<net>"):
    """Upgrade a NetParameter read from ``path`` in place and return it.

    Raises:
        CaffeError: V0/V1 layer syntax (``layers { ... }``), not yet supported.
    """
    if len(param.layers):
        raise CaffeError(f"{path}: legacy V1 'layers' syntax is not supported yet; "
                         "use 'layer { ... }' (Caffe's upgrade_net_proto_text)")
    return upgrade_net_input(param)


def upgrade_solver(param, path="<solver>"):
    """Map the deprecated ``solver_type`` enum onto ``type`` (in place) and return ``param``.

    Raises:
        CaffeError: both are set and disagree, as Caffe refuses.
    """
    if param.HasField("solver_type"):
        name = _SOLVER_TYPE_NAMES[param.solver_type]
        if param.HasField("type") and param.type != name:
            raise CaffeError(f"{path}: solver_type {caffe_pb2.SolverParameter.SolverType.Name(param.solver_type)} "
                             f"conflicts with type '{param.type}'")
        param.type = name
        param.ClearField("solver_type")
    upgrade_snapshot_prefix(param, path)
    return param


def upgrade_snapshot_prefix(param, path):
    """Default ``snapshot_prefix`` as Caffe does (UpgradeSnapshotPrefixProperty).

    Unset: the solver file's path without extension. A directory: that directory joined with
    the solver file's stem.
    """
    import os
    stem = os.path.splitext(path)[0]
    if not param.HasField("snapshot_prefix"):
        param.snapshot_prefix = stem
    elif os.path.isdir(param.snapshot_prefix):
        param.snapshot_prefix = os.path.join(param.snapshot_prefix, os.path.basename(stem))
