"""Real-world weights: every .caffemodel in ../shared/realworld loads into its net by layer name
and computes BVLC Caffe's forward outputs.

For each ``reference/forward/*.npz`` (Caffe master, CPU, float32), the exact text Caffe ran
(stored in the npz) is built in TEST phase, the caffemodel copied in, the stored inputs fed, and
every stored blob compared elementwise with the README's tolerance
``|value - ref| <= 1e-5 * max|ref| + 1e-4 * |ref|``. The loaded parameters must have the sums
the manifest records, and the caffemodel layers Caffe ignored must be the ones the engine
ignores. Also: the same weights in the legacy V1 binary format load identically; the HDF5
snapshot (``.caffemodel.h5``) loads through ``io.hdf5_weights``; and the deliberately
mismatched cifar100 deploy net is refused with Caffe's message (layer and both shapes).
"""
import json
import logging
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.io.hdf5_weights import save_hdf5_weights
from caffe_engine.io.upgrade import V1_TYPE_NAMES, upgrade_net
from caffe_engine.layers import layer_type_list
from caffe_engine.log import LOGGER_NAME
from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REALWORLD = SHARED / "realworld"
REF = REALWORLD / "reference"

RTOL = 1e-4
ATOL_OF_MAX = 1e-5


def manifest():
    with open(REF / "manifest.json") as f:
        return json.load(f)


FORWARD = manifest()["forward"]
NEGATIVE_LOAD = [n for n in manifest()["negative"] if n["what"].startswith("load weights")]


def load_npz(entry):
    with numpy.load(REF / entry["file"]) as z:
        return {k: z[k] for k in z.files}


def net_from_text(text, where="<forward prototxt>"):
    param = text_format.Parse(text, caffe_pb2.NetParameter())
    upgrade_net(param, where)
    return Net(param, caffe_pb2.TEST)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def copy_weights_logged(net, path):
    """``net.copy_from(path)``, returning the engine's log messages."""
    logger = logging.getLogger(LOGGER_NAME)
    handler, level = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        net.copy_from(str(path))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.messages


def assert_close(name, value, ref):
    value = numpy.asarray(value, numpy.float64).reshape(ref.shape)
    ref = ref.astype(numpy.float64)
    scale = float(numpy.abs(ref).max()) if ref.size else 0.0
    bound = ATOL_OF_MAX * scale + RTOL * numpy.abs(ref)
    err = numpy.abs(value - ref)
    if not (err <= bound).all():
        i = numpy.unravel_index(int(numpy.argmax(err - bound)), ref.shape) if ref.shape else ()
        raise AssertionError(f"blob {name}: max excess {float((err - bound).max()):.3g} at {i}: "
                             f"engine {value[i]!r} vs Caffe {ref[i]!r}")


def forward_param(entry):
    text = str(load_npz(entry)["prototxt"])
    types = {lp.type for lp in text_format.Parse(text, caffe_pb2.NetParameter()).layer}
    missing = sorted(types - set(layer_type_list()))
    marks = [pytest.mark.xfail(strict=True, reason=f"layer type(s) {', '.join(missing)} not "
                               "implemented yet")] if missing else []
    return pytest.param(entry, id=Path(entry["file"]).name[:-len(".TEST.npz")], marks=marks)


def run_forward(entry, weights=None):
    arrays = load_npz(entry)
    net = net_from_text(str(arrays["prototxt"]))
    messages = copy_weights_logged(net, weights or REALWORLD / entry["weights"])
    for key, value in arrays.items():
        if key.startswith("input/"):
            blob = net.blobs[key[len("input/"):]]
            blob.data[...] = backend.get_array_module(blob.data).asarray(value)
    net.forward_loss()
    return net, arrays, messages


@pytest.mark.parametrize("entry", [forward_param(e) for e in FORWARD])
def test_caffemodel_forward_matches_caffe(entry):
    net, arrays, messages = run_forward(entry)
    # The parameters Caffe loaded, by sum and absolute sum.
    for p in entry["params"]:
        data = backend.to_numpy(net.params[p["layer"]][p["index"]].data).astype(numpy.float64)
        assert list(data.shape) == p["shape"], (p["layer"], p["index"])
        assert data.sum() == pytest.approx(p["sum"], rel=1e-6, abs=1e-6 * p["abs_sum"])
        assert numpy.abs(data).sum() == pytest.approx(p["abs_sum"], rel=1e-6)
    ignored = [m[len("Ignoring source layer "):] for m in messages
               if m.startswith("Ignoring source layer ")]
    assert ignored == entry["weights_layers_ignored_by_caffe"]
    blob_keys = [k for k in arrays if k.startswith("blob/")]
    assert blob_keys, "reference stores no blobs"
    for key in blob_keys:
        name = key[len("blob/"):]
        assert name in net.blobs, f"engine has no blob {name}"
        assert_close(name, backend.to_numpy(net.blobs[name].data), arrays[key])


def to_v1(param):
    """``param`` rewritten in the legacy V1 ``layers`` syntax (as pre-2015 caffemodels are)."""
    enum = {name: number for number, name in V1_TYPE_NAMES.items()}
    out = caffe_pb2.NetParameter(name=param.name)
    for lp in param.layer:
        v1 = out.layers.add(name=lp.name, type=enum[lp.type])
        v1.bottom.extend(lp.bottom)
        v1.top.extend(lp.top)
        for bp in lp.blobs:
            v1.blobs.add().CopyFrom(bp)
    return out


