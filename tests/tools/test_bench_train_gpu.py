"""tools/bench_train.py's GPU mode (``--device gpu``) where it can be checked without a GPU: the
one-line refusal, the table and JSON it builds from its workers' figures, and the BVLC GoogLeNet
it times (models/googlenet).

Oracles: the refusal's exact form (one line, exit status 1, no traceback); the table's figures
worked out by hand from the fake workers' times; BVLC Caffe's own shapes of the same
architecture (../shared's reference build of the Places205 GoogLeNet, which differs only in its
three classifiers' 205 outputs) and PyTorch's count of the peer model's parameters.
"""
import importlib.util
import json
import subprocess
import sys

import pytest

from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from paths import ROOT, SHARED

SPEC = importlib.util.spec_from_file_location("bench_train_gpu_mod",
                                              ROOT / "tools" / "bench_train.py")
bench_train = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_train)

NO_GPU = bench_train.gpu_missing()
GOOGLENET = ROOT / "models" / "googlenet" / "train_val.prototxt"
PLACES_SHAPES = (SHARED / "realworld" / "reference" / "shapes" /
                 "natanielruiz__net-archive__places205-googlenet__"
                 "train_val_googlenet_places205.prototxt.TRAIN.json")


@pytest.mark.skipif(NO_GPU is None, reason="a GPU is here: the refusal cannot be seen")
def test_device_gpu_without_a_gpu_stops_with_one_line():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_train.py"), "--device",
                           "gpu", "--nets", "lenet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("bench_train: --device gpu: ")
    assert NO_GPU in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.skipif(NO_GPU is None, reason="a GPU is here: the refusal cannot be seen")
def test_engine_worker_refuses_gpu_mode_in_one_line():
    with pytest.raises(SystemExit, match=r"^bench_train: --device gpu: .+"):
        bench_train._engine_gpu()


def test_gpu_kernels_without_device_gpu_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as stop:
        bench_train.main(["--gpu-kernels", "reference", "--nets", "lenet"])
    assert stop.value.code == 2
    assert "--gpu-kernels needs --device gpu" in capsys.readouterr().err


def test_torch_worker_refuses_gpu_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("PyTorch sees a CUDA device here")
    with pytest.raises(SystemExit, match=r"^bench_train: --device gpu: PyTorch .* sees no CUDA"):
        bench_train.worker_torch("lenet", 1, 0, 1, device="gpu")


def _fake_workers(monkeypatch, calls, engine_fails=()):
    """bench_train's workers replaced by fixed figures; ``calls`` collects (kind, net)."""
    def run_worker(kind, net, args):
        calls.append((kind, net, args.device))
        if kind == "peak":
            return {"gflops": 50000.0, "peak_rss_mb": 1.0}
        if kind == "engine":
            if net in engine_fails:
                return None
            return {"times": [0.010, 0.012, 0.011], "batch": 64, "flops": 2e9, "gpu_mb": 123.4,
                    "launches": 42, "peak_rss_mb": 500.0}
        return {"times": [0.005, 0.004, 0.006], "batch": 64, "gpu_mb": 80.0,
                "gpu_reserved_mb": 96.0, "peak_rss_mb": 700.0}

    monkeypatch.setattr(bench_train, "run_worker", run_worker)
    monkeypatch.setattr(bench_train, "gpu_missing", lambda: None)
    monkeypatch.setattr(bench_train.importlib.util, "find_spec", lambda name: object())


