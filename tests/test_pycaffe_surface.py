"""pycaffe's surface beyond Net and the solvers, through ``import caffe`` (the tutorial flows are
tests/pycaffe_scripts/, run by tests/test_pycaffe_scripts.py): the import name, coord_map, draw,
Detector, the net and solver callbacks, solver_count/rank, NCCL, Timer, set_mode_gpu without a
GPU, and the CAFFE_ENGINE_NO_ALIAS switch.

Oracles: FCN-8s's published train.prototxt (the crop offsets Caffe's coord_map gave its
authors), Caffe's callback order (src/caffe/net.cpp ForwardFromTo / BackwardFromTo,
src/caffe/solver.cpp Step), Caffe's DataLayer::Skip rule, and direct forwards for Detector.
"""
import os
import subprocess
import sys

import numpy
import pytest
from PIL import Image

import caffe
from caffe import layers as L, params as P
from caffe.coord_map import coord_map_from_to, crop
from caffe.proto import caffe_pb2
from paths import ROOT, SHARED
from tiny_train import tiny_solver

FCN8S = SHARED / "realworld/shelhamer__fcn.berkeleyvision.org/voc-fcn8s/train.prototxt"
CIFAR_DEPLOY = SHARED / "realworld/yuvval__nn_ex1/examples/cifar10/cifar10_full.prototxt"
CIFAR_WEIGHTS = SHARED / "realworld/yuvval__nn_ex1/examples/cifar10/cifar10_full_iter_70000.caffemodel"


def test_import_caffe_is_the_engine():
    import caffe_engine
    assert caffe.Net is caffe_engine.Net and caffe.SGDSolver is caffe_engine.SGDSolver
    assert caffe.io is caffe_engine.io and caffe_pb2 is caffe_engine.proto.caffe_pb2
    assert caffe.layers is caffe_engine.net_spec.layers and caffe.Layer is caffe_engine.Layer
    assert caffe.TRAIN == caffe_pb2.TRAIN and caffe.TEST == caffe_pb2.TEST
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX
    import importlib
    classifier, detector, pycaffe = (importlib.import_module(f"caffe.{name}")
                                     for name in ("classifier", "detector", "pycaffe"))
    assert classifier.Classifier is caffe.Classifier is caffe_engine.Classifier
    assert detector.Detector is caffe.Detector and pycaffe.Net is caffe.Net


# -- coord_map: FCN-8s, as fcn.berkeleyvision.org's voc-fcn8s/net.py writes it ------------------
def _conv_relu(bottom, nout, ks=3, stride=1, pad=1):
    conv = L.Convolution(bottom, kernel_size=ks, stride=stride, num_output=nout, pad=pad)
    return conv, L.ReLU(conv, in_place=True)


def _max_pool(bottom):
    return L.Pooling(bottom, pool=P.Pooling.MAX, kernel_size=2, stride=2)


