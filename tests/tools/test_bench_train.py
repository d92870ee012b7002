"""tools/bench_train.py's own arithmetic and plumbing: the FLOP count from a net's shapes, the
peak RSS a worker reports, ``--write-nets`` (the nets ``caffe time`` profiles), the Model Zoo
nets' TRAIN nets and their PyTorch peers, the subprocesses' environment and the CPU table.

Oracles: LeNet's multiply-adds worked out by hand from Caffe's layer shapes; the kernel's own
``VmHWM`` against a buffer the test allocates; the written prototxt built as a Net; the engine
Net's blob shapes and forward loss (Caffe's layer semantics) for the PyTorch models; the
architectures' published parameter counts; table figures worked out by hand from fake workers.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import caffe_engine as caffe
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from paths import ROOT

SPEC = importlib.util.spec_from_file_location("bench_train", ROOT / "tools" / "bench_train.py")
bench_train = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_train)


def test_flops_of_lenet_from_its_shapes(tmp_path):
    net = caffe.Net(bench_train.train_net_param("lenet", str(tmp_path)), caffe.TRAIN)
    # multiply-adds per forward: top count x (C_in / group * prod(kernel)) or x inputs
    conv1 = 64 * 20 * 24 * 24 * (1 * 5 * 5)
    conv2 = 64 * 50 * 8 * 8 * (20 * 5 * 5)
    ip1 = 64 * 500 * (50 * 4 * 4)
    ip2 = 64 * 10 * 500
    # forward + weight gradient for all; data gradient for all but conv1 (its bottom is data)
    want = 2 * (2 * conv1 + 3 * (conv2 + ip1 + ip2))
    assert bench_train.count_flops(net) == want


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_peak_rss_is_this_process_high_water_mark_in_mib():
    block = numpy.ones(64 * 2 ** 20 // 8)          # 64 MiB, every page written
    with open("/proc/self/status") as status:
        resident_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert block.sum() == block.size
    assert bench_train.peak_rss_mb() >= resident_kib / 1024 >= 64


def test_write_nets_gives_a_net_caffe_time_can_run(tmp_path):
    tool = [sys.executable, str(ROOT / "tools" / "bench_train.py"), "--write-nets",
            str(tmp_path), "--nets", "lenet"]
    done = subprocess.run(tool, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "lenet" / "train.prototxt"
    assert f"caffe time --model {path}" in done.stdout
    param = pio.read_net_param(str(path))
    net = caffe.Net(param, caffe.TRAIN)
    net.forward()
    assert net.blobs["data"].shape == (64, 1, 28, 28)
    assert numpy.isfinite(net.blobs["loss"].data).all()
    # A second write into the same folder is refused in one line, nothing overwritten.
    again = subprocess.run(tool, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert again.stderr.strip().count("\n") == 0 and "already holds" in again.stderr
    assert "Traceback" not in again.stderr


def _fake_caffe(tmp_path, body):
    """An executable standing in for BVLC Caffe's binary: runs ``body`` (sh) with its args."""
    path = tmp_path / "caffe"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_caffe_bin_column_reads_caffe_times_average_forward_backward(tmp_path):
    # Caffe's tools/caffe.cpp time() logs these three lines through glog (stderr).
    fake = _fake_caffe(tmp_path, 'test "$1" = time && test -f "$3" || exit 3\n'
                       'echo "I1202 caffe.cpp:417] Average Forward pass: 40.5 ms." >&2\n'
                       'echo "I1202 caffe.cpp:419] Average Backward pass: 80.25 ms." >&2\n'
                       'echo "I1202 caffe.cpp:421] Average Forward-Backward: 121.75 ms." >&2')
    assert bench_train.caffe_time_ms(fake, "lenet", 2, 1) == 121.75


def test_caffe_bin_failure_gives_no_figure_and_says_why(tmp_path, capsys):
    fake = _fake_caffe(tmp_path, 'echo "F1202 net.cpp:44] Unknown layer type: Foo" >&2; exit 1')
    assert bench_train.caffe_time_ms(fake, "lenet", 2, 1) is None
    assert "Unknown layer type: Foo" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# The Model Zoo nets: their TRAIN nets, the PyTorch peers, the table
