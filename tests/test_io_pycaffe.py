"""pycaffe's surface on the engine: caffe.io (Transformer, images, protobuf conversions), the
Net methods and properties pycaffe scripts use, and the top-level names.

Oracles: the formulas of pycaffe's documentation (the Transformer's order of steps, the
conversions' shapes and dtypes), Pillow's own bilinear resize, NumPy, and nets whose outputs are
worked out by hand.
"""

import numpy
import pytest
from PIL import Image

import caffe_engine as caffe
from caffe_engine.errors import CaffeError
from caffe_engine.proto import caffe_pb2

from golden import SHARED

LENET = SHARED / "realworld" / "HorizonRobotics-Platform__ModelZoo" / "Lenet"


# ---------------------------------------------------------------------------------------------
# caffe.io.Transformer
# ---------------------------------------------------------------------------------------------
def make_transformer():
    t = caffe.io.Transformer({"data": (2, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", numpy.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_transformer_applies_pycaffes_steps_in_order():
    t = make_transformer()
    image = numpy.random.RandomState(0).rand(4, 5, 3).astype(numpy.float32)
    kept = image.copy()
    out = t.preprocess("data", image)
    # transpose -> channel swap -> * raw_scale -> - mean -> * input_scale
    expected = (image.transpose(2, 0, 1)[::-1] * 255.0 - numpy.array([10.0, 20.0, 30.0])[:, None, None]) * 0.5
    assert out.shape == (3, 4, 5) and out.dtype == numpy.float32
    numpy.testing.assert_allclose(out, expected, rtol=1e-6)
    numpy.testing.assert_array_equal(image, kept)          # the caller's array is untouched
    numpy.testing.assert_allclose(t.deprocess("data", out), image, atol=1e-6)


def test_transformer_resizes_and_takes_mean_images():
    t = caffe.io.Transformer({"data": (1, 1, 6, 8)})
    t.set_transpose("data", (2, 0, 1))
    mean = numpy.arange(48, dtype=numpy.float32).reshape(1, 6, 8)
    t.set_mean("data", mean)
    image = numpy.full((3, 4, 1), 0.5, numpy.float32)      # resized to 6 x 8 (a constant stays)
    numpy.testing.assert_allclose(t.preprocess("data", image), 0.5 - mean)
    t.set_mean("data", mean[0])                            # (H, W) is taken as (1, H, W)
    numpy.testing.assert_allclose(t.preprocess("data", image), 0.5 - mean)


def test_transformer_errors():
    t = caffe.io.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(CaffeError, match="not one of the net inputs"):
        t.set_raw_scale("label", 2)
    with pytest.raises(CaffeError, match="Transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(CaffeError, match="Channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(CaffeError, match="Mean channels"):
        t.set_mean("data", numpy.zeros(4))
    with pytest.raises(CaffeError, match="Mean shape incompatible"):
        t.set_mean("data", numpy.zeros((3, 5, 5)))
    with pytest.raises(CaffeError, match="not one of the net inputs"):
        t.preprocess("nope", numpy.zeros((4, 5, 3)))


# ---------------------------------------------------------------------------------------------
# Images
# ---------------------------------------------------------------------------------------------
def test_load_image_colour_grey_alpha_and_16_bit(tmp_path):
    rs = numpy.random.RandomState(1)
    rgb = rs.randint(0, 256, (5, 7, 3)).astype(numpy.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    img = caffe.io.load_image(str(tmp_path / "rgb.png"))
    assert img.shape == (5, 7, 3) and img.dtype == numpy.float32
    numpy.testing.assert_allclose(img, rgb / 255.0, rtol=1e-6)
    # pycaffe: color=False only affects grey files; a colour file stays colour.
    assert caffe.io.load_image(str(tmp_path / "rgb.png"), color=False).shape == (5, 7, 3)

    grey = rs.randint(0, 256, (5, 7)).astype(numpy.uint8)
    Image.fromarray(grey).save(tmp_path / "grey.png")
    as_colour = caffe.io.load_image(str(tmp_path / "grey.png"))
    as_grey = caffe.io.load_image(str(tmp_path / "grey.png"), color=False)
    assert as_colour.shape == (5, 7, 3) and as_grey.shape == (5, 7, 1)
    numpy.testing.assert_allclose(as_grey[:, :, 0], grey / 255.0, rtol=1e-6)
    numpy.testing.assert_array_equal(as_colour, numpy.repeat(as_grey, 3, axis=2))

    rgba = numpy.dstack([rgb, numpy.full((5, 7), 9, numpy.uint8)])
    Image.fromarray(rgba, "RGBA").save(tmp_path / "rgba.png")
    numpy.testing.assert_allclose(caffe.io.load_image(str(tmp_path / "rgba.png")), rgb / 255.0, rtol=1e-6)

    deep = (numpy.arange(35, dtype=numpy.uint16).reshape(5, 7) * 1800)
    Image.fromarray(deep).save(tmp_path / "deep.png")
    numpy.testing.assert_allclose(caffe.io.load_image(str(tmp_path / "deep.png"), color=False)[:, :, 0],
                                  deep / 65535.0, rtol=1e-6)
    with pytest.raises(CaffeError, match="cannot load image"):
        caffe.io.load_image(str(tmp_path / "missing.png"))


def test_resize_image_matches_pillows_bilinear_upsampling():
    rs = numpy.random.RandomState(2)
    image = rs.rand(6, 9).astype(numpy.float32)
    ours = caffe.io.resize_image(image[:, :, None], (13, 20))
    pillow = numpy.asarray(Image.fromarray(image, "F").resize((20, 13), Image.BILINEAR))
    assert ours.shape == (13, 20, 1) and ours.dtype == numpy.float32
    numpy.testing.assert_allclose(ours[:, :, 0], pillow, atol=1e-5)
    # Any number of channels, each resized alike.
    stack = numpy.dstack([image, 2 * image])
    both = caffe.io.resize_image(stack, (13, 20))
    numpy.testing.assert_allclose(both[:, :, 1], 2 * both[:, :, 0], rtol=1e-6)
    # Nearest neighbour by an integer factor repeats pixels.
    near = caffe.io.resize_image(image[:, :, None], (12, 18), interp_order=0)
    numpy.testing.assert_array_equal(near[::2, ::2, 0], image)
    numpy.testing.assert_array_equal(caffe.io.resize_image(image[:, :, None], (6, 9))[:, :, 0], image)
    with pytest.raises(CaffeError, match="positive"):
        caffe.io.resize_image(image[:, :, None], (0, 3))


def test_oversample_crops_corners_centre_and_mirrors():
    image = numpy.arange(6 * 8 * 2, dtype=numpy.float32).reshape(6, 8, 2)
    crops = caffe.io.oversample([image, image + 1000], (4, 4))
    assert crops.shape == (20, 4, 4, 2)
    corners = [image[:4, :4], image[:4, 4:], image[2:, :4], image[2:, 4:], image[1:5, 2:6]]
    for k, crop in enumerate(corners):
        numpy.testing.assert_array_equal(crops[k], crop)
        numpy.testing.assert_array_equal(crops[5 + k], crop[:, ::-1])
    numpy.testing.assert_array_equal(crops[10], image[:4, :4] + 1000)


# ---------------------------------------------------------------------------------------------
# Protobuf conversions
# ---------------------------------------------------------------------------------------------
def test_blobproto_conversions():
    array = numpy.random.RandomState(3).rand(2, 3, 4).astype(numpy.float32)
    proto = caffe.io.array_to_blobproto(array, diff=-array)
    assert list(proto.shape.dim) == [2, 3, 4] and not proto.HasField("num")
    back = caffe.io.blobproto_to_array(proto)
    assert back.dtype == numpy.float64
    numpy.testing.assert_array_equal(back, array)
    numpy.testing.assert_array_equal(caffe.io.blobproto_to_array(proto, return_diff=True), -array)
    legacy = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3, data=[1, 2, 3, 4, 5, 6])
    assert caffe.io.blobproto_to_array(legacy).shape == (1, 2, 1, 3)
    arrays = [array, numpy.ones((5,), numpy.float32)]
    data = caffe.io.arraylist_to_blobprotovector_str(arrays)
    assert isinstance(data, bytes)
    for mine, theirs in zip(caffe.io.blobprotovector_str_to_arraylist(data), arrays):
        numpy.testing.assert_array_equal(mine, theirs)
    assert caffe.io.arraylist_to_blobprotovecor_str is caffe.io.arraylist_to_blobprotovector_str
    # A mean file as Caffe writes it reads back through the same function.
    mean = caffe_pb2.BlobProto()
    mean.ParseFromString((SHARED / "data/synthetic_cifar/mean.binaryproto").read_bytes())
    assert caffe.io.blobproto_to_array(mean).shape == (1, 3, 32, 32)


def test_datum_conversions(tmp_path):
    pixels = numpy.arange(24, dtype=numpy.uint8).reshape(2, 3, 4)
    datum = caffe.io.array_to_datum(pixels, label=7)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 7)
    assert datum.data == pixels.tobytes() and not len(datum.float_data)
    back = caffe.io.datum_to_array(datum)
    assert back.dtype == numpy.uint8
    numpy.testing.assert_array_equal(back, pixels)
    floats = caffe.io.array_to_datum(pixels.astype(numpy.float32) / 2)
    assert not floats.HasField("label") and not floats.data
    assert caffe.io.datum_to_array(floats).dtype == numpy.float64
    numpy.testing.assert_array_equal(caffe.io.datum_to_array(floats), pixels / 2)
    with pytest.raises(CaffeError, match="Incorrect array shape"):
        caffe.io.array_to_datum(numpy.zeros((3, 4)))
    # An encoded record (as convert_imageset --encoded writes) decodes to BGR pixels.
    rgb = numpy.random.RandomState(4).randint(0, 256, (3, 4, 3)).astype(numpy.uint8)
    Image.fromarray(rgb).save(tmp_path / "x.png")
    encoded = caffe_pb2.Datum(data=(tmp_path / "x.png").read_bytes(), encoded=True, label=2)
    plain = caffe.io.decode_datum(encoded)
    assert plain.label == 2 and not plain.encoded
    numpy.testing.assert_array_equal(caffe.io.datum_to_array(plain), rgb[:, :, ::-1].transpose(2, 0, 1))
    # A real record of the MNIST LMDB.
    from caffe_engine.io.lmdb_source import LMDBCursor
    with LMDBCursor(SHARED / "data/mnist_5k/mnist_test_lmdb") as cursor:
        record = caffe_pb2.Datum.FromString(cursor.value())
    assert caffe.io.datum_to_array(record).shape == (1, 28, 28)


# ---------------------------------------------------------------------------------------------
# Net: pycaffe's methods and properties
# ---------------------------------------------------------------------------------------------
REGRESSION = """name: "r"
force_backward: true
layer { name: "in" type: "Input" top: "x" top: "y"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 }
                              bias_filler { type: "constant" value: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "y" top: "loss" loss_weight: 2 }
"""

SCORER = """name: "s"
force_backward: true
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 3 dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "out" type: "Scale" bottom: "ip" top: "out"
        scale_param { filler { type: "constant" value: 3 } } }
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_net_forward_backward_return_pycaffes_blobs(tmp_path):
    net = caffe.Net(write(tmp_path, "r.prototxt", REGRESSION), caffe.TRAIN)
    x = numpy.random.RandomState(5).randn(4, 3).astype(numpy.float32)
    y = numpy.zeros((4, 2), numpy.float32)
    out = net.forward(x=x, y=y)
    assert set(out) == {"loss"}
    w, b = (p.data for p in net.params["ip"])
    ip = x @ w.T + b
    numpy.testing.assert_allclose(out["loss"], ((ip - y) ** 2).sum() / 4 / 2, rtol=1e-5)
    # blobs= adds blobs; end= returns that layer's tops.
    assert set(net.forward(blobs=["ip"], x=x, y=y)) == {"loss", "ip"}
    assert set(net.forward(end="ip", x=x, y=y)) == {"ip"}
    # backward: the inputs' diffs, or with end= that layer's bottoms' diffs.
    diffs = net.backward()
    assert set(diffs) == {"x", "y"}
    numpy.testing.assert_allclose(diffs["x"], 2 * ((ip - y) / 4) @ w, rtol=1e-4, atol=1e-6)
    assert set(net.backward(end="ip")) == {"x"}
    assert set(net.backward(diffs=["ip"])) == {"x", "y", "ip"}
    with pytest.raises(CaffeError, match="do not match net inputs"):
        net.forward(x=x)
    with pytest.raises(CaffeError, match="not batch sized"):
        net.forward(x=x[:2], y=y[:2])
    with pytest.raises(CaffeError, match="unknown layer"):
        net.forward(end="nope")


def test_backward_with_top_diffs_and_forward_backward_all(tmp_path):
    net = caffe.Net(write(tmp_path, "s.prototxt", SCORER), caffe.TEST)
    rs = numpy.random.RandomState(6)
    x = rs.randn(7, 4).astype(numpy.float32)     # 7 items, batch 3: batches 3 + 3 + 1 (padded)
    w = net.params["ip"][0].data
    expected = 3 * numpy.maximum(x @ w.T, 0)
    out = net.forward_all(x=x)
    assert out["out"].shape == (7, 2)
    numpy.testing.assert_allclose(out["out"], expected, rtol=1e-5, atol=1e-6)
    both = net.forward_all(x=x, blobs=["ip"])
    assert set(both) == {"out", "ip"} and both["ip"].shape == (7, 2)
    # forward_backward_all: top diffs for the output, input diffs back.
    top = rs.randn(7, 2).astype(numpy.float32)
    blobs, diffs = net.forward_backward_all(x=x, out=top)
    numpy.testing.assert_allclose(blobs["out"], expected, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(diffs["x"], (3 * top * (x @ w.T > 0)) @ w, rtol=1e-4, atol=1e-5)
    with pytest.raises(CaffeError, match="do not match net outputs"):
        net.backward(ip=top[:3])
    with pytest.raises(CaffeError, match="input arrays"):
        net.forward_all()


def test_net_properties(tmp_path):
    net = caffe.Net(write(tmp_path, "r.prototxt", REGRESSION), caffe.TRAIN)
    assert net.inputs == ["x", "y"] and net.outputs == ["loss"]
    assert list(net.blobs) == ["x", "y", "ip", "loss"] == net._blob_names
    assert net._layer_names == ["in", "ip", "loss"]
    assert net._inputs == [0, 1] and net._outputs == [3]
    assert dict(net.blob_loss_weights) == {"x": 0, "y": 0, "ip": 0, "loss": 2}
    assert list(net.blob_loss_weights) == ["x", "y", "ip", "loss"]
    assert net._blob_loss_weights == [0, 0, 0, 2]
    assert net.blob_loss_weights[3] == 2                      # index lookups keep working
    assert dict(net.top_names) == {"in": ["x", "y"], "ip": ["ip"], "loss": ["loss"]}
    assert dict(net.bottom_names) == {"in": [], "ip": ["x"], "loss": ["ip", "y"]}
    assert list(net.layer_dict) == ["in", "ip", "loss"] and net.layer_dict["ip"].type == "InnerProduct"
    assert [layer.type for layer in net.layers] == ["Input", "InnerProduct", "EuclideanLoss"]
    assert [b.shape for b in net.layers[1].blobs] == [(2, 3), (2,)]
    assert list(net.params) == ["ip"] and net.params["ip"][0].count == 6
    assert net._blobs[2] is net.blobs["ip"]
    net.forward(x=numpy.ones((4, 3), numpy.float32), y=numpy.ones((4, 2), numpy.float32))
    net.backward()
    assert numpy.abs(net.params["ip"][0].diff).sum() > 0
    net.clear_param_diffs()
    assert numpy.abs(net.params["ip"][0].diff).sum() == 0


def test_reshape_share_save_and_copy(tmp_path):
    path = write(tmp_path, "s.prototxt", SCORER)
    caffe.set_random_seed(3)
    net = caffe.Net(path, caffe.TEST)
    net.blobs["x"].reshape(5, 4)
    net.reshape()
    assert net.blobs["out"].shape == (5, 2)
    x = numpy.random.RandomState(7).randn(5, 4).astype(numpy.float32)
    first = net.forward(x=x)["out"].copy()
    # share_with: the other net views these params.
    caffe.set_random_seed(4)
    other = caffe.Net(path, caffe.TEST)
    other.share_with(net)
    assert other.params["ip"][0].data is net.params["ip"][0].data
    # save / Net(model, weights, phase) / Net(model, phase, weights=) / copy_from / HDF5.
    net.save(str(tmp_path / "w.caffemodel"))
    net.save_hdf5(str(tmp_path / "w.caffemodel.h5"))
    for loaded in (caffe.Net(path, str(tmp_path / "w.caffemodel"), caffe.TEST),
                   caffe.Net(path, caffe.TEST, weights=str(tmp_path / "w.caffemodel")),
                   caffe.Net(path, caffe.TEST, 0, None, str(tmp_path / "w.caffemodel")),   # pycaffe's order
                   caffe.Net(path, caffe.TEST, weights=str(tmp_path / "w.caffemodel.h5"))):
        loaded.blobs["x"].reshape(5, 4)
        loaded.reshape()
        numpy.testing.assert_array_equal(loaded.forward(x=x)["out"], first)
    fresh = caffe.Net(path, caffe.TEST)
    fresh.load_hdf5(str(tmp_path / "w.caffemodel.h5"))
    numpy.testing.assert_array_equal(fresh.params["ip"][0].data, net.params["ip"][0].data)


def test_real_caffemodel_through_the_pycaffe_surface():
    net = caffe.Net(str(LENET / "lenet_train_test.prototxt"), str(LENET / "lenet_iter_100000.caffemodel"),
                    caffe.TEST)
    ref = numpy.load(SHARED / "realworld/reference/forward/HorizonRobotics-Platform__ModelZoo__Lenet__"
                     "lenet_iter_100000.caffemodel__lenet_train_test.prototxt.TEST.npz")
    net.blobs["data"].reshape(*ref["input/data"].shape)
    net.reshape()
    out = net.forward(data=ref["input/data"], blobs=["ip1"])
    numpy.testing.assert_allclose(out["ip2"], ref["blob/ip2"], rtol=1e-4, atol=1e-4)
    numpy.testing.assert_allclose(out["ip1"], ref["blob/ip1"], rtol=1e-4, atol=1e-4)


def test_top_level_names():
    from caffe_engine import solvers
    for name in ("SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver", "AdaDeltaSolver",
                 "AdamSolver"):
        assert getattr(caffe, name) is getattr(solvers, name)
    for name in ("Net", "get_solver", "set_mode_cpu", "set_mode_gpu", "set_device", "set_random_seed",
                 "layer_type_list", "Layer", "Classifier", "NetSpec", "to_proto", "init_log", "log"):
        assert callable(getattr(caffe, name)), name
    assert (caffe.TRAIN, caffe.TEST) == (caffe_pb2.TRAIN, caffe_pb2.TEST)
    assert caffe.proto.caffe_pb2 is caffe_pb2
    assert "Convolution" in caffe.layer_type_list()
    assert caffe.io.Transformer and caffe.io.load_image and caffe.layers.Pooling


def test_solver_from_a_prototxt_path(tmp_path):
    write(tmp_path, "r.prototxt", REGRESSION)
    solver_path = write(tmp_path, "solver.prototxt",
                        f'net: "{tmp_path / "r.prototxt"}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
                        f'max_iter: 3\nsnapshot_after_train: false\ntype: "Adam"\n'
                        f'snapshot_prefix: "{tmp_path / "snap"}"\n')
    solver = caffe.get_solver(solver_path)
    assert isinstance(solver, caffe.AdamSolver)
    solver.net.blobs["x"].data[...] = 1
    solver.step(2)
    assert solver.iter == 2 and solver.test_nets == []
    solver.snapshot()
    again = caffe.AdamSolver(solver_path)
    again.restore(str(tmp_path / "snap_iter_2.solverstate"))
    assert again.iter == 2
    numpy.testing.assert_array_equal(again.net.params["ip"][0].data, solver.net.params["ip"][0].data)
    sgd = caffe.SGDSolver(solver_path)
    assert sgd.net.blobs["ip"].shape == (4, 2)


def test_backward_callbacks(tmp_path):
    net = caffe.Net(write(tmp_path, "s.prototxt", SCORER), caffe.TEST)
    seen = []
    net.before_backward(lambda i: seen.append(("before", net._layer_names[i])))
    net.after_backward(lambda i: seen.append(("after", net._layer_names[i])))
    net.forward(x=numpy.ones((3, 4), numpy.float32))
    net.backward()
    assert seen == [(when, name) for name in ("out", "relu", "ip", "in") for when in ("before", "after")]
