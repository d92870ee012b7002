"""Input checks of the layers (labels, indices) on the device path, run on NumPy.

On the CPU a bad label or index raises in the forward pass (Caffe's CHECK). On the device the
layer reads nothing: it records the check (``backend.defer_check``) and indexes safely, and the
error -- the same message, naming the layer -- is raised by ``backend.raise_deferred`` at the
next display, test or pycaffe forward. ``backend.count_host_reads()`` makes NumPy arrays take
the device path, so every such layer is checked here both ways, with the reads counted.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from gradient_check import blobs_of

f32 = numpy.float32
SCORES = numpy.random.RandomState(0).standard_normal((4, 3)).astype(f32)

#: (layer text, bottoms, message); the bad value is always the item at index 2.
CASES = {
    "SoftmaxWithLoss": ('type: "SoftmaxWithLoss"', [SCORES, f32([0, 1, 3, 2])], "label value 3"),
    "SoftmaxWithLoss_ignore": ('type: "SoftmaxWithLoss" loss_param { ignore_label: 3 }',
                               [SCORES, f32([3, 1, -1, 2])], "label value -1"),
    "Accuracy": ('type: "Accuracy"', [SCORES, f32([0, 1, 7, 2])], "label value 7"),
    "HingeLoss": ('type: "HingeLoss"', [SCORES, f32([0, 1, 3, 2])], "label value 3"),
    "InfogainLoss": ('type: "InfogainLoss"', [SCORES, f32([0, 1, 3, 2]), numpy.eye(3, dtype=f32)],
                     "label value 3"),
    "MultinomialLogisticLoss": ('type: "MultinomialLogisticLoss"',
                                [numpy.abs(SCORES), f32([0, 1, 3, 2])], "label value 3"),
    "BatchReindex": ('type: "BatchReindex"', [SCORES, f32([0, 1, 4])], "reindex index 4"),
    "Embed": ('type: "Embed" embed_param { num_output: 2 input_dim: 3 }', [f32([0, 1, 5])],
              "embedding index 5"),
    "Embed_fraction": ('type: "Embed" embed_param { num_output: 2 input_dim: 3 }',
                       [f32([0, 1, 1.5])], "non-integer input"),
}


def _layer(text, values):
    lp = text_format.Parse(f'name: "checked" {text}', caffe_pb2.LayerParameter())
    lp.bottom.extend(f"b{i}" for i in range(len(values)))
    lp.top.append("t")
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottoms, tops = blobs_of(values), [Blob()]
    layer.setup(bottoms, tops)
    layer.reshape(bottoms, tops)
    return layer, bottoms, tops


@pytest.mark.parametrize("name", sorted(CASES))
def test_cpu_raises_in_forward(name):
    text, values, message = CASES[name]
    layer, bottoms, tops = _layer(text, values)
    with pytest.raises(CaffeError, match=f"checked.*{message}"):
        layer.forward(bottoms, tops)
    assert backend.pending_checks() == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_defers_to_one_read(name):
    backend.discard_deferred()
    text, values, message = CASES[name]
    layer, bottoms, tops = _layer(text, values)
    with backend.count_host_reads() as reads:
        layer.forward(bottoms, tops)          # twice: the checks of one layer merge
        layer.forward(bottoms, tops)
        assert reads.count == 0
        assert backend.pending_checks() >= 1
        with pytest.raises(CaffeError, match=f"checked.*{message}"):
            backend.raise_deferred()
        assert reads.count == 2               # the flags, then the bad value
    assert backend.pending_checks() == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_device_good_inputs_read_once_and_match_the_cpu(name):
    backend.discard_deferred()
    text, values, _ = CASES[name]
    good = [v.copy() for v in values]
    if name != "Embed_fraction":
        good[1 if len(good) > 1 else 0][2] = 1
    else:
        good[0][2] = 2
    layer, bottoms, tops = _layer(text, good)
    layer.forward(bottoms, tops)
    expected = tops[0].data.copy()
    layer, bottoms, tops = _layer(text, good)
    with backend.count_host_reads() as reads:
        layer.forward(bottoms, tops)
        backend.raise_deferred()
        assert reads.count == 1
    numpy.testing.assert_array_equal(tops[0].data, expected)
