"""tools/bench_startup.py: glog timestamps read back, the nets it writes (parameter counts of
the published architectures: AlexNet 60,965,224, VGG-16 138,357,544), and one LeNet run's marks
in the order the log gives them."""
import importlib.util
import time

import numpy

from caffe_engine.io import prototxt as pio
from paths import ROOT, SHARED

SPEC = importlib.util.spec_from_file_location("bench_startup", ROOT / "tools" / "bench_startup.py")
bench_startup = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_startup)


def test_glog_timestamps_are_read_in_local_time():
    t = time.mktime((2026, 12, 5, 23, 4, 52, 0, 0, -1)) + 0.690369
    line = "I20261205 23:04:52.690369 12108 solver.py:447] Solving LeNet"
    assert abs(bench_startup.stamp(line, 2026) - t) < 1e-6
    assert abs(bench_startup.stamp(line.replace("I2026", "W"), 2026) - t) < 1e-6   # no year
    assert bench_startup.stamp("    Train net output #0: loss = 2.3", 2026) is None


def _param_count(text, tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(text)
    net = pio.read_net_param(str(path))
    channels = {"data": 3}
    spatial = {"data": 227 if net.name == "AlexNet" else 224}
    total = 0
    for layer in net.layer:
        if layer.type == "Convolution":
            p = layer.convolution_param
            k, group = p.kernel_size[0], p.group or 1
            c = channels[layer.bottom[0]]
            total += p.num_output * c // group * k * k + p.num_output
            channels[layer.top[0]] = p.num_output
            s = p.stride[0] if p.stride else 1
            pad = p.pad[0] if p.pad else 0
            spatial[layer.top[0]] = (spatial[layer.bottom[0]] + 2 * pad - k) // s + 1
        elif layer.type in ("ReLU", "Dropout", "LRN"):     # in place or shape-keeping
            channels[layer.top[0]] = channels[layer.bottom[0]]
            if layer.bottom[0] in spatial:
                spatial[layer.top[0]] = spatial[layer.bottom[0]]
        elif layer.type == "Pooling":
            p = layer.pooling_param
            channels[layer.top[0]] = channels[layer.bottom[0]]
            spatial[layer.top[0]] = -(-(spatial[layer.bottom[0]] - p.kernel_size) // p.stride) + 1
        elif layer.type == "InnerProduct":
            b = layer.bottom[0]
            fan_in = channels[b] * spatial[b] ** 2 if b in spatial else channels[b]
            n = layer.inner_product_param.num_output
            total += n * fan_in + n
            channels[layer.top[0]] = n
            spatial.pop(layer.top[0], None)
    return total


def test_written_nets_have_the_published_parameter_counts(tmp_path):
    source, mean = "/nowhere/lmdb", "/nowhere/mean.binaryproto"
    assert _param_count(bench_startup.alexnet_prototxt(source, mean, 32), tmp_path) == 60965224
    assert _param_count(bench_startup.vgg16_prototxt(source, mean, 32), tmp_path) == 138357544


def test_one_lenet_run_gives_its_marks_in_order(tmp_path):
    assert (SHARED / "data" / "mnist_5k" / "mnist_train_lmdb").is_dir()
    solver = bench_startup.solver_for("lenet", str(tmp_path))
    marks = bench_startup.run_once(bench_startup.sys.executable, solver)
    order = ["first log", "train net", "test net", "solving", "iter 0", "iter 1", "exit"]
    values = [marks[name] for name in order]
    assert 0 < values[0] and numpy.all(numpy.diff(values) >= 0), marks
    assert marks["loss0"] == "2.32426"       # lenet_sgd's first loss: Caffe's, random_seed 1701
    stopped = bench_startup.run_once(bench_startup.sys.executable, solver, stop_at="solving")
    assert "solving" in stopped and "iter 0" not in stopped and "exit" not in stopped
