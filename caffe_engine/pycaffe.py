"""pycaffe conveniences beyond Net and the solvers: ``Classifier``, ``init_log``, ``log``,
``Timer``, ``NCCL`` and ``has_nccl``.

Caffe: python/caffe/classifier.py, python/caffe/_caffe.cpp (``init_log``, ``log``, ``Timer``,
``NCCL``, ``has_nccl``).
"""
import time

import numpy

from . import io as caffe_io
from .log import logger, setup_logging
from .net import TEST, Net


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """The Transformer of ``net``'s first input for (H, W, K) images, as pycaffe's Classifier
    and Detector set it up: transpose (2, 0, 1), then each step given (None: left out)."""
    in_ = net.inputs[0]
    transformer = caffe_io.Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


class Classifier(Net):
    """A deploy net with its image preprocessing, predicting class scores (pycaffe's).

    Args:
        model_file: deploy prototxt (one input, batch of any size N).
        pretrained_file: ``.caffemodel`` with its weights.
        image_dims: (H, W) images are resized to before cropping (default: the input's size).
        mean: mean to subtract, (K,) or (K, H, W) as :meth:`Transformer.set_mean` takes.
        input_scale, raw_scale, channel_swap: as the Transformer's setters.

    Attributes:
        transformer: the :class:`caffe_engine.io.Transformer` for the input (transpose (2, 0, 1)).
        crop_dims: the input blob's (H, W); image_dims: the resize target.
    """

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        in_ = self.inputs[0]
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = numpy.array(self.blobs[in_].shape[2:])
        self.image_dims = tuple(image_dims) if image_dims is not None else tuple(self.crop_dims)

    def predict(self, inputs, oversample=True):
        """Class scores for a list of (H, W, K) images.

        With ``oversample`` each image gives ten crops (corners, centre, mirrored) whose
        outputs are averaged; without, the centre crop. Returns an (N, classes) array of the
        first output blob.
        """
        batch = numpy.zeros((len(inputs), self.image_dims[0], self.image_dims[1], inputs[0].shape[2]),
                            dtype=numpy.float32)
        for ix, image in enumerate(inputs):
            batch[ix] = caffe_io.resize_image(image, self.image_dims)
        if oversample:
            batch = caffe_io.oversample(batch, self.crop_dims)
        else:
            center = numpy.array(self.image_dims) / 2.0
            crop = (numpy.tile(center, (1, 2))[0]
                    + numpy.concatenate([-self.crop_dims / 2.0, self.crop_dims / 2.0])).astype(int)
            batch = batch[:, crop[0]:crop[2], crop[1]:crop[3], :]
        in_ = self.inputs[0]
        caffe_in = numpy.stack([self.transformer.preprocess(in_, image) for image in batch])
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions


def init_log(level=0):
    """Send the engine's log to stderr in glog's format (pycaffe's ``caffe.init_log``).

    ``level`` is glog's minimum severity: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL.
    """
    import logging
    levels = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.CRITICAL}
    setup_logging(level=levels.get(int(level), logging.INFO))


def log(message):
    """Write one INFO line to the engine's log (pycaffe's ``caffe.log``)."""
    logger.info("%s", message)


class Timer:
    """Wall-clock timer (pycaffe's ``caffe.Timer``, Caffe's CPUTimer): ``start()``, ``stop()``,
    and ``ms``, the milliseconds between them (float; reading it while running stops it)."""

    def __init__(self):
        self._start = None
        self._elapsed = None

    def start(self):
        """Start (or restart) timing."""
        self._start = time.perf_counter()

    def stop(self):
        """Stop timing; a timer that was not started stays as it was."""
        if self._start is not None:
            self._elapsed = time.perf_counter() - self._start
            self._start = None

    @property
    def ms(self):
        """Milliseconds of the last start..stop (0 with a warning if never run, as Caffe)."""
        if self._start is not None:
            self.stop()
        if self._elapsed is None:
            from .log import logger
            logger.warning("Timer has never been run before reading time.")
            return 0.0
        return self._elapsed * 1e3


def has_nccl():
    """Whether NCCL can reduce gradients between GPU solvers here (pycaffe's ``has_nccl``):
    CuPy with its NCCL bindings and a CUDA device."""
    try:
        import cupy
        from cupy.cuda import nccl  # noqa: F401
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, CUDARuntimeError
        return False


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)`` as a build without NCCL has it: an object a script
    may hand to ``solver.add_callback`` and ``net.after_backward`` that does nothing, so the
    single-process path of multi-GPU scripts (python/train.py) runs unchanged.

    Gradients of several processes are reduced by ``mpiexec -n P caffe train`` (MPI, or NCCL
    with ``--comm nccl``), not through this object.

    Raises:
        CaffeError: ``solver_count`` > 1 (set by ``set_solver_count``): nothing here would
            reduce the gradients of the other processes.
    """

    def __init__(self, solver, uid=""):
        from . import backend
        from .errors import CaffeError
        if backend.solver_count() > 1:
            raise CaffeError("caffe.NCCL: multi-process pycaffe training is not supported; run "
                             "'mpiexec -n P caffe train --solver ...' instead")
        self.solver = solver
        self.uid = uid

    def on_start(self):
        """Solver callback: nothing to do with one solver."""

    def on_gradients_ready(self):
        """Solver callback: nothing to reduce with one solver."""

    def __call__(self, layer_index):
        """Net after-backward callback: nothing to reduce with one solver."""
