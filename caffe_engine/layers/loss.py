"""Loss layers on Caffe's LossLayer: EuclideanLoss, HingeLoss, InfogainLoss,
MultinomialLogisticLoss, SigmoidCrossEntropyLoss and ContrastiveLoss.

Caffe: src/caffe/layers/loss_layer.cpp, and src/caffe/layers/<name>_layer.cpp for each
(euclidean_loss, hinge_loss, infogain_loss, multinomial_logistic_loss,
sigmoid_cross_entropy_loss, contrastive_loss).

Labels arrive as float blobs holding integer values; like Caffe, a label is truncated to int.
"""
import numpy

from ..backend import get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, create_layer, register
from .softmax import _label_check

f32 = numpy.float32

_NORM = caffe_pb2.LossParameter


# ------------------------------------------------------------------------------------------------
# Helpers shared by the loss layers below (Caffe's LossLayer and its get_normalizer copies)
# ------------------------------------------------------------------------------------------------
#: Caffe's floor on probabilities before taking their log (kLOG_THRESHOLD).
LOG_THRESHOLD = f32(1e-20)


def _normalization_mode(param, default):
    """``loss_param.normalization``; else the deprecated ``normalize`` (true: VALID, false:
    BATCH_SIZE); else ``default``."""
    lp = param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return _NORM.VALID if lp.normalize else _NORM.BATCH_SIZE
    return default


def _get_normalizer(layer, xp, mode, outer, inner, valid_count=None):
    """Caffe's ``get_normalizer``: FULL ``outer * inner``, VALID the valid count (``outer *
    inner`` when not counted), BATCH_SIZE ``outer``, NONE 1; then at least 1. ``valid_count``
    may be a device scalar; the result is float32 (a device scalar for VALID)."""
    if mode == _NORM.VALID and valid_count is not None:
        return xp.maximum(xp.asarray(valid_count).astype(f32), f32(1))
    if mode in (_NORM.FULL, _NORM.VALID):
        return f32(max(1, outer * inner))
    if mode == _NORM.BATCH_SIZE:
        return f32(max(1, outer))
    if mode == _NORM.NONE:
        return f32(1)
    raise layer.error(f"unknown normalization mode {mode}")


def _legacy_shape(blob):
    """(num, channels, height, width) as Caffe's legacy accessors give them (1 for missing
    axes)."""
    return tuple(blob.shape) + (1,) * (4 - blob.num_axes)


class _LossLayer(Layer):
    """Caffe's LossLayer: two or more bottoms of equal first dimension, a scalar top 0 with loss
    weight 1 by default, and no force_backward into the labels (bottom 1)."""

    is_loss = True

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[0].shape[:1] != bottom[1].shape[:1]:
            raise self.error(f"the data and label should have the same first dimension "
                             f"({bottom[0].shape} vs {bottom[1].shape})")
        top[0].reshape(())

    def _no_label_backward(self, propagate_down, index=1, what="label"):
        if propagate_down[index]:
            raise self.error(f"cannot backpropagate to {what} inputs")

    def _loss_scale(self, top, normalizer):
        """The top diff (the loss weight) over the normalizer, as a float32 scalar."""
        return (top[0].diff.reshape(()) / normalizer).astype(f32)


