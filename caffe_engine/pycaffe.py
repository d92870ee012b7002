"""pycaffe conveniences beyond Net and the solvers: ``Classifier``, ``init_log``, ``log``.

Caffe: python/caffe/classifier.py, python/caffe/_caffe.cpp (``init_log``, ``log``).
"""
import numpy

from . import io as caffe_io
from .log import logger, setup_logging
from .net import TEST, Net


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
        self.transformer = caffe_io.Transformer({in_: self.blobs[in_].shape})
        self.transformer.set_transpose(in_, (2, 0, 1))
        if mean is not None:
            self.transformer.set_mean(in_, mean)
        if input_scale is not None:
            self.transformer.set_input_scale(in_, input_scale)
        if raw_scale is not None:
            self.transformer.set_raw_scale(in_, raw_scale)
        if channel_swap is not None:
            self.transformer.set_channel_swap(in_, channel_swap)
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
