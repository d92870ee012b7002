"""Caffe's tools: convert_imageset, compute_image_mean, extract_features, parse_log,
plot_training_log, draw_net (caffe_engine/tools, run by tools/*.py).

Oracles: images decoded by Pillow on their own and averaged by NumPy; the real Caffe logs of
shared/caffe_reference/training against their trajectory.json; a net's forward for the
extracted features.
"""
import io
import json
import shutil
import subprocess
import sys

import numpy
import pytest
from PIL import Image, ImageDraw

import caffe_engine as caffe
from caffe_engine.io.blobproto import read_blobproto
from caffe_engine.proto import caffe_pb2
from caffe_engine.tools import (compute_image_mean, convert_imageset, draw_net, extract_features,
                                parse_log, plot_training_log)

from paths import ROOT, SHARED

TRAINING = SHARED / "caffe_reference" / "training"
LENET = SHARED / "realworld" / "HorizonRobotics-Platform__ModelZoo" / "Lenet"


@pytest.fixture(autouse=True)
def keep_logging():
    """The tools set up glog-style logging for the process; undo it after each test."""
    from caffe_engine.log import logger
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def records(path):
    """(key, Datum) pairs in key order (through the engine's shared read-only environments:
    Python's lmdb opens a database once per process, and a net may hold it open)."""
    from caffe_engine.io.lmdb_source import read_all
    return [(k.decode(), caffe_pb2.Datum.FromString(v)) for k, v in read_all(str(path))]


def make_images(folder, count=12, size=(24, 20), kinds=("png", "jpg")):
    """Pictures drawn with Pillow (gradients, shapes, noise), saved as PNG and JPEG."""
    folder.mkdir(exist_ok=True)
    rs = numpy.random.RandomState(0)
    lines = []
    for i in range(count):
        w, h = size
        yy, xx = numpy.mgrid[0:h, 0:w]
        base = numpy.stack([(xx * 9 + 20 * i) % 256, (yy * 11 + 7 * i) % 256,
                            rs.randint(0, 256, (h, w))], -1).astype(numpy.uint8)
        img = Image.fromarray(base)
        ImageDraw.Draw(img).ellipse([2 + i % 5, 3, w - 4, h - 2 - i % 4], outline=(255, 255 - 9 * i, 0))
        name = f"pic{i:02d}.{kinds[i % len(kinds)]}"
        img.save(folder / name, quality=95)
        lines.append(f"{name} {i % 3}")
    (folder.parent / "list.txt").write_text("\n".join(lines) + "\n")
    return folder.parent / "list.txt", [line.split()[0] for line in lines]


def pillow_bgr(path):
    return numpy.asarray(Image.open(path).convert("RGB"))[:, :, ::-1].transpose(2, 0, 1)


def run_tool(module, argv, capsys):
    status = module.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ---------------------------------------------------------------------------------------------
# convert_imageset + compute_image_mean
# ---------------------------------------------------------------------------------------------
def test_convert_imageset_then_mean_is_numpys_mean(tmp_path, capsys):
    list_file, names = make_images(tmp_path / "images")
    status, _, err = run_tool(convert_imageset, [str(tmp_path / "images") + "/", list_file, tmp_path / "db"], capsys)
    assert status == 0, err
    assert "A total of 12 images." in err and "Processed 12 files." in err
    stored = records(tmp_path / "db")
    assert [k for k, _ in stored] == [f"{i:08d}_{n}" for i, n in enumerate(names)]
    decoded = []
    for i, (_, datum) in enumerate(stored):
        pixels = pillow_bgr(tmp_path / "images" / names[i])
        assert (datum.channels, datum.height, datum.width, datum.label) == (3, 20, 24, i % 3)
        numpy.testing.assert_array_equal(caffe.io.datum_to_array(datum), pixels)
        decoded.append(pixels)
    status, _, err = run_tool(compute_image_mean, [tmp_path / "db", tmp_path / "mean.binaryproto"], capsys)
    assert status == 0, err
    mean = read_blobproto(tmp_path / "mean.binaryproto")
    assert mean.shape == (1, 3, 20, 24) and mean.dtype == numpy.float32
    expected = numpy.mean(numpy.stack(decoded).astype(numpy.float64), axis=0)
    numpy.testing.assert_allclose(mean[0], expected, rtol=1e-6)
    proto = caffe_pb2.BlobProto.FromString((tmp_path / "mean.binaryproto").read_bytes())
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 3, 20, 24)   # legacy fields
    assert "mean_value channel [2]:" in err

    # The same images stored encoded give the same mean (the tool decodes them).
    status, _, err = run_tool(convert_imageset, ["--encoded", str(tmp_path / "images") + "/", list_file,
                                                 tmp_path / "enc"], capsys)
    assert status == 0, err
    first = records(tmp_path / "enc")[1][1]                   # pic01.jpg: the file's own bytes
    assert first.encoded and first.data == (tmp_path / "images" / names[1]).read_bytes()
    status, _, err = run_tool(compute_image_mean, [tmp_path / "enc", tmp_path / "mean2.binaryproto"], capsys)
    assert status == 0, err
    numpy.testing.assert_array_equal(read_blobproto(tmp_path / "mean2.binaryproto"), mean)


