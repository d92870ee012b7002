"""Elementwise arithmetic layers: Eltwise (product, sum or max of equally shaped bottoms), and
Bias and Scale (an operand broadcast over bottom 0, learned or given as bottom 1).

Caffe: src/caffe/layers/<name>_layer.cpp for each (eltwise, bias, scale).
"""
import numpy

from .. import fillers, kernels
from ..backend import get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from . import scratch
from ._helpers import _axis
from .base import Layer, register

f32 = numpy.float32


def _buffer(current, shape, xp, dtype=f32):
    """``current`` if it already has ``shape`` on ``xp``, else a new empty array."""
    if current is None or current.shape != tuple(shape) or get_array_module(current) is not xp:
        return xp.empty(shape, dtype)
    return current


_ELTWISE = caffe_pb2.EltwiseParameter


@register("Eltwise")
class EltwiseLayer(Layer):
    """Elementwise product, weighted sum or maximum of two or more equally shaped bottoms.

    Shapes: every bottom the same shape; top as they are. float32.

    * PROD: ``top = x0 * x1 * ...``. Gradient to bottom i: the product of the other bottoms times
      the top diff (``stable_prod_grad``), or ``top / x_i * top_diff`` (faster, unstable at 0).
    * SUM: ``top = sum_i coeff_i * x_i`` (coeff default 1); gradient ``coeff_i * top_diff``.
    * MAX: ``top = max_i x_i``; an argmax per element (int32) routes the gradient. Caffe's
      ties: between bottoms 0 and 1 the later wins, after that the earlier one stays.

    Fields read (eltwise_param): operation (SUM), coeff (repeated; SUM only), stable_prod_grad
    (true).

    Raises:
        CaffeError: coeff given with PROD; a coeff count that is not the bottom count; bottoms
        of different shapes.

    Caffe: src/caffe/layers/eltwise_layer.cpp.
    """

    min_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if self.op == _ELTWISE.PROD and len(p.coeff):
            raise self.error("Eltwise layer only takes coefficients for summation.")
        if len(p.coeff) not in (0, len(bottom)):
            raise self.error(f"Eltwise Layer takes one coefficient per bottom blob: "
                             f"{len(p.coeff)} for {len(bottom)} bottoms")
        self.coeffs = [f32(c) for c in p.coeff] or [f32(1)] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.max_idx = None

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"bottom {i} shape {b.shape} differs from bottom 0 shape "
                                 f"{bottom[0].shape}")
        top[0].reshape(bottom[0].shape)
        if self.op == _ELTWISE.MAX:
            xp = get_array_module(bottom[0].data)
            self.max_idx = _buffer(self.max_idx, bottom[0].shape, xp, numpy.int32)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        if self.op == _ELTWISE.PROD:
            xp.multiply(bottom[0].data, bottom[1].data, out=y)
            for b in bottom[2:]:
                y *= b.data
        elif self.op == _ELTWISE.SUM:
            if self.coeffs[0] == 1:
                xp.copyto(y, bottom[0].data)
            else:
                xp.multiply(bottom[0].data, self.coeffs[0], out=y)
            for b, c in zip(bottom[1:], self.coeffs[1:]):
                y += b.data if c == 1 else b.data * c
        elif self.op == _ELTWISE.MAX:
            a, b = bottom[0].data, bottom[1].data
            idx = self.max_idx
            first = a > b
            xp.copyto(idx, xp.where(first, 0, 1).astype(numpy.int32))
            xp.copyto(y, xp.where(first, a, b))
            for i, blob in enumerate(bottom[2:], 2):
                better = blob.data > y
                idx[better] = i
                xp.copyto(y, blob.data, where=better)
        else:
            raise self.error(f"unknown elementwise operation {self.op}")

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        dy, y = top[0].diff, top[0].data
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            dx = b.diff
            if self.op == _ELTWISE.PROD:
                if self.stable_prod_grad:
                    others = [o.data for j, o in enumerate(bottom) if j != i]
                    xp.copyto(dx, others[0])
                    for o in others[1:]:
                        dx *= o
                else:
                    xp.divide(y, b.data, out=dx)
                dx *= dy
            elif self.op == _ELTWISE.SUM:
                if self.coeffs[i] == 1:
                    xp.copyto(dx, dy)
                else:
                    xp.multiply(dy, self.coeffs[i], out=dx)
            else:
                xp.multiply(dy, self.max_idx == i, out=dx)


# ------------------------------------------------------------------------------------------------
# Bias and Scale
# ------------------------------------------------------------------------------------------------
def _param_shape(layer, bottom0, axis, num_axes):
    """Shape of a learned Bias/Scale blob: ``bottom0.shape[axis : axis + num_axes]``."""
    axis = _axis(layer, bottom0, axis)
    if num_axes < -1:
        raise layer.error("num_axes must be non-negative, or -1 to extend to the end of "
                          "bottom[0]")
    if num_axes >= 0 and bottom0.num_axes < axis + num_axes:
        raise layer.error(f"parameter blob's shape extends past bottom[0]'s shape "
                          f"{bottom0.shape} when applied starting with axis {axis}")
    end = bottom0.num_axes if num_axes == -1 else axis + num_axes
    return bottom0.shape[axis:end]


