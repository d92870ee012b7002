"""Indexing layers: items picked by index. BatchReindex (by an index bottom), Filter (by a
selector bottom), Embed (rows of a learned table, by the bottom's values).

Caffe: src/caffe/layers/<name>_layer.cpp for each (batch_reindex, filter, embed).
"""
import numpy

from .. import backend, fillers
from ..backend import get_array_module
from ..blob import Blob
from .base import Layer, register

f32 = numpy.float32


def _int_indices(layer, xp, values, limit, what):
    """Float index values -> integer array, checked to lie in [0, limit) (truncated like C).

    The check is immediate on the CPU and deferred on the device
    (:func:`caffe_engine.backend.check_values`; out-of-range indices then read item 0 until the error is
    raised)."""
    bad = (values < 0) | (values >= limit)
    backend.check_values((layer, "range"), bad, values,
                  lambda value: layer.error(f"{what} {float(value):g} outside [0, {limit})"))
    return xp.where(bad, 0, values).astype(numpy.int64)


def _scatter_add(xp, target, indices, values):
    """``target[indices[i]] += values[i]`` for every i, repeated indices summed.

    On NumPy the additions happen one by one in the order of ``indices`` (``ufunc.at``), which is
    the order of Caffe's CPU loops; on CuPy they are atomic adds.
    """
    if xp is numpy:
        numpy.add.at(target, indices, values)
    else:  # pragma: no cover - GPU only
        import cupyx
        cupyx.scatter_add(target, indices, values)


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """Pick items of bottom 0 by the indices in bottom 1: ``top[i] = bottom0[idx[i]]``.

    Shapes: bottom 0 (N, ...), bottom 1 (M,) float32 holding integers in [0, N); top (M, ...).
    Backward sums the top diff of every pick into the picked item (zero for items never picked),
    in index order; the index bottom gets no gradient.

    Raises:
        CaffeError: bottom 1 not 1-D; an index outside [0, N); backward asked to propagate to
        the indices (Caffe aborts).

    Caffe: src/caffe/layers/batch_reindex_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"the index bottom must be 1-D, got shape {bottom[1].shape}")
        top[0].reshape((bottom[1].shape[0],) + bottom[0].shape[1:])

    def _indices(self, bottom):
        xp = get_array_module(bottom[1].data)
        return _int_indices(self, xp, bottom[1].data, bottom[0].shape[0], "reindex index")

    def forward(self, bottom, top):
        if top[0].count == 0:
            return
        top[0].data[...] = bottom[0].data[self._indices(bottom)]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("Cannot backprop to index.")
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        bottom[0].diff[...] = 0
        _scatter_add(xp, bottom[0].diff, self._indices(bottom), top[0].diff)


@register("Filter")
class FilterLayer(Layer):
    """Keep the items whose selector is non-zero: ``top_t = bottom_t[selector != 0]``.

    Shapes: bottoms 0..K-1 (N, ...) to filter, the last bottom the selector (N,) or (N, 1, ...)
    with singleton trailing dims; top t is (M, ...) with M the number of kept items (at setup,
    before any selector values exist, M = N as in Caffe). float32. Backward copies each top
    diff back to the kept items and zeroes the others; the selector gets no gradient.

    Raises:
        CaffeError: not one top fewer than bottoms; selector dims other than the first not 1;
        a bottom whose first dim differs from the selector's; backward asked to propagate to
        the selector (Caffe aborts).

    Caffe: src/caffe/layers/filter_layer.cpp.
    """

    min_bottom = 2
    min_top = 1

    def layer_setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom: {len(bottom)} bottoms "
                             f"(the last is the selector), {len(top)} tops")
        self.first_reshape = True
        self.indices = None

    def reshape(self, bottom, top):
        sel = bottom[-1]
        if any(d != 1 for d in sel.shape[1:]):
            raise self.error(f"selector blob dimensions must be singletons (1), except the "
                             f"first: {sel.shape}")
        for i, b in enumerate(bottom[:-1]):
            if b.shape[0] != sel.shape[0]:
                raise self.error(f"each bottom should have the same 0th dimension as the "
                                 f"selector blob: bottom {i} {b.shape}, selector {sel.shape}")
        xp = get_array_module(sel.data)
        self.indices = xp.nonzero(sel.data.reshape(-1))[0]
        kept = int(self.indices.shape[0])
        if self.first_reshape:
            kept = bottom[0].shape[0]
            self.first_reshape = False
        for t, b in zip(top, bottom):
            t.reshape((kept,) + b.shape[1:])

    def forward(self, bottom, top):
        for t, b in zip(top, bottom):
            t.data[...] = b.data[self.indices]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error("Layer cannot backpropagate to filter index inputs")
        for i, t in enumerate(top):
            if propagate_down[i]:
                bottom[i].diff[...] = 0
                bottom[i].diff[self.indices] = t.diff


@register("Embed")
class EmbedLayer(Layer):
    """Lookup table: ``top[..., :] = W[idx] + b`` for each integer index in the bottom.

    Shapes: bottom any shape (float32 holding integers in [0, input_dim)); top the bottom's
    shape plus (num_output,). Params: ``blobs[0]`` W (input_dim, num_output), ``blobs[1]`` b
    (num_output,) when ``bias_term``; filled with ``weight_filler`` then ``bias_filler``
    (default constant 0). Backward: W's rows get the top diffs of their lookups added one by one
    in bottom order; b the sum of all top diffs. The index bottom gets no gradient.

    Fields read (embed_param): num_output (> 0), input_dim (> 0), bias_term (true),
    weight_filler, bias_filler.

    Raises:
        CaffeError: num_output or input_dim missing; an index outside [0, input_dim) or not an
        integer; backward asked to propagate to the indices (Caffe aborts).

    Caffe: src/caffe/layers/embed_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        self.n, self.k, self.bias_term = p.num_output, p.input_dim, p.bias_term
        if self.n <= 0:
            raise self.error("EmbedLayer num_output must be positive.")
        if self.k <= 0:
            raise self.error("EmbedLayer input_dim must be positive.")
        if not self.blobs:
            self.blobs = [Blob((self.k, self.n))]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.n,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.n,))

    def _indices(self, bottom):
        xp = get_array_module(bottom[0].data)
        values = bottom[0].data.reshape(-1)
        idx = _int_indices(self, xp, values, self.k, "embedding index")
        backend.check_values((self, "integer"), idx.astype(f32) != values, values,
                      lambda bad: self.error("non-integer input to an Embed layer"))
        return idx

    def forward(self, bottom, top):
        y = top[0].data.reshape(-1, self.n)
        y[...] = self.blobs[0].data[self._indices(bottom)]
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Can't backpropagate to EmbedLayer input.")
        xp = get_array_module(top[0].diff)
        dy = top[0].diff.reshape(-1, self.n)
        if self.param_propagate_down[0]:
            _scatter_add(xp, self.blobs[0].diff, self._indices(bottom), dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)
