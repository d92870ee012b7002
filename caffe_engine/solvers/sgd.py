"""Caffe's SGD family: SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam.

Caffe: src/caffe/solvers/sgd_solver.cpp and its subclasses' files. Per iteration
(``SGDSolver::ApplyUpdate``): compute the rate, log it, clip the global L2 norm of the
gradients, then per learnable param: normalise by ``iter_size``, add weight decay (L2 or L1,
times ``decay_mult``), let the update rule turn the diff into the step, and ``data -= diff``:
one fused kernel per param (``update`` of the param's kernel set, :mod:`caffe_engine.kernels`;
the reference set's :mod:`caffe_engine.kernels.reference.solver` shows the arithmetic, in
float32 and in Caffe's order).

Each rule's code, history sets and hyper-parameters are declared once, in
:mod:`caffe_engine.kernels.update_rules`; a solver class here adds its ``type`` and Caffe's
checks of its hyper-parameters. History layout (what the ``.solverstate`` holds, in this
order): one blob per learnable param, of its shape; AdaDelta and Adam append a second set after
the first (AdaDelta: squared gradients then squared updates; Adam: first moments then second
moments).

SolverParameter fields read: ``base_lr`` and the ``lr_policy`` fields (``lr_policy.py``,
with NVCaffe's warm-up ``rampup_interval``/``rampup_lr`` and ``min_lr``), ``momentum`` (0),
``momentum2`` (0.999, Adam), ``delta`` (1e-8), ``rms_decay`` (0.99), ``weight_decay`` (0),
``regularization_type`` ("L2" or "L1"), ``clip_gradients`` (-1: off), ``iter_size`` (1),
``display``, ``snapshot_format``, and NVCaffe's LARC fields ``larc`` (false), ``larc_policy``
("scale"), ``larc_eta`` (0.001), ``larc_turbo`` (false) for SGD and Nesterov (``larc.py``: the
rate of each param is then set from its weight and gradient norms before the fused step).
"""
import numpy

from .. import backend
from ..blob import Blob
from ..errors import CaffeError
from ..io import prototxt as pio
from ..io.blobproto import blob_to_proto, proto_shape, proto_to_array
from ..log import g, logger
from ..proto import caffe_pb2
from .. import kernels
from ..kernels.update_rules import RULES, Hyper
from . import larc
from .lr_policy import check_warmup, learning_rate
from .solver import Solver

f32 = numpy.float32


