"""The solver loop: test, forward/backward, display, update, snapshot — Caffe's template.

Caffe: src/caffe/solver.cpp (Solver::Init, Step, Solve, Test, Snapshot, Restore,
UpdateSmoothedLoss). The update rule itself lives in a subclass (``sgd.py``): it owns the
history blobs and ``apply_update``. Log lines are Caffe's, word for word, so log parsers work.
"""
import os
import time

import numpy

from .. import rng
from ..errors import CaffeError
from ..io import prototxt as pio
from ..log import g, logger
from ..net import Net
from ..proto import caffe_pb2

f32 = numpy.float32


class Solver:
    """Builds the train net and test nets from a SolverParameter and trains.

    Args:
        param: caffe_pb2.SolverParameter, or a solver prototxt path.

    Attributes:
        net: the train Net; test_nets: list of test Nets; iter: updates done so far.

    Raises:
        CaffeError: no or several train nets, test_iter count mismatch, unwritable snapshot
            prefix, and anything the nets raise.
    """

    type = None

    def __init__(self, param):
        if not isinstance(param, caffe_pb2.SolverParameter):
            param = pio.read_solver_param(str(param))
        self.param = param
        logger.info("Initializing solver from parameters: \n%s", param)
        if param.random_seed >= 0:
            rng.set_random_seed(param.random_seed)
        self.iter = 0
        self.current_step = 0
        self.lr_state = {"current_step": 0}
        self.requested_early_exit = False
        self.losses = []
        self.smoothed_loss = f32(0)
        self._check_snapshot_prefix()
        self.net = self._init_train_net()
        self.test_nets = self._init_test_nets()
        logger.info("Solver scaffolding done.")
        self.init_state()

    # -- construction ----------------------------------------------------------------------
    def _check_snapshot_prefix(self):
        p = self.param
        if not (p.snapshot or p.snapshot_after_train):
            return
        folder = os.path.dirname(p.snapshot_prefix) or "."
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise CaffeError(f"Cannot write to snapshot prefix '{p.snapshot_prefix}'. "
                             "Make sure that the directory exists and is writable.")

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
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.train_net_param)
        elif p.HasField("train_net"):
            logger.info("Creating training net from train_net file: %s", p.train_net)
            net_param = pio.read_net_param(p.train_net)
        elif p.HasField("net_param"):
            logger.info("Creating training net specified in net_param.")
            net_param = caffe_pb2.NetParameter()
            net_param.CopyFrom(p.net_param)
        else:
            logger.info("Creating training net from net file: %s", p.net)
            net_param = pio.read_net_param(p.net)
        state = caffe_pb2.NetState(phase=caffe_pb2.TRAIN)
        state.MergeFrom(net_param.state)
        state.MergeFrom(p.train_state)
        net_param.state.CopyFrom(state)
        return Net(net_param, state.phase, level=state.level, stages=list(state.stage))

    def _init_test_nets(self):
        p = self.param
        has_generic = p.HasField("net_param") or p.HasField("net")
        n_params, n_files = len(p.test_net_param), len(p.test_net)
        n_specific = n_params + n_files
        n_generic = (len(p.test_iter) - n_specific) if has_generic else 0
        total = n_specific + n_generic
        if len(p.test_iter) != total:
            raise CaffeError(f"solver: test_iter must be specified for each test network "
                             f"({len(p.test_iter)} given for {total} test nets)")
        if len(p.test_state) and len(p.test_state) != total:
            raise CaffeError("solver: test_state must be unspecified or specified once per test net")
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
                logger.info("Creating test net (#%d) specified by %s", i, kind)
                net_param = caffe_pb2.NetParameter()
                net_param.CopyFrom(inline)
            else:
                logger.info("Creating test net (#%d) specified by %s: %s", i, kind, path)
                net_param = pio.read_net_param(path)
            state = caffe_pb2.NetState(phase=caffe_pb2.TEST)
            state.MergeFrom(net_param.state)
            if len(p.test_state):
                state.MergeFrom(p.test_state[i])
            net_param.state.CopyFrom(state)
            nets.append(Net(net_param, state.phase, level=state.level, stages=list(state.stage)))
        return nets

    # -- the update rule (subclasses) -------------------------------------------------------
    def init_state(self):
        """Create the update rule's history blobs."""

    def apply_update(self):
        raise NotImplementedError

    def snapshot_state(self, model_filename):
        raise NotImplementedError

    def restore_state(self, state):
        raise NotImplementedError

    # -- training ---------------------------------------------------------------------------
    def solve(self, resume_file=None):
        """Train to ``max_iter`` (Caffe's Solver::Solve), resuming from a .solverstate if given."""
        logger.info("Solving %s", self.net.name)
        logger.info("Learning Rate Policy: %s", self.param.lr_policy)
        self.requested_early_exit = False
        if resume_file:
            logger.info("Restoring previous solver status from %s", resume_file)
            self.restore(resume_file)
        start_iter = self.iter
        self.step(self.param.max_iter - self.iter)
        p = self.param
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.requested_early_exit:
            logger.info("Optimization stopped early.")
            return
        if p.display and self.iter % p.display == 0:
            loss = self.net.forward_loss()
            self._update_smoothed_loss(loss, start_iter, p.average_loss)
            logger.info("Iteration %d, loss = %s", self.iter, g(self.smoothed_loss))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        logger.info("Optimization Done.")

    def step(self, iters):
        """Run ``iters`` iterations (Caffe's Solver::Step)."""
        p = self.param
        start_iter = self.iter
        stop_iter = self.iter + iters
        self.losses = []
        self.smoothed_loss = f32(0)
        last_iter, last_time = self.iter, time.perf_counter()
        while self.iter < stop_iter:
            self.net.clear_param_diffs()
            if (p.test_interval and self.iter % p.test_interval == 0
                    and (self.iter > 0 or p.test_initialization)):
                self.test_all()
                if self.requested_early_exit:
                    break
            display = p.display and self.iter % p.display == 0
            loss = f32(0)
            for _ in range(p.iter_size):
                loss += self.net.forward_backward()
            loss = f32(loss / f32(p.iter_size))
            self._update_smoothed_loss(loss, start_iter, p.average_loss)
            if display:
                now = time.perf_counter()
                lapse = now - last_time
                per_s = (self.iter - last_iter) / (lapse or 1.0)
                logger.info("Iteration %d (%s iter/s, %.3gs/%d iters), loss = %s", self.iter,
                            g(per_s), lapse, p.display, g(self.smoothed_loss))
                last_iter, last_time = self.iter, now
                self._log_outputs(self.net, "Train")
            self.apply_update()
            self.iter += 1
            if p.snapshot and self.iter % p.snapshot == 0:
                self.snapshot()
            if self.requested_early_exit:
                break

    def _log_outputs(self, net, kind, values=None):
        """Caffe's ``    Train net output #k: name = v (* w = wv loss)`` lines."""
        index = 0
        for name in net.outputs:
            blob = net.blobs[name]
            weight = net.blob_loss_weights[net.blob_names.index(name)]
            vec = values[name] if values is not None else numpy.asarray(blob.data).ravel()
            for v in vec:
                suffix = f" (* {g(weight)} = {g(f32(weight) * f32(v))} loss)" if weight else ""
                logger.info("    %s net output #%d: %s = %s%s", kind, index, name, g(v), suffix)
                index += 1

    def _update_smoothed_loss(self, loss, start_iter, average_loss):
        if len(self.losses) < average_loss:
            self.losses.append(f32(loss))
            size = len(self.losses)
            self.smoothed_loss = f32((self.smoothed_loss * f32(size - 1) + f32(loss)) / f32(size))
        else:
            idx = (self.iter - start_iter) % average_loss
            self.smoothed_loss = f32(self.smoothed_loss + (f32(loss) - self.losses[idx]) / f32(average_loss))
            self.losses[idx] = f32(loss)

    def test_all(self):
        for i in range(len(self.test_nets)):
            if self.requested_early_exit:
                break
            self.test(i)

    def test(self, test_net_id=0):
        """Run test net ``test_net_id`` for its ``test_iter`` batches and log mean outputs.

        Returns:
            dict output name -> list of float32 means (one per element of the output blob).
        """
        p = self.param
        logger.info("Iteration %d, Testing net (#%d)", self.iter, test_net_id)
        net = self.test_nets[test_net_id]
        net.share_trained_layers_with(self.net)
        n = p.test_iter[test_net_id]
        sums = None
        loss = f32(0)
        for i in range(n):
            iter_loss = net.forward_loss()
            if p.test_compute_loss:
                loss += iter_loss
            vals = {name: numpy.asarray(net.blobs[name].data, dtype=f32).ravel().copy()
                    for name in net.outputs}
            if sums is None:
                sums = vals
            else:
                for name in sums:
                    sums[name] += vals[name]
        if p.test_compute_loss:
            logger.info("Test loss: %s", g(loss / f32(n)))
        means = {name: (s / f32(n)).astype(f32) for name, s in (sums or {}).items()}
        self._log_outputs(net, "Test", means)
        return means

    # -- snapshots --------------------------------------------------------------------------
    def snapshot_filename(self, extension):
        return f"{self.param.snapshot_prefix}_iter_{self.iter}{extension}"

    def snapshot(self):
        """Write ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate`` (atomically)."""
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            raise CaffeError("solver: snapshot_format HDF5 is not supported yet; use BINARYPROTO")
        model_filename = self.snapshot_filename(".caffemodel")
        logger.info("Snapshotting to binary proto file %s", model_filename)
        self.net.save(model_filename, self.param.snapshot_diff)
        self.snapshot_state(model_filename)

    def restore(self, state_file):
        """Restore iter, lr step, history and (via ``learned_net``) weights from a .solverstate."""
        if state_file.endswith(".h5"):
            raise CaffeError(f"{state_file}: HDF5 solver states are not supported yet")
        state = pio.read_binary(state_file, caffe_pb2.SolverState(), "solverstate")
        self.iter = state.iter
        if state.learned_net:
            self.net.copy_from(state.learned_net)
        self.current_step = state.current_step
        self.lr_state["current_step"] = state.current_step
        self.restore_state(state)