# --------------------------------------------------------------------------------------------
def _missing(net):
    """Why ``net``'s prototxt cannot be read here (../shared's nets), or None."""
    path = ROOT / bench_train.NETS[net][0]
    return None if path.exists() else f"needs {path}"


@pytest.mark.parametrize("net", bench_train.ZOO)
def test_zoo_net_trains_in_the_engine_and_pytorch_with_the_same_shapes(net, tmp_path):
    # Oracle: the engine Net's blob shapes (Caffe's shape rules) for every top of the PyTorch
    # model, and the published parameter counts of the architectures.
    torch = pytest.importorskip("torch")
    if _missing(net):
        pytest.skip(_missing(net))
    param = bench_train.train_net_param(net, str(tmp_path), batch=2, records=2)
    assert all(not layer.include or layer.include[0].phase == caffe.TRAIN
               for layer in param.layer)
    assert "Accuracy" not in {layer.type for layer in param.layer}
    engine = caffe.Net(param, caffe.TRAIN)
    crop = 227 if net in ("alexnet", "caffenet", "squeezenet") else 224
    assert engine.blobs["data"].shape == (2, 3, crop, crop)
    compared, mismatches = bench_train.check_shapes(param, engine)
    assert mismatches == [] and compared >= len(engine.layers) - 30
    model = bench_train.torch_model(param)
    loss = model(torch.rand(2, 3, crop, crop), torch.randint(0, 1000, (2,)))
    learnt = sum(b.count for layer in engine.layers if layer.type != "BatchNorm"
                 for b in layer.blobs)
    assert sum(p.numel() for p in model.parameters()) == learnt == {
        "alexnet": 60965224, "caffenet": 60965224, "googlenet": 13378280,
        "vgg16": 138357544, "resnet50": 25557096, "squeezenet": 1235496,
        "mobilenet": 4231976}[net]
    assert torch.isfinite(loss)


@pytest.mark.skipif(_missing("resnet50") is not None, reason="needs ../shared's ResNet-50")
def test_deploy_to_train_gives_resnet50_a_data_layer_batch_statistics_and_a_loss():
    deploy = pio.read_net_param(str(ROOT / bench_train.NETS["resnet50"][0]))
    param = bench_train.deploy_to_train(deploy, "some_lmdb", 32, 1000)
    data, loss = param.layer[0], param.layer[-1]
    assert (data.type, list(data.top)) == ("Data", ["data", "label"])
    assert (data.data_param.source, data.data_param.batch_size) == ("some_lmdb", 32)
    assert data.transform_param.crop_size == 224 and data.transform_param.mirror
    assert list(data.transform_param.mean_value) == [104, 117, 123]
    assert (loss.type, list(loss.bottom)) == ("SoftmaxWithLoss", ["fc1000", "label"])
    types = [layer.type for layer in param.layer]
    assert "Input" not in types and "Softmax" not in types
    assert types.count("BatchNorm") == 53
    assert all(not l.batch_norm_param.use_global_stats for l in param.layer
               if l.type == "BatchNorm")
    assert {l.convolution_param.weight_filler.type for l in param.layer
            if l.type == "Convolution"} == {"msra"}
    assert param.layer[1].bottom[0] == "data"


def test_check_shapes_names_a_top_that_differs(tmp_path):
    pytest.importorskip("torch")
    param = bench_train.train_net_param("lenet", str(tmp_path), batch=2, records=2)
    other = caffe_pb2.NetParameter()
    other.CopyFrom(param)
    next(l for l in other.layer if l.name == "conv1").convolution_param.num_output = 21
    compared, mismatches = bench_train.check_shapes(param, caffe.Net(other, caffe.TRAIN))
    assert compared == 10
    assert mismatches[:2] == ["conv1 conv1: engine (2, 21, 24, 24) torch (2, 20, 24, 24)",
                              "pool1 pool1: engine (2, 21, 12, 12) torch (2, 20, 12, 12)"]


