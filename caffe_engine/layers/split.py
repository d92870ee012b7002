"""Split: one bottom shared by several tops, whose gradients are summed on the way back.

Caffe: src/caffe/layers/split_layer.cpp. Inserted by ``graph.insert_splits`` wherever a blob
feeds more than one layer; can also be written explicitly. Tops view the bottom's data (no
copy); backward writes ``bottom.diff = sum(top[i].diff)``.
"""
from ..backend import get_array_module
from .base import Layer, register


@register("Split")
class SplitLayer(Layer):
    """Bottom (any shape) -> K tops sharing its data; bottom diff = sum of top diffs."""

    exact_num_bottom = 1
    min_top = 1

    def reshape(self, bottom, top):
        for t in top:
            if t is bottom[0]:
                raise self.error("does not allow in-place computation")
            t.reshape(bottom[0].shape)
            t.share_data(bottom[0])

    def forward(self, bottom, top):
        for t in top:  # keep sharing even if the bottom's array was replaced since reshape
            t.share_data(bottom[0])

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(bottom[0].diff)
        if len(top) == 1:
            bottom[0].diff[...] = top[0].diff
            return
        xp.add(top[0].diff, top[1].diff, out=bottom[0].diff)
        for t in top[2:]:
            bottom[0].diff += t.diff