def fcn8s():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 500, 500]))
    n.conv1_1, n.relu1_1 = _conv_relu(n.data, 64, pad=100)
    n.conv1_2, n.relu1_2 = _conv_relu(n.relu1_1, 64)
    n.pool1 = _max_pool(n.relu1_2)
    n.conv2_1, n.relu2_1 = _conv_relu(n.pool1, 128)
    n.conv2_2, n.relu2_2 = _conv_relu(n.relu2_1, 128)
    n.pool2 = _max_pool(n.relu2_2)
    n.conv3_1, n.relu3_1 = _conv_relu(n.pool2, 256)
    n.conv3_2, n.relu3_2 = _conv_relu(n.relu3_1, 256)
    n.conv3_3, n.relu3_3 = _conv_relu(n.relu3_2, 256)
    n.pool3 = _max_pool(n.relu3_3)
    n.conv4_1, n.relu4_1 = _conv_relu(n.pool3, 512)
    n.conv4_2, n.relu4_2 = _conv_relu(n.relu4_1, 512)
    n.conv4_3, n.relu4_3 = _conv_relu(n.relu4_2, 512)
    n.pool4 = _max_pool(n.relu4_3)
    n.conv5_1, n.relu5_1 = _conv_relu(n.pool4, 512)
    n.conv5_2, n.relu5_2 = _conv_relu(n.relu5_1, 512)
    n.conv5_3, n.relu5_3 = _conv_relu(n.relu5_2, 512)
    n.pool5 = _max_pool(n.relu5_3)
    n.fc6, n.relu6 = _conv_relu(n.pool5, 4096, ks=7, pad=0)
    n.drop6 = L.Dropout(n.relu6, dropout_ratio=0.5, in_place=True)
    n.fc7, n.relu7 = _conv_relu(n.drop6, 4096, ks=1, pad=0)
    n.drop7 = L.Dropout(n.relu7, dropout_ratio=0.5, in_place=True)
    n.score_fr = L.Convolution(n.drop7, num_output=21, kernel_size=1, pad=0)
    up = dict(num_output=21, kernel_size=4, stride=2, bias_term=False)
    n.upscore2 = L.Deconvolution(n.score_fr, convolution_param=up, param=[dict(lr_mult=0)])
    n.score_pool4 = L.Convolution(n.pool4, num_output=21, kernel_size=1, pad=0)
    n.score_pool4c = crop(n.score_pool4, n.upscore2)
    n.fuse_pool4 = L.Eltwise(n.upscore2, n.score_pool4c, operation=P.Eltwise.SUM)
    n.upscore_pool4 = L.Deconvolution(n.fuse_pool4, convolution_param=up, param=[dict(lr_mult=0)])
    n.score_pool3 = L.Convolution(n.pool3, num_output=21, kernel_size=1, pad=0)
    n.score_pool3c = crop(n.score_pool3, n.upscore_pool4)
    n.fuse_pool3 = L.Eltwise(n.upscore_pool4, n.score_pool3c, operation=P.Eltwise.SUM)
    n.upscore8 = L.Deconvolution(n.fuse_pool3, param=[dict(lr_mult=0)], convolution_param=dict(
        num_output=21, kernel_size=16, stride=8, bias_term=False))
    n.score = crop(n.upscore8, n.data)
    return n


def _crops(net_param):
    return {layer.name: (layer.crop_param.axis, list(layer.crop_param.offset))
            for layer in net_param.layer if layer.type == "Crop"}


def test_coord_map_gives_fcn8s_published_crop_offsets():
    from google.protobuf import text_format
    published = text_format.Merge(FCN8S.read_text(), caffe_pb2.NetParameter())
    assert _crops(published) == {"score_pool4c": (2, [5]), "score_pool3c": (2, [9]),
                                 "score": (2, [31])}
    n = fcn8s()
    assert _crops(n.to_proto()) == _crops(published)
    axis, a, b = coord_map_from_to(n.upscore8, n.data)
    assert axis == 1 and numpy.all(a == 1) and numpy.all(b == -31)


def test_coord_map_refuses_what_it_cannot_crop():
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    n.pooled = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=2, stride=2)
    with pytest.raises(ValueError, match="scale mismatch"):
        crop(n.pooled, n.data)
    n.other = L.Input(shape=dict(dim=[1, 3, 8, 8]))
    with pytest.raises(RuntimeError, match="connected by spatial layers"):
        coord_map_from_to(n.pooled, n.other)


# -- draw ---------------------------------------------------------------------------------------
def test_draw_net_gives_dot_text_of_the_net(tmp_path):
    pytest.importorskip("pydot")
    import caffe.draw
    from google.protobuf import text_format
    net = text_format.Merge((ROOT / "models/lenet/lenet_train_test.prototxt").read_text(),
                            caffe_pb2.NetParameter())
    dot = caffe.draw.draw_net(net, "LR", ext="dot").decode()
    assert "conv1_Convolution" in dot and '"Batch 64"' in dot and "rankdir=LR" in dot
    graph = caffe.draw.get_pydot_graph(net, "TB", phase=caffe.TEST)
    assert {node.get_name() for node in graph.get_nodes()} >= {"conv1_Convolution", "accuracy_Accuracy"}
    caffe.draw.draw_net_to_file(net, str(tmp_path / "lenet.dot"))
    assert (tmp_path / "lenet.dot").read_text() == dot