class SGDSolver(Solver):
    """Stochastic gradient descent with momentum (and the shared update steps of its family).

    Raises:
        CaffeError: as :class:`Solver`, plus an unknown ``regularization_type``, a
            hyper-parameter the rule refuses (see the subclasses), or bad LARC or warm-up
            fields (:func:`.larc.check_larc`, :func:`.lr_policy.check_warmup`).
    """

    type = "SGD"

    @property
    def history_sets(self):
        """History blobs per learnable param (1 or 2), as the update rule ``type`` declares."""
        return RULES[self.type].history_sets

    def check_param(self, param):
        """Refuse hyper-parameters the rule cannot use (Caffe's constructor checks)."""

    def init_state(self):
        self.check_param(self.param)
        larc.check_larc(self.param, self.type)
        check_warmup(self.param)
        params = self.net.learnable_params
        self.history = [Blob(b.shape) for _ in range(self.history_sets) for b in params]
        self.hyper = Hyper(self.param)
        sets = [kernels.for_array(b.data) for b in params]
        self._steps = [k.update(self.type) for k in sets]
        self._norms = [k.param_norms for k in sets]

    def get_learning_rate(self):
        rate = learning_rate(self.param, self.iter, self.lr_state)
        self.current_step = self.lr_state.get("current_step", 0)
        return rate

    def clip_gradients(self, display=True):
        """Scale all diffs down when their global L2 norm exceeds ``clip_gradients`` (Caffe's
        SGDSolver::ClipGradients: the sum of squares in float32, param by param; its root in
        double, rounded to float32; scale ``clip / norm`` in float32).

        The norm and the scale are computed where the diffs are, as scalars that are never
        read to decide anything. On the CPU, as Caffe: the diffs are scaled and the
        ``Gradient clipping:`` line is logged in every iteration that clips. On the device
        (``backend.on_device``) every diff is multiplied by the scale, 1 when nothing clips
        (exact), and the line is logged only in ``display`` iterations that clip, from one host
        read of (norm, scale).
        """
        clip = f32(self.param.clip_gradients)
        if clip < 0:
            return
        params = self.net.learnable_params
        if not params:
            return
        sumsq = None
        for b in params:
            xp = backend.get_array_module(b.diff)
            term = xp.vdot(b.diff.ravel(), b.diff.ravel())
            sumsq = term + f32(0) if sumsq is None else sumsq + term
        xp = backend.get_array_module(sumsq)
        l2norm = xp.sqrt(sumsq.astype(numpy.float64)).astype(f32)
        clipping = l2norm > clip
        # xp.divide: the host ``clip`` over a device norm (no NumPy-scalar operator on it)
        scale = xp.where(clipping, xp.divide(clip, xp.where(clipping, l2norm, f32(1))),
                         f32(1)).astype(f32)
        if not backend.on_device(l2norm):
            if clipping:
                self._log_clipping(l2norm, clip, scale)
                for b in params:
                    b.diff *= scale
            return
        for b in params:
            b.diff *= scale
        if display:
            norm_h, scale_h = backend.to_numpy(xp.stack([l2norm, scale]))
            if norm_h > clip:
                self._log_clipping(norm_h, clip, scale_h)

    @staticmethod
    def _log_clipping(l2norm, clip, scale):
        logger.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                    g(f32(l2norm)), g(clip), g(f32(scale)))

    def apply_update(self):
        rate = self.get_learning_rate()
        display = bool(self.param.display and self.iter % self.param.display == 0)
        if display:
            logger.info("Iteration %d, lr = %s", self.iter, g(rate))
        self.clip_gradients(display)
        self.hyper.t = self.iter + 1
        kind = self.param.regularization_type
        if kind not in ("L1", "L2"):
            raise CaffeError(f"solver: Unknown regularization type: '{kind}' (known: L1, L2)")
        params = self.net.learnable_params
        n = len(params)
        iter_scale = f32(1) / f32(self.param.iter_size) if self.param.iter_size > 1 else f32(1)
        weight_decay = f32(self.param.weight_decay)
        use_larc = self.param.larc
        for i, blob in enumerate(params):
            history = [self.history[s * n + i].data for s in range(self.history_sets)]
            local_rate = f32(rate) * f32(self.net.params_lr[i])
            decay = weight_decay * f32(self.net.params_weight_decay[i])
            if use_larc and self.net.params_lr[i] > 0:
                local_rate = self.larc_rate(i, rate, iter_scale, decay)
            self._steps[i](blob.data, blob.diff, history, local_rate,
                           self.hyper, decay, kind == "L1", iter_scale)

    def larc_rate(self, i, rate, iter_scale, decay):
        """LARC's rate for learnable param ``i`` this iteration (:func:`.larc.local_rate`),
        ``decay`` its weight decay (``weight_decay * decay_mult``):
        the gradient's norm is taken as the rule will see it, after the ``iter_size``
        normalisation (``iter_scale``), before weight decay. The norms may be device scalars
        (the cuda set's ``param_norms``): the rate is then one too, computed and used unread."""
        blob = self.net.learnable_params[i]
        w_norm, g_norm = self._norms[i](blob.data, blob.diff)
        if iter_scale != 1:
            g_norm = g_norm * iter_scale
        return larc.local_rate(rate, w_norm, g_norm, self.hyper.momentum,
                               self.param.larc_eta, self.param.larc_policy,
                               self.param.larc_trust, decay)

    # -- solver state -----------------------------------------------------------------------
    def snapshot_state(self, model_filename):
        """Write the solver state for ``model_filename``; returns the state's file name."""
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            from ..io.hdf5_snapshot import save_solver_state_hdf5
            filename = self.snapshot_filename(".solverstate.h5")
            logger.info("Snapshotting solver state to HDF5 file %s", filename)
            save_solver_state_hdf5(filename, self.iter, model_filename, self.current_step, self.history)
            return filename
        state = caffe_pb2.SolverState(iter=self.iter, learned_net=model_filename,
                                      current_step=self.current_step)
        for h in self.history:
            blob_to_proto(h, state.history.add())
        filename = self.snapshot_filename(".solverstate")
        logger.info("Snapshotting solver state to binary proto file %s", filename)
        pio.write_binary(filename, state)
        return filename

    def restore_state(self, history, log=True):
        """Load the history blobs from a list of BlobProtos or float32 arrays.

        Raises:
            CaffeError: wrong number of blobs, or a blob whose shape differs from its param's.
        """
        if len(history) != len(self.history):
            raise CaffeError(f"solverstate: Incorrect length of history blobs "
                             f"({len(history)} in file, {len(self.history)} expected for {self.type})")
        if log:
            logger.info("SGDSolver: restoring history")
        for i, (h, saved) in enumerate(zip(self.history, history)):
            if isinstance(saved, caffe_pb2.BlobProto):
                shape, values = proto_shape(saved, h.shape), proto_to_array(saved)
            else:
                values = numpy.asarray(saved, dtype=f32)
                shape = tuple(values.shape)
            if shape != tuple(h.shape):
                raise CaffeError(f"solverstate: history blob {i} has shape {shape}; its param has "
                                 f"shape {tuple(h.shape)}")
            h.data[...] = backend.get_array_module(h.data).asarray(values.reshape(h.shape))


class NesterovSolver(SGDSolver):
    """Nesterov's accelerated gradient (Caffe: src/caffe/solvers/nesterov_solver.cpp)."""

    type = "Nesterov"


class AdaGradSolver(SGDSolver):
    """AdaGrad (Caffe: src/caffe/solvers/adagrad_solver.cpp).

    Raises:
        CaffeError: ``momentum`` is not 0 ("Momentum cannot be used with AdaGrad.").
    """

    type = "AdaGrad"

    def check_param(self, param):
        if param.momentum != 0:
            raise CaffeError("solver: Momentum cannot be used with AdaGrad.")


class RMSPropSolver(SGDSolver):
    """RMSProp (Caffe: src/caffe/solvers/rmsprop_solver.cpp).

    Raises:
        CaffeError: ``momentum`` is not 0, or ``rms_decay`` is outside [0, 1).
    """

    type = "RMSProp"

    def check_param(self, param):
        if param.momentum != 0:
            raise CaffeError("solver: Momentum cannot be used with RMSProp.")
        if not 0 <= param.rms_decay < 1:
            raise CaffeError(f"solver: rms_decay should lie between 0 and 1 (got {g(param.rms_decay)}).")


class AdaDeltaSolver(SGDSolver):
    """AdaDelta (Caffe: src/caffe/solvers/adadelta_solver.cpp); two history sets."""

    type = "AdaDelta"


class AdamSolver(SGDSolver):
    """Adam (Caffe: src/caffe/solvers/adam_solver.cpp); two history sets (m, then v)."""

    type = "Adam"
