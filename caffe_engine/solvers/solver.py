"""The solver loop: test, forward/backward, display, update, snapshot — Caffe's template.

Caffe: src/caffe/solver.cpp (Solver::Init, Step, Solve, Test, Snapshot, Restore,
UpdateSmoothedLoss). The update rule itself lives in a subclass (``sgd.py``): it owns the
history blobs, ``apply_update`` and the solver-state payload. The nets are built by
``net_factory.py`` (InitTrainNet, InitTestNets), snapshots written and restored by
``snapshot.py``. Log lines are Caffe's, word for word, so log parsers work.

Requests from outside (``caffe train``'s SIGINT/SIGHUP handling) reach the loop through
``action_request_function``, a callable returning one of :class:`SolverAction`'s values: it is
asked after every update and before every test batch, as Caffe's ``GetRequestedAction``, and
(not in Caffe) between the forward/backward passes of an ``iter_size`` > 1 iteration, so that a
stop is not ignored for the whole of a huge one (see ``_forward_backward_passes``).

Callbacks (``callback.py``: :class:`~.callback.SolverCallback`, Caffe's ``Solver::Callback``)
are called at fixed points of the loop; data parallelism is one of them, given to the
constructor (``callbacks=``): the solver knows nothing of communicators. It only knows its
``rank`` and ``solver_count`` (pycaffe's ``set_solver_rank`` / ``set_solver_count``, or what a
callback sets, as Caffe's process-wide ``Caffe::solver_rank`` / ``solver_count``): with
``solver_count`` > 1 its train net reads only the records i with i % solver_count == rank
(Caffe's ``DataLayer::Skip``), and only the root solver (rank 0) logs the display lines, tests
and snapshots (Caffe's ``Caffe::root_solver()``).

Host reads (GPU mode): an iteration that displays nothing reads no device value. The loss of
each pass stays where the blobs are (``Net.forward_backward(to_host=False)``: a 0-d CuPy array
on the GPU, a ``numpy.float32`` on the CPU) and the smoothed loss is updated there in Caffe's
float32 order; a display iteration reads the smoothed loss and the logged outputs, and raises
the checks the layers deferred (bad labels, ``backend.raise_deferred``), as does the end of
every :meth:`Solver.step` and every test. Tests sum their outputs on the device and read the
means once. Reads go through ``backend.to_numpy`` / ``backend.host_scalar``, which count them
(``tests/solvers/test_host_reads.py`` bounds them, running the device path on NumPy).
"""
import time

import numpy

from .. import backend, environment, rng
from ..errors import CaffeError
from ..io import prototxt as pio
from ..log import g, logger
from ..layers.record_dealing import deal_records
from ..proto import caffe_pb2
from . import net_factory
from . import snapshot as snapshots
from .callback import CALLBACK_EVENTS, CallbackPair, SolverAction, implements

f32 = numpy.float32