def test_legacy_v1_caffemodel_loads_like_the_new_one(tmp_path):
    entry = next(e for e in FORWARD if e["weights"].endswith("lenet_iter_10000.caffemodel"))
    model = pio.read_binary(str(REALWORLD / entry["weights"]), caffe_pb2.NetParameter())
    legacy = tmp_path / "lenet_v1.caffemodel"
    pio.write_binary(str(legacy), to_v1(model))
    net, arrays, _ = run_forward(entry, weights=legacy)
    for key in arrays:
        if key.startswith("blob/"):
            assert_close(key[5:], backend.to_numpy(net.blobs[key[5:]].data), arrays[key])


@pytest.mark.parametrize("case", NEGATIVE_LOAD, ids=[n["net_file"] for n in NEGATIVE_LOAD])
def test_mismatched_deploy_net_refuses_the_weights(case):
    net = Net(str(REALWORLD / case["net_file"]), caffe_pb2.TEST)
    with pytest.raises(CaffeError) as info:
        net.copy_from(str(REALWORLD / case["weights"]))
    message = str(info.value)
    assert "\n" not in message
    caffe_says = case["caffe_error"]["message"]
    # "Cannot copy param 0 weights from layer 'ip2'; shape mismatch.  Source param shape is
    # 20 64 (1280); target param shape is 100 64 (6400). ..."
    assert caffe_says.startswith("Cannot copy param 0 weights from layer 'ip2'; shape mismatch.")
    assert "Cannot copy param 0 weights from layer 'ip2'; shape mismatch." in message
    assert "Source param shape is 20 64 (1280)" in message
    assert "target param shape is 100 64 (6400)" in message


# ------------------------------------------------------------------------------------------------
# HDF5 weights
# ------------------------------------------------------------------------------------------------
H5_MODEL = (REALWORLD / "leetonfreestyle__DMSH/examples/cifar10"
            / "cifar10_quick_iter_5000.caffemodel.h5")
H5_NET = (REF / "substituted"
          / "leetonfreestyle__DMSH__examples__cifar10__cifar10_quick_train_test.prototxt")
CIFAR_MEAN = REALWORLD / "leetonfreestyle__DMSH/examples/cifar10/mean.binaryproto"


def h5_datasets(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        for layer, group in f["data"].items():
            out[layer] = [group[str(k)][()] for k in range(len(group))]
    return out


def test_hdf5_caffemodel_loads_by_layer_name():
    net = Net(str(H5_NET), caffe_pb2.TEST)
    copied = net.load_hdf5(H5_MODEL)
    stored = h5_datasets(H5_MODEL)
    assert copied == [name for name in stored if name in net.layer_names]
    assert sorted(name for name in stored if stored[name]) == sorted(net.params)
    for name, arrays in stored.items():
        for blob, array in zip(net.params.get(name, []), arrays):
            numpy.testing.assert_array_equal(backend.to_numpy(blob.data), array)
    # The trained CIFAR-10 quick net on mean-subtracted random pixels: a finite loss and
    # probabilities that are not uniform (the weights did arrive).
    from caffe_engine.io.blobproto import read_blobproto
    rs = numpy.random.RandomState(0)
    mean = numpy.asarray(read_blobproto(CIFAR_MEAN), numpy.float32).reshape(1, 3, 32, 32)
    net.blobs["data"].data[...] = rs.randint(0, 256, (2, 3, 32, 32)).astype(numpy.float32) - mean
    net.blobs["label"].data[...] = rs.randint(0, 10, 2)
    loss = net.forward_loss()
    assert numpy.isfinite(loss) and loss > 0
    ip2 = backend.to_numpy(net.blobs["ip2"].data)
    assert numpy.abs(ip2).max() > 1


def test_hdf5_weights_round_trip_and_shape_mismatch(tmp_path):
    net = Net(str(H5_NET), caffe_pb2.TEST)
    net.load_hdf5(H5_MODEL)
    out = tmp_path / "copy.caffemodel.h5"
    save_hdf5_weights(net, out)
    again = Net(str(H5_NET), caffe_pb2.TEST)
    again.load_hdf5(out)
    for name, blobs in net.params.items():
        for a, b in zip(blobs, again.params[name]):
            numpy.testing.assert_array_equal(backend.to_numpy(a.data), backend.to_numpy(b.data))
    text = H5_NET.read_text().replace("num_output: 64\n", "num_output: 65\n", 1)
    wider = tmp_path / "wider.prototxt"
    wider.write_text(text)
    with pytest.raises(CaffeError) as info:
        Net(str(wider), caffe_pb2.TEST).load_hdf5(H5_MODEL)
    message = str(info.value)
    assert "\n" not in message and "'conv3'" in message
    assert "32 5 5 (51200)" in message and "65 32 5 5 (52000)" in message
    with pytest.raises(CaffeError, match="Couldn't open"):
        net.load_hdf5(tmp_path / "absent.caffemodel.h5")


def test_net_copy_from_dispatches_hdf5():
    # Caffe's CopyTrainedLayersFrom reads a path ending in ".h5" as HDF5 weights.
    net = Net(str(H5_NET), caffe_pb2.TEST, weights=str(H5_MODEL))
    numpy.testing.assert_array_equal(backend.to_numpy(net.params["conv1"][0].data),
                                     h5_datasets(H5_MODEL)["conv1"][0])
