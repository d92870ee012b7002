"""The solver loop: test, forward/backward, display, update, snapshot — Caffe's template.

Caffe: src/caffe/solver.cpp (Solver::Init, Step, Solve, Test, Snapshot, Restore,
UpdateSmoothedLoss). The update rule itself lives in a subclass (``sgd.py``): it owns the
history blobs, ``apply_update`` and the solver-state payload. Log lines are Caffe's, word for
word, so log parsers work.

Requests from outside (``caffe train``'s SIGINT/SIGHUP handling) reach the loop through
``action_request_function``, a callable returning one of :class:`SolverAction`'s values: it is
asked after every update and before every test batch, as Caffe's ``GetRequestedAction``, and
(not in Caffe) between the forward/backward passes of an ``iter_size`` > 1 iteration, so that a
stop is not ignored for the whole of a huge one (see ``_forward_backward_passes``).

Callbacks (:class:`SolverCallback`, Caffe's ``Solver::Callback``): objects the loop calls at
fixed points: Caffe's ``on_start`` and ``on_gradients_ready``, and a few more that a
data-parallel run needs. The solver knows nothing of communicators: data parallelism is such a
callback, :class:`caffe_engine.comm.data_parallel.DataParallel` (Caffe's P2PSync / NCCL), given
to the constructor (``callbacks=``). The solver itself only knows its ``rank`` and
``solver_count`` (pycaffe's ``set_solver_rank`` / ``set_solver_count``, or what a callback sets,
as Caffe's process-wide ``Caffe::solver_rank`` / ``solver_count``): with ``solver_count`` > 1
its train net reads only the records i with i % solver_count == rank (Caffe's
``DataLayer::Skip``), and only the root solver (rank 0) logs the display lines, tests and
snapshots (Caffe's ``Caffe::root_solver()``).

Host reads (GPU mode): an iteration that displays nothing reads no device value. The loss of
each pass stays where the blobs are (``Net.forward_backward(to_host=False)``: a 0-d CuPy array
on the GPU, a ``numpy.float32`` on the CPU) and the smoothed loss is updated there in Caffe's
float32 order; a display iteration reads the smoothed loss and the logged outputs, and raises
the checks the layers deferred (bad labels, ``backend.raise_deferred``), as does the end of
every :meth:`Solver.step` and every test. Tests sum their outputs on the device and read the
means once. Reads go through ``backend.to_numpy`` / ``backend.host_scalar``, which count them
(``tests/solvers/test_host_reads.py`` bounds them, running the device path on NumPy).
"""
import os
import time

import numpy

from .. import backend, rng
from ..errors import CaffeError
from ..io import prototxt as pio
from ..log import g, logger
from ..layers.record_dealing import deal_records
from ..net import Net
from ..proto import caffe_pb2
from . import resume

f32 = numpy.float32