# -- Detector ------------------------------------------------------------------------------------
def test_detector_scores_each_window_as_the_net_scores_its_warped_crop(tmp_path):
    rng = numpy.random.RandomState(3)
    pixels = rng.randint(0, 256, (60, 80, 3)).astype(numpy.uint8)
    Image.fromarray(pixels).save(tmp_path / "scene.png")
    detector = caffe.Detector(str(CIFAR_DEPLOY), str(CIFAR_WEIGHTS), raw_scale=255)
    windows = [numpy.array([0, 0, 32, 32]), numpy.array([10, 20, 50, 70])]
    detections = detector.detect_windows([(str(tmp_path / "scene.png"), windows)])
    assert [d["filename"] for d in detections] == [str(tmp_path / "scene.png")] * 2
    image = caffe.io.load_image(str(tmp_path / "scene.png"))
    net = caffe.Net(str(CIFAR_DEPLOY), caffe.TEST, weights=str(CIFAR_WEIGHTS))
    for detection, (y0, x0, y1, x1) in zip(detections, windows):
        warped = caffe.io.resize_image(image[y0:y1, x0:x1], (32, 32))
        net.blobs["data"].data[...] = warped.transpose(2, 0, 1) * 255
        numpy.testing.assert_allclose(detection["prediction"], net.forward()["prob"][0],
                                      rtol=1e-4, atol=1e-6)
    padded = caffe.Detector(str(CIFAR_DEPLOY), str(CIFAR_WEIGHTS), raw_scale=255,
                            mean=numpy.full(3, 100.0), context_pad=4)
    window = padded.crop(image.astype(numpy.float32), numpy.array([0, 0, 20, 20]))
    assert window.shape == (32, 32, 3)
    # the box grown for context reaches above and left of the image: mean (in image units) there
    numpy.testing.assert_allclose(window[0, 0], 100.0 / 255, rtol=1e-6)


# -- callbacks --------------------------------------------------------------------------------
def test_net_callbacks_run_around_every_layer_in_caffes_order():
    net = caffe.Net(str(CIFAR_DEPLOY), caffe.TEST, weights=str(CIFAR_WEIGHTS))
    calls = []
    net.before_forward(lambda i: calls.append(("before_forward", i)))
    net.after_forward(lambda i: calls.append(("after_forward", i)))
    net.before_backward(lambda i: calls.append(("before_backward", i)))
    net.after_backward(lambda i: calls.append(("after_backward", i)))
    net.forward()
    count = len(net.layers)
    assert calls == [(kind, i) for i in range(count) for kind in ("before_forward", "after_forward")]
    calls.clear()
    net.backward()
    assert calls == [(kind, i) for i in reversed(range(count))
                     for kind in ("before_backward", "after_backward")]


