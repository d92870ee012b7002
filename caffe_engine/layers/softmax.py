"""Softmax, and the layers that score predictions: SoftmaxWithLoss and Accuracy.

Caffe: src/caffe/layers/softmax_layer.cpp, softmax_loss_layer.cpp, accuracy_layer.cpp,
loss_layer.cpp.

Labels arrive as float blobs holding integer values; like Caffe, a label is truncated to int.
A prediction blob of shape (N, C, H, W) with ``axis: 1`` is scored at every (n, h, w), so the
label blob must hold ``N * H * W`` values.
"""
import numpy

from .. import kernels
from ..backend import get_array_module
from ..blob import Blob
from ..kernels.reference.softmax import label_check
from ..proto import caffe_pb2
from .base import Layer, create_layer, register

f32 = numpy.float32

_NORM = caffe_pb2.LossParameter


@register("Softmax")
class SoftmaxLayer(Layer):
    """Softmax over one axis, computed as Caffe does in float32: subtract the max, exp, sum, divide.

    Shapes: any; top as bottom. With ``axis = a`` the bottom is read as
    (count(0, a), shape[a], count(a + 1)) and normalised over the middle axis. In place allowed.

    Fields read (softmax_param): axis (1, may be negative). ``engine`` is ignored.

    Raises:
        CaffeError: axis out of range.

    Caffe: src/caffe/layers/softmax_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1
    backward_ignores_propagate_down = True

    def reshape(self, bottom, top):
        try:
            axis = bottom[0].canonical_axis(self.param.softmax_param.axis)
        except IndexError as exc:
            raise self.error(str(exc)) from None
        top[0].reshape(bottom[0].shape)
        shape = bottom[0].shape
        self.view = (bottom[0].count_range(0, axis), shape[axis], bottom[0].count_range(axis + 1))
        xp = get_array_module(bottom[0].data)
        scale_shape = (self.view[0], 1, self.view[2])
        scale = getattr(self, "scale", None)
        if scale is None or scale.shape != scale_shape or get_array_module(scale) is not xp:
            self.scale = xp.empty(scale_shape, f32)
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.view)
        y = top[0].data.reshape(self.view)
        self.kernels.softmax_forward(x, y, self.scale)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        y = top[0].data.reshape(self.view)
        dy = top[0].diff.reshape(self.view)
        dx = bottom[0].diff.reshape(self.view)
        # dx = (dy - sum_c(dy * y)) * y ; dy and dx may be one array (in place).
        dot = xp.sum(dy * y, axis=1, keepdims=True)
        xp.subtract(dy, dot, out=dx)
        dx *= y


def _label_check(layer, labels, valid, num_classes):
    """Raise when a non-ignored label is outside [0, num_classes) (Caffe only DCHECKs this);
    return the labels to index with: ignored (``valid`` False) and out-of-range ones set to 0.

    Immediate on the CPU (no label is then out of range); on the device deferred without a
    host read and raised at the next display, test or pycaffe forward
    (:func:`caffe_engine.backend.check_values`), the out-of-range labels indexing class 0 meanwhile.

    Args:
        labels: int32 array; valid: bool array of its shape, or None (all valid).
    """
    return label_check(layer, labels, valid, num_classes,
                       lambda value: _label_error(layer, value, num_classes))


def _label_error(layer, value, num_classes):
    return layer.error(f"label value {int(value)} outside [0, {num_classes}) "
                       f"(labels must be integers in 0 .. number of classes - 1)")


@register("SoftmaxWithLoss")
class SoftmaxWithLossLayer(Layer):
    """Multinomial logistic loss of the softmax of the predictions.

    Bottoms: predictions (N, C, ...) and labels with ``count(0, axis) * count(axis + 1)`` values
    (integer-valued floats). Tops: the loss, shape () , and optionally the probabilities (shape
    of the predictions) -- which then needs a ``loss_weight`` per top, as in Caffe.

    ``loss = -sum(log(max(p[label], FLT_MIN))) / normalizer`` over the non-ignored positions.
    The normalizer is, by ``loss_param.normalization``: FULL ``count(0, axis) * count(axis+1)``,
    VALID (the default) the number of non-ignored labels, BATCH_SIZE ``count(0, axis)``, NONE 1;
    then at least 1. The deprecated ``normalize: false`` (when normalization is unset) means
    BATCH_SIZE, ``normalize: true`` VALID. The gradient is ``(p - onehot(label)) * loss_weight /
    normalizer``, zero at ignored positions. The labels never get a gradient.

    The arithmetic is the kernel set's (``softmax_forward``, ``softmax_loss_forward``,
    ``softmax_loss_backward``, :mod:`caffe_engine.kernels.reference.softmax`): on the cuda set
    3 launches forward (softmax, per-chunk loss and label check, the sum and normalizer) and 1
    backward (the normalizer and the top's diff read on the device).

    Fields read: loss_param.ignore_label (unset: none), loss_param.normalization (VALID),
    loss_param.normalize (deprecated), softmax_param.axis (1).

    Raises:
        CaffeError: label count not matching the predictions; data and label of different first
            dimension; a label outside [0, C); backward asked for the labels; two tops without
            one loss_weight per top.

    Caffe: src/caffe/layers/softmax_loss_layer.cpp, src/caffe/layers/loss_layer.cpp.
    """

    exact_num_bottom = 2
    min_top = 1
    max_top = 2
    is_loss = True

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        softmax_param = caffe_pb2.LayerParameter()
        softmax_param.CopyFrom(self.param)
        softmax_param.type = "Softmax"
        del softmax_param.loss_weight[:]
        del softmax_param.top[:]
        self.softmax = create_layer(softmax_param, self.phase)
        self.prob = Blob(bottom[0].shape, xp=get_array_module(bottom[0].data))
        self.softmax.setup([bottom[0]], [self.prob])
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        if lp.HasField("normalization"):
            self.normalization = lp.normalization
        elif lp.HasField("normalize"):
            self.normalization = _NORM.VALID if lp.normalize else _NORM.BATCH_SIZE
        else:
            self.normalization = _NORM.VALID

    def reshape(self, bottom, top):
        data, label = bottom
        if data.shape[:1] != label.shape[:1]:
            raise self.error(f"the data and label should have the same first dimension "
                             f"({data.shape} vs {label.shape})")
        top[0].reshape(())
        self.softmax.reshape([data], [self.prob])
        axis = data.canonical_axis(self.param.softmax_param.axis)
        self.axis = axis
        self.outer, self.inner = data.count_range(0, axis), data.count_range(axis + 1)
        self.channels = data.shape[axis]
        if self.outer * self.inner != label.count:
            raise self.error(f"number of labels must match number of predictions: prediction "
                             f"shape {data.shape} with softmax axis {axis} needs "
                             f"{self.outer * self.inner} labels, got {label.count} "
                             f"(label shape {label.shape})")
        if len(top) > 1:
            top[1].reshape(data.shape)
        self.kernels = kernels.for_array(data.data)

    def _label_error(self, value):
        return _label_error(self, value, self.channels)

    def _normalizer(self):
        """The normalizer as float32, or None for VALID (counted by the kernels)."""
        mode = self.normalization
        if mode == _NORM.FULL:
            return f32(max(1, self.outer * self.inner))
        if mode == _NORM.VALID:
            return None
        if mode == _NORM.BATCH_SIZE:
            return f32(max(1, self.outer))
        if mode == _NORM.NONE:
            return f32(1)
        raise self.error(f"unknown normalization mode {mode}")

    def forward(self, bottom, top):
        self.softmax.forward([bottom[0]], [self.prob])
        prob = self.prob.data.reshape(self.outer, self.channels, self.inner)
        labels = bottom[1].data.reshape(self.outer, self.inner)
        self._cache = self.kernels.softmax_loss_forward(
            prob, labels, self.ignore_label, self._normalizer(), top[0].data, self,
            self._label_error)
        if len(top) > 1:
            top[1].data[...] = self.prob.data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to label inputs")
        if not propagate_down[0]:
            return
        shape = (self.outer, self.channels, self.inner)
        self.kernels.softmax_loss_backward(self.prob.data.reshape(shape), self._cache,
                                           top[0].diff, bottom[0].diff.reshape(shape))


@register("Accuracy")
class AccuracyLayer(Layer):
    """Top-k classification accuracy (forward only), optionally per class.

    Bottoms: predictions (N, C, ...) and labels with ``count(0, axis) * count(axis + 1)`` values.
    Tops: accuracy, shape (); optionally per-class accuracy, shape (C,).

    A position counts as correct when fewer than ``top_k`` *other* classes score ``>=`` the true
    class's score -- so ties count against the prediction, exactly as Caffe counts them. Positions
    whose label equals ``ignore_label`` are skipped; with none left the accuracy is 0. Per-class
    accuracy is hits / occurrences of each label (0 for labels that never occur).

    Fields read (accuracy_param): top_k (1), axis (1), ignore_label (unset: none).

    Raises:
        CaffeError: top_k larger than the number of classes; label count not matching the
            predictions; a label outside [0, C); backward asked for any bottom (not
            differentiable, as in Caffe).

    Caffe: src/caffe/layers/accuracy_layer.cpp.
    """

    exact_num_bottom = 2
    min_top = 1
    max_top = 2

    def allow_force_backward(self, bottom_index):
        # Caffe aborts (NOT_IMPLEMENTED) when force_backward reaches an Accuracy layer; here
        # force_backward simply does not propagate into it.
        return False

    def layer_setup(self, bottom, top):
        p = self.param.accuracy_param
        self.top_k = p.top_k
        self.ignore_label = p.ignore_label if p.HasField("ignore_label") else None

    def reshape(self, bottom, top):
        data, label = bottom
        if self.top_k > data.count // max(label.count, 1):
            raise self.error(f"top_k ({self.top_k}) must be less than or equal to the number of "
                             f"classes ({data.count // max(label.count, 1)})")
        axis = data.canonical_axis(self.param.accuracy_param.axis)
        self.outer, self.inner = data.count_range(0, axis), data.count_range(axis + 1)
        self.channels = data.shape[axis]
        if self.outer * self.inner != label.count:
            raise self.error(f"number of labels must match number of predictions: prediction "
                             f"shape {data.shape} with axis {axis} needs "
                             f"{self.outer * self.inner} labels, got {label.count}")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.channels,))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        scores = bottom[0].data.reshape(self.outer, self.channels, self.inner)
        labels = bottom[1].data.reshape(self.outer, self.inner).astype(numpy.int32)
        if self.ignore_label is None:
            valid = xp.ones(labels.shape, bool)
        else:
            valid = labels != self.ignore_label
        labels = _label_check(self, labels, valid, self.channels)
        true_score = xp.take_along_axis(scores, labels[:, None, :], axis=1)
        # The true class itself always scores >= itself: subtract it.
        better = (scores >= true_score).sum(axis=1) - 1
        hit = valid & (better < self.top_k)
        count = valid.sum()
        hits = hit.sum()
        top[0].data[...] = xp.where(count > 0, hits.astype(f32) / xp.maximum(count, 1).astype(f32),
                                    f32(0))
        if len(top) > 1:
            flat = labels.ravel()
            seen = xp.bincount(flat, weights=valid.ravel().astype(f32), minlength=self.channels)
            right = xp.bincount(flat, weights=hit.ravel().astype(f32), minlength=self.channels)
            seen, right = seen.astype(f32), right.astype(f32)
            top[1].data[...] = xp.where(seen > 0, right / xp.maximum(seen, f32(1)), f32(0))

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise self.error("Accuracy is not differentiable: it cannot propagate gradients")
