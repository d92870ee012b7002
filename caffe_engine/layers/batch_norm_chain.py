"""BatchNorm, then an in-place Scale and ReLU on its blob, run as one pass each way.

ResNet's and MobileNet's every convolution is followed by ``BatchNorm -> Scale -> ReLU``, all
three in place on the convolution's top (Caffe's model zoo writes them so). Run one after the
other, the three layers read and write that blob about eleven times forward and seventeen times
backward. Run together (the kernel sets' ``batch_norm_stats_forward`` -- ``batch_norm_forward``
with global statistics -- and ``batch_norm_backward``, with the Scale's and ReLU's operands), the
forward makes three passes over the blob (two for the statistics, one writing it and
``x_norm``), the backward two over three arrays (the sums, then the diff); the cpu set makes
them a group of channels at a time, so that only the first pass of a group reads memory.

The results are the same bits: each element goes through the same float32 operations in the
same order, and every sum is taken as the layers take it (NumPy's pairwise order per plane,
then over items; :mod:`caffe_engine.kernels.cpu.channelwise`). What the layers leave behind is
the same too -- the blob's data and diff, BatchNorm's statistics and ``x_norm``, the Scale's
param diffs (accumulated or overwritten by the Scale's own rule) -- so pycaffe sees no
difference. The net runs a chain together only when its range covers all of it and no
forward/backward hook is registered (a hook could look between the layers); otherwise the
layers run one by one, as they always can.

A chain is: a BatchNorm in place (top = bottom), then optionally a Scale in place on that blob
with one bottom, a learned per-channel scale (``axis: 1``, ``num_axes: 1``) and the BatchNorm's
``x_norm`` as its saved input (:func:`caffe_engine.graph.share_saved_inputs`), then
optionally a ReLU in place on it; at least two layers, none with a loss weight. Backward runs
together only when every layer of it propagates down.
"""
class BatchNormChain:
    """Layers ``first``..``last`` of a net (indices) as one BatchNorm(+Scale)(+ReLU) chain."""

    def __init__(self, net, first, last):
        self.first, self.last = first, last
        self.length = last - first + 1
        layers = net.layers[first:last + 1]
        self.batch_norm = layers[0]
        self.scale = next((layer for layer in layers if layer.type == "Scale"), None)
        self.relu = next((layer for layer in layers if layer.type == "ReLU"), None)
        self.bottom, self.top = net.bottom_vecs[first], net.top_vecs[first]
        self.vecs = [(net.bottom_vecs[i], net.top_vecs[i]) for i in range(first, last + 1)]
        self.layers = layers
        self.backward_together = all(
            net.layer_need_backward[i] and net.bottom_need_backward[i][0]
            for i in range(first, last + 1))

    def _operands(self):
        scale = bias = slope = None
        if self.scale is not None:
            scale = self.scale.blobs[0].data
            bias = self.scale.blobs[1].data if self.scale.bias_term else None
        if self.relu is not None:
            slope = self.relu.negative_slope
        return scale, bias, slope

    def forward(self):
        """Every layer's ``reshape``, then the three forwards in one pass."""
        for layer, (bottom, top) in zip(self.layers, self.vecs):
            layer.reshape(bottom, top)
        scale, bias, slope = self._operands()
        self.batch_norm.forward_fused(self.bottom, self.top, scale, bias, slope)

    def backward(self):
        """The three backwards in two passes (only when :attr:`backward_together`)."""
        scale, _, slope = self._operands()
        relu_top = self.top[0].data if self.relu is not None else None
        bias_sum, scale_sum = self.batch_norm.backward_fused(self.top, self.bottom, scale,
                                                             relu_top, slope)
        if self.scale is not None:
            self.scale.add_param_grads(self.bottom, bias_sum, scale_sum)


def _in_place_on(net, i, blob_id):
    return net.bottom_ids[i] == [blob_id] and net.top_ids[i] == [blob_id]


def _has_loss(net, i):
    layer = net.layers[i]
    return any(layer.loss(j) for j in range(len(net.top_vecs[i])))


def _chain_scale(net, i, blob_id):
    layer = net.layers[i]
    p = layer.param.scale_param
    return (layer.type == "Scale" and _in_place_on(net, i, blob_id)
            and getattr(layer, "input_source", None) is not None
            and p.axis == 1 and p.num_axes == 1 and not _has_loss(net, i))


def _chain_relu(net, i, blob_id):
    return (net.layers[i].type == "ReLU" and _in_place_on(net, i, blob_id)
            and not _has_loss(net, i))


def find(net):
    """The net's chains, keyed by their first and by their last layer index: ``(by_first,
    by_last)``. Call after the net's backward flags are final."""
    by_first, by_last = {}, {}
    count = len(net.layers)
    for i, layer in enumerate(net.layers):
        if layer.type != "BatchNorm" or len(net.bottom_ids[i]) != 1:
            continue
        blob_id = net.bottom_ids[i][0]
        if not _in_place_on(net, i, blob_id) or _has_loss(net, i):
            continue
        if net._blob_list[blob_id].num_axes < 2:
            continue
        last = i
        if last + 1 < count and _chain_scale(net, last + 1, blob_id):
            last += 1
        if last + 1 < count and _chain_relu(net, last + 1, blob_id):
            last += 1
        if last == i:
            continue
        chain = BatchNormChain(net, i, last)
        by_first[i] = by_last[last] = chain
    return by_first, by_last

