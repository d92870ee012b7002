"""Reduction layers: Reduction (sum, sum of |x|, sum of squares or mean over the trailing axes)
and ArgMax (the top_k largest entries).

Caffe: src/caffe/layers/reduction_layer.cpp, src/caffe/layers/argmax_layer.cpp.
"""
import numpy

from ..backend import get_array_module
from ..proto import caffe_pb2
from ._helpers import _axis
from .base import Layer, register

f32 = numpy.float32


_REDUCTION = caffe_pb2.ReductionParameter


@register("Reduction")
class ReductionLayer(Layer):
    """Reduce all axes from ``axis`` on to one number each, times ``coeff``.

    Shapes: bottom (d0, ..., dn) read as (count(0, axis), count(axis)); top (d0, ...,
    d_{axis-1}), a 0-axis scalar for ``axis = 0``. float32.

    Operations: SUM, ASUM (sum of ``|x|``), SUMSQ (sum of ``x**2``), MEAN (SUM with ``coeff``
    divided by the reduced count). Gradients: ``coeff * top_diff`` times 1, ``sign(x)``,
    ``2 x``, or 1 respectively.

    Fields read (reduction_param): operation (SUM), axis (0, may be negative), coeff (1).

    Raises:
        CaffeError: axis out of range; an unknown operation.

    Caffe: src/caffe/layers/reduction_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.reduction_param
        self.op = p.operation
        if self.op not in (_REDUCTION.SUM, _REDUCTION.ASUM, _REDUCTION.SUMSQ, _REDUCTION.MEAN):
            raise self.error(f"unknown reduction operation {self.op}")

    def reshape(self, bottom, top):
        p = self.param.reduction_param
        b = bottom[0]
        axis = _axis(self, b, p.axis)
        top[0].reshape(b.shape[:axis])
        self.num, self.dim = b.count_range(0, axis), b.count_range(axis)
        self.coeff = f32(p.coeff)
        if self.op == _REDUCTION.MEAN:
            self.coeff = f32(self.coeff / f32(self.dim))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self.num, self.dim)
        y = top[0].data.reshape(self.num)
        if self.op == _REDUCTION.ASUM:
            x = xp.abs(x)
        elif self.op == _REDUCTION.SUMSQ:
            x = x * x
        xp.sum(x, axis=1, out=y)
        if self.coeff != 1:
            y *= self.coeff

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        g = (top[0].diff.reshape(self.num, 1) * self.coeff)
        dx = bottom[0].diff.reshape(self.num, self.dim)
        x = bottom[0].data.reshape(self.num, self.dim)
        if self.op == _REDUCTION.ASUM:
            xp.sign(x, out=dx)
            dx *= g
        elif self.op == _REDUCTION.SUMSQ:
            xp.multiply(x, g * f32(2), out=dx)
        else:
            dx[...] = g


@register("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and optionally values) of the ``top_k`` largest entries.

    Without ``axis``: per item n of bottom (N, ...) over its ``count(1)`` values; top is
    (N, 1, top_k) -- or (N, 2, top_k) with ``out_max_val``, indices then values -- padded with
    1-dims to the bottom's number of axes (at least 3). With ``axis``: along that axis; top is
    the bottom's shape with ``top_k`` there, holding values if ``out_max_val`` else indices.
    Indices are float32 holding integers. Order: by value, descending; equal values by index,
    descending (Caffe's ``partial_sort`` with ``std::greater`` on (value, index) pairs).
    No backward.

    Fields read (argmax_param): out_max_val (false), top_k (1), axis (unset; may be negative).

    Raises:
        CaffeError: top_k < 1 or larger than the searched dimension; axis out of range;
        backward asked to propagate (Caffe: not implemented).

    Caffe: src/caffe/layers/argmax_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.argmax_param
        self.out_max_val, self.top_k = p.out_max_val, p.top_k
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise self.error("top k must not be less than 1.")

    def reshape(self, bottom, top):
        b = bottom[0]
        if self.has_axis:
            axis = _axis(self, b, self.param.argmax_param.axis)
            if self.top_k > b.shape[axis]:
                raise self.error(f"top_k ({self.top_k}) must be less than or equal to the "
                                 f"dimension of the axis ({b.shape[axis]}).")
            self.view = (b.count_range(0, axis), b.shape[axis], b.count_range(axis + 1))
            shape = list(b.shape)
            shape[axis] = self.top_k
        else:
            if self.top_k > b.count_range(1):
                raise self.error(f"top_k ({self.top_k}) must be less than or equal to the "
                                 f"dimension of the flattened bottom blob per instance "
                                 f"({b.count_range(1)}).")
            self.view = (b.shape[0], b.count_range(1), 1)
            shape = [1] * max(3, b.num_axes)
            shape[0], shape[2] = b.shape[0], self.top_k
            if self.out_max_val:
                shape[1] = 2
        top[0].reshape(shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, dim, inner = self.view
        x = bottom[0].data.reshape(self.view)
        # Descending by (value, index): a stable ascending sort of the negated values, run over
        # the axis reversed so that among equal values the larger index comes first.
        reversed_neg = -x[:, ::-1, :]
        order = xp.argsort(reversed_neg, axis=1, kind="stable")[:, :self.top_k, :]
        index = (dim - 1) - order
        if self.has_axis:
            out = top[0].data.reshape(outer, self.top_k, inner)
            if self.out_max_val:
                out[...] = xp.take_along_axis(x, index, axis=1)
            else:
                out[...] = index
            return
        out = top[0].data.reshape(outer, -1)
        out[:, :self.top_k] = index[:, :, 0]
        if self.out_max_val:
            out[:, self.top_k:] = xp.take_along_axis(x, index, axis=1)[:, :, 0]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("ArgMax has no backward (Caffe: not implemented)")