def _broadcast_view(layer, bottom0, operand, axis_param, what):
    """(outer, dim, inner) with which ``operand`` (a blob) broadcasts over ``bottom0``.

    A scalar operand (0 axes) applies everywhere (axis 0); otherwise its dims must equal
    bottom0's from the canonical ``axis_param`` on.
    """
    axis = 0 if operand.num_axes == 0 else _axis(layer, bottom0, axis_param)
    if bottom0.num_axes < axis + operand.num_axes:
        raise layer.error(f"{what} blob's shape {operand.shape} extends past bottom[0]'s shape "
                          f"{bottom0.shape} when applied starting with axis {axis}")
    for i, d in enumerate(operand.shape):
        if bottom0.shape[axis + i] != d:
            raise layer.error(f"dimension mismatch between bottom[0] {bottom0.shape} (axis "
                              f"{axis + i}) and {what} {operand.shape} (axis {i})")
    return (bottom0.count_range(0, axis), operand.count,
            bottom0.count_range(axis + operand.num_axes))


@register("Bias")
class BiasLayer(Layer):
    """Add a bias broadcast over bottom 0: ``top = x + b`` (b learned, or bottom 1).

    Shapes: bottom 0 (d0, ..., dn); b has the dims ``d_axis .. d_{axis+num_axes-1}`` (a 0-axis
    scalar for ``num_axes: 0``); top as bottom 0. float32. In place allowed.
    Params (one bottom only): ``blobs[0]`` b, filled with ``filler`` (default constant 0).
    Backward: bottom 0 gets the top diff; b (param, accumulated; or bottom 1, overwritten) the
    top diff summed over the broadcast axes.

    Fields read (bias_param): axis (1, may be negative), num_axes (1; -1 = to the end; with two
    bottoms the shape of bottom 1 decides), filler.

    Raises:
        CaffeError: axis/num_axes out of range; b's dims not matching bottom 0's.

    Caffe: src/caffe/layers/bias_layer.cpp.
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1 and not self.blobs:
            self.blobs = [Blob(_param_shape(self, bottom[0], p.axis, p.num_axes))]
            fillers.fill(self.blobs[0], p.filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.view = _broadcast_view(self, bottom[0], bias, self.param.bias_param.axis, "bias")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        _add_bias(bottom[0], top[0], bias.data, self.view)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        if propagate_down[0] and top[0] is not bottom[0]:
            xp.copyto(bottom[0].diff, top[0].diff)
        if len(bottom) > 1:
            if propagate_down[1]:
                _bias_grad(top[0].diff, bottom[1].diff, self.view, accumulate=False)
        elif self.param_propagate_down[0]:
            _bias_grad(top[0].diff, self.blobs[0].diff, self.view, accumulate=True)


def _add_bias(src, dst, bias, view):
    """``dst = src + bias`` with ``bias`` (dim,) broadcast over the (outer, dim, inner) view."""
    xp = get_array_module(src.data)
    outer, dim, inner = view
    xp.add(src.data.reshape(view), bias.reshape(1, dim, 1), out=dst.data.reshape(view))


def _bias_grad(top_diff, target, view, accumulate):
    """Sum ``top_diff`` over outer and inner into ``target`` (dim,): ``+=`` or ``=``."""
    outer, dim, inner = view
    s = top_diff.reshape(view).sum(axis=2).sum(axis=0)
    if accumulate:
        target += s.reshape(target.shape)
    else:
        target[...] = s.reshape(target.shape)


@register("Scale")
class ScaleLayer(Layer):
    """Multiply bottom 0 by a scale broadcast over it, optionally plus a bias.

    ``top = x * s (+ b)``, with ``s`` learned (one bottom) or given as bottom 1, ``b`` learned.
    Shapes: bottom 0 (d0, ..., dn); s has the dims ``d_axis .. d_{axis+num_axes-1}`` (a 0-axis
    scalar for ``num_axes: 0``); b has s's shape; top as bottom 0. float32. In place allowed
    (the input is kept for the scale's gradient, as in Caffe).
    Params: one bottom: ``blobs[0]`` s (``filler``, default constant 1) and, with
    ``bias_term``, ``blobs[1]`` b (``bias_filler``, default constant 0); two bottoms: only b.
    Backward: bottom 0 gets ``top_diff * s``; s the sum of ``top_diff * x`` over the broadcast
    axes; b the sum of ``top_diff``. Like Caffe, the learned scale's gradient is *overwritten*
    rather than accumulated when the scale covers all of bottom 0 or when nothing precedes
    ``axis`` (outer size 1) while the scale has several values and something follows it.

    Fields read (scale_param): axis (1, may be negative), num_axes (1; -1 = to the end),
    filler, bias_term (false), bias_filler.

    Raises:
        CaffeError: axis/num_axes out of range; s's dims not matching bottom 0's.

    Caffe: src/caffe/layers/scale_layer.cpp (the bias through bias_layer.cpp).
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.bias_term = p.bias_term
        loaded = bool(self.blobs)
        if len(bottom) == 1 and not loaded:
            self.blobs = [Blob(_param_shape(self, bottom[0], p.axis, p.num_axes))]
            if p.HasField("filler"):
                filler = p.filler
            else:
                filler = caffe_pb2.FillerParameter(type="constant", value=1.0)
            fillers.fill(self.blobs[0], filler)
        if self.bias_term and not loaded:
            num_axes = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            bias = Blob(_param_shape(self, bottom[0], p.axis, num_axes))
            fillers.fill(bias, p.bias_filler)
            self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)
        self.temp = None
        self.input_source = None

    def share_input(self, source):
        """Read the input saved for the scale's gradient from ``source()`` (an array of bottom
        0's values, e.g. the BatchNorm just before, in place, keeps its output as ``x_norm``)
        instead of copying it in ``forward``: Caffe's ``temp_`` holds the same values a second
        time. The net links the two (:meth:`caffe_engine.net.Net`); results are unchanged."""
        self.input_source = source
        self.temp = None

    def reshape(self, bottom, top):
        p = self.param.scale_param
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.view = _broadcast_view(self, bottom[0], scale, p.axis, "scale")
        xp = get_array_module(bottom[0].data)
        self.kernels = kernels.for_array(bottom[0].data)
        if top[0] is bottom[0]:
            if self.input_source is None:
                self.temp = _buffer(self.temp, bottom[0].shape, xp)
        else:
            top[0].reshape(bottom[0].shape)
        if self.bias_term:
            self.bias_view = _broadcast_view(self, bottom[0], self.blobs[-1], p.axis, "bias")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        if top[0] is bottom[0] and self.input_source is None:
            xp.copyto(self.temp, bottom[0].data)
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        outer, dim, inner = self.view
        xp.multiply(bottom[0].data.reshape(self.view), scale.data.reshape(1, dim, 1),
                    out=top[0].data.reshape(self.view))
        if self.bias_term:
            _add_bias(top[0], top[0], self.blobs[-1].data, self.bias_view)

    def _overwrites(self, bottom):
        """Caffe accumulates a learned scale's gradient except in two layouts, where its BLAS
        call writes the scale diff directly (eltwise: the product itself; outer 1 with inner > 1
        and several scales: gemv with beta 0). Kept for number-for-number agreement, e.g. with
        iter_size > 1."""
        outer, dim, inner = self.view
        eltwise = bottom[0].count == dim
        return eltwise or (outer == 1 and inner > 1 and dim > 1)

    @staticmethod
    def _store_scale_grad(scale, sums, accumulate):
        if accumulate:
            scale.diff += sums.reshape(scale.shape)
        else:
            scale.diff[...] = sums.reshape(scale.shape)

    def add_param_grads(self, bottom, bias_sum, scale_sum):
        """The learned params' gradients from their per-channel sums ((dim,) each: the top
        diff's and ``top_diff * x``'s), as :meth:`backward` stores them -- for the net's
        :mod:`.batch_norm_chain`, which computes the sums in BatchNorm's passes."""
        if self.bias_term and self.param_propagate_down[-1]:
            self.blobs[-1].diff += bias_sum.reshape(self.blobs[-1].shape)
        if self.param_propagate_down[0]:
            self._store_scale_grad(self.blobs[0], scale_sum, not self._overwrites(bottom))

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        if self.bias_term and self.param_propagate_down[-1]:
            _bias_grad(top[0].diff, self.blobs[-1].diff, self.bias_view, accumulate=True)
        scale_param = len(bottom) == 1
        scale = self.blobs[0] if scale_param else bottom[1]
        outer, dim, inner = self.view
        dy = top[0].diff.reshape(self.view)
        dx = bottom[0].diff.reshape(self.view) if propagate_down[0] else None
        fused = False
        if (scale_param and self.param_propagate_down[0]) or \
                (not scale_param and propagate_down[1]):
            # The product top_diff * x needs a bottom-sized scratch array. As in Caffe, that is
            # the bottom diff (overwritten below when it is wanted, garbage otherwise, as in
            # Caffe), or in place the saved input itself (no longer needed after this).
            in_place = top[0] is bottom[0]
            if in_place and self.input_source is not None:
                x = self.input_source().reshape(bottom[0].shape)
                product = scratch.get(xp, bottom[0].shape, "scale_product")
            else:
                x = self.temp if in_place else bottom[0].data
                product = self.temp if in_place else bottom[0].diff
            # One pass for the product and the bottom diff, unless they are the same memory;
            # each element of dy is read before the bottom diff (dy itself in place) is written.
            fused = dx is not None and product is not bottom[0].diff
            self.kernels.scale_grad(dy, x.reshape(self.view), scale.data,
                                    product.reshape(self.view), dx if fused else None)
            sums = product.reshape(self.view).sum(axis=2).sum(axis=0)
            self._store_scale_grad(scale, sums, scale_param and not self._overwrites(bottom))
        if dx is not None and not fused:
            self.kernels.scale_grad(dy, None, scale.data, None, dx)
