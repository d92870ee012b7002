"""tools/bench_batch1.py: the deploy copy at batch 1, the per-type sums of a ``caffe time`` log,
and ``--train-nets`` timing the written TRAIN nets with a baseline checkout beside (LeNet, one
iteration, through the real command)."""
import importlib.util
import json
import subprocess
import sys

from paths import ROOT

SPEC = importlib.util.spec_from_file_location("bench_batch1", ROOT / "tools" / "bench_batch1.py")
tool = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(tool)

DEPLOY = """name: "n"
layer {
  name: "data" type: "Input" top: "data"
  input_param { shape { dim: 10 dim: 3 dim: 8 dim: 8 } }
}
layer {
  name: "c1" type: "Convolution" bottom: "data" top: "c1"
  convolution_param { num_output: 2 kernel_size: 3 }
}
layer {
  name: "r1" type: "ReLU" bottom: "c1" top: "c1"
}
"""


def test_batch_1_copy_and_per_type_sums(tmp_path):
    src = tmp_path / "m" / "deploy.prototxt"
    src.parent.mkdir()
    src.write_text(DEPLOY)
    out = tool.at_batch_1(str(src), str(tmp_path))
    text = open(out).read()
    assert "dim: 1 dim: 3 dim: 8 dim: 8" in text and "dim: 10" not in text
    log = ("I1206 10:00:00.0 1 cli.py:1]     c1\tforward: 1.5 ms.\n"
           "I1206 10:00:00.0 1 cli.py:1]     c1\tbackward: 2.5 ms.\n"
           "I1206 10:00:00.0 1 cli.py:1]     r1\tforward: 0.25 ms.\n")
    assert tool.per_type(log, out) == {"Convolution": 4.0, "ReLU": 0.25}


def test_train_nets_with_a_baseline(tmp_path):
    nets = tmp_path / "nets"
    subprocess.run([sys.executable, str(ROOT / "tools" / "bench_train.py"), "--nets", "lenet",
                    "--write-nets", str(nets)], check=True, capture_output=True)
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_batch1.py"), "--nets",
                        "lenet", "--train-nets", str(nets), "--runs", "1", "--iterations", "1",
                        "--baseline", str(ROOT), "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())["nets"]["lenet"]
    assert result["model"] == str(nets / "lenet" / "train.prototxt")
    assert result["engine_median"] > 0 and result["baseline_median"] > 0
    assert "lenet: engine" in r.stdout and "baseline" in r.stdout


def test_unknown_train_net_is_refused(tmp_path):
    (tmp_path / "lenet").mkdir()
    (tmp_path / "lenet" / "train.prototxt").write_text("")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_batch1.py"), "--nets",
                        "vgg16", "--train-nets", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown nets ['vgg16']; known: lenet" in r.stderr


def test_the_baseline_runs_its_own_checkout(tmp_path, monkeypatch):
    """``--baseline DIR`` imports DIR's engine even when the tool runs from this checkout
    (``python -m`` puts the working directory first on ``sys.path``): a stand-in checkout whose
    ``caffe_engine`` prints its own figure is the one timed."""
    checkout = tmp_path / "checkout"
    (checkout / "caffe_engine").mkdir(parents=True)
    (checkout / "caffe_engine" / "__init__.py").write_text("")
    (checkout / "caffe_engine" / "__main__.py").write_text(
        'print("I0 cli.py:1] Average Forward-Backward: 12.5 ms.")\n')
    model = tmp_path / "m.prototxt"
    model.write_text(DEPLOY)
    monkeypatch.chdir(ROOT)
    ms, _ = tool.time_once((sys.executable, "-m", "caffe_engine"), str(model), 1, 1,
                           pythonpath=str(checkout))
    assert ms == 12.5
