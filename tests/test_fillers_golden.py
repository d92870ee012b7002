"""Fillers against real Caffe: every ``kind: filler`` case of the layer fixtures, bit for bit.

Each case is a net Caffe built right after ``caffe.set_random_seed(caffe_seed)``; the ``.npz``
holds the parameter blobs its fillers produced (shared/caffe_reference/layers/README.md,
"Filler cases"). We build the same prototxt with ``caffe_engine.Net`` after
``set_random_seed(caffe_seed)`` and compare every blob byte for byte (so -0.0 and 0.0 differ).
"""
import numpy
import pytest
from google.protobuf import text_format

import caffe_engine
from caffe_engine import fillers, rng
from caffe_engine.blob import Blob
from caffe_engine.errors import CaffeError
from caffe_engine.proto import caffe_pb2

import golden

f32 = numpy.float32
FILLER_CASES = [c for c in golden.manifest()["cases"] if c["kind"] == "filler"]


@pytest.mark.parametrize("case", FILLER_CASES, ids=[c["id"] for c in FILLER_CASES])
def test_filler_case_bit_exact(case):
    with numpy.load(golden.LAYER_REF / case["file"]) as z:
        arrays = {k: z[k] for k in z.files}
    net_param = text_format.Parse(str(arrays["prototxt"]), caffe_pb2.NetParameter())
    phase = caffe_engine.TRAIN if net_param.state.phase == caffe_pb2.TRAIN else caffe_engine.TEST
    caffe_engine.set_random_seed(case["caffe_seed"])
    net = caffe_engine.Net(net_param, phase)
    stored = sorted(k for k in arrays if k.startswith("param/"))
    assert stored
    engine_keys = sorted(f"param/{name}/{i}" for name, blobs in net.params.items()
                         for i in range(len(blobs)))
    assert engine_keys == stored
    for key in stored:
        _, layer, i = key.split("/")
        got = numpy.asarray(net.params[layer][int(i)].data)
        ref = arrays[key]
        assert got.dtype == ref.dtype == f32 and got.shape == ref.shape, key
        assert (got == ref).all(), f"{key}: {(got != ref).sum()} of {ref.size} values differ"
        assert got.tobytes() == ref.tobytes(), f"{key}: equal values, different bits (signed zeros)"


# ------------------------------------------------------------------------------------------------
# Behaviour the fixtures do not pin down
# ------------------------------------------------------------------------------------------------
def filler(text):
    return text_format.Parse(text, caffe_pb2.FillerParameter())


def filled(shape, text, seed=5):
    blob = Blob(shape)
    stream = rng.CaffeRNG(seed)
    fillers.fill(blob, filler(text), stream)
    return numpy.asarray(blob.data), stream


@pytest.mark.parametrize("text", ['type: "constant" value: 2', 'type: "bilinear"'])
def test_deterministic_fillers_draw_nothing(text):
    _, stream = filled((2, 1, 4, 4), text)
    assert stream.word() == rng.CaffeRNG(5).word()


def test_uniform_and_xavier_take_one_word_per_value():
    for text in ('type: "uniform" min: -1 max: 1', 'type: "xavier"', 'type: "positive_unitball"'):
        _, stream = filled((3, 10), text)
        assert stream.word() == int(rng.CaffeRNG(5).words(31)[30]), text


def test_positive_unitball_sums_rows_left_to_right():
    values, _ = filled((3, 1000), 'type: "positive_unitball"')
    raw = rng.CaffeRNG(5).uniform(3000, 0, 1).reshape(3, 1000)
    for row, raw_row in zip(values, raw):
        total = f32(0)
        for v in raw_row:
            total = f32(total + v)
        assert (row == raw_row / total).all()


def test_sparse_gaussian_masks_after_all_gaussians():
    values, stream = filled((6, 20), 'type: "gaussian" std: 2 sparse: 2')
    reference = rng.CaffeRNG(5)
    gauss = reference.gaussian(120, 0, 2)
    mask = reference.bernoulli(120, f32(2) / f32(6), dtype=numpy.float32)
    expected = (gauss * mask.astype(f32)).reshape(6, 20)
    assert values.tobytes() == expected.tobytes()
    assert stream.word() == reference.word()
    assert numpy.signbit(values[(mask.reshape(6, 20) == 0) & (gauss.reshape(6, 20) < 0)]).all()


def test_msra_and_xavier_scale_from_variance_norm():
    # (4, 3, 2, 2): fan_in 12, fan_out 16, average 14.
    for norm, n in (("FAN_IN", 12), ("FAN_OUT", 16), ("AVERAGE", 14)):
        values, _ = filled((4, 3, 2, 2), f'type: "msra" variance_norm: {norm}')
        std = f32(numpy.sqrt(f32(2) / f32(n)))
        expected = rng.CaffeRNG(5).gaussian(48, 0, std).reshape(4, 3, 2, 2)
        assert values.tobytes() == expected.tobytes(), norm


@pytest.mark.parametrize("shape,text", [
    ((2, 3), 'type: "gaussian" std: 0'),
    ((2, 3), 'type: "gaussian" sparse: -2'),
    ((2, 3), 'type: "gaussian" sparse: 3'),
    ((2, 3), 'type: "uniform" min: 1 max: 0'),
    ((2, 3), 'type: "xavier" sparse: 1'),
    ((2, 3), 'type: "constant" sparse: 1'),
    ((2, 3), 'type: "msra" sparse: 0'),
    ((2, 3), 'type: "bilinear"'),
    ((1, 1, 3, 4), 'type: "bilinear"'),
    ((2, 3), 'type: "no_such_filler"'),
])
def test_bad_filler_parameters_raise(shape, text):
    with pytest.raises(CaffeError):
        filled(shape, text)
