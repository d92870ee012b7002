"""tools/bench_train.py's own arithmetic and plumbing: the FLOP count from a net's shapes, the
peak RSS a worker reports, and ``--write-nets`` (the nets ``caffe time`` profiles).

Oracles: LeNet's multiply-adds worked out by hand from Caffe's layer shapes; the kernel's own
``VmHWM`` against a buffer the test allocates; the written prototxt built as a Net.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import caffe_engine as caffe
from caffe_engine.io import prototxt as pio
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