def test_convert_imageset_options(tmp_path, capsys):
    list_file, names = make_images(tmp_path / "images", count=8)
    root = str(tmp_path / "images") + "/"
    assert run_tool(convert_imageset, ["--gray", "--resize_height=10", "-resize_width", "12", root,
                                       list_file, tmp_path / "grey"], capsys)[0] == 0
    datum = records(tmp_path / "grey")[0][1]
    assert (datum.channels, datum.height, datum.width) == (1, 10, 12) and len(datum.data) == 120

    orders = []
    for k in range(2):
        assert run_tool(convert_imageset, ["--shuffle", "--seed=5", root, list_file, tmp_path / f"s{k}"],
                        capsys)[0] == 0
        orders.append([(key.split("_", 1)[1], d.label) for key, d in records(tmp_path / f"s{k}")])
    assert orders[0] == orders[1] and sorted(orders[0]) == sorted((n, i % 3) for i, n in enumerate(names))
    assert [n for n, _ in orders[0]] != names

    assert run_tool(convert_imageset, ["--encode_type=png", root, list_file, tmp_path / "png"], capsys)[0] == 0
    datum = records(tmp_path / "png")[0][1]                    # pic00.png was .png: re-encoded? no
    reencoded = records(tmp_path / "png")[1][1]                # pic01.jpg -> PNG bytes
    assert reencoded.encoded and reencoded.data[:8] == b"\x89PNG\r\n\x1a\n"
    numpy.testing.assert_array_equal(caffe.io.datum_to_array(caffe.io.decode_datum(reencoded)),
                                     pillow_bgr(tmp_path / "images" / names[1]))
    assert datum.data == (tmp_path / "images" / names[0]).read_bytes()


def test_convert_imageset_errors(tmp_path, capsys):
    list_file, names = make_images(tmp_path / "images", count=4)
    root = str(tmp_path / "images") + "/"
    Image.new("RGB", (30, 30)).save(tmp_path / "images" / "big.png")
    (tmp_path / "mixed.txt").write_text(list_file.read_text() + "big.png 1\nmissing.png 2\n")
    status, _, err = run_tool(convert_imageset, ["--check_size", root, tmp_path / "mixed.txt", tmp_path / "a"], capsys)
    assert status == 1 and "convert_imageset: error: Incorrect data field size" in err
    # Without --check_size a missing file is logged and skipped (Caffe's behaviour).
    status, _, err = run_tool(convert_imageset, [root, tmp_path / "mixed.txt", tmp_path / "b"], capsys)
    assert status == 0 and "Could not open or find file" in err and len(records(tmp_path / "b")) == 5
    status, _, err = run_tool(convert_imageset, [root, list_file, tmp_path / "b"], capsys)
    assert status == 1 and "already exists" in err
    (tmp_path / "bad.txt").write_text("pic00.png seven\n")
    status, _, err = run_tool(convert_imageset, [root, tmp_path / "bad.txt", tmp_path / "c"], capsys)
    assert status == 1 and "bad.txt:1: expected 'path label'" in err
    status, _, err = run_tool(convert_imageset, ["--backend=rocksdb", root, list_file, tmp_path / "d"], capsys)
    assert status == 1 and err.count("\n") == 1 and "unknown database backend" in err
    status, _, err = run_tool(compute_image_mean, [tmp_path / "nothing"], capsys)
    assert status == 1 and err.startswith("compute_image_mean: error:") and err.count("\n") == 1


