"""Normalisation layers: LRN, BatchNorm and MVN, with Caffe's float32 numerics.

Caffe: src/caffe/layers/lrn_layer.cpp, batch_norm_layer.cpp, mvn_layer.cpp.

Each layer follows the order of Caffe's CPU arithmetic where that order shows in float32: LRN's
running window sums over channels and WITHIN_CHANNEL as Caffe's chain of Split, Power, AVE
Pooling, Power and Eltwise PROD layers (the kernel sets' LRN, :mod:`caffe_engine.kernels`), and
the mean/variance reductions of BatchNorm and MVN as a sum over the spatial positions of each
(n, c) followed by a sum over n. The reductions that
Caffe hands to BLAS may still differ from it by a few float32 ulps of the summed magnitudes.

BatchNorm keeps no work array (Caffe's per-layer ``temp_``): its passes are the kernel sets'
(``batch_norm_stats_forward`` with batch statistics, ``batch_norm_forward`` with global ones,
``batch_norm_backward``: on the cpu set channel by channel, so that of the statistics' two reads
and the output's pass only the first reads memory, and the gradient's pass reads from the cache
what its sums' pass read; with the reference's bits), and they take an in-place Scale and ReLU
after the layer into the same passes when the net runs them together
(:mod:`.batch_norm_chain`).
"""
import numpy

from .. import kernels
from ..backend import get_array_module
from ..blob import Blob
from ..kernels.geometry import LRNGeometry
from ..proto import caffe_pb2
from .base import Layer, register

f32 = numpy.float32


def _buffer(layer, name, xp, shape):
    """``layer.<name>``: a float32 work array of ``shape``, reallocated only when it changes."""
    buf = getattr(layer, name, None)
    shape = tuple(int(d) for d in shape)
    if buf is None or buf.shape != shape or get_array_module(buf) is not xp:
        buf = xp.zeros(shape, f32)
        setattr(layer, name, buf)
    return buf


@register("LRN")
class LRNLayer(Layer):
    """Local response normalisation: ``top = x * scale ** -beta``.

    Shapes: bottom (N, C, H, W), top the same; float32. Not in place.

    ACROSS_CHANNELS (the default): ``scale = k + alpha / local_size * sum(x_j ** 2)`` over the
    ``local_size`` channels centred on each channel (zero beyond the edges). Caffe keeps that sum
    as a running window over the channels (add the head, subtract the tail), and so does this
    layer; the gradient is Caffe's ``scale ** -beta * dy - 2 alpha beta / local_size * x *
    sum_window(dy * top / scale)``.

    WITHIN_CHANNEL: Caffe composes it of layers, and this layer repeats their arithmetic:
    square (Power 2), AVE pooling of ``local_size x local_size`` windows with pad
    ``(local_size - 1) / 2`` and stride 1 -- so every window, padded cells included, divides by
    ``local_size ** 2`` -- then ``(1 + alpha * pooled) ** -beta`` (Power), times x (Eltwise
    PROD). Note that ``k`` is not used there.

    Fields read (lrn_param): local_size (5, odd), alpha (1), beta (0.75), k (1), norm_region
    (ACROSS_CHANNELS). ``engine`` is ignored.

    ACROSS_CHANNELS keeps the scale from forward to backward (Caffe's ``scale_``, no blob); on
    the cpu kernel set the solver's train net places it in its gradient memory
    (:meth:`saved_bytes`, :mod:`caffe_engine.diff_sharing`).

    Raises:
        CaffeError: even local_size; a bottom without 4 axes; in-place use.

    Caffe: src/caffe/layers/lrn_layer.cpp (and power_layer.cpp, pooling_layer.cpp,
    eltwise_layer.cpp, split_layer.cpp for WITHIN_CHANNEL).
    """

    exact_num_bottom = 1
    exact_num_top = 1
    #: Caffe's CrossChannelBackward ignores propagate_down; WITHIN_CHANNEL's layers follow it.
    backward_ignores_propagate_down = property(
        lambda self: self.param.lrn_param.norm_region == caffe_pb2.LRNParameter.ACROSS_CHANNELS)

    def layer_setup(self, bottom, top):
        p = self.param.lrn_param
        self.size = int(p.local_size)
        if self.size % 2 != 1:
            raise self.error(f"LRN only supports odd values for local_size, got {self.size}")
        self.pre_pad = (self.size - 1) // 2
        self.alpha, self.beta, self.k = f32(p.alpha), f32(p.beta), f32(p.k)
        self.within = p.norm_region == caffe_pb2.LRNParameter.WITHIN_CHANNEL
        if top[0] is bottom[0]:
            raise self.error("does not support in-place computation")
        self.plan = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), got shape "
                             f"{bottom[0].shape}")
        top[0].reshape(bottom[0].shape)
        geometry = LRNGeometry(bottom[0].shape, self.size, float(self.alpha), float(self.beta),
                               float(self.k), self.within)
        kernel_set = kernels.for_array(bottom[0].data)
        if self.plan is None or (geometry, kernel_set) != self._planned_for:
            self.plan = kernel_set.lrn(geometry)
            self._planned_for = (geometry, kernel_set)

    def forward(self, bottom, top):
        self.plan.forward(bottom[0].data, top[0].data)

    def saved_bytes(self):
        """ACROSS_CHANNELS's scale (Caffe's ``scale_``), float32 (N, C, H, W), where the kernel
        set's plan lets the net place it (``plan.saved_bytes``; 0 for plans that keep their
        own arrays, such as the reference set's)."""
        return 0 if self.plan is None else self.plan.saved_bytes

    def keep_saved_in(self, buffer):
        self.plan.keep_saved_in(buffer)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.plan.backward(bottom[0].data, top[0].data, top[0].diff, bottom[0].diff)


