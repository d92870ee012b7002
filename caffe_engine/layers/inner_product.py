"""InnerProduct: the fully connected layer, on the kernel set's GEMM.

Caffe: src/caffe/layers/inner_product_layer.cpp.
"""
from .. import fillers, kernels
from ..blob import Blob
from .base import Layer, register


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
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        self.kernels.matmul(x, self.blobs[0].data, y, trans_b=not self.transpose)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.m, self.num_output)
        x = bottom[0].data.reshape(self.m, self.k)
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        if ppd[0]:
            if self.transpose:
                self.kernels.matmul(x, dy, self.blobs[0].diff, accumulate=True, trans_a=True)
            else:
                self.kernels.matmul(dy, x, self.blobs[0].diff, accumulate=True, trans_a=True)
        if self.bias_term and ppd[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.m, self.k)
            self.kernels.matmul(dy, self.blobs[0].data, dx, trans_b=self.transpose)
