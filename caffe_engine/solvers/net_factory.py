"""The solver's nets, built from its parameters: Caffe's Solver::InitTrainNet and InitTestNets.

Caffe: src/caffe/solver.cpp. A SolverParameter names its nets in one of three ways, each net
either embedded (``*_param``) or read from a prototxt file:

* the train net: exactly one of ``train_net_param``, ``train_net``, ``net_param``, ``net``;
* the test nets: one per ``test_net_param``, then one per ``test_net`` file, then, with a
  generic ``net_param`` / ``net``, one more per remaining ``test_iter``;
* each net's NetState: the phase (TRAIN or TEST), merged with the net's own ``state``, then
  with ``train_state`` or the test net's ``test_state``.

Every net gets the weights of the solver's ``weights`` lists (Caffe's LoadNetWeights) once
built. The checks are Caffe's: a ``test_iter`` per test net, a ``test_state`` per test net or
none, a positive ``test_interval`` when there are test nets.
"""
from ..errors import CaffeError
from ..io import prototxt as pio
from ..log import logger
from ..net import Net
from ..proto import caffe_pb2


def load_net_weights(net, model_list):
    """Copy weights into ``net`` from each of the comma-separated files (Caffe's LoadNetWeights).

    ``.h5`` files are read as HDF5 weights, anything else as a binary ``.caffemodel``
    (``Net.copy_from``).
    """
    for name in model_list.split(","):
        name = name.strip()
        logger.info("Finetuning from %s", name)
        net.copy_from(name)


def inline_net_param(inline, where):
    """A copy of a NetParameter embedded in the solver (``net_param``, ``train_net_param`` or a
    ``test_net_param``), upgraded as a net file is; ``where`` (``<solver file>: <field>``)
    names it in messages.

    Nets read from files go through UpgradeNetAsNeeded (ReadNetParamsFromTextFileOrDie);
    Caffe's InitTrainNet/InitTestNets copy an embedded net as it is, so BVLC Caffe builds an
    embedded V1 (``layers {}``) net without any of its layers and trains it with loss 0.
    Here the embedded net is upgraded too, with a WARNING saying so.

    Raises:
        CaffeError: where the upgrade refuses the net (e.g. ``layer`` and ``layers`` mixed),
            naming the solver and the field.
    """
    from ..io.upgrade import net_needs_upgrade, upgrade_net
    net_param = caffe_pb2.NetParameter()
    net_param.CopyFrom(inline)
    if net_needs_upgrade(net_param):
        if len(net_param.layers):
            logger.warning("%s uses the deprecated V1 'layers' field: upgraded here (BVLC "
                           "Caffe does not upgrade a net embedded in a solver and would "
                           "build it without those layers)", where)
        upgrade_net(net_param, where)
    return net_param


def _build(param, net_param, phase, extra_state):
    """The Net of ``net_param`` in NetState ``phase`` merged with the net's own state and then
    ``extra_state`` (None or a NetState), with the solver's ``weights`` loaded."""
    state = caffe_pb2.NetState(phase=phase)
    state.MergeFrom(net_param.state)
    if extra_state is not None:
        state.MergeFrom(extra_state)
    net_param.state.CopyFrom(state)
    net = Net(net_param, state.phase, level=state.level, stages=list(state.stage))
    for model_list in param.weights:
        load_net_weights(net, model_list)
    return net


def build_train_net(param, source):
    """The train Net of SolverParameter ``param`` (Caffe's InitTrainNet); ``source`` is the
    solver file, naming embedded nets in messages.

    Raises:
        CaffeError: none or several of ``train_net_param``, ``train_net``, ``net_param``,
            ``net``; anything reading, upgrading or building the net raises.
    """
    sources = [param.HasField("train_net_param"), param.HasField("train_net"),
               param.HasField("net_param"), param.HasField("net")]
    if sum(sources) != 1:
        raise CaffeError("solver: exactly one train net must be given by one of "
                         "train_net_param, train_net, net_param, net "
                         f"({sum(sources)} given)")
    if param.HasField("train_net_param"):
        logger.info("Creating training net specified in train_net_param.")
        net_param = inline_net_param(param.train_net_param, f"{source}: train_net_param")
    elif param.HasField("train_net"):
        logger.info("Creating training net from train_net file: %s", param.train_net)
        net_param = pio.read_net_param(param.train_net)
    elif param.HasField("net_param"):
        logger.info("Creating training net specified in net_param.")
        net_param = inline_net_param(param.net_param, f"{source}: net_param")
    else:
        logger.info("Creating training net from net file: %s", param.net)
        net_param = pio.read_net_param(param.net)
    return _build(param, net_param, caffe_pb2.TRAIN, param.train_state)


def _check_test_nets(param):
    """Caffe's InitTestNets checks; returns the number of test nets of the generic net.

    Raises:
        CaffeError: a ``test_iter`` missing for a test net (or, without a generic net, one
            too many), a ``test_state`` count that is neither 0 nor the test nets', test nets
            with ``test_interval`` <= 0.
    """
    has_generic = param.HasField("net_param") or param.HasField("net")
    n_specific = len(param.test_net_param) + len(param.test_net)
    n_iter = len(param.test_iter)
    if (has_generic and n_iter < n_specific) or (not has_generic and n_iter != n_specific):
        raise CaffeError(f"solver: test_iter must be specified for each test network "
                         f"({n_iter} test_iter for {n_specific} test_net/test_net_param)")
    n_generic = (n_iter - n_specific) if has_generic else 0
    total = n_specific + n_generic
    for k, n in enumerate(param.test_iter):
        if n < 0:
            logger.warning("solver: test_iter %d (test net #%d) is negative; that test runs "
                           "no iteration, as in Caffe", n, k)
    if len(param.test_state) and len(param.test_state) != total:
        raise CaffeError("solver: test_state must be unspecified or specified once per test net "
                         f"({len(param.test_state)} test_state for {total} test nets)")
    if total and param.test_interval <= 0:
        raise CaffeError("solver: test_interval must be positive when there are test nets")
    return n_generic


def _test_net_specs(param, n_generic):
    """(kind, embedded NetParameter or None, file or None) of each test net, in Caffe's order."""
    specs = [("test_net_param", inline, None) for inline in param.test_net_param]
    specs += [("test_net file", None, path) for path in param.test_net]
    if param.HasField("net_param"):
        specs += [("net_param", param.net_param, None)] * n_generic
    else:
        specs += [("net file", None, param.net)] * n_generic
    return specs


def build_test_nets(param, source):
    """The test Nets of SolverParameter ``param``, in Caffe's order (InitTestNets); ``source``
    is the solver file, naming embedded nets in messages.

    Raises:
        CaffeError: what :func:`_check_test_nets` checks; anything reading, upgrading or
            building a net raises.
    """
    specs = _test_net_specs(param, _check_test_nets(param))
    nets = []
    for i, (kind, inline, path) in enumerate(specs):
        if inline is not None:
            net_param = inline_net_param(inline, f"{source}: {kind}")
            logger.info("Creating test net (#%d) specified by %s", i, kind)
        else:
            net_param = pio.read_net_param(path)
            logger.info("Creating test net (#%d) specified by %s: %s", i, kind, path)
        test_state = param.test_state[i] if len(param.test_state) else None
        nets.append(_build(param, net_param, caffe_pb2.TEST, test_state))
    return nets