@register("BatchNorm")
class BatchNormLayer(Layer):
    """Batch normalisation without the affine part (Caffe pairs it with a Scale layer).

    Shapes: bottom (N, C, ...) (or (N,), read as one channel), top the same; float32. In place
    allowed. Statistics are per channel over N and all axes after the channel axis.

    Params (not learned): ``blobs[0]`` running mean sum (C,), ``blobs[1]`` running variance sum
    (C,), ``blobs[2]`` the scale factor (1,); all start at 0. Like Caffe, setup appends
    ``param { lr_mult: 0 }`` for each of them to the layer's LayerParameter (so the net's
    learning-rate bookkeeping, and a saved net, see lr_mult 0).

    With global statistics ``mean = blobs[0] / s`` and ``var = blobs[1] / s`` for the factor
    ``s = blobs[2]`` (both 0 when ``s == 0``). Otherwise the batch mean and biased variance are
    used, and the running sums are updated: ``s = maf * s + 1``, ``blobs[0] = maf * blobs[0] +
    mean``, ``blobs[1] = maf * blobs[1] + m / (m - 1) * var`` with ``m = count / C`` (factor 1
    when m = 1). ``top = (x - mean) / sqrt(var + eps)``. The gradient is ``dy / std`` with global
    statistics, else Caffe's ``(dy - mean(dy) - mean(dy * y) * y) / std``.

    Fields read (batch_norm_param): use_global_stats (default: phase == TEST),
    moving_average_fraction (0.999), eps (1e-5). ``param`` specs must be absent or lr_mult 0.

    Raises:
        CaffeError: a ``param`` spec with non-zero lr_mult; a bottom whose channel count changed.

    Caffe: src/caffe/layers/batch_norm_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1
    backward_ignores_propagate_down = True

    def layer_setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.moving_average_fraction = f32(p.moving_average_fraction)
        self.use_global_stats = self.phase == caffe_pb2.TEST
        if p.HasField("use_global_stats"):
            self.use_global_stats = p.use_global_stats
        self.channels = 1 if bottom[0].num_axes == 1 else bottom[0].shape[1]
        self.eps = f32(p.eps)
        if not self.blobs:
            xp = get_array_module(bottom[0].data)
            self.blobs = [Blob((self.channels,), xp=xp), Blob((self.channels,), xp=xp),
                          Blob((1,), xp=xp)]
        # Caffe masks the statistics from the solver by giving them lr_mult 0.
        for i in range(len(self.blobs)):
            if len(self.param.param) == i:
                self.param.param.add().lr_mult = 0
            elif self.param.param[i].lr_mult != 0:
                raise self.error("Cannot configure batch normalization statistics as layer "
                                 f"parameters (param {i} has lr_mult "
                                 f"{self.param.param[i].lr_mult:g}; it must be 0 or unset)")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        channels = 1 if len(shape) == 1 else shape[1]
        if channels != self.channels:
            raise self.error(f"bottom has {channels} channels, the layer was set up for "
                             f"{self.channels} (shape {shape})")
        top[0].reshape(shape)
        num = shape[0]
        self.view = (num, self.channels, bottom[0].count // max(num * self.channels, 1))
        xp = get_array_module(bottom[0].data)
        self.kernels = kernels.for_array(bottom[0].data)
        _buffer(self, "x_norm", xp, self.view)
        _buffer(self, "std", xp, (1, self.channels, 1))

    def forward(self, bottom, top):
        self.forward_fused(bottom, top)

    def forward_fused(self, bottom, top, scale=None, bias=None, slope=None):
        """Forward; with ``scale`` (and ``bias``) and ``slope`` also the forward of the in-place
        Scale and ReLU layers after this one, in the same pass (the net's
        :mod:`.batch_norm_chain`). ``scale``/``bias`` are (C,) arrays, ``slope`` a float32."""
        xp = get_array_module(bottom[0].data)
        num, channels, spatial = self.view
        x = bottom[0].data.reshape(self.view)
        y = top[0].data.reshape(self.view)
        std = self.std.reshape(-1)
        if not self.use_global_stats:
            mean, var = self.kernels.batch_norm_stats_forward(
                x, f32(1.0 / (num * spatial)), self.eps, self.x_norm, y, std, scale, bias, slope)
            self._update_running_stats(mean, var, bottom[0].count // channels)
            return
        stored = self.blobs[2].data.reshape(-1)[:1]
        factor = xp.where(stored == 0, f32(0), f32(1) / xp.where(stored == 0, f32(1), stored))
        mean = factor * self.blobs[0].data
        var = factor * self.blobs[1].data
        std[...] = var + self.eps
        xp.sqrt(std, out=std)
        self.kernels.batch_norm_forward(x, mean, std, self.x_norm, y, scale, bias, slope)

    def _update_running_stats(self, mean, var, m):
        """Caffe's moving averages of the batch statistics (``m`` values per channel)."""
        maf = self.moving_average_fraction
        s = self.blobs[2].data
        s *= maf
        s += f32(1)
        self.blobs[0].data *= maf
        self.blobs[0].data += mean
        correction = f32(m) / f32(m - 1) if m > 1 else f32(1)
        self.blobs[1].data *= maf
        self.blobs[1].data += correction * var

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.backward_fused(top, bottom)

    def backward_fused(self, top, bottom, scale=None, relu_top=None, slope=None):
        """The bottom's gradient; with ``scale`` and ``slope`` the gradient through the in-place
        ReLU (at ``relu_top``, its top data) and Scale after this layer as well, in the same
        passes. Returns the Scale's ``(bias_sum, scale_sum)`` (see
        :meth:`caffe_engine.kernels.reference.ReferenceKernels.batch_norm_backward`)."""
        num, channels, spatial = self.view
        dy = top[0].diff.reshape(self.view)
        dx = bottom[0].diff.reshape(self.view)
        factor = None if self.use_global_stats else f32(-1.0 / (num * spatial))
        y = relu_top.reshape(self.view) if relu_top is not None else None
        return self.kernels.batch_norm_backward(dy, self.x_norm, self.std.reshape(-1), dx,
                                                factor, scale, y, slope)