class SolverCallback:
    """What a solver calls back, and when: Caffe's ``Solver::Callback``, widened.

    Caffe's two (include/caffe/solver.hpp; pycaffe's ``solver.add_callback``), without arguments
    (the callback holds its solver, as Caffe's P2PSync does):

    - ``on_start()``: at the start of every iteration, after its tests, before its
      forward/backward passes;
    - ``on_gradients_ready()``: after the iteration's ``iter_size`` passes (and the display
      lines), before the update (Caffe's ApplyUpdate).

    Not in Caffe, each optional (a callback defines those it needs; this class defines every one
    as a no-op, so a subclass overrides what it uses; the no-ops it inherits are never called).
    They are the points where Caffe's multi-GPU code (src/caffe/parallel.cpp) and solver.cpp's
    root-only tests and snapshots keep the solvers of a group in step. Every solver of a group
    calls each one at the same point of its loop, so a callback may run collective operations
    there:

    - ``on_init(solver)``: in the constructor, once the parameters are checked and the random
      seed is set, before the nets are built. A data-parallel callback sets ``solver.rank`` and
      ``solver.solver_count`` here and reseeds (Caffe's Solver::Init seeds with
      ``random_seed + solver_rank``).
    - ``on_nets_ready(solver)``: in the constructor, the train and test nets built, their
      weights loaded and the train net's records dealt, before ``Solver scaffolding done.``.
    - ``on_pass(solver, k)``: before forward/backward pass ``k`` (0 .. ``iter_size`` - 1) of an
      iteration.
    - ``on_update_done(solver, action)``: after every update (``solver.iter`` counts it), with
      the :class:`SolverAction` asked for from outside; returns the action to follow (callbacks
      chain: each gets the previous one's answer). A solver with such a callback does not ask
      for actions between the passes of an iteration: one solver stopping there alone would
      leave the others waiting.
    - ``on_test(solver)``: after the tests of an iteration, which the root solver alone runs;
      may set ``solver.requested_early_exit`` (e.g. to the root's).
    - ``on_snapshot(solver)``: before the root solver writes a snapshot; returns None or the
      ``--exact_resume`` side file's content for the root to write (the last one not None wins).
    - ``on_root_done(solver)``: after a snapshot, and at the end of :meth:`Solver.solve` (after
      the root's final display and tests): the other solvers may wait for the root here.

    ``on_init`` and ``on_nets_ready`` reach only the callbacks given to the constructor.
    """

    def on_start(self):
        """Start of an iteration (Caffe)."""

    def on_gradients_ready(self):
        """Gradients of the iteration complete, the update not yet applied (Caffe)."""

    def on_init(self, solver):
        """Constructor: parameters checked, seed set, nets not yet built."""

    def on_nets_ready(self, solver):
        """Constructor: nets built, weights loaded, records dealt."""

    def on_pass(self, solver, k):
        """Before forward/backward pass ``k`` of an iteration."""

    def on_update_done(self, solver, action):
        """After an update: the action to follow (here ``action`` unchanged)."""
        return action

    def on_test(self, solver):
        """After an iteration's tests (the root's)."""

    def on_snapshot(self, solver):
        """Before the root's snapshot: its exact-resume content, or None."""

    def on_root_done(self, solver):
        """After a snapshot, and at the end of :meth:`Solver.solve`."""


#: The points a :class:`SolverCallback` may implement, in the order a run first reaches them.
CALLBACK_EVENTS = ("on_init", "on_nets_ready", "on_test", "on_start", "on_pass",
                   "on_gradients_ready", "on_update_done", "on_snapshot", "on_root_done")


