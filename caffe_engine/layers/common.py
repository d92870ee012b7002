"""Common layers: Input and InnerProduct.

Caffe: src/caffe/layers/input_layer.cpp, src/caffe/layers/inner_product_layer.cpp.
"""
from .. import fillers
from ..backend import get_array_module
from ..blob import Blob
from .base import Layer, register


@register("Input")
class InputLayer(Layer):
    """Net inputs: tops shaped once from ``input_param.shape``, filled by the caller.

    Shapes: one ``shape`` for every top, one per top, or none (the caller shapes the tops).
    Forward and backward do nothing; ``reshape`` keeps whatever shape the caller has since given
    a top (pycaffe's ``net.blobs['data'].reshape(...)``).

    Fields read (input_param): shape (repeated BlobShape, each ``dim`` a non-negative int).

    Raises:
        CaffeError: bottoms given; the number of shapes is neither 0, 1 nor the number of tops.

    Caffe: src/caffe/layers/input_layer.cpp.
    """

    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"must specify 'shape' once, once per top blob, or not at all: "
                             f"{len(top)} tops vs. {len(shapes)} shapes")
        for i, t in enumerate(top):
            if shapes:
                t.reshape(tuple(shapes[0 if len(shapes) == 1 else i].dim))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass


@register("InnerProduct")
class InnerProductLayer(Layer):
    """Fully connected layer: ``top = bottom @ W.T + b`` over the axes from ``axis`` on.

    Shapes: bottom (d0, ..., d_{axis-1}, *K) is read as (M, K) with ``M = count(0, axis)``,
    ``K = count(axis)``; top is (d0, ..., d_{axis-1}, num_output). float32.

    Params: ``blobs[0]`` weights (num_output, K), or (K, num_output) with ``transpose``;
    ``blobs[1]`` bias (num_output,) when ``bias_term``. Filled with ``weight_filler`` then
    ``bias_filler`` (both default constant 0).

    Fields read (inner_product_param): num_output (required, > 0), bias_term (true), axis (1),
    transpose (false), weight_filler, bias_filler.

    Raises:
        CaffeError: num_output missing; a later bottom whose ``count(axis)`` differs from K.

    Caffe: src/caffe/layers/inner_product_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        self.num_output = p.num_output
        if self.num_output <= 0:
            raise self.error("num_output must be specified and > 0")
        self.bias_term = p.bias_term
        self.transpose = p.transpose
        self.axis = bottom[0].canonical_axis(p.axis)
        self.k = bottom[0].count_range(self.axis)
        if not self.blobs:
            shape = (self.k, self.num_output) if self.transpose else (self.num_output, self.k)
            self.blobs = [Blob(shape)]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.num_output,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        axis = bottom[0].canonical_axis(self.param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.k:
            raise self.error(f"input size incompatible with inner product parameters: "
                             f"bottom {bottom[0].shape} gives K = {k}, weights expect {self.k}")
        self.m = bottom[0].count_range(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.num_output,))

    def _w(self, blob_array):
        """The weights as a (K, num_output) operand."""
        return blob_array if self.transpose else blob_array.T

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        xp.matmul(x, self._w(self.blobs[0].data), out=y)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        dy = top[0].diff.reshape(self.m, self.num_output)
        x = bottom[0].data.reshape(self.m, self.k)
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        if ppd[0]:
            if self.transpose:
                self.blobs[0].diff += xp.matmul(x.T, dy)
            else:
                self.blobs[0].diff += xp.matmul(dy.T, x)
        if self.bias_term and ppd[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.m, self.k)
            xp.matmul(dy, self._w(self.blobs[0].data).T, out=dx)