@register("MVN")
class MVNLayer(Layer):
    """Mean-variance normalisation of each item (and channel).

    Shapes: bottom (N, C, H, W) or fewer axes (missing ones count as 1), top the same; float32.
    The statistics are taken over (C, H, W) of each item with ``across_channels``, else over
    (H, W) of each (item, channel).

    ``top = x - mean``; with ``normalize_variance`` then ``top /= sqrt(var) + eps`` -- Caffe adds
    eps to the standard deviation, not to the variance. The gradient is Caffe's
    ``(dy - mean(dy) - mean(dy * y) * y) / (std + eps)`` (exact for eps -> 0), or
    ``dy - mean(dy)`` without variance normalisation.

    Fields read (mvn_param): normalize_variance (true), across_channels (false), eps (1e-9).

    Raises:
        CaffeError: a bottom of more than 4 axes.

    Caffe: src/caffe/layers/mvn_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1
    backward_ignores_propagate_down = True

    def layer_setup(self, bottom, top):
        p = self.param.mvn_param
        self.normalize_variance = p.normalize_variance
        self.across_channels = p.across_channels
        self.eps = f32(p.eps)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) > 4:
            raise self.error(f"takes at most 4 axes (num, channels, height, width), got {shape}")
        legacy = tuple(shape) + (1,) * (4 - len(shape))
        top[0].reshape(shape)
        num = legacy[0] if self.across_channels else legacy[0] * legacy[1]
        self.view = (num, bottom[0].count // max(num, 1))
        xp = get_array_module(bottom[0].data)
        _buffer(self, "work", xp, self.view)
        _buffer(self, "std", xp, (num, 1))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        num, dim = self.view
        inv = f32(1.0 / dim)
        x = bottom[0].data.reshape(self.view)
        y = top[0].data.reshape(self.view)
        mean = x.sum(axis=1, keepdims=True, dtype=f32)
        mean *= inv
        xp.subtract(x, mean, out=y)
        if self.normalize_variance:
            xp.multiply(y, y, out=self.work)
            var = self.work.sum(axis=1, keepdims=True, dtype=f32)
            var *= inv
            xp.power(var, f32(0.5), out=self.std)
            self.std += self.eps
            y /= self.std

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        num, dim = self.view
        dy = top[0].diff.reshape(self.view)
        if top[0] is bottom[0]:
            dy = dy.copy()
        dx = bottom[0].diff.reshape(self.view)
        if self.normalize_variance:
            y = top[0].data.reshape(self.view)
            xp.multiply(y, dy, out=self.work)
            dot = self.work.sum(axis=1, keepdims=True, dtype=f32)
            total = dy.sum(axis=1, keepdims=True, dtype=f32)
            xp.multiply(y, dot, out=dx)
            xp.add(total, dx, out=dx)
            dx *= f32(-1.0 / dim)
            dx += dy
            dx /= self.std
        else:
            mean = dy.sum(axis=1, keepdims=True, dtype=f32)
            mean *= f32(1.0 / dim)
            xp.subtract(dy, mean, out=dx)
