"""The solver's callback seam: what a solver calls back and when, and what it may be asked.

Caffe: include/caffe/solver.hpp (Solver::Callback, SolverAction::Enum). Callbacks
(:class:`SolverCallback`) are objects the loop (:class:`~.solver.Solver`) calls at fixed points:
Caffe's ``on_start`` and ``on_gradients_ready``, and a few more that a data-parallel run needs.
The solver knows nothing of communicators: data parallelism is such a callback,
:class:`caffe_engine.comm.data_parallel.DataParallel` (Caffe's P2PSync / NCCL), given to the
solver's constructor (``callbacks=``).

Requests from outside (``caffe train``'s SIGINT/SIGHUP handling) reach the loop through the
solver's ``action_request_function``, a callable returning one of :class:`SolverAction`'s
values; ``on_update_done`` callbacks pass such values on.
"""

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
      weights loaded and the train net's records dealt, before ``Solver scaffolding done.``
      (and before the update rule makes its history). A callback that slices the params over
      several solvers (PCL-DNN's hybrid layers) sets ``solver.param_slicing`` here.
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
    - ``on_root_done(solver)``: after a snapshot, and at the end of
      :meth:`~.solver.Solver.solve` (after the root's final display and tests): the other
      solvers may wait for the root here.

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
        """After a snapshot, and at the end of :meth:`~.solver.Solver.solve`."""


#: The points a :class:`SolverCallback` may implement, in the order a run first reaches them.
CALLBACK_EVENTS = ("on_init", "on_nets_ready", "on_test", "on_start", "on_pass",
                   "on_gradients_ready", "on_update_done", "on_snapshot", "on_root_done")


class SolverAction:
    """What ``action_request_function`` may return (Caffe's SolverAction::Enum)."""

    NONE = "none"
    STOP = "stop"
    SNAPSHOT = "snapshot"
    ALL = (NONE, STOP, SNAPSHOT)


def implements(callback, event):
    """Whether ``callback`` has its own ``event`` method (not :class:`SolverCallback`'s no-op:
    an inherited ``on_update_done`` must not make the solver think someone decides actions)."""
    return (callable(getattr(callback, event, None))
            and getattr(type(callback), event, None) is not getattr(SolverCallback, event))


class CallbackPair:
    """Two callables as one Solver callback (pycaffe's ``add_callback(on_start, on_ready)``)."""

    def __init__(self, on_start, on_gradients_ready):
        self.on_start = on_start
        self.on_gradients_ready = on_gradients_ready
