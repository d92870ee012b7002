"""Data-parallel training as a solver callback: Caffe's P2PSync / NCCL for one rank of many.

One solver per process under ``mpiexec -n P``; each gets a :class:`DataParallel` over the job's
communicator, given to its constructor (``get_solver(param, callbacks=[DataParallel(comm)])``;
``caffe train`` does this when P > 1). The solver knows nothing of communicators: it calls the
callback at the points of :class:`caffe_engine.solvers.callback.SolverCallback`, every rank at the
same point of its loop, and the callback does the rest (Caffe: src/caffe/parallel.cpp, NCCL and
P2PSync; solver.cpp, the root-only tests and snapshots):

- ``on_init``: the solver's ``rank`` / ``solver_count`` from the communicator; every rank must
  hold the same solver parameters (the device id aside); seed ``random_seed + rank`` (Caffe's
  Solver::Init);
- ``on_nets_ready``: the same learnable shapes everywhere; rank 0's initial weights broadcast
  (NCCL::Broadcast); PCL-DNN's hybrid InnerProduct layers sliced over their groups
  (:mod:`.hybrid_train`: ``inner_product_param.parallel`` or ``fc_parallel``), their slices
  kept out of the world allreduce and summed over their replicas instead; the gradient buckets (:class:`~.buckets.GradientSync`) hooked on the train
  net's after-backward (NCCL::run per layer); with ``bucket_mb="auto"`` the MG-WFBP planner
  (:class:`~.bucket_plan.AutoBuckets`); the ``Data parallel: ...`` line; ``debug_sync``'s
  first check;
- ``on_start``: the planner's turn (it measures, then re-plans between iterations);
- ``on_pass``: the buckets armed before the last of the ``iter_size`` passes;
- ``on_gradients_ready``: the buckets finished, the diffs averaged over the ranks
  (NCCL::on_gradients_ready); with gradient compression (:mod:`.compress`: the solver's
  engine-only ``comm_param`` block, overridden by ``compress`` / ``density`` /
  ``error_feedback``), each bucket's compressed sum instead, and every ``display`` iterations
  an ``Iteration N, gradient traffic`` line with the bytes sent per iteration;
- ``on_update_done``: ``debug_sync``'s check that all ranks hold the same weights; the root's
  requested action (SIGINT, SIGHUP) followed by every rank;
- ``on_test``: the others wait while the root tests; its stop request followed by all;
- ``on_snapshot``: with ``--exact_resume``, every rank's cursors and streams for the root's
  side file (the solver's ``resume_content``: :func:`caffe_engine.solvers.snapshot.gather_resume`);
- ``on_root_done``: the others wait while the root snapshots, and at the end of ``solve``.

The solver itself deals the train records (record i to rank i mod P, through the Data layers'
``solver_count`` / ``solver_rank``) once ``on_init`` has set its ``solver_count``, and gates the
display lines, tests and snapshots on rank 0 (Caffe's ``Caffe::root_solver()``).
"""

from .. import environment, rng
from ..errors import CaffeError
from ..log import g, logger
from ..proto import caffe_pb2
from . import compress as compression
from . import distributed, hybrid_train
from .buckets import GradientSync
from .communicator import Communicator


def _bucket_size(bucket_mb):
    """``bucket_mb`` checked: ``"auto"``, or a float (MiB; <= 0: one bucket per param).

    Raises:
        CaffeError: anything else (one line).
    """
    if bucket_mb == "auto":
        return bucket_mb
    try:
        return float(bucket_mb)
    except (TypeError, ValueError):
        raise CaffeError(f"DataParallel: bucket_mb must be a size in MiB or 'auto', got "
                         f"{bucket_mb!r}") from None