@register("EuclideanLoss")
class EuclideanLossLayer(_LossLayer):
    """``loss = sum((a - b) ** 2) / N / 2``.

    Bottoms: a and b, (N, ...) with equal ``count(1)``. Top: the loss, shape (). Both bottoms
    are differentiable (force_backward reaches both, as in Caffe): ``da = w / N * (a - b)``,
    ``db = -da`` for the loss weight ``w``.

    Raises:
        CaffeError: different first dimensions or ``count(1)``.

    Caffe: src/caffe/layers/euclidean_loss_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return True

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count_range(1) != bottom[1].count_range(1):
            raise self.error(f"inputs must have the same dimension: {bottom[0].shape} vs "
                             f"{bottom[1].shape}")
        xp = get_array_module(bottom[0].data)
        if getattr(self, "diff", None) is None or self.diff.shape != bottom[0].shape \
                or get_array_module(self.diff) is not xp:
            self.diff = xp.zeros(bottom[0].shape, f32)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        xp.subtract(bottom[0].data, bottom[1].data.reshape(self.diff.shape), out=self.diff)
        flat = self.diff.reshape(-1)
        dot = xp.dot(flat, flat)
        top[0].data[...] = dot / f32(bottom[0].shape[0]) / f32(2)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        for i, sign in ((0, f32(1)), (1, f32(-1))):
            if propagate_down[i]:
                alpha = (sign * top[0].diff.reshape(()) / f32(bottom[i].shape[0])).astype(f32)
                xp.multiply(self.diff.reshape(bottom[i].shape), alpha, out=bottom[i].diff)


@register("HingeLoss")
class HingeLossLayer(_LossLayer):
    """One-versus-all hinge loss: ``t = max(0, 1 + s * x)`` with ``s = -1`` at the true class
    and ``+1`` elsewhere; ``loss = sum(t) / N`` (L1) or ``sum(t ** 2) / N`` (L2).

    Bottoms: scores (N, ...) read as (N, D) with ``D = count / N``, labels (N, ...) whose first N
    values are the classes (integer-valued floats). Top: the loss, shape (). Gradient: ``w / N *
    s * [t > 0]`` (L1) or ``2 w / N * s * t`` (L2) for the loss weight ``w``. The labels never
    get a gradient.

    Fields read (hinge_loss_param): norm (L1).

    Raises:
        CaffeError: different first dimensions; a label outside [0, D); backward asked for the
            labels.

    Caffe: src/caffe/layers/hinge_loss_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        num = bottom[0].shape[0]
        self.view = (num, bottom[0].count // max(num, 1))
        if bottom[1].count < num:
            raise self.error(f"needs {num} labels, got {bottom[1].count}")
        xp = get_array_module(bottom[0].data)
        if getattr(self, "margin", None) is None or self.margin.shape != self.view \
                or get_array_module(self.margin) is not xp:
            self.margin = xp.zeros(self.view, f32)

    def _sign_flip(self, xp, bottom):
        """(row indices, label indices) of the true-class entries."""
        num, dim = self.view
        labels = bottom[1].data.reshape(-1)[:num].astype(numpy.int32)
        return xp.arange(num), _label_check(self, labels, None, dim)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        t = self.margin
        t[...] = bottom[0].data.reshape(self.view)
        rows, labels = self._sign_flip(xp, bottom)
        t[rows, labels] *= f32(-1)
        t += f32(1)
        xp.maximum(t, f32(0), out=t)
        num = f32(self.view[0])
        if self.norm == caffe_pb2.HingeLossParameter.L1:
            top[0].data[...] = t.sum(dtype=f32) / num
        elif self.norm == caffe_pb2.HingeLossParameter.L2:
            flat = t.reshape(-1)
            top[0].data[...] = xp.dot(flat, flat) / num
        else:
            raise self.error(f"unknown norm {self.norm}")

    def backward(self, top, propagate_down, bottom):
        self._no_label_backward(propagate_down)
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = bottom[0].diff.reshape(self.view)
        num = f32(self.view[0])
        w = top[0].diff.reshape(())
        if self.norm == caffe_pb2.HingeLossParameter.L1:
            xp.sign(self.margin, out=dx)
            scale = (w / num).astype(f32)
        else:
            dx[...] = self.margin
            scale = (w * f32(2) / num).astype(f32)
        rows, labels = self._sign_flip(xp, bottom)
        dx[rows, labels] *= f32(-1)
        dx *= scale


@register("InfogainLoss")
class InfogainLossLayer(_LossLayer):
    """Infogain loss of the softmax of the scores: ``loss = -sum_l H[label, l] * log(p_l)``,
    summed over the non-ignored positions and divided by the normalizer.

    Bottoms: scores (N, K, ...) with the classes on ``axis``; labels with ``count(0, axis) *
    count(axis + 1)`` integer values; optionally H (K x K, any shape of K*K values) as a third
    bottom -- else H is read from the binaryproto ``infogain_loss_param.source``. Tops: the loss,
    shape (); optionally the softmax probabilities (shape of the scores), which then needs a
    loss_weight per top. ``p`` is floored at 1e-20 before the log. The gradient is ``(p_l *
    sum_m H[label, m] - H[label, l]) * w / normalizer``, zero at ignored positions; neither the
    labels nor H get a gradient (Caffe aborts when force_backward reaches H, and so does this).

    Fields read: infogain_loss_param.source, infogain_loss_param.axis (1),
    loss_param.ignore_label (unset: none), loss_param.normalization (VALID; FULL, BATCH_SIZE,
    NONE as for SoftmaxWithLoss). The deprecated ``loss_param.normalize`` is refused, as in Caffe.

    Raises:
        CaffeError: no H (neither a third bottom nor a source); an unreadable source; H not
            K x K; label count not matching the scores; a label outside [0, K); ``normalize``
            set; backward asked for the labels or H.

    Caffe: src/caffe/layers/infogain_loss_layer.cpp.
    """

    min_bottom = 2
    max_bottom = 3
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        softmax_param = caffe_pb2.LayerParameter()
        softmax_param.CopyFrom(self.param)
        softmax_param.type = "Softmax"
        softmax_param.softmax_param.axis = self.param.infogain_loss_param.axis
        del softmax_param.loss_weight[:]
        del softmax_param.top[:]
        self.softmax = create_layer(softmax_param, self.phase)
        xp = get_array_module(bottom[0].data)
        self.prob = Blob(bottom[0].shape, xp=xp)
        self.softmax.setup([bottom[0]], [self.prob])
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        if lp.HasField("normalize"):
            raise self.error('normalize is deprecated. use "normalization"')
        self.normalization = lp.normalization
        self.infogain = None
        if len(bottom) < 3:
            p = self.param.infogain_loss_param
            if not p.source:
                raise self.error("Infogain matrix source must be specified "
                                 "(infogain_loss_param.source, or H as a third bottom)")
            from ..io.blobproto import read_blobproto
            self.infogain = xp.asarray(read_blobproto(p.source))

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        data, label = bottom[0], bottom[1]
        self.softmax.reshape([data], [self.prob])
        try:
            axis = data.canonical_axis(self.param.infogain_loss_param.axis)
        except IndexError as exc:
            raise self.error(str(exc)) from None
        self.outer, self.inner = data.count_range(0, axis), data.count_range(axis + 1)
        self.channels = data.shape[axis]
        if self.outer * self.inner != label.count:
            raise self.error(f"number of labels must match number of predictions: prediction "
                             f"shape {data.shape} with axis {axis} needs "
                             f"{self.outer * self.inner} labels, got {label.count} "
                             f"(label shape {label.shape})")
        h = self.infogain if len(bottom) < 3 else bottom[2].data
        k = self.channels
        if h.size != k * k:
            raise self.error(f"H must be {k}x{k} ({k * k} values), got {h.size} values "
                             f"(shape {tuple(h.shape)})")
        if len(top) > 1:
            top[1].reshape(data.shape)

    def _matrix(self, bottom):
        h = self.infogain if len(bottom) < 3 else bottom[2].data
        return h.reshape(self.channels, self.channels)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        self.softmax.forward([bottom[0]], [self.prob])
        labels = bottom[1].data.reshape(self.outer, self.inner).astype(numpy.int32)
        if self.ignore_label is None:
            valid = xp.ones(labels.shape, bool)
        else:
            valid = labels != self.ignore_label
        labels = _label_check(self, labels, valid, self.channels)
        h = self._matrix(bottom)
        prob = self.prob.data.reshape(self.outer, self.channels, self.inner)
        logp = xp.log(xp.maximum(prob, LOG_THRESHOLD))
        rows = h[labels].transpose(0, 2, 1)                   # (outer, K, inner): H[label, l]
        terms = xp.where(valid[:, None, :], rows * logp, f32(0))
        count = valid.sum()
        normalizer = _get_normalizer(self, xp, self.normalization, self.outer, self.inner, count)
        self._cache = labels, valid, normalizer
        top[0].data[...] = -terms.sum(dtype=f32) / normalizer
        if len(top) > 1:
            top[1].data[...] = self.prob.data

    def backward(self, top, propagate_down, bottom):
        self._no_label_backward(propagate_down)
        if len(propagate_down) > 2:
            self._no_label_backward(propagate_down, 2, "infogain")
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        labels, valid, normalizer = self._cache
        h = self._matrix(bottom)
        row_sums = h.sum(axis=1, dtype=f32)
        prob = self.prob.data.reshape(self.outer, self.channels, self.inner)
        dx = bottom[0].diff.reshape(prob.shape)
        xp.multiply(prob, row_sums[labels][:, None, :], out=dx)
        dx -= h[labels].transpose(0, 2, 1)
        dx *= valid[:, None, :]
        dx *= self._loss_scale(top, normalizer)


@register("MultinomialLogisticLoss")
class MultinomialLogisticLossLayer(_LossLayer):
    """``loss = -sum_n log(max(p[n, label_n], 1e-20)) / N`` for given probabilities.

    Bottoms: probabilities (N, ...) read as (N, D) with ``D = count / N``; labels (N,) or (N, 1,
    1, 1) integer-valued. Top: the loss, shape (). Gradient: ``-w / N / max(p, 1e-20)`` at the
    true class, 0 elsewhere. The labels never get a gradient.

    Raises:
        CaffeError: different first dimensions; labels with channels, height or width other than
            1; a label outside [0, D); backward asked for the labels.

    Caffe: src/caffe/layers/multinomial_logistic_loss_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[1].num_axes > 4 or _legacy_shape(bottom[1])[1:] != (1, 1, 1):
            raise self.error(f"labels must have shape (N,) or (N, 1, 1, 1), got "
                             f"{bottom[1].shape}")
        num = bottom[0].shape[0]
        self.view = (num, bottom[0].count // max(num, 1))

    def _picked(self, xp, bottom):
        num, dim = self.view
        labels = bottom[1].data.reshape(num).astype(numpy.int32)
        labels = _label_check(self, labels, None, dim)
        rows = xp.arange(num)
        prob = bottom[0].data.reshape(self.view)[rows, labels]
        return rows, labels, xp.maximum(prob, LOG_THRESHOLD)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        _, _, prob = self._picked(xp, bottom)
        top[0].data[...] = -xp.log(prob).sum(dtype=f32) / f32(self.view[0])

    def backward(self, top, propagate_down, bottom):
        self._no_label_backward(propagate_down)
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        rows, labels, prob = self._picked(xp, bottom)
        dx = bottom[0].diff.reshape(self.view)
        dx[...] = 0
        scale = (-top[0].diff.reshape(()) / f32(self.view[0])).astype(f32)
        dx[rows, labels] = scale / prob


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossLayer(_LossLayer):
    """Cross entropy of ``sigmoid(x)`` against targets in [0, 1], computed stably from x:
    ``loss = -sum(x * (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0]))) / normalizer``.

    Bottoms: scores x (N, ...) and targets t of the same count. Top: the loss, shape (). The
    sigmoid is Caffe's ``0.5 * tanh(0.5 x) + 0.5`` (evaluated in double, stored as float32). The
    gradient is ``(sigmoid(x) - t) * w / normalizer``, 0 where ``int(t) == ignore_label``; the
    targets never get a gradient.

    Fields read (loss_param): ignore_label (unset: none), normalization (BATCH_SIZE by default for
    this layer; VALID counts the non-ignored targets), normalize (deprecated: false means
    BATCH_SIZE, true VALID).

    Raises:
        CaffeError: different first dimensions or counts; backward asked for the targets.

    Caffe: src/caffe/layers/sigmoid_cross_entropy_loss_layer.cpp, sigmoid_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = lp.ignore_label if lp.HasField("ignore_label") else None
        self.normalization = _normalization_mode(self.param, _NORM.BATCH_SIZE)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise self.error(f"inputs must have the same count: {bottom[0].shape} vs "
                             f"{bottom[1].shape}")
        self.outer = bottom[0].shape[0]
        self.inner = bottom[0].count_range(1)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(-1)
        t = bottom[1].data.reshape(-1)
        xd = x.astype(numpy.float64)
        self.sigmoid = (0.5 * xp.tanh(0.5 * xd) + 0.5).astype(f32)
        positive = (x >= 0).astype(f32)
        terms = x * (t - positive) - xp.log(f32(1) + xp.exp(x - f32(2) * x * positive))
        if self.ignore_label is None:
            self.valid = None
            count = None
        else:
            self.valid = t.astype(numpy.int32) != self.ignore_label
            terms = xp.where(self.valid, terms, f32(0))
            count = self.valid.sum()
        if count is None and self.normalization == _NORM.VALID:
            count = numpy.int64(x.size)
        self.normalizer = _get_normalizer(self, xp, self.normalization, self.outer, self.inner,
                                          count)
        top[0].data[...] = -terms.sum(dtype=f32) / self.normalizer

    def backward(self, top, propagate_down, bottom):
        self._no_label_backward(propagate_down, what="label")
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = bottom[0].diff.reshape(-1)
        xp.subtract(self.sigmoid, bottom[1].data.reshape(-1), out=dx)
        if self.valid is not None:
            dx *= self.valid
        dx *= self._loss_scale(top, self.normalizer)


