"""tools/bench_gemm_shapes.py: the products it times are those of the net's convolutions (LeNet's
shapes worked out by hand from Caffe's layers), their FLOPs are the engine's convolution FLOPs,
and the command prints its table from a child process."""
import importlib.util
import subprocess
import sys

from paths import ROOT

SPEC = importlib.util.spec_from_file_location("bench_gemm_shapes",
                                              ROOT / "tools" / "bench_gemm_shapes.py")
tool = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(tool)


def test_lenet_products_and_engine_flops():
    net = tool.build("lenet", 4)
    shapes = tool.conv_shapes(net)
    # conv1: 20 filters of 1x5x5 over 24x24 outputs; conv2: 50 of 20x5x5 over 8x8
    assert shapes == [("conv1", 20, 25, 576, 1, 4), ("conv2", 50, 500, 64, 1, 4)]
    rows = tool.time_products(shapes, reps=1)
    assert [r[0] for r in rows] == ["conv1", "conv2"]
    for (_, M, K, P, G, N), row in zip(shapes, rows):
        assert row[5] == 3 * 2.0 * M * K * P * N * G and row[6] > 0
    flops, seconds = tool.engine_convolutions(net, reps=1)
    # conv1 does not propagate down to the data: two products; conv2 three
    assert flops == 2 * 2.0 * 20 * 25 * 576 * 4 + 3 * 2.0 * 50 * 500 * 64 * 4
    assert seconds > 0


def test_command_prints_the_table():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_gemm_shapes.py"), "--nets",
                        "lenet", "--batch", "2", "--layers"], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert any(line.startswith("BLAS: ") for line in lines)
    row = next(line for line in lines if line.startswith("lenet"))
    fields = row.split()
    assert float(fields[3]) > 0 and fields[4].endswith("%") and fields[7].endswith("%")
    assert any(line.strip().startswith("conv2 ") for line in lines)