#: A net of the layer types the Model Zoo nets add, with the forms their fields take.
TYPES_NET = """
layer { name: "in" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 4 dim: 9 dim: 9 } shape { dim: 2 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 6 group: 2 kernel_h: 3 kernel_w: 1 pad_h: 1 pad_w: 0
                            stride_h: 1 stride_w: 2 bias_term: false
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 1.5 }
                      bias_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "dw" type: "Convolution" bottom: "conv1" top: "dw"
        convolution_param { num_output: 6 group: 6 kernel_size: 3 pad: 1 dilation: 1
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "scale2" type: "Scale" bottom: "dw" top: "dw2"
        scale_param { filler { type: "uniform" min: 0.5 max: 1.5 } } }
layer { name: "sum" type: "Eltwise" bottom: "conv1" bottom: "dw2" top: "sum"
        eltwise_param { operation: SUM coeff: 1 coeff: -0.5 } }
layer { name: "prod" type: "Eltwise" bottom: "sum" bottom: "dw" top: "prod"
        eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "prod" bottom: "sum" top: "max"
        eltwise_param { operation: MAX } }
layer { name: "lrn" type: "LRN" bottom: "max" top: "lrn"
        lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }
layer { name: "pmax" type: "Pooling" bottom: "lrn" top: "pmax"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "pave" type: "Pooling" bottom: "lrn" top: "pave"
        pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "pmax" bottom: "pave" top: "cat" }
layer { name: "gap" type: "Pooling" bottom: "cat" top: "gap"
        pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "cat" top: "fc"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "flat" type: "Flatten" bottom: "gap" top: "flat" }
layer { name: "fc2" type: "InnerProduct" bottom: "flat" top: "fc2"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "both" type: "Eltwise" bottom: "fc" bottom: "fc2" top: "both" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "both" bottom: "label" top: "loss" }
"""


def test_torch_peer_computes_the_engines_loss_with_the_engines_weights():
    # Oracle: the engine's forward (Caffe's layer semantics) of a net of every layer type the
    # zoo nets add, the PyTorch peer given the engine's weights computing the same loss.
    torch = pytest.importorskip("torch")
    from google.protobuf import text_format
    param = text_format.Parse(TYPES_NET, caffe_pb2.NetParameter())
    net = caffe.Net(param, caffe.TRAIN)
    rng = numpy.random.RandomState(3)
    x = rng.randn(2, 4, 9, 9).astype(numpy.float32)
    label = numpy.array([1, 4], numpy.float32)
    net.blobs["data"].data[...] = x
    net.blobs["label"].data[...] = label
    want = float(net.forward()["loss"])
    model = bench_train.torch_model(param)
    data, target = torch.from_numpy(x), torch.from_numpy(label).long()
    model(data, target)                                 # materializes the lazy modules
    assert model.fused == {"scale1"}
    blobs = {name: [torch.from_numpy(numpy.array(b.data)) for b in net.layer_dict[name].blobs]
             for name in ("conv1", "scale1", "dw", "scale2", "fc", "fc2")}
    with torch.no_grad():
        model.mods["conv1"].weight.copy_(blobs["conv1"][0])
        assert model.mods["conv1"].bias is None
        model.mods["bn1"].weight.copy_(blobs["scale1"][0])
        model.mods["bn1"].bias.copy_(blobs["scale1"][1])
        model.mods["scale2"].weight.copy_(blobs["scale2"][0])
        assert model.mods["scale2"].bias is None
        for name in ("dw", "fc", "fc2"):
            model.mods[name].weight.copy_(blobs[name][0])
            model.mods[name].bias.copy_(blobs[name][1])
        got = float(model(data, target))
    assert got == pytest.approx(want, rel=1e-5)
    assert sum(p.numel() for p in model.parameters()) == sum(
        b.count for layer in net.layers if layer.type != "BatchNorm" for b in layer.blobs)