class SolverAction:
    """What ``action_request_function`` may return (Caffe's SolverAction::Enum)."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"
    ALL = (NONE, STOP, SNAPSHOT)


def load_net_weights(net, model_list):
    """Copy weights into ``net`` from each of the comma-separated files (Caffe's LoadNetWeights).

    ``.h5`` files are read as HDF5 weights, anything else as a binary ``.caffemodel``.
    """
    for name in model_list.split(","):
        name = name.strip()
        logger.info("Finetuning from %s", name)
        copy_trained_layers(net, name)


def copy_trained_layers(net, path):
    """``net.copy_from(path)`` (``.h5`` files are read as Caffe's HDF5 weights)."""
    net.copy_from(path)


def _learned_net_path(state_file, learned_net):
    """``learned_net`` from solver state ``state_file``, checked to exist.

    Caffe opens the name as stored (relative to the working directory; no search beside the
    state file). A missing file is one CaffeError line naming both, with a hint when a file of
    that name lies beside the state (the run that wrote it worked from another folder).
    """
    if isinstance(learned_net, bytes):
        # protobuf hands back bytes for a string field that is not UTF-8: a damaged file
        raise CaffeError(f"{state_file}: learned_net is not UTF-8 text ({learned_net[:60]!r}); "
                         "the solver state is damaged")
    if os.path.exists(learned_net):
        return learned_net
    hint = ""
    beside = os.path.join(os.path.dirname(state_file), os.path.basename(learned_net))
    if os.path.exists(beside):
        hint = f"; {beside} exists: run from the folder the snapshot was taken in"
    raise CaffeError(f"{state_file}: learned_net '{learned_net}' does not exist (opened as "
                     f"written, relative to the working directory {os.getcwd()}){hint}")


class Solver:
    """Builds the train net and test nets from a SolverParameter and trains.

    Args:
        param: caffe_pb2.SolverParameter, or a solver prototxt path.
        source: the file a SolverParameter was read from, for messages (optional).
        callbacks: :class:`SolverCallback`-like objects (any object; the solver calls the
            methods of :data:`CALLBACK_EVENTS` it has), called in this order, before any added
            later by :meth:`add_callback`. Only these get ``on_init`` and ``on_nets_ready``
            (e.g. :class:`caffe_engine.comm.data_parallel.DataParallel`).

    SolverParameter fields read here (the update rule reads its own): ``net`` / ``net_param`` /
    ``train_net`` / ``train_net_param`` (exactly one), ``test_net`` / ``test_net_param`` and the
    generic net (one test net per remaining ``test_iter``), ``train_state``, ``test_state``,
    ``weights`` (comma-separated lists, copied into every net after it is built),
    ``test_iter``, ``test_interval`` (0), ``test_initialization`` (true), ``test_compute_loss``
    (false), ``display`` (0), ``average_loss`` (1), ``max_iter``, ``iter_size`` (1),
    ``snapshot`` (0), ``snapshot_prefix``, ``snapshot_format`` (BINARYPROTO), ``snapshot_diff``
    (false), ``snapshot_after_train`` (true), ``random_seed`` (-1: from the clock).

    Attributes:
        net: the train Net; test_nets: list of test Nets; iter: updates done so far.
        rank, solver_count: this solver's place among the solvers training together (pycaffe's
            ``solver_rank()`` / ``solver_count()`` when made, unless an ``on_init`` callback
            sets them); ``is_root``: rank 0.
        dealt_layers: names of the train-net layers that read only this solver's share of the
            records (``solver_count`` > 1), else [].
        callbacks: the callbacks, in calling order.
        action_request_function: None or a callable returning a :class:`SolverAction` value.
        exact_resume: when true, each snapshot also writes the ``.resume`` side file
            (see ``resume.py``).

    Raises:
        CaffeError: no or several train nets, test_iter count mismatch, unwritable snapshot
            prefix, average_loss < 1, and anything the nets raise.
    """

    type = None

    def __init__(self, param, source=None, callbacks=()):
        #: the solver file (the path given, or ``source=``), else "<SolverParameter>": names
        #: the solver's embedded nets in messages
        self.source = str(source) if source is not None else "<SolverParameter>"
        if not isinstance(param, caffe_pb2.SolverParameter):
            self.source = str(param)
            param = pio.read_solver_param(self.source)
        self.param = param
        # pycaffe's set_solver_count / set_solver_rank (Caffe's process-wide
        # Caffe::solver_count / solver_rank; 1 and 0 unless a script set them); a data-parallel
        # callback sets its own in on_init.
        self.rank = backend.solver_rank()
        self.solver_count = backend.solver_count()
        self.callbacks = []
        self._events = dict.fromkeys(CALLBACK_EVENTS, ())
        for callback in callbacks:
            self._append_callback(callback)
        self.iter = 0
        self.current_step = 0
        self.lr_state = {"current_step": 0}
        self.requested_early_exit = False
        self.action_request_function = None
        self.exact_resume = False
        self.losses = []
        self.smoothed_loss = f32(0)
        self._loss_start_iter = 0
        self._pending_loss_window = None
        logger.info("Initializing solver from parameters: \n%s", param)
        if param.average_loss < 1:
            raise CaffeError("solver: average_loss should be non-negative (at least 1).")
        if param.iter_size < 1:
            raise CaffeError("solver: iter_size must be at least 1")
        self._check_snapshot_prefix()
        if param.random_seed >= 0:
            rng.set_random_seed(param.random_seed)
        self._notify("on_init", self)
        if self.is_root:
            self._remove_stale_snapshot_temporaries()
        self.net = self._init_train_net()
        if os.environ.get("CAFFE_ENGINE_SHARE_DIFFS", "1") != "0":
            # Intermediate gradients share memory (caffe_engine/diff_sharing.py); set
            # CAFFE_ENGINE_SHARE_DIFFS=0 to keep every blob's diff after step() as Caffe does.
            self.net.share_diff_memory()
        self.test_nets = self._init_test_nets()
        # Several solvers: this one reads its share of the records, as Caffe's DataLayer skips
        # by solver_count / solver_rank (gradients are averaged by a callback, or the script's).
        self.dealt_layers = (deal_records(self.net, self.rank, self.solver_count)
                             if self.solver_count > 1 else [])
        self._notify("on_nets_ready", self)
        logger.info("Solver scaffolding done.")
        self.init_state()

    # -- callbacks (Caffe's Solver::Callback; pycaffe's add_callback) ----------------------
    def add_callback(self, on_start, on_gradients_ready=None):
        """Call ``on_start()`` at the start of every iteration (after its tests) and
        ``on_gradients_ready()`` after forward/backward, before the update (pycaffe's
        ``solver.add_callback``; Caffe's Solver::Callback). A single object with both methods
        (pycaffe's ``caffe.NCCL``, a :class:`SolverCallback`) is accepted too; its other
        :data:`CALLBACK_EVENTS` methods, but ``on_init`` and ``on_nets_ready``, are called too.

        Raises:
            CaffeError: neither two callables nor an object with both methods.
        """
        if on_gradients_ready is None:
            callback = on_start
            if not (callable(getattr(callback, "on_start", None))
                    and callable(getattr(callback, "on_gradients_ready", None))):
                raise CaffeError("add_callback: give on_start and on_gradients_ready callables, "
                                 "or an object with both methods")
        else:
            if not (callable(on_start) and callable(on_gradients_ready)):
                raise CaffeError("add_callback: on_start and on_gradients_ready must be callable")
            callback = _Callback(on_start, on_gradients_ready)
        self._append_callback(callback)

    def _append_callback(self, callback):
        """Add ``callback`` and recompute, per event, the tuple of its methods to call."""
        self.callbacks.append(callback)
        self._events = {event: tuple(getattr(cb, event) for cb in self.callbacks
                                     if _implements(cb, event))
                        for event in CALLBACK_EVENTS}

    def _notify(self, event, *args):
        """Call every callback's ``event`` method with ``args`` (in order)."""
        for method in self._events[event]:
            method(*args)

    def share_weights(self, net):
        """Make ``net`` use this solver's train-net weights, by layer name (pycaffe's)."""
        net.share_trained_layers_with(self.net)

    @property
    def is_root(self):
        """Whether this is the root solver (rank 0, or the only one): it logs, tests, snapshots."""
        return self.rank == 0

    # -- construction ----------------------------------------------------------------------
    def _check_snapshot_prefix(self):
        p = self.param
        if not (p.snapshot or p.snapshot_after_train):
            return
        if p.snapshot and not p.snapshot_prefix:
            raise CaffeError("In solver params, snapshot is specified but snapshot_prefix is not")
        folder = os.path.dirname(p.snapshot_prefix) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise CaffeError(f"Cannot write to snapshot prefix '{p.snapshot_prefix}'. "
                             "Make sure that the directory exists and is writable.")

    def _load_weights(self, net):
        for model_list in self.param.weights:
            load_net_weights(net, model_list)

    def _inline_net_param(self, inline, field):
        """A copy of the solver's embedded NetParameter ``field`` (``net_param``,
        ``train_net_param`` or a ``test_net_param``), upgraded as a net file is.

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
            where = f"{getattr(self, 'source', '<SolverParameter>')}: {field}"
            if len(net_param.layers):
                logger.warning("%s uses the deprecated V1 'layers' field: upgraded here (BVLC "
                               "Caffe does not upgrade a net embedded in a solver and would "
                               "build it without those layers)", where)
            upgrade_net(net_param, where)
        return net_param

    def _init_train_net(self):
        p = self.param
        sources = [p.HasField("train_net_param"), p.HasField("train_net"),
                   p.HasField("net_param"), p.HasField("net")]
        if sum(sources) != 1:
            raise CaffeError("solver: exactly one train net must be given by one of "
                             "train_net_param, train_net, net_param, net "
                             f"({sum(sources)} given)")
        if p.HasField("train_net_param"):
            logger.info("Creating training net specified in train_net_param.")
            net_param = self._inline_net_param(p.train_net_param, "train_net_param")
        elif p.HasField("train_net"):
            logger.info("Creating training net from train_net file: %s", p.train_net)
            net_param = pio.read_net_param(p.train_net)
        elif p.HasField("net_param"):
            logger.info("Creating training net specified in net_param.")
            net_param = self._inline_net_param(p.net_param, "net_param")
        else:
            logger.info("Creating training net from net file: %s", p.net)
            net_param = pio.read_net_param(p.net)
        state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        net = Net(net_param, state.phase, level=state.level, stages=list(state.stage))
        self._load_weights(net)
        return net

    def _init_test_nets(self):
        p = self.param
        has_generic = p.HasField("net_param") or p.HasField("net")
        n_params, n_files = len(p.test_net_param), len(p.test_net)
        n_specific = n_params + n_files
        if (has_generic and len(p.test_iter) < n_specific) or \
                (not has_generic and len(p.test_iter) != n_specific):
            raise CaffeError(f"solver: test_iter must be specified for each test network "
                             f"({len(p.test_iter)} test_iter for {n_specific} test_net/test_net_param)")
        n_generic = (len(p.test_iter) - n_specific) if has_generic else 0
        total = n_specific + n_generic
        for k, n in enumerate(p.test_iter):
            if n < 0:
                logger.warning("solver: test_iter %d (test net #%d) is negative; that test runs "
                               "no iteration, as in Caffe", n, k)
        if len(p.test_state) and len(p.test_state) != total:
            raise CaffeError("solver: test_state must be unspecified or specified once per test net "
                             f"({len(p.test_state)} test_state for {total} test nets)")
        if total and p.test_interval <= 0:
            raise CaffeError("solver: test_interval must be positive when there are test nets")
        specs = []
        for i in range(n_params):
            specs.append(("test_net_param", p.test_net_param[i], None))
        for i in range(n_files):
            specs.append(("test_net file", None, p.test_net[i]))
        for i in range(n_generic):
            if p.HasField("net_param"):
                specs.append(("net_param", p.net_param, None))
            else:
                specs.append(("net file", None, p.net))
        nets = []
        for i, (kind, inline, path) in enumerate(specs):
            if inline is not None:
                net_param = self._inline_net_param(inline, kind)
            else:
                net_param = pio.read_net_param(path)
            state = caffe_pb2.NetState(phase=caffe_pb2.TEST)
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net_param.state.CopyFrom(state)
            if inline is not None:
                logger.info("Creating test net (#%d) specified by %s", i, kind)
            else:
                logger.info("Creating test net (#%d) specified by %s: %s", i, kind, path)
            net = Net(net_param, state.phase, level=state.level, stages=list(state.stage))
            self._load_weights(net)
            nets.append(net)
        return nets

    # -- the update rule (subclasses) -------------------------------------------------------
    def init_state(self):
        """Create the update rule's history blobs."""

    def apply_update(self):
        raise NotImplementedError

    def snapshot_state(self, model_filename):
        raise NotImplementedError

    def restore_state(self, history):
        raise NotImplementedError

    # -- requests from outside --------------------------------------------------------------
    def get_requested_action(self):
        """Ask ``action_request_function`` (Caffe's GetRequestedAction); NONE without one."""
        if self.action_request_function is None:
            return SolverAction.NONE
        action = self.action_request_function()
        if action not in SolverAction.ALL:
            raise CaffeError(f"solver: unknown requested action {action!r}")
        return action

    # -- training ---------------------------------------------------------------------------
    def solve(self, resume_file=None):
        """Train to ``max_iter`` (Caffe's Solver::Solve), resuming from a solver state if given.

        ``caffe train --snapshot`` restores before calling this (as Caffe's tool does), so
        ``resume_file`` serves the pycaffe-style ``solver.solve(file)``.
        """
        logger.info("Solving %s", self.net.name)
        logger.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            logger.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        self.step(self.param.max_iter - self.iter)
        p = self.param
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self._snapshot_all_ranks()
        if not self.is_root:  # the root snapshots, displays and tests the final weights
            self._notify("on_root_done", self)
            logger.info("Optimization Done.")
            return
        if self.requested_early_exit:
            self._notify("on_root_done", self)
            logger.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = self.net.forward_loss(to_host=False)
            self._update_smoothed_loss(loss, self._loss_start_iter, p.average_loss)
            backend.raise_deferred()
            logger.info("Iteration %d, loss = %s", self.iter, g(self._smoothed_on_host()))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self._notify("on_root_done", self)
        logger.info("Optimization Done.")

    def step(self, iters):
        """Run ``iters`` iterations (Caffe's Solver::Step), calling the callbacks' ``on_test``,
        ``on_start``, ``on_pass``, ``on_gradients_ready``, ``on_update_done``, ``on_snapshot``
        and ``on_root_done`` on the way (see :class:`SolverCallback`).

        No host reads in an iteration that displays nothing: the losses stay where the blobs
        are (device scalars on the GPU) and are smoothed there; a display iteration reads the
        smoothed loss, the outputs it logs and the layers' deferred checks
        (``backend.raise_deferred``), which are read once more when the step ends.
        """
        try:
            self._step(iters)
        except BaseException:
            backend.discard_deferred()    # the error in flight is the one to report
            raise
        backend.raise_deferred()

    def _step(self, iters):
        p = self.param
        stop_iter = self.iter + iters
        self._start_loss_window()
        start_iter = self._loss_start_iter
        last_iter, last_time = self.iter, time.perf_counter()
        while self.iter < stop_iter:
            self.net.clear_param_diffs()
            if (p.test_interval and self.iter % p.test_interval == 0
                    and (self.iter > 0 or p.test_initialization)):
                if self.is_root:
                    self.test_all()
                self._notify("on_test", self)
                if self.requested_early_exit:
                    break
            self._notify("on_start")
            display = p.display and self.iter % p.display == 0
            loss, early = self._forward_backward_passes()
            if early == SolverAction.STOP:
                self.requested_early_exit = True
                break
            self._update_smoothed_loss(loss, start_iter, p.average_loss)
            if display and self.is_root:
                now = time.perf_counter()
                lapse = now - last_time
                per_s = (self.iter - last_iter) / (lapse or 1.0)
                backend.raise_deferred()
                logger.info("Iteration %d (%s iter/s, %ss/%d iters), loss = %s", self.iter,
                            g(per_s), g(lapse), p.display, g(self._smoothed_on_host()))
                last_iter, last_time = self.iter, now
                self._log_outputs(self.net, "Train")
            self._notify("on_gradients_ready")
            self.apply_update()
            self.iter += 1
            request = self.get_requested_action()
            for on_update_done in self._events["on_update_done"]:
                request = on_update_done(self, request)
            snapshot_requested = SolverAction.SNAPSHOT in (request, early)
            if (p.snapshot and self.iter % p.snapshot == 0) or snapshot_requested:
                self._snapshot_all_ranks()
                self._notify("on_root_done", self)
            if request == SolverAction.STOP:
                self.requested_early_exit = True
                break

    def _forward_backward_passes(self):
        """The iteration's ``iter_size`` forward/backward passes; returns (mean loss, request).

        Not in Caffe, which asks for a requested action only after the update: without an
        ``on_update_done`` callback (which decides the action every solver of a group follows)
        and without ``exact_resume`` it is also asked for between the passes, so that a stop
        (SIGINT) ends even an iteration of a huge ``iter_size`` instead of being ignored until it
        is done. A stop there drops the unfinished iteration (no update, ``iter`` unchanged; the
        stop's snapshot holds the last update's weights): returned as (None, STOP). Snapshot
        requests there are returned as SNAPSHOT and served after the update; else NONE. With
        ``exact_resume`` the passes are not interrupted, so that the resumed run reads the
        records the uninterrupted one reads.
        """
        p = self.param
        between = (p.iter_size > 1 and not self._events["on_update_done"]
                   and not self.exact_resume and self.action_request_function is not None)
        loss, snapshot = None, False
        for k in range(p.iter_size):
            if k and between:
                request = self.get_requested_action()
                if request == SolverAction.STOP:
                    logger.info("Iteration %d stopped after %d of %d forward/backward passes; "
                                "not applied.", self.iter, k, p.iter_size)
                    return None, request
                snapshot = snapshot or request == SolverAction.SNAPSHOT
            self._notify("on_pass", self, k)
            # Unread (a device scalar on the GPU); summed in float32 from 0, as Caffe's
            # ``Dtype loss = 0; loss += net_->ForwardBackward()``, the device value on the left.
            term = self.net.forward_backward(to_host=False)
            loss = term + f32(0) if loss is None else loss + term
        return loss / f32(p.iter_size), (SolverAction.SNAPSHOT if snapshot
                                         else SolverAction.NONE)

    def _log_outputs(self, net, kind, values=None):
        """Caffe's ``    Train net output #k: name = v (* w = wv loss)`` lines."""
        index = 0
        for name in net.outputs:
            blob = net.blobs[name]
            weight = f32(net.blob_loss_weights[net.blob_names.index(name)])
            vec = values[name] if values is not None else backend.to_numpy(blob.data).ravel()
            # (a display iteration: one host read per output blob)
            for v in vec:
                suffix = f" (* {g(weight)} = {g(weight * f32(v))} loss)" if weight else ""
                logger.info("    %s net output #%d: %s = %s%s", kind, index, name, g(v), suffix)
                index += 1

    # -- the smoothed loss ------------------------------------------------------------------
    def _start_loss_window(self):
        """Caffe restarts the window with every Step; an exact resume continues the saved one."""
        pending, self._pending_loss_window = self._pending_loss_window, None
        if pending:
            self.losses = [f32(x) for x in pending["losses"]]
            self.smoothed_loss = f32(pending["smoothed"])
            self._loss_start_iter = int(pending["start_iter"])
        else:
            self.losses = []
            self.smoothed_loss = f32(0)
            self._loss_start_iter = self.iter

    def loss_window_state(self):
        """The smoothed-loss window as JSON-able data (for the exact-resume side file; a
        snapshot reads the device losses)."""
        return {"losses": [float(backend.host_scalar(x)) for x in self.losses],
                "smoothed": float(self._smoothed_on_host()),
                "start_iter": int(self._loss_start_iter)}

    def _smoothed_on_host(self):
        """The smoothed loss as a ``numpy.float32`` (one host read on the GPU)."""
        return f32(backend.host_scalar(self.smoothed_loss))

    def set_loss_window_state(self, state):
        """Continue the saved window in the next :meth:`step` instead of starting a new one."""
        self._pending_loss_window = state

    def _update_smoothed_loss(self, loss, start_iter, average_loss):
        """Caffe's UpdateSmoothedLoss, in float32, where ``loss`` is: NumPy float32 scalars on
        the CPU, 0-d CuPy arrays on the GPU (nothing is read; the device value is the left
        operand wherever one side may still be a NumPy scalar, and float32 + and * commute
        exactly, so the values are Caffe's order's)."""
        if len(self.losses) < average_loss:
            self.losses.append(loss)
            size = len(self.losses)
            self.smoothed_loss = (loss + self.smoothed_loss * f32(size - 1)) / f32(size)
        else:
            idx = (self.iter - start_iter) % average_loss
            self.smoothed_loss = (loss - self.losses[idx]) / f32(average_loss) + self.smoothed_loss
            self.losses[idx] = loss

    # -- testing ----------------------------------------------------------------------------
    def test_all(self):
        """Run every test net (stopping early if a stop was requested)."""
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id=0):
        """Run test net ``test_net_id`` for its ``test_iter`` batches and log mean outputs.

        Returns:
            dict output name -> float32 array of means (one per element of the output blob),
            or None when a stop was requested during the test.
        """
        p = self.param
        logger.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.net)
        n = p.test_iter[test_net_id]
        start_state = resume.net_state(net, warn=False) if self.exact_resume else None
        # Sums stay where the blobs are; read once at the end of the test.
        sums = None
        loss = f32(0)
        for i in range(n):
            request = self.get_requested_action()
            while request != SolverAction.NONE:
                if request == SolverAction.SNAPSHOT:
                    self.snapshot()
                elif request == SolverAction.STOP:
                    self.requested_early_exit = True
                request = self.get_requested_action()
            if self.requested_early_exit:
                break
            iter_loss = net.forward_loss(to_host=False)
            if p.test_compute_loss:
                loss = iter_loss + loss
            vals = {name: net.blobs[name].data.astype(f32).ravel() for name in net.outputs}
            if sums is None:
                sums = vals
            else:
                for name in sums:
                    sums[name] += vals[name]
        if self.requested_early_exit:
            backend.discard_deferred()
            logger.info("Test interrupted.")
            if start_state is not None:  # the resumed run repeats this test from its start
                resume.set_net_state(net, start_state, f"test net #{test_net_id}")
            return None
        backend.raise_deferred()
        if p.test_compute_loss:
            logger.info("Test loss: %s", g(f32(backend.host_scalar(loss / f32(n)))))
        if sums is None:        # test_iter <= 0: nothing was scored, and Caffe logs no output
            return {}
        means = {name: backend.to_numpy((s / f32(n)).astype(f32)) for name, s in sums.items()}
        self._log_outputs(net, "Test", means)
        return means

    # -- snapshots --------------------------------------------------------------------------
    def _remove_stale_snapshot_temporaries(self):
        """Delete temporary snapshot files a killed run left (``.tmp-<prefix>_iter_*``), at the
        start and before each snapshot; logged, one line per file."""
        for path in pio.remove_stale_temporaries(f"{self.param.snapshot_prefix}_iter_"):
            logger.info("Removed a temporary file a previous run left: %s", path)

    def snapshot_filename(self, extension):
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{extension}"

    def snapshot(self, resume_content=None):
        """Write the weights and the solver state (atomically), in ``snapshot_format``.

        BINARYPROTO: ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate``; HDF5:
        ``.caffemodel.h5`` and ``.solverstate.h5``. With :attr:`exact_resume` also the solver
        state's ``.resume`` side file: ``resume_content`` (every rank's, from an
        ``on_snapshot`` callback: :func:`resume.gather`) or this process's own.
        """
        self._remove_stale_snapshot_temporaries()
        fmt = self.param.snapshot_format
        if fmt == caffe_pb2.SolverParameter.HDF5:
            from ..io.hdf5_snapshot import save_net_hdf5
            model_filename = self.snapshot_filename(".caffemodel.h5")
            logger.info("Snapshotting to HDF5 file %s", model_filename)
            save_net_hdf5(self.net, model_filename, self.param.snapshot_diff)
        elif fmt == caffe_pb2.SolverParameter.BINARYPROTO:
            model_filename = self.snapshot_filename(".caffemodel")
            logger.info("Snapshotting to binary proto file %s", model_filename)
            self.net.save(model_filename, self.param.snapshot_diff)
        else:
            raise CaffeError("solver: Unsupported snapshot format.")
        state_filename = self.snapshot_state(model_filename)
        if self.exact_resume:
            side = resume.side_file(state_filename)
            logger.info("Snapshotting data cursors and random streams to %s", side)
            resume.write(side, resume_content or resume.capture(self))

    def _snapshot_all_ranks(self):
        """The root snapshots, with the side-file content the ``on_snapshot`` callbacks give
        (every solver of a group calls this at the same point)."""
        content = None
        for on_snapshot in self._events["on_snapshot"]:
            given = on_snapshot(self)
            if given is not None:
                content = given
        if self.is_root:
            self.snapshot(content)

    def restore(self, state_file, exact_resume=None):
        """Restore iter, lr step, history and (via ``learned_net``) weights from a solver state.

        A name ending in ``.h5`` is read as an HDF5 solver state (Caffe's layout or this
        engine's older one, see :mod:`caffe_engine.io.hdf5_snapshot`), anything else as a
        binary ``.solverstate`` (as Caffe's Solver::Restore). The ``learned_net`` named in the
        state is opened as written, i.e. relative to the working directory, as Caffe's
        RestoreSolverStateFrom* pass it straight to CopyTrainedLayersFrom. With
        ``exact_resume`` (default: the :attr:`exact_resume` attribute) the ``.resume`` side file
        is applied too.

        Raises:
            CaffeError: unreadable or malformed state, a ``learned_net`` file that does not
                exist (one line naming it and the state), weights that do not fit, history of
                the wrong length or shape, a missing or foreign side file.
        """
        state_file = str(state_file)
        if exact_resume is None:
            exact_resume = self.exact_resume
        if state_file.endswith(".h5"):
            from ..io.hdf5_snapshot import load_solver_state_hdf5
            state = load_solver_state_hdf5(state_file)
            self.iter = state["iter"]
            self._warn_odd_iter(state_file, self.iter)
            if state["learned_net"] is not None:
                copy_trained_layers(self.net, _learned_net_path(state_file, state["learned_net"]))
            self._set_current_step(state["current_step"])
            self.restore_state(state["history"], log=False)
        else:
            state = pio.read_binary(state_file, caffe_pb2.SolverState(), "solverstate")
            self.iter = state.iter
            self._warn_odd_iter(state_file, self.iter)
            if state.HasField("learned_net"):
                copy_trained_layers(self.net, _learned_net_path(state_file, state.learned_net))
            self._set_current_step(state.current_step)
            self.restore_state(list(state.history), log=True)
        if exact_resume:
            side = resume.side_file(state_file)
            logger.info("Restoring data cursors and random streams from %s", side)
            content = resume.for_rank(resume.read(side), self.rank, self.solver_count, side)
            resume.apply(self, content)

    @staticmethod
    def _warn_odd_iter(state_file, iteration):
        """Caffe resumes from a negative ``iter`` as stored; one WARNING names it."""
        if iteration < 0:
            logger.warning("%s: iter %d is negative; training resumes from it as Caffe does",
                           state_file, iteration)

    def _set_current_step(self, step):
        self.current_step = step
        self.lr_state["current_step"] = step


def _implements(callback, event):
    """Whether ``callback`` has its own ``event`` method (not :class:`SolverCallback`'s no-op:
    an inherited ``on_update_done`` must not make the solver think someone decides actions)."""
    return (callable(getattr(callback, event, None))
            and getattr(type(callback), event, None) is not getattr(SolverCallback, event))


class _Callback:
    """Two callables as one Solver callback (pycaffe's ``add_callback(on_start, on_ready)``)."""

    def __init__(self, on_start, on_gradients_ready):
        self.on_start = on_start
        self.on_gradients_ready = on_gradients_ready
