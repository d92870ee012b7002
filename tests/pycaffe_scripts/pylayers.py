"""Python layers used by python_layer.py (module files next to the scripts, as pycaffe's
examples/pycaffe/layers/).

EuclideanLossLayer: ``sum((a - b)^2) / N / 2`` over two bottoms of equal count.
LearnedScale: ``top = s * bottom`` with one learnable scalar ``s`` (param_str "{'init': v}").
"""
import ast

import numpy as np

import caffe


class EuclideanLossLayer(caffe.Layer):
    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data.reshape(bottom[0].data.shape)
        top[0].data[...] = np.sum(self.diff ** 2) / bottom[0].num / 2.

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            sign = 1 if i == 0 else -1
            grad = sign * top[0].diff[0] * self.diff / bottom[i].num
            bottom[i].diff[...] = grad.reshape(bottom[i].diff.shape)


class LearnedScale(caffe.Layer):
    def setup(self, bottom, top):
        params = ast.literal_eval(self.param_str) if self.param_str else {}
        self.blobs.add_blob(1)
        self.blobs[0].data[...] = params.get("init", 1.0)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.blobs[0].data[0] * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] += np.sum(top[0].diff * bottom[0].data)
        if propagate_down[0]:
            bottom[0].diff[...] = self.blobs[0].data[0] * top[0].diff