def test_gpu_table_and_json_from_the_workers_figures(monkeypatch, tmp_path, capsys):
    calls = []
    _fake_workers(monkeypatch, calls, engine_fails=("nin",))
    out = tmp_path / "bench.json"
    assert bench_train.main(["--device", "gpu", "--nets", "lenet,nin", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "GPU float32 GEMM peak (8192^3, cupy.matmul): 50000 GFLOP/s" in lines[0]
    header = next(line for line in lines if line.startswith("net "))
    for column in ("ms/it", "%peak", "launch/it", "GPU MB", "torch ms", "torch MB", "eng/torch"):
        assert column in header
    assert "RSS MB" not in header and "Caffe ms" not in header
    row = next(line for line in lines if line.startswith("lenet "))
    # median 11 ms -> 90.91 it/s, 5818 img/s, 2e9 FLOP x 90.91 = 181.8 GFLOP/s = 0% of 50 TFLOP/s;
    # 42 launches; 123 MB; PyTorch's median 5.0 ms, 80 MB; 5.0 / 11.0 = 0.45
    assert row.split() == ["lenet", "64", "90.91", "11.0", "5818", "181.8", "0%", "42", "123",
                           "5.0", "80", "0.45"]
    assert any(line.startswith("nin ") and "engine run failed" in line for line in lines)
    results = json.loads(out.read_text())
    assert set(results) == {"lenet"}
    lenet = results["lenet"]
    assert lenet["device"] == "gpu"
    assert lenet["engine_launches_per_iter"] == 42
    assert lenet["engine_gpu_mb"] == pytest.approx(123.4)
    assert lenet["torch_gpu_mb"] == pytest.approx(80.0)
    assert lenet["torch_gpu_reserved_mb"] == pytest.approx(96.0)
    assert lenet["engine_ms"] == pytest.approx(11.0)
    assert lenet["torch_ms"] == pytest.approx(5.0)
    assert lenet["engine_ms_over_torch_ms"] == pytest.approx(2.2)
    assert all(device == "gpu" for _, _, device in calls)


def test_gpu_default_nets_are_the_ones_the_gpu_machine_has(monkeypatch, capsys):
    calls = []
    _fake_workers(monkeypatch, calls)
    assert bench_train.main(["--device", "gpu", "--no-torch"]) == 0
    timed = [net for kind, net, _ in calls if kind == "engine"]
    assert timed == ["lenet", "cifar10_quick", "nin", "bvlc_googlenet"]
    assert all(not bench_train.NETS[n][0].startswith("../") for n in timed)
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("bvlc_googlenet"))
    assert row.split()[-3:] == ["-", "-", "-"]


def _input_net(param, batch):
    """``param`` with its TRAIN Data layer replaced by an Input of ``batch`` 224x224 crops."""
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    for layer in param.layer:
        if layer.type != "Data":
            out.layer.add().CopyFrom(layer)
        elif layer.include[0].phase == caffe_pb2.TRAIN:
            data = out.layer.add(name="data", type="Input", top=["data", "label"])
            data.input_param.shape.add(dim=[batch, 3, 224, 224])
            data.input_param.shape.add(dim=[batch])
    return out


@pytest.mark.skipif(not PLACES_SHAPES.exists(), reason="needs ../shared's reference shapes")
def test_bvlc_googlenet_has_caffes_shapes():
    import caffe_engine as caffe
    ref = json.loads(PLACES_SHAPES.read_text())
    param = pio.read_net_param(str(GOOGLENET))
    assert [l.data_param.batch_size for l in param.layer if l.type == "Data"] == [32, 50]
    assert {l.transform_param.crop_size for l in param.layer if l.type == "Data"} == {224}
    classifiers = [l for l in param.layer if l.name.endswith("classifier")]
    assert [l.inner_product_param.num_output for l in classifiers] == \
        [bench_train.CLASSES["bvlc_googlenet"]] * 3
    net = caffe.Net(_input_net(param, ref["substitution"]["batch"]), caffe.TRAIN)
    theirs = [(l["name"], l["type"], [tuple(p) for p in l.get("params", [])])
              for l in ref["layers"] if l["type"] not in ("Input", "Split")]
    ours = [(l.name, l.type, [tuple(b.shape) for b in l.blobs])
            for l in net.layers if l.type not in ("Input", "Split")]
    assert [t[:2] for t in ours] == [t[:2] for t in theirs]
    for (name, _, our_params), (_, _, their_params) in zip(ours, theirs):
        if name.endswith("classifier"):  # 1000 ImageNet classes against Places' 205
            their_params = [(1000, 1024), (1000,)]
        assert our_params == their_params, name
    blobs = {b["name"]: tuple(b["shape"]) for b in ref["blobs"]}
    for name, blob in net.blobs.items():
        if name in blobs and "classifier" not in name:
            assert tuple(blob.shape) == blobs[name], name


def test_bvlc_googlenet_torch_peer_has_the_engines_parameters():
    torch = pytest.importorskip("torch")
    import caffe_engine as caffe
    param = pio.read_net_param(str(GOOGLENET))
    net = caffe.Net(_input_net(param, 1), caffe.TRAIN)
    engine_count = sum(b.count for layer in net.layers for b in layer.blobs)
    model = bench_train.torch_model(param)
    loss = model(torch.rand(1, 3, 224, 224), torch.randint(0, 1000, (1,)))
    assert loss.dim() == 0
    assert sum(p.numel() for p in model.parameters()) == engine_count == 13378280


def test_engine_worker_reports_gpu_figures_from_its_device_hooks(monkeypatch):
    # The GPU worker's own plumbing, on the CPU: the hooks _engine_gpu would return (device
    # synchronize, the memory pool's bytes, the launch counter) replaced by counting stand-ins.
    state = {"syncs": 0, "launches": 0}

    def sync():
        state["syncs"] += 1
        state["launches"] += 7      # as if every iteration launched 7 kernels

    monkeypatch.setattr(bench_train, "_engine_gpu",
                        lambda: (sync, lambda: 5 * 2 ** 20, lambda: state["launches"]))
    out = bench_train.worker_engine("lenet", 2, 1, device="gpu")
    assert len(out["times"]) == 2 and out["batch"] == 64
    assert out["gpu_mb"] == 5.0
    assert out["launches"] == 7
    assert state["syncs"] == 3      # after the warm-up, then after each timed iteration


def test_engine_worker_on_the_cpu_reports_no_gpu_figures():
    out = bench_train.worker_engine("lenet", 1, 0)
    assert "gpu_mb" not in out and "launches" not in out
