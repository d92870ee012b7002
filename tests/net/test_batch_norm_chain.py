"""BatchNorm + in-place Scale + ReLU run together by the net (caffe_engine/layers/
batch_norm_chain.py): every blob's data and diff and every param's data and diff the same bits
as the layers run one by one, on the cpu and reference kernel sets, TRAIN and TEST, batch 1 (the
Scale's overwrite rule) and 3, frozen Scale, leaky ReLU; partial ranges and hooks fall back."""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import kernels, rng
from caffe_engine.layers import batch_norm_chain
from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2

NET = """
force_backward: true
layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: {n} dim: 2 dim: 5 dim: 6 }} }} }}
layer {{ name: "t" type: "Input" top: "t" input_param {{ shape {{ dim: {n} dim: 3 }} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "x" top: "c"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "bn" type: "BatchNorm" bottom: "c" top: "c" {bn_param} }}
layer {{ name: "scale" type: "Scale" bottom: "c" top: "c" {scale_lr}
  scale_param {{ bias_term: {bias} filler {{ type: "uniform" min: 0.5 max: 2 }} bias_filler {{ type: "uniform" }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "c" top: "c" relu_param {{ negative_slope: {slope} }} }}
layer {{ name: "conv2" type: "Convolution" bottom: "c" top: "d"
  convolution_param {{ num_output: 4 kernel_size: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "bn2" type: "BatchNorm" bottom: "d" top: "d" }}
layer {{ name: "scale2" type: "Scale" bottom: "d" top: "d" scale_param {{ bias_term: true }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "d" top: "y"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }}
"""

CASES = {
    "plain": dict(n=3, bn_param="", scale_lr="", bias="true", slope=0),
    "batch1": dict(n=1, bn_param="", scale_lr="", bias="true", slope=0),
    "leaky_nobias": dict(n=3, bn_param="", scale_lr="", bias="false", slope=0.1),
    "frozen_scale": dict(n=2, bn_param="", bias="true", slope=0,
                         scale_lr="param { lr_mult: 0 } param { lr_mult: 0 }"),
    "global_stats": dict(n=3, bn_param="batch_norm_param { use_global_stats: true }",
                         scale_lr="", bias="true", slope=0),
}


def run(case, phase, together, kernel_set, steps=3, hook=False):
    param = text_format.Parse(NET.format(**CASES[case]), caffe_pb2.NetParameter())
    rng.set_random_seed(5)
    original = batch_norm_chain.find
    if not together:
        batch_norm_chain.find = lambda net: ({}, {})
    previous = kernels.current_name() if hasattr(kernels, "current_name") else None
    try:
        kernels.use(kernel_set)
        net = Net(param, phase)
        if hook:
            net.before_forward(lambda i: None)
            net.before_backward(lambda i: None)
        r = numpy.random.RandomState(0)
        out = []
        for _ in range(steps):
            net.blobs["x"].data[...] = r.standard_normal(net.blobs["x"].shape)
            net.blobs["t"].data[...] = r.standard_normal(net.blobs["t"].shape)
            for p in net.learnable_params:
                p.diff[...] = 0.5      # accumulation shows
            net.forward()
            net.backward()
            out.append({name: (b.data.copy(), b.diff.copy()) for name, b in net.blobs.items()})
            out.append({f"{n}{k}": (p.data.copy(), p.diff.copy())
                        for n, ps in net.params.items() for k, p in enumerate(ps)})
    finally:
        batch_norm_chain.find = original
        kernels.use(previous or "cpu")
    return net, out


def assert_same(got, want):
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in g:
            for a, b in zip(g[name], w[name]):
                assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("kernel_set", ["cpu", "reference"])
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
@pytest.mark.parametrize("case", sorted(CASES))
def test_chains_give_the_layers_bits(case, phase, kernel_set):
    if kernel_set == "cpu":
        pytest.importorskip("numba")
    fused, got = run(case, phase, True, kernel_set)
    plain, want = run(case, phase, False, kernel_set)
    assert sorted(fused._chains_by_first) == [3, 7]
    assert [c.length for c in fused._chains_by_first.values()] == [3, 2]
    assert not plain._chains_by_first
    assert_same(got, want)


def test_hooks_and_partial_ranges_run_the_layers_one_by_one(monkeypatch):
    calls = []
    original = batch_norm_chain.BatchNormChain.forward

    def counting(self):
        calls.append(self.first)
        return original(self)
    monkeypatch.setattr(batch_norm_chain.BatchNormChain, "forward", counting)
    net, _ = run("plain", caffe_pb2.TRAIN, True, "reference", steps=1, hook=True)
    assert calls == []                # a pycaffe hook may look between the layers
    net, _ = run("plain", caffe_pb2.TRAIN, True, "reference", steps=1)
    calls.clear()
    net.forward(end="scale")          # stops inside the first chain
    assert calls == []
    net.forward(start="bn", end="relu")
    assert calls == [3]
    net.forward()
    assert calls == [3, 3, 7]


def test_blind_hooks_keep_the_backward_chain_and_see_every_layer(monkeypatch):
    """The engine's own hooks (gradient buckets, backward timer) read no blob: the chain runs
    backward as one and they still hear of every layer, in backward order."""
    calls = []
    original = batch_norm_chain.BatchNormChain.backward

    def counting(self):
        calls.append(self.last)
        return original(self)
    monkeypatch.setattr(batch_norm_chain.BatchNormChain, "backward", counting)
    net, _ = run("plain", caffe_pb2.TRAIN, True, "reference", steps=1)
    calls.clear()
    seen = []
    net.before_backward(lambda i: seen.append(("b", i)), sees_blobs=False)
    net.after_backward(lambda i: seen.append(("a", i)), sees_blobs=False)
    net.forward()
    net.backward()
    assert calls == [8, 5]
    assert seen == [(e, i) for i in range(len(net.layers) - 1, -1, -1) for e in "ba"]


def test_a_chain_needs_the_layers_in_place():
    text = NET.format(**CASES["plain"]).replace(
        'layer { name: "relu" type: "ReLU" bottom: "c" top: "c"',
        'layer { name: "relu" type: "ReLU" bottom: "c" top: "r"').replace(
        'bottom: "c" top: "d"', 'bottom: "r" top: "d"')
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    assert [c.length for c in net._chains_by_first.values()] == [2, 2]
