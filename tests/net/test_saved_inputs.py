"""An in-place Scale right after its BatchNorm reads the BatchNorm's x_norm instead of keeping a
copy of its input (caffe_engine/graph.py ``share_saved_inputs``): the same blobs and gradients,
bit for bit, as with Caffe's copy, in TRAIN and TEST, in place and not."""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import Net, graph, rng
from caffe_engine.proto import caffe_pb2

NET = """
force_backward: true
layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 3 dim: 2 dim: 5 dim: 6 }} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "x" top: "c"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
layer {{ name: "bn" type: "BatchNorm" bottom: "c" top: "{bn_top}" }}
layer {{ name: "scale" type: "Scale" bottom: "{bn_top}" top: "{bn_top}"
  scale_param {{ bias_term: true filler {{ type: "uniform" min: 0.5 max: 2 }} bias_filler {{ type: "uniform" }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "{bn_top}" top: "{bn_top}" }}
layer {{ name: "ip" type: "InnerProduct" bottom: "{bn_top}" top: "y"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }}
layer {{ name: "t" type: "Input" top: "t" input_param {{ shape {{ dim: 3 dim: 3 }} }} }}
"""


def run(phase, bn_top, share):
    text = NET.format(bn_top=bn_top)
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    # the target input before the loss, as Caffe requires its bottoms to exist
    layers = list(param.layer)
    param.ClearField("layer")
    param.layer.extend([layers[0], layers[-1]] + layers[1:-1])
    rng.set_random_seed(5)
    original = graph.share_saved_inputs
    if not share:
        graph.share_saved_inputs = lambda net: None
    try:
        net = Net(param, phase)
    finally:
        graph.share_saved_inputs = original
    r = numpy.random.RandomState(0)
    out = []
    for _ in range(3):
        net.blobs["x"].data[...] = r.standard_normal(net.blobs["x"].shape)
        net.blobs["t"].data[...] = r.standard_normal(net.blobs["t"].shape)
        net.forward()
        net.backward()
        out.append({name: (b.data.copy(), b.diff.copy()) for name, b in net.blobs.items()})
        out.append({f"{n}{k}": (p.data.copy(), p.diff.copy())
                    for n, ps in net.params.items() for k, p in enumerate(ps)})
    return net, out


@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
@pytest.mark.parametrize("bn_top", ["c", "b"])
def test_scale_after_batchnorm_reads_x_norm_with_the_same_results(phase, bn_top):
    shared, got = run(phase, bn_top, True)
    plain, want = run(phase, bn_top, False)
    scale = shared.layers[shared.layer_names.index("scale")]
    assert scale.input_source is not None and scale.temp is None
    assert plain.layers[plain.layer_names.index("scale")].temp is not None
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for name in g:
            for a, b in zip(g[name], w[name]):
                assert a.tobytes() == b.tobytes(), name


def test_a_scale_not_right_after_its_batchnorm_keeps_its_copy():
    text = NET.format(bn_top="b").replace(
        'layer { name: "scale"', 'layer { name: "mid" type: "ReLU" bottom: "b" top: "b" }\n'
        'layer { name: "scale"')
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    layers = list(param.layer)
    param.ClearField("layer")
    param.layer.extend([layers[0], layers[-1]] + layers[1:-1])
    net = Net(param, caffe_pb2.TRAIN)
    scale = net.layers[net.layer_names.index("scale")]
    assert scale.input_source is None and scale.temp is not None
