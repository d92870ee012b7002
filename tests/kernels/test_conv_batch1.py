"""The cpu convolution's batch-1 paths give the bits of its general ones.

Where a layer has fewer blocks of output positions than threads (batch 1's small planes), the
forward splits each block's output channels between the threads and reads the weights in place,
and the weight gradient splits the block's rows (:mod:`caffe_engine.kernels.cpu.conv`). Every
output is the same chain of multiply-adds as on one thread with many blocks and packed weights,
so the results are compared bit for bit: the output with that of one thread on one-position
blocks, the gradients (the weight gradient a chain per block of positions, accumulated onto
ones: no -0) with those of one thread on the same blocks.
"""
import numpy
import pytest

from caffe_engine.kernels.geometry import ConvGeometry, conv_output_shape

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import CpuKernels  # noqa: E402
from caffe_engine.kernels.cpu.tuning import CpuTuning  # noqa: E402

f32 = numpy.float32
#: (channels, size, num_output, kernel, stride, pad, group): ResNet-50's and MobileNet's small
#: planes, odd channel counts (rows padded to the micro-kernel's), groups.
SHAPES = [(64, 7, 64, 3, 1, 1, 1), (96, 7, 40, 1, 1, 0, 1), (40, 14, 24, 3, 1, 1, 1),
          (33, 5, 19, 3, 1, 1, 1), (24, 9, 36, 3, 2, 1, 3), (16, 6, 16, 2, 1, 0, 2)]


def run(tuning, g, x, w, b, dy):
    plan = CpuKernels(tuning).conv(g)
    y = numpy.full(dy.shape, numpy.nan, f32)
    dx = numpy.full(x.shape, numpy.nan, f32)
    dw = numpy.ones(w.shape, f32)
    plan.forward(x, w, b, y)
    plan.backward_data(dy, w, dx)
    plan.weight_grad(x, dy, dw)
    return y, dx, dw


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("shape", SHAPES)
def test_batch1_split_matches_one_thread(shape, threads):
    c, size, m, k, s, p, group = shape
    out = conv_output_shape((size, size), (k, k), (s, s), (p, p), (1, 1))
    g = ConvGeometry(1, c, m, group, (size, size), out, (k, k), (s, s), (p, p), (1, 1))
    rng = numpy.random.default_rng(sum(shape) + threads)
    x = rng.standard_normal((1, c, size, size)).astype(f32)
    w = rng.standard_normal((m, c // group, k, k)).astype(f32)
    b = rng.standard_normal(m).astype(f32)
    dy = rng.standard_normal((1, m) + out).astype(f32)
    split = CpuTuning(threads=threads, kc=40)
    assert len(CpuKernels(split).conv(g).blocks[1]) < threads   # the batch-1 paths
    got = run(split, g, x, w, b, dy)
    # the output: one chain each, whatever the blocks (one-position blocks, packed weights)
    many_blocks = run(CpuTuning(threads=1, block_columns=1, kc=40), g, x, w, b, dy)
    # the gradients sum by block (a chain per block; col2im adds block after block): the same
    # blocks on one thread
    one_thread = run(CpuTuning(threads=1, kc=40), g, x, w, b, dy)
    for name, a, e in zip(("y", "dx", "dw"), got, many_blocks[:1] + one_thread[1:]):
        assert a.tobytes() == e.tobytes(), name
