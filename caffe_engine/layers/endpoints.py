"""Endpoint layers: where blobs enter or leave the net, computing nothing.

Input (tops the caller fills), Parameter (a learned blob as a top), Silence (bottoms consumed).

Caffe: src/caffe/layers/<name>_layer.cpp for each (input, parameter, silence).
"""
from ..blob import Blob
from ._helpers import _share_whole
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


@register("Parameter")
class ParameterLayer(Layer):
    """A learnable blob exposed as a top: the top shares the param's data and diff.

    Shapes: top = ``parameter_param.shape``; float32. The blob starts at zero (no filler, no
    draws from the random stream); load or learn its values. A diff written into the top is the
    param's gradient.

    Fields read (parameter_param): shape (BlobShape).

    Caffe: src/caffe/layers/parameter_layer.cpp (include/caffe/layers/parameter_layer.hpp).
    """

    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if not self.blobs:
            self.blobs = [Blob(tuple(self.param.parameter_param.shape.dim))]
        self.param_propagate_down = [True]

    def reshape(self, bottom, top):
        _share_whole(top[0], self.blobs[0])

    def forward(self, bottom, top):
        _share_whole(top[0], self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        pass


@register("Silence")
class SilenceLayer(Layer):
    """Swallow its bottoms (so they are not net outputs); backward zeroes their diffs.

    Shapes: any number of bottoms of any shape, no tops.

    Caffe: src/caffe/layers/silence_layer.cpp.
    """

    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0
