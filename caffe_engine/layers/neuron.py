"""Neuron layers: elementwise functions of one bottom, top shaped like it, in place allowed.

Caffe: include/caffe/layers/neuron_layer.hpp and one ``*_layer.cpp`` per function.

In place (``top: "x"`` = ``bottom: "x"``) the top and the bottom are the same Blob, so a
layer's backward reads ``bottom[0].data`` knowing it may already hold the forward's output, as
Caffe's do.
"""
import numpy

from ..backend import get_array_module
from .base import Layer, register


class NeuronLayer(Layer):
    """Base for elementwise layers: one bottom, one top of the bottom's shape.

    Caffe: src/caffe/layers/neuron_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)


@register("ReLU")
class ReLULayer(NeuronLayer):
    """Rectified linear unit, leaky when ``negative_slope`` is set.

    ``top = max(x, 0) + negative_slope * min(x, 0)``; the gradient is ``top_diff`` where
    ``x > 0`` and ``negative_slope * top_diff`` elsewhere. Shapes: any, top as bottom; float32.
    In place the ``x > 0`` test is made on the stored top data, which has the same sign for any
    ``negative_slope >= 0`` (Caffe does the same).

    Fields read (relu_param): negative_slope (0). ``engine`` is accepted and ignored.

    Caffe: src/caffe/layers/relu_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        self.negative_slope = numpy.float32(self.param.relu_param.negative_slope)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x, y = bottom[0].data, top[0].data
        if self.negative_slope == 0:
            xp.maximum(x, 0, out=y)
        else:
            xp.copyto(y, xp.where(x > 0, x, x * self.negative_slope))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        x, dy, dx = bottom[0].data, top[0].diff, bottom[0].diff
        if self.negative_slope == 0:
            xp.multiply(dy, x > 0, out=dx)
        else:
            xp.copyto(dx, xp.where(x > 0, dy, dy * self.negative_slope))
