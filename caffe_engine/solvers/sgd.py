"""Stochastic gradient descent with momentum (Caffe's SGDSolver) and the shared update steps.

Caffe: src/caffe/solvers/sgd_solver.cpp. Per iteration: compute the rate, clip the global L2
norm of the gradients, then per param: normalise by ``iter_size``, add weight decay (L2 or L1,
times ``decay_mult``), compute the update into the diff, and finally ``data -= diff``.
SGD's update: ``history = lr * lr_mult * diff + momentum * history; diff = history``
(the rate is applied before momentum, as Caffe does). All arithmetic in float32.
"""
import math

import numpy

from .. import backend
from ..blob import Blob
from ..errors import CaffeError
from ..io import prototxt as pio
from ..io.weights import blob_from_proto, blob_to_proto, proto_shape
from ..log import g, logger
from ..proto import caffe_pb2
from .lr_policy import learning_rate
from .solver import Solver

f32 = numpy.float32


class SGDSolver(Solver):
    """SGD with momentum; history blobs mirror the learnable params' shapes."""

    type = "SGD"

    def init_state(self):
        self.history = [Blob(b.shape) for b in self.net.learnable_params]

    def get_learning_rate(self):
        rate = learning_rate(self.param, self.iter, self.lr_state)
        self.current_step = self.lr_state.get("current_step", 0)
        return rate

    def clip_gradients(self):
        clip = f32(self.param.clip_gradients)
        if clip < 0:
            return
        params = self.net.learnable_params
        sumsq = f32(0)
        for b in params:
            xp = backend.get_array_module(b.diff)
            sumsq += f32(xp.vdot(b.diff.ravel(), b.diff.ravel()))
        l2norm = f32(math.sqrt(sumsq))
        if l2norm > clip:
            scale = f32(clip / l2norm)
            logger.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                        g(l2norm), g(clip), g(scale))
            for b in params:
                b.diff *= scale

    def normalize(self, i):
        if self.param.iter_size > 1:
            self.net.learnable_params[i].diff *= f32(1) / f32(self.param.iter_size)

    def regularize(self, i):
        blob = self.net.learnable_params[i]
        decay = f32(self.param.weight_decay) * f32(self.net.params_weight_decay[i])
        if not decay:
            return
        kind = self.param.regularization_type
        if kind == "L2":
            blob.diff += decay * blob.data
        elif kind == "L1":
            xp = backend.get_array_module(blob.data)
            blob.diff += decay * xp.sign(blob.data)
        else:
            raise CaffeError(f"solver: unknown regularization_type '{kind}' (known: L1, L2)")

    def compute_update_value(self, i, rate):
        blob, hist = self.net.learnable_params[i], self.history[i].data
        local_rate = f32(rate) * f32(self.net.params_lr[i])
        hist *= f32(self.param.momentum)
        hist += local_rate * blob.diff
        blob.diff[...] = hist

    def apply_update(self):
        rate = self.get_learning_rate()
        if self.param.display and self.iter % self.param.display == 0:
            logger.info("Iteration %d, lr = %s", self.iter, g(rate))
        self.clip_gradients()
        for i in range(len(self.net.learnable_params)):
            self.normalize(i)
            self.regularize(i)
            self.compute_update_value(i, rate)
        self.net.update()

    def snapshot_state(self, model_filename):
        state = caffe_pb2.SolverState(iter=self.iter, learned_net=model_filename,
                                      current_step=self.current_step)
        for h in self.history:
            blob_to_proto(h, state.history.add())
        filename = self.snapshot_filename(".solverstate")
        logger.info("Snapshotting solver state to binary proto file %s", filename)
        pio.write_binary(filename, state)

    def restore_state(self, state):
        if len(state.history) != len(self.history):
            raise CaffeError(f"solverstate: Incorrect length of history blobs "
                             f"({len(state.history)} in file, {len(self.history)} expected)")
        logger.info("SGDSolver: restoring history")
        for h, bp in zip(self.history, state.history):
            shape = proto_shape(bp, h.shape)
            if shape != h.shape:
                raise CaffeError(f"solverstate: history blob shape {shape} does not match param shape {h.shape}")
            h.data[...] = backend.get_array_module(h.data).asarray(blob_from_proto(bp).reshape(h.shape))