@register("ContrastiveLoss")
class ContrastiveLossLayer(_LossLayer):
    """Contrastive loss of pairs: ``loss = sum_n l_n / N / 2`` with ``d_n = ||a_n - b_n||^2`` and
    ``l_n = d_n`` for similar pairs, ``max(margin - sqrt(d_n), 0) ** 2`` for dissimilar ones
    (``max(margin - d_n, 0)`` with ``legacy_version``).

    Bottoms: a and b, (N, C, 1, 1) (or (N, C)); the similarity (N, 1, 1, 1) (or (N,)),
    non-zero (after truncation to int) meaning similar. Top: the loss, shape (). a and b are
    differentiable, the similarity never is. For a dissimilar pair the gradient is
    ``-w / N * (margin - dist) / (dist + 1e-4) * (a - b)`` (Caffe's 1e-4 guard), or
    ``-w / N * (a - b)`` in the legacy form, and 0 beyond the margin.

    Fields read (contrastive_loss_param): margin (1), legacy_version (false).

    Raises:
        CaffeError: a and b of different channels; a, b or the similarity with height or width
            other than 1, or a similarity with more than one channel; backward asked for the
            similarity.

    Caffe: src/caffe/layers/contrastive_loss_layer.cpp.
    """

    exact_num_bottom = 3
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def layer_setup(self, bottom, top):
        p = self.param.contrastive_loss_param
        self.margin = f32(p.margin)
        self.legacy = p.legacy_version

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if any(b.num_axes > 4 for b in bottom):
            raise self.error("bottoms must have at most 4 axes")
        a, b, sim = (_legacy_shape(x) for x in bottom)
        if a[1] != b[1]:
            raise self.error(f"a and b must have the same channels: {bottom[0].shape} vs "
                             f"{bottom[1].shape}")
        if a[2:] != (1, 1) or b[2:] != (1, 1):
            raise self.error(f"a and b must have height and width 1: {bottom[0].shape}, "
                             f"{bottom[1].shape}")
        if sim[1:] != (1, 1, 1):
            raise self.error(f"the similarity must have shape (N, 1, 1, 1), got "
                             f"{bottom[2].shape}")
        if bottom[2].count < a[0]:
            raise self.error(f"needs {a[0]} similarity values, got {bottom[2].count}")
        self.view = (a[0], a[1])

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        num = self.view[0]
        self.diff = bottom[0].data.reshape(self.view) - bottom[1].data.reshape(self.view)
        self.dist_sq = (self.diff * self.diff).sum(axis=1, dtype=f32)
        self.similar = bottom[2].data.reshape(-1)[:num].astype(numpy.int32) != 0
        if self.legacy:
            other = xp.maximum(self.margin - self.dist_sq, f32(0))
        else:
            other = xp.maximum(self.margin - xp.sqrt(self.dist_sq), f32(0))
            other = other * other
        terms = xp.where(self.similar, self.dist_sq, other)
        top[0].data[...] = terms.sum(dtype=f32) / f32(num) / f32(2)

    def backward(self, top, propagate_down, bottom):
        self._no_label_backward(propagate_down, 2, "similarity")
        xp = get_array_module(top[0].diff)
        num = self.view[0]
        if self.legacy:
            mdist = self.margin - self.dist_sq
        else:
            dist = xp.sqrt(self.dist_sq)
            mdist = self.margin - dist
        for i, sign in ((0, f32(1)), (1, f32(-1))):
            if not propagate_down[i]:
                continue
            alpha = (sign * top[0].diff.reshape(()) / f32(num)).astype(f32)
            if self.legacy:
                beta = xp.broadcast_to(-alpha, mdist.shape)
            else:
                beta = -alpha * mdist / (dist + f32(1e-4))
            beta = xp.where(mdist > 0, beta, f32(0))
            coeff = xp.where(self.similar, alpha, beta).astype(f32)
            xp.multiply(self.diff, coeff[:, None], out=bottom[i].diff.reshape(self.view))