class DataParallel:
    """The data-parallel side of one solver among ``comm.size`` (a solver callback).

    Give it to the solver's constructor, first among the callbacks (its ``on_gradients_ready``
    averages the gradients, which later callbacks then see):
    ``get_solver(param, callbacks=[DataParallel(comm, bucket_mb=25)])``. It must see the
    constructor (``on_init`` seeds the random stream before the nets are filled), so it cannot
    be added to a built solver. Meant for ``comm.size`` > 1; with one rank the collectives are
    trivial and the result is a plain solver's.

    Args:
        comm: the job's communicator (:func:`.communicator.get_communicator`: ``rank``,
            ``size``, ``name``, ``allgather_object``, ``bcast_``, ``allreduce_async_``,
            ``barrier``).
        bucket_mb: gradient bucket cap in MiB (float; <= 0: one bucket per param), or
            ``"auto"``: 25 MiB until MG-WFBP's plan from measured backward times takes over
            (``CAFFE_COST_MODEL`` names an alpha-beta model file; see :mod:`.bucket_plan`).
        debug_sync: after every update (and once at start) check that all ranks hold bitwise
            identical weights (:func:`.distributed.check_params_in_sync`); costs one allgather
            of digests per iteration.
        compress, density, error_feedback: gradient compression (``"none"``, ``"fp16"``,
            ``"topk"``, ``"gtopk"``; the fraction of each bucket sent; the residual kept or
            not); None (default) takes the solver's ``comm_param`` block's value, or its
            default (none, 0.001, true) without a block. See :mod:`.compress`.
        fc_parallel: PCL-DNN's hybrid parallelism for every InnerProduct layer: ``"data"``,
            ``"auto"`` or a group size G (text or int, dividing ``comm.size``); None (default)
            takes each layer's ``inner_product_param.parallel``. See :mod:`.hybrid_train`.

    Attributes:
        comm, rank, size: the communicator and this process's place in it.
        solver: the solver, from ``on_init`` on.
        grad_sync: the :class:`~.buckets.GradientSync`, from ``on_nets_ready`` on.
        planner: the :class:`~.bucket_plan.AutoBuckets` with ``bucket_mb="auto"``, else None.
        compression: the :class:`~.compress.Compression` in use (from ``on_init``), or None.
        hybrid: the :class:`~.hybrid_train.HybridLayers` (from ``on_nets_ready``), or None
            when no layer is hybrid; it is also the solver's ``param_slicing``.

    Raises:
        CaffeError: a ``bucket_mb`` that is neither a number nor ``"auto"``; at ``on_init`` /
            ``on_nets_ready``, solver parameters or learnable shapes that differ between ranks
            (on every rank); ``debug_sync``, weights that differ; a bad compression method or
            density (one line), or compression on a communicator without it (``nccl``); a bad
            ``fc_parallel`` or one that does not divide ``comm.size`` (one line).
    """

    def __init__(self, comm, bucket_mb=25.0, debug_sync=False, compress=None, density=None,
                 error_feedback=None, fc_parallel=None):
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.bucket_mb = _bucket_size(bucket_mb)
        self.debug_sync = bool(debug_sync)
        if compress is not None:
            compression.check_method(compress, "DataParallel: compress")
        if density is not None:
            compression.check_density(density, "DataParallel: density")
        self._compress_args = (compress, density, error_feedback)
        self.fc_parallel = None if fc_parallel is None else str(fc_parallel)
        if self.fc_parallel is not None:
            hybrid_train.check_divides(
                hybrid_train.parse_parallel(self.fc_parallel, "DataParallel: fc_parallel"),
                self.size, "DataParallel: fc_parallel")
        self.hybrid = None
        self.compression = None
        self.solver = None
        self.grad_sync = None
        self.planner = None
        self._traffic_mark = ((0, 0, 0), 0)

    def __repr__(self):
        return f"<DataParallel rank {self.rank} of {self.size} ({self.comm.name})>"

    # -- construction ---------------------------------------------------------------------
    def on_init(self, solver):
        """Rank and solver count from the communicator, same solver everywhere, rank seed."""
        self.solver = solver
        solver.rank, solver.solver_count = self.rank, self.size
        same = caffe_pb2.SolverParameter()
        same.CopyFrom(solver.param)
        same.ClearField("device_id")     # one GPU per rank: the device may differ
        distributed.check_same_config(self.comm, solver=same)
        if solver.param.random_seed >= 0:
            rng.set_random_seed(distributed.rank_seed(solver.param.random_seed, self.rank))
        self.compression = compression.from_param(solver.param, *self._compress_args)
        if self.compression is not None:
            method = getattr(type(self.comm), "allreduce_compressed_async_", None)
            if method is None or method is Communicator.allreduce_compressed_async_:
                raise CaffeError(f"gradient compression '{self.compression.method}' needs an "
                                 f"MPI communicator (tree, ring, ps, mpi, hier), not "
                                 f"'{self.comm.name}'")

    def on_nets_ready(self, solver):
        """Rank 0's weights everywhere, the hybrid layers sliced, the gradient buckets hooked
        on, the summary line."""
        net = solver.net
        chosen = hybrid_train.choose_groups(net, self.comm, self.fc_parallel)
        distributed.check_same_config(self.comm, params=",".join(
            str(tuple(b.shape)) for b in net.learnable_params), hybrid=repr(sorted(chosen.items())))
        distributed.broadcast_params(net, self.comm)     # full blobs, before slicing
        plain = net
        if chosen:
            self.hybrid = hybrid_train.HybridLayers(solver, self.comm, chosen, self.bucket_mb)
            solver.param_slicing = self.hybrid
            plain = self.hybrid.plain
        auto = self.bucket_mb == "auto"
        first_mb = 25.0 if auto else self.bucket_mb
        self.grad_sync = GradientSync(plain, self.comm, bucket_mb=first_mb, op="mean",
                                      compress=self.compression)
        net.after_backward(self.grad_sync.on_layer_backward_done, sees_blobs=False)
        if auto:    # MG-WFBP: planned from the first iterations' backward times
            from .bucket_plan import AutoBuckets
            self.planner = AutoBuckets(plain, self.grad_sync, self.comm, log=logger,
                                       model_path=environment.read("CAFFE_COST_MODEL"))
        logger.info("Data parallel: rank %d of %d (%s), %d gradient bucket(s) of at most %s MB%s, "
                    "records dealt to %s%s%s", self.rank, self.size, self.comm.name,
                    len(self.grad_sync.buckets), g(first_mb),
                    " until the auto plan" if auto else "",
                    ", ".join(solver.dealt_layers) or "none", self._compression_text(),
                    self._hybrid_text(net))
        if self.debug_sync:
            self._check_sync(net, 0)

    def _hybrid_text(self, net):
        """The ``Data parallel`` line's tail: the hybrid layers and their group sizes."""
        if self.hybrid is None:
            return ""
        return f", hybrid (PCL-DNN) layers: {self.hybrid.describe(net)}"

    def _check_sync(self, net, iteration):
        """``debug_sync``: the unsliced params equal on every rank, each slice within its
        replicas (collective)."""
        if self.hybrid is None:
            distributed.check_params_in_sync(net, self.comm, iteration=iteration)
            return
        distributed.check_params_in_sync(self.hybrid.plain, self.comm, iteration=iteration)
        self.hybrid.check_in_sync(net, iteration)

    # -- every iteration ------------------------------------------------------------------
    def on_start(self):
        """The bucket planner's turn (every rank, after the tests)."""
        if self.planner is not None:
            self.planner.on_start(self.solver.iter)

    def on_pass(self, solver, k):
        """Arm the buckets for the last pass: they launch as backward finishes their layers."""
        if k == solver.param.iter_size - 1:
            self.grad_sync.begin()
            if self.hybrid is not None:
                self.hybrid.begin()

    def on_gradients_ready(self):
        """Launch the buckets not launched yet, wait for all: the diffs are the ranks' mean
        (the hybrid slices': their replicas' sum over P)."""
        self.grad_sync.finish()
        if self.hybrid is not None:
            self.hybrid.finish(self.solver.net)

    def on_update_done(self, solver, action):
        """``debug_sync``'s check; the root's requested action for every rank; with
        compression, every ``display`` iterations, the bytes sent per iteration."""
        if self.debug_sync:
            self._check_sync(solver.net, solver.iter)
        display = solver.param.display
        if self.compression is not None and display and solver.iter % display == 0:
            self._log_traffic(solver.iter)
        if solver.action_request_function is not None:
            action = self._root_value(action)
        return action

    # -- the root's phases ----------------------------------------------------------------
    def on_test(self, solver):
        """The root has tested: wait for it, and stop if it was asked to during its tests."""
        self._wait_for_root()
        solver.requested_early_exit = self._root_value(solver.requested_early_exit)

    def on_snapshot(self, solver):
        """With ``exact_resume``: every rank's state for the root's side file (collective)."""
        if solver.exact_resume:
            return solver.resume_content(self.comm)
        return None

    def on_root_done(self, solver):
        """The root has snapshot, or finished: wait for it."""
        self._wait_for_root()

    def close(self):
        """After training: free what the hybrid layers made (collective over the world; the
        world communicator itself is the caller's)."""
        if self.hybrid is not None:
            self.hybrid.close()

    # -- compression ----------------------------------------------------------------------
    def _compression_text(self):
        """The ``Data parallel`` line's tail: the compression and what it sends."""
        if self.compression is None:
            return ""
        sync = self.grad_sync
        n = sum(b.count for b in sync.buckets)
        if self.compression.sparse:
            k = sum(b.compressor.k for b in sync.buckets)
            return (f", gradients compressed: {self.compression.describe()} "
                    f"(k = {k} of {n} values)")
        return f", gradients compressed: fp16 ({n} values as float16)"

    def _log_traffic(self, iteration):
        """Rank 0 logs the bytes sent per iteration since the last such line (collective)."""
        sync = self.grad_sync
        (total, iters), mark = (sync.traffic_total, sync.iterations), self._traffic_mark
        self._traffic_mark = (total, iters)
        count = iters - mark[1]
        if count <= 0:
            return
        sent = (total[0] - mark[0][0]) / count
        everyone = self.comm.allgather_object(sent)
        n = sum(b.count for b in sync.buckets)
        logger.info("Iteration %d, gradient traffic (%s): %.0f bytes sent per iteration by the "
                    "busiest rank (this rank %.0f, mean %.0f over %d ranks); a dense ring "
                    "allreduce sends %.0f", iteration, self.compression.method, max(everyone),
                    sent, sum(everyone) / len(everyone), len(everyone),
                    compression.dense_ring_bytes(n, self.size))

    # -- collectives ----------------------------------------------------------------------
    def _root_value(self, value):
        """Rank 0's ``value`` on every rank (collective)."""
        return self.comm.allgather_object(value)[0]

    def _wait_for_root(self):
        """Wait at a barrier without a timeout: the root may test or write for long."""
        self.comm.barrier(timeout=None)