class Solver:
    """Builds the train net and test nets from a SolverParameter and trains.

    Args:
        param: caffe_pb2.SolverParameter, or a solver prototxt path.
        source: the file a SolverParameter was read from, for messages (optional).
        callbacks: :class:`~.callback.SolverCallback`-like objects (any object; it calls the
            methods of :data:`CALLBACK_EVENTS` it has), called in this order, before any added
            later by :meth:`add_callback`. Only these get ``on_init`` and ``on_nets_ready``
            (e.g. :class:`caffe_engine.comm.data_parallel.DataParallel`).

    SolverParameter fields read here (the update rule reads its own; the nets' fields,
    ``net`` .. ``test_state`` and ``weights``, are :mod:`.net_factory`'s):
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
            (see ``snapshot.py``).
        param_slicing: None, or what a callback's ``on_nets_ready`` set when this solver's
            params are slices of params spread over several solvers (PCL-DNN's hybrid
            InnerProduct, :class:`caffe_engine.comm.hybrid_train.HybridLayers`): an object with
            ``full_view(solver, write_back)``, a context manager (collective: every solver
            enters it) within which the nets' layers and ``history`` hold the full blobs.
            Snapshots and restores then run inside it, and since the nets' forward passes are
            collective, every solver runs the tests and the final display's forward (the root
            alone logs), and no action is asked for between test batches.

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
        self.param_slicing = None
        self.losses = []
        self.smoothed_loss = f32(0)
        self._loss_start_iter = 0
        self._pending_loss_window = None
        logger.info("Initializing solver from parameters: \n%s", param)
        if param.average_loss < 1:
            raise CaffeError("solver: average_loss should be non-negative (at least 1).")
        if param.iter_size < 1:
            raise CaffeError("solver: iter_size must be at least 1")
        snapshots.check_snapshot_prefix(param)
        if param.random_seed >= 0:
            rng.set_random_seed(param.random_seed)
        self._notify("on_init", self)
        if self.is_root:
            snapshots.remove_stale_temporaries(param.snapshot_prefix)
        self.net = net_factory.build_train_net(param, self.source)
        if environment.read("CAFFE_ENGINE_SHARE_DIFFS"):
            # Intermediate gradients share memory (caffe_engine/diff_sharing.py); set
            # CAFFE_ENGINE_SHARE_DIFFS=0 to keep every blob's diff after step() as Caffe does.
            self.net.share_diff_memory()
        self.test_nets = net_factory.build_test_nets(param, self.source)
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
            callback = CallbackPair(on_start, on_gradients_ready)
        self._append_callback(callback)

    def _append_callback(self, callback):
        """Add ``callback`` and recompute, per event, the tuple of its methods to call."""
        self.callbacks.append(callback)
        self._events = {event: tuple(getattr(cb, event) for cb in self.callbacks
                                     if implements(cb, event))
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
        if not self.is_root and self.param_slicing is None:
            # the root snapshots, displays and tests the final weights
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
            if self.is_root:
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
                if self.is_root or self.param_slicing is not None:
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
        start_state = snapshots.net_state(net, warn=False) if self.exact_resume else None
        # Sums stay where the blobs are; read once at the end of the test.
        sums = None
        loss = f32(0)
        for i in range(n):
            # sliced params: every solver tests, collectively; actions wait for the update
            request = (self.get_requested_action() if self.param_slicing is None
                       else SolverAction.NONE)
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
                snapshots.set_net_state(net, start_state, f"test net #{test_net_id}")
            return None
        backend.raise_deferred()
        if p.test_compute_loss:
            logger.info("Test loss: %s", g(f32(backend.host_scalar(loss / f32(n)))))
        if sums is None:        # test_iter <= 0: nothing was scored, and Caffe logs no output
            return {}
        means = {name: backend.to_numpy((s / f32(n)).astype(f32)) for name, s in sums.items()}
        self._log_outputs(net, "Test", means)
        return means

    # -- snapshots (snapshot.py) ------------------------------------------------------------
    def snapshot_filename(self, extension):
        """``<snapshot_prefix>_iter_<iter><extension>`` (Caffe's SnapshotFilename)."""
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{extension}"

    def snapshot(self, resume_content=None):
        """Write the weights and the solver state, atomically (:func:`.snapshot.snapshot`);
        with :attr:`exact_resume` also the ``.resume`` side file, of ``resume_content`` (every
        rank's, from an ``on_snapshot`` callback) or of this process's own state. With
        :attr:`param_slicing` every solver calls it (the full blobs are gathered) and the root
        alone writes."""
        if self.param_slicing is None:
            snapshots.snapshot(self, resume_content)
            return
        with self.param_slicing.full_view(self, write_back=False):
            if self.is_root:
                snapshots.snapshot(self, resume_content)

    def resume_content(self, comm=None):
        """The ``.resume`` side file's content: this process's (:func:`.snapshot.capture_resume`),
        or with ``comm`` of several ranks every rank's, gathered on rank 0 (collective; None on
        the other ranks: :func:`.snapshot.gather_resume`). The data-parallel callback's
        ``on_snapshot`` calls it, so that the communicator package needs no solver module."""
        return snapshots.gather_resume(self, comm)

    def _snapshot_all_ranks(self):
        """The root snapshots, with the side-file content the ``on_snapshot`` callbacks give
        (every solver of a group calls this at the same point)."""
        content = None
        for on_snapshot in self._events["on_snapshot"]:
            given = on_snapshot(self)
            if given is not None:
                content = given
        if self.is_root or self.param_slicing is not None:
            self.snapshot(content)

    def restore(self, state_file, exact_resume=None):
        """Restore iter, lr step, history and weights from solver state ``state_file``, and
        with ``exact_resume`` (default: :attr:`exact_resume`) its ``.resume`` side file
        (:func:`.snapshot.restore`, which lists the errors raised). With :attr:`param_slicing`
        every solver calls it: the full blobs read are sliced into each."""
        exact = self.exact_resume if exact_resume is None else exact_resume
        if self.param_slicing is None:
            snapshots.restore(self, state_file, exact)
            return
        with self.param_slicing.full_view(self, write_back=True):
            snapshots.restore(self, state_file, exact)