def test_compute_image_mean_of_the_mnist_lmdb(tmp_path, capsys):
    source = SHARED / "data" / "mnist_5k" / "mnist_train_lmdb"
    status, _, err = run_tool(compute_image_mean, [source, tmp_path / "m.binaryproto"], capsys)
    assert status == 0, err
    digits = numpy.stack([caffe.io.datum_to_array(d) for _, d in records(source)]).astype(numpy.float64)
    assert len(digits) == 4000
    numpy.testing.assert_allclose(read_blobproto(tmp_path / "m.binaryproto")[0], digits.mean(0), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# extract_features
# ---------------------------------------------------------------------------------------------
def test_extract_features_lmdb_and_npy(tmp_path, capsys):
    deploy = (LENET / "lenet_train_test.prototxt").read_text()
    data_layer = ('layer { name: "mnist" type: "Data" top: "data" top: "label" '
                  'transform_param { scale: 0.00390625 } '
                  f'data_param {{ source: "{SHARED / "data/mnist_5k/mnist_test_lmdb"}" batch_size: 10 backend: LMDB }} }}\n')
    body = deploy[deploy.index("\nlayer {"):]
    (tmp_path / "features.prototxt").write_text('name: "LeNet"\n' + data_layer + body)
    weights = LENET / "lenet_iter_100000.caffemodel"
    status, _, err = run_tool(extract_features, [weights, tmp_path / "features.prototxt", "ip1,ip2",
                                                 f"{tmp_path / 'ip1_db'},{tmp_path / 'ip2_db'}", 2, "lmdb"], capsys)
    assert status == 0, err
    stored = records(tmp_path / "ip1_db")
    assert [k for k, _ in stored] == [f"{i:010d}" for i in range(20)]
    assert (stored[0][1].channels, stored[0][1].height, stored[0][1].width) == (500, 1, 1)
    features = numpy.array([list(d.float_data) for _, d in stored], numpy.float32)

    net = caffe.Net(str(LENET / "lenet_train_test.prototxt"), caffe.TEST, weights=str(weights))
    net.blobs["data"].reshape(20, 1, 28, 28)
    net.reshape()
    digits = [caffe.io.datum_to_array(d) for _, d in records(SHARED / "data/mnist_5k/mnist_test_lmdb")[:20]]
    expected = net.forward(data=numpy.stack(digits).astype(numpy.float32) * numpy.float32(0.00390625),
                           blobs=["ip1"])
    numpy.testing.assert_allclose(features, expected["ip1"], rtol=1e-5, atol=1e-5)
    ip2 = numpy.array([list(d.float_data) for _, d in records(tmp_path / "ip2_db")])
    numpy.testing.assert_allclose(ip2, expected["ip2"], rtol=1e-5, atol=1e-5)

    status, _, err = run_tool(extract_features, [weights, tmp_path / "features.prototxt", "ip2",
                                                 tmp_path / "ip2.npy", 2, "npy"], capsys)
    assert status == 0, err
    numpy.testing.assert_allclose(numpy.load(tmp_path / "ip2.npy"), expected["ip2"], rtol=1e-5, atol=1e-5)

    status, _, err = run_tool(extract_features, [weights, tmp_path / "features.prototxt", "fc7",
                                                 tmp_path / "x", 1, "lmdb"], capsys)
    assert status == 1 and "Unknown feature blob name fc7" in err


# ---------------------------------------------------------------------------------------------
# parse_log
# ---------------------------------------------------------------------------------------------
def fixture_runs():
    for case in sorted(p for p in TRAINING.iterdir() if (p / "trajectory.json").exists()):
        trajectory = json.loads((case / "trajectory.json").read_text())
        for run_name, run in trajectory["runs"].items():
            yield pytest.param(case / run["log"], run, id=f"{case.name}-{run_name}")


@pytest.mark.parametrize("log, run", list(fixture_runs()))
def test_parse_log_reads_every_real_caffe_log(log, run):
    train, test = parse_log.parse_log(str(log))
    iterations = run["iterations"]
    assert [r["NumIters"] for r in train] == [float(i) for i in iterations["iter"]]
    for blob, values in iterations["train_outputs"].items():
        assert [r[blob] for r in train] == values, blob
    assert [r["LearningRate"] for r in train] == iterations["lr"]
    assert [r["NumIters"] for r in test] == [float(t["iter"]) for t in run["tests"]]
    for row, t in zip(test, run["tests"]):
        assert {k: row[k] for k in t["outputs"]} == t["outputs"]
    seconds = [r["Seconds"] for r in train]
    assert seconds == sorted(seconds) and 0 <= seconds[0] < 60


def test_parse_log_writes_caffes_csv_files(tmp_path, capsys):
    log = TRAINING / "lenet_sgd" / "caffe.log"
    status, out, err = run_tool(parse_log, ["--verbose", log, tmp_path], capsys)
    assert status == 0, err
    train = (tmp_path / "caffe.log.train").read_text().splitlines()
    test = (tmp_path / "caffe.log.test").read_text().splitlines()
    assert train[0] == "NumIters,Seconds,LearningRate,loss" and len(train) == 301
    assert train[1].startswith("0.0,") and train[1].endswith(",0.01,2.32426")
    assert test[0] == "NumIters,Seconds,LearningRate,accuracy,loss" and len(test) == 8
    assert test[-1].startswith("300.0,") and test[-1].endswith(",0.955,0.150497")
    assert "Wrote" in out
    status, _, err = run_tool(parse_log, [log, tmp_path / "missing_dir"], capsys)
    assert status == 1 and "does not exist" in err


def test_parse_log_reads_glog_dates_without_a_year(tmp_path):
    source = TRAINING / "lenet_adam" / "caffe.log"
    old = "".join(line[:1] + line[5:] if line[:1] in "IWEF" and line[1:9].isdigit() else line
                  for line in source.read_text().splitlines(True))
    assert old.startswith("I1129 08:")
    (tmp_path / "old.log").write_text(old)
    assert parse_log.parse_log(str(tmp_path / "old.log")) == parse_log.parse_log(str(source))


def test_parse_log_reads_the_engines_own_log(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(f"""name: "mlp"
layer {{ name: "mnist" type: "Data" top: "data" top: "label" transform_param {{ scale: 0.00390625 }}
        data_param {{ source: "{SHARED / 'data/mnist_5k/mnist_train_lmdb'}" batch_size: 16 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(f'net: "{net}"\ntest_iter: 2\ntest_interval: 4\nbase_lr: 0.1\n'
                           'lr_policy: "step"\ngamma: 0.5\nstepsize: 3\nmax_iter: 8\ndisplay: 1\n'
                           'random_seed: 3\nsnapshot_after_train: false\n')
    from caffe_engine.log import setup_logging
    stream = io.StringIO()
    setup_logging(stream)                 # keep_logging restores the logger afterwards
    solver = caffe.get_solver(str(solver_file))
    losses = []
    for _ in range(8):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    parsed = parse_log.parse_lines(stream.getvalue().splitlines(True))
    train, test = parsed.train, parsed.test
    assert [r["NumIters"] for r in train] == list(map(float, range(8)))
    numpy.testing.assert_allclose([r["loss"] for r in train], losses, rtol=1e-5)
    assert [r["LearningRate"] for r in train] == [0.1] * 3 + [0.05] * 3 + [0.025] * 2
    assert [r["NumIters"] for r in test] == [0.0, 4.0] and set(test[0]) >= {"acc", "loss"}


# ---------------------------------------------------------------------------------------------
# plot_training_log
# ---------------------------------------------------------------------------------------------
def test_plot_training_log_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib (extra 'tools') is not installed")
    logs = [TRAINING / "lenet_sgd" / "caffe.log", TRAINING / "lenet_adam" / "caffe.log"]
    for chart in (0, 6):
        status, _, err = run_tool(plot_training_log, [chart, tmp_path / f"c{chart}.png"] + logs, capsys)
        assert status == 0, err
        with Image.open(tmp_path / f"c{chart}.png") as png:
            assert png.format == "PNG" and png.size == (800, 500)
            pixels = numpy.asarray(png.convert("RGB"))
        assert (pixels < 128).any() and (pixels.std(axis=(0, 1)) > 10).all()   # drawn, coloured
    assert plot_training_log.series(parse_log.parse_log_full(str(logs[0])), 4)[1][:2] == [0.01, 0.00999925]
    status, _, err = run_tool(plot_training_log, [9, tmp_path / "x.png", logs[0]], capsys)
    assert status == 1 and "not a valid chart type" in err
    status, _, err = run_tool(plot_training_log, [0, tmp_path / "x.png", tmp_path / "none.log"], capsys)
    assert status == 1 and "does not exist" in err
    status, _, err = run_tool(plot_training_log, [0, tmp_path / "x.jpg", logs[0]], capsys)
    assert status == 1 and ".png" in err


# ---------------------------------------------------------------------------------------------
# draw_net
# ---------------------------------------------------------------------------------------------
MODEL = ROOT / "models" / "lenet" / "lenet_train_test.prototxt"


def test_draw_net_dot_text_needs_no_graphviz(tmp_path, capsys, monkeypatch):
    pytest.importorskip("pydot", reason="pydot (extra 'tools') is not installed")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    status, _, err = run_tool(draw_net, ["--rankdir", "TB", "--phase", "TRAIN", MODEL, tmp_path / "n.dot"], capsys)
    assert status == 0, err
    dot = (tmp_path / "n.dot").read_text()
    assert dot.startswith("digraph LeNet {") and "rankdir=TB" in dot
    assert 'label="conv1 (Convolution) kernel size: 5 stride: 1 pad: 0"' in dot
    assert 'label="pool1 (Pooling MAX) kernel size: 2 stride: 2 pad: 0"' in dot
    assert 'conv1_Convolution -> conv1_blob [label="20"];' in dot
    assert 'mnist_Data -> data_blob [label="Batch 64"];' in dot and "Batch 100" not in dot
    assert "accuracy_Accuracy" not in dot                     # TEST-only layer, TRAIN drawn
    assert run_tool(draw_net, ["--phase=TEST", MODEL, tmp_path / "t.dot"], capsys)[0] == 0
    assert "accuracy_Accuracy" in (tmp_path / "t.dot").read_text()
    # Without Graphviz an image format is one clear line and status 1.
    status, _, err = run_tool(draw_net, [MODEL, tmp_path / "n.png"], capsys)
    assert status == 1 and "Graphviz's 'dot' program is not installed" in err and err.count("\n") == 1


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_draw_net_renders_png_and_svg(tmp_path, capsys):
    pytest.importorskip("pydot", reason="pydot (extra 'tools') is not installed")
    status, _, err = run_tool(draw_net, [MODEL, tmp_path / "n.png"], capsys)
    assert status == 0, err
    with Image.open(tmp_path / "n.png") as png:
        assert png.format == "PNG" and png.size[0] > png.size[1] > 50      # LR: wide
    assert run_tool(draw_net, ["--rankdir=TB", MODEL, tmp_path / "n.svg"], capsys)[0] == 0
    svg = (tmp_path / "n.svg").read_text()
    assert "<svg" in svg and "conv1" in svg
    status, _, err = run_tool(draw_net, [MODEL, tmp_path / "n.qqq"], capsys)
    assert status == 1 and "unknown output format" in err


# ---------------------------------------------------------------------------------------------
# Command lines
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", [convert_imageset, compute_image_mean, extract_features, parse_log,
                                    plot_training_log, draw_net])
def test_help(module, capsys):
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: " + module.PROG)


def test_scripts_in_tools_folder(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "parse_log.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: parse_log" in done.stdout
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "compute_image_mean.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("compute_image_mean: error:")
    assert done.stderr.count("\n") == 1


def test_progress_bar_shows_on_a_terminal_only(monkeypatch):
    pytest.importorskip("tqdm", reason="tqdm (extra 'tools') is not installed")
    from caffe_engine.tools._common import progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(progress(range(3), total=3, desc="demo")) == [0, 1, 2]
        assert ("demo" in stream.getvalue()) == shown
