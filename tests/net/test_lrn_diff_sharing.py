"""LRN's scale (Caffe's ``scale_``) in the train net's gradient arena
(caffe_engine/diff_sharing.py): it lives from the layer's forward to its backward, and the net
computes the same bits as with every blob's diff and every scale in memory of its own."""
import numpy

from caffe_engine.kernels.cpu.lrn import LRNPlan as CpuLRNPlan
from test_diff_sharing import _feed as shared_feed, _solver as shared_solver

LRN_NET = """
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 6 dim: 7 dim: 7 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1"
        lrn_param { local_size: 5 alpha: 0.5 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 1
                            weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "norm2" type: "LRN" bottom: "conv2" top: "norm2"
        lrn_param { local_size: 7 alpha: 2 beta: 0.6 k: 0.5 } }
layer { name: "norm3" type: "LRN" bottom: "norm2" top: "norm3"
        lrn_param { local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL } }
layer { name: "ip" type: "InnerProduct" bottom: "norm3" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _solver(monkeypatch, share):
    return shared_solver(monkeypatch, share, LRN_NET, seed=5)


def _feed(net, batch, seed):
    shared_feed(net, batch, seed, chw=(6, 7, 7))


def _state(net):
    """Every blob's data, the loss, and the params' data and diffs, as bytes."""
    blobs = [b.data.tobytes() for b in net.blobs.values()]
    return blobs + [p.data.tobytes() + p.diff.tobytes() for p in net.learnable_params]


def test_lrn_training_has_the_same_bits_with_shared_memory(monkeypatch, kernel_set):
    runs = []
    for share in (False, True):
        solver = _solver(monkeypatch, share)
        states = []
        for it, batch in enumerate((4, 4, 6, 4)):     # a batch change re-plans the arena
            _feed(solver.net, batch, it)
            solver.step(1)
            states.append(_state(solver.net))
        runs.append(states)
    assert runs[0] == runs[1]


def test_forward_backward_with_a_reshape_between_them(monkeypatch, kernel_set):
    """Forward at batch 4, reshape to 6, forward and backward: LRN planned anew in that forward
    keeps its scale where backward finds it."""
    runs = []
    for share in (False, True):
        net = _solver(monkeypatch, share).net
        _feed(net, 4, 0)
        net.forward()
        net.backward()
        _feed(net, 6, 1)
        net.forward()
        net.backward()
        runs.append(_state(net))
    assert runs[0] == runs[1]


def test_the_scale_lives_in_the_gradient_arena(monkeypatch):
    solver = _solver(monkeypatch, True)
    _feed(solver.net, 4, 0)
    solver.step(1)
    net = solver.net
    arena = net.blobs["conv1"].diff
    while arena.base is not None:
        arena = arena.base
    lrns = {name: layer for name, layer in zip(net.layer_names, net.layers)
            if layer.type == "LRN"}
    if not all(isinstance(layer.plan, CpuLRNPlan) for layer in lrns.values()):
        return                  # another kernel set: its plans keep their own arrays
    assert lrns["norm1"].saved_bytes() == 4 * 4 * 6 * 7 * 7
    assert lrns["norm3"].saved_bytes() == 0          # WITHIN_CHANNEL keeps its own arrays
    for name in ("norm1", "norm2"):
        assert numpy.shares_memory(lrns[name].plan.scale, arena)
        assert lrns[name].plan._own is None