def test_zoo_names_aliases_and_default_nets():
    assert set(bench_train.ZOO) <= set(bench_train.NETS)
    assert bench_train.NETS["bvlc_googlenet"] == bench_train.NETS["googlenet"] == \
        ("models/googlenet/train_val.prototxt", (3, 256, 256))
    assert "places205" in bench_train.NETS["googlenet_places"][0]
    assert bench_train.DEFAULT_NETS == ("lenet", "cifar10_quick", "nin", "inception",
                                        "googlenet_places")
    assert all(bench_train.CLASSES[n] == 1000 and bench_train.BATCH[n] == 32
               for n in bench_train.ZOO)
    for net in ("alexnet", "squeezenet"):
        first = (ROOT / bench_train.NETS[net][0]).read_text().splitlines()[0]
        assert first.startswith("# Source: https://github.com/")


def test_subprocesses_run_without_the_machines_blas_overrides(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = bench_train.child_env(3)
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert env["SOMETHING_ELSE"] == "kept"
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "3"
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"     # this process keeps them
    info = bench_train.blas_info()
    assert info["overrides"] == {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"}
    text = bench_train.blas_text(info)
    assert text.startswith("BLAS in the workers: ")
    assert "OPENBLAS_CORETYPE=Haswell" in text


def test_cpu_table_of_the_zoo_from_the_workers_figures(monkeypatch, capsys):
    calls, timed = [], []

    def run_worker(kind, net, args):
        calls.append((kind, net))
        if kind == "peak":
            return {"gflops": 100.0, "blas": [{"internal_api": "openblas", "version": "0.3",
                                               "architecture": "SkylakeX", "num_threads": 2,
                                               "filepath": "/x/libopenblas.so"}],
                    "kernels": "cpu", "kernel_threads": 2, "overrides": {}}
        if kind == "shapes":
            return {"compared": 5, "mismatches": ["x y: engine (1,) torch (2,)"]
                    if net == "vgg16" else [], "batch": 2}
        if kind == "engine":
            return {"times": [2.0, 2.5, 3.0], "batch": 32, "flops": 100e9, "peak_rss_mb": 900.0}
        return {"times": [4.0, 5.0], "batch": 32, "peak_rss_mb": 800.0}

    def caffe_time(caffe_bin, net, iters, threads, gpu=False):
        timed.append((tuple(caffe_bin), net, iters))
        return 1234.5

    monkeypatch.setattr(bench_train, "run_worker", run_worker)
    monkeypatch.setattr(bench_train, "caffe_time_ms", caffe_time)
    monkeypatch.setattr(bench_train.importlib.util, "find_spec", lambda name: object())
    assert bench_train.main(["--nets", "zoo,resnet50", "--iters", "3"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0].startswith("BLAS in the workers: openblas 0.3 kernel SkylakeX, 2 threads")
    engine_nets = [net for kind, net in calls if kind == "engine"]
    assert engine_nets == list(bench_train.ZOO)
    assert [net for kind, net in calls if kind == "torch"] == \
        [n for n in bench_train.ZOO if n != "vgg16"]
    assert "vgg16: the PyTorch model's shapes differ" in captured.err
    assert timed == [(bench_train.ENGINE_CAFFE, net, 3) for net in bench_train.ZOO]
    row = next(line for line in lines if line.startswith("resnet50 "))
    # median 2.5 s -> 0.40 it/s, 12.8 img/s, 100 GFLOP x 0.4 = 40 GFLOP/s = 40 % of 100;
    # PyTorch median 4.5 s: 0.22 it/s; 4.5 / 2.5 = 1.80; caffe time 1234.5 ms; no Caffe figure
    assert row.split() == ["resnet50", "32", "0.40", "2500.0", "13", "40.0", "40%", "900",
                           "0.22", "4500.0", "800", "1.80", "1234.5", "-", "-"]
    vgg = next(line for line in lines if line.startswith("vgg16 "))
    assert vgg.split()[8:12] == ["-", "-", "-", "-"]