def test_solver_callbacks_come_before_the_forward_and_before_the_update(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver = caffe.get_solver(write_tiny_solver(tmp_path))
    seen = []

    def on_start():
        seen.append(("start", solver.iter))

    def on_gradients_ready():
        # the gradients are there and the update has not been applied yet
        seen.append(("gradients", solver.iter,
                     bool(numpy.abs(solver.net.params["ip"][0].diff).max() > 0)))

    solver.add_callback(on_start, on_gradients_ready)
    solver.step(2)
    assert seen == [("start", 0), ("gradients", 0, True), ("start", 1), ("gradients", 1, True)]
    with pytest.raises(caffe_engine_error()):
        solver.add_callback(object())


def write_tiny_solver(folder):
    """The tiny MNIST solver (tests/tiny_train.py) in ``folder``, which must be the cwd (its
    net path is relative, as Caffe resolves it)."""
    return str(tiny_solver(folder))


def caffe_engine_error():
    from caffe_engine.errors import CaffeError
    return CaffeError


# -- solver_count / rank, NCCL, Timer, set_mode_gpu ----------------------------------------------
# (conftest's process.reset puts solver_count, solver_rank and multiprocess back after each test)
def test_solver_count_and_rank_give_each_solver_its_share_of_the_records(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_tiny_solver(tmp_path)
    whole = caffe.get_solver(path)
    whole.net.forward()
    labels_whole = [whole.net.blobs["label"].data.copy()]
    whole.net.forward()
    labels_whole.append(whole.net.blobs["label"].data.copy())
    caffe.set_solver_count(2)
    caffe.set_solver_rank(1)
    caffe.set_multiprocess(True)
    assert (caffe.solver_count(), caffe.solver_rank()) == (2, 1)
    share = caffe.get_solver(path)
    assert not share.is_root                             # rank 1 does not test or snapshot
    share.net.forward()
    every = numpy.concatenate(labels_whole)
    # Caffe's DataLayer::Skip: rank r of n keeps records whose offset % n == r
    assert numpy.array_equal(share.net.blobs["label"].data, every[1::2][:len(every) // 2])
    with pytest.raises(caffe_engine_error(), match="mpiexec"):
        caffe.NCCL(share, "")
    with pytest.raises(ValueError):
        caffe.set_solver_count(0)


def test_nccl_without_gpus_is_the_no_op_of_a_build_without_nccl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    solver = caffe.get_solver(write_tiny_solver(tmp_path))
    nccl = caffe.NCCL(solver, "")
    solver.add_callback(nccl)
    solver.net.after_backward(nccl)
    before = solver.net.params["ip"][0].data.copy()
    solver.step(1)
    assert not numpy.array_equal(before, solver.net.params["ip"][0].data)
    if not caffe.has_nccl():
        assert caffe.has_nccl() is False


def test_timer_measures_milliseconds():
    import time
    timer = caffe.Timer()
    assert timer.ms == 0.0                             # never run: 0, as Caffe's CPUTimer
    timer.start()
    time.sleep(0.02)
    timer.stop()
    assert 15 <= timer.ms < 1000


def test_set_mode_gpu_without_a_gpu_warns_once_and_stays_on_the_cpu():
    script = ("import caffe, caffe_engine.backend as b, numpy\n"
              "on = caffe.set_mode_gpu(); again = caffe.set_mode_gpu()\n"
              "net = caffe.Net(%r, caffe.TEST)\n"
              "print(on, again, type(net.blobs['data'].data).__module__)\n" % str(CIFAR_DEPLOY))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "numpy"]
    assert done.stderr.count("no usable GPU") == 1 and "Traceback" not in done.stderr


# -- CAFFE_ENGINE_NO_ALIAS ---------------------------------------------------------------------
def test_no_alias_switch_loads_the_other_caffe_or_says_there_is_none(tmp_path):
    other = tmp_path / "bvlc" / "caffe"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("WHO = 'bvlc'\n")
    env = dict(os.environ, CAFFE_ENGINE_NO_ALIAS="1")
    probe = "import caffe; print(getattr(caffe, 'WHO', 'engine'))"
    # appended after the engine on the path: the switch still finds it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT),
                                                      str(tmp_path / "bvlc")]))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "bvlc"
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.returncode != 0 and "no other 'caffe' package" in done.stderr
    env.pop("CAFFE_ENGINE_NO_ALIAS")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert done.stdout.strip() == "engine", done.stderr


# -- Python layers: param_str and phase ---------------------------------------------------------
def test_python_layer_sees_param_str_and_phase(tmp_path, monkeypatch):
    (tmp_path / "probe_layer.py").write_text(
        "import caffe\n"
        "class Probe(caffe.Layer):\n"
        "    def setup(self, bottom, top):\n"
        "        self.seen = (self.param_str, self.phase)\n"
        "    def reshape(self, bottom, top):\n"
        "        top[0].reshape(*bottom[0].data.shape)\n"
        "    def forward(self, bottom, top):\n"
        "        top[0].data[...] = 2 * bottom[0].data\n"
        "    def backward(self, top, propagate_down, bottom):\n"
        "        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3]))
    n.out = L.Python(n.data, module="probe_layer", layer="Probe", param_str="{'k': 3}")
    (tmp_path / "net.prototxt").write_text(str(n.to_proto()))
    for phase in (caffe.TRAIN, caffe.TEST):
        net = caffe.Net(str(tmp_path / "net.prototxt"), phase)
        layer = net.layers[list(net._layer_names).index("out")]
        assert layer.impl.seen == ("{'k': 3}", phase)
        assert numpy.array_equal(net.forward(data=numpy.ones((2, 3), numpy.float32))["out"],
                                 numpy.full((2, 3), 2, numpy.float32))
