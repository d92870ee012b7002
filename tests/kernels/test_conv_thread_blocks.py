"""The convolution kernels' threads take consecutive runs of blocks of about equal work
(:func:`caffe_engine.kernels.cpu.conv.my_blocks`, issue 27): every block once, in order, and
no thread more than one block's work above the even share -- where every ``threads``-th block
gave one thread all the short blocks of ResNet-50's 28x28 layers."""
import numpy
import pytest

pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
from caffe_engine.kernels.cpu import conv  # noqa: E402
from caffe_engine.kernels.cpu.conv import NR  # noqa: E402


def work(lengths):
    return [-(-int(n) // NR) for n in lengths]


def runs(lengths, threads):
    bounds = [conv._boundary(lengths, t, threads) for t in range(threads + 1)]
    return [range(bounds[t], bounds[t + 1]) for t in range(threads)]


def check_split(lengths, threads):
    parts = runs(lengths, threads)
    assert [b for r in parts for b in r] == list(range(len(lengths)))
    cost = work(lengths)
    shares = [sum(cost[b] for b in r) for r in parts]
    assert max(shares) <= sum(cost) / threads + max(cost, default=0)
    return shares


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", range(6))
def test_every_block_once_in_order_and_shares_within_one_block(threads, seed):
    rng = numpy.random.default_rng(seed)
    count = int(rng.integers(0, 40))
    lengths = rng.integers(1, 400, count).astype(numpy.int64)
    check_split(lengths, threads)


def test_resnet50_28x28_blocks_split_evenly():
    # 28 rows of 28 an image, runs of 9, 9, 9 and 1 rows: every other block the short one
    _, _, lengths = conv.plan_blocks(32, 28, 28, 28, 1, 256)
    cost = work(lengths)
    strided = [sum(cost[t::2]) for t in range(2)]
    assert max(strided) / min(strided) > 1.5          # what striding gave
    shares = check_split(lengths, 2)
    assert max(shares) - min(shares) <= max(cost)


def test_fewer_blocks_than_threads():
    lengths = numpy.array([96], numpy.int64)
    parts = runs(lengths, 4)
    assert sum(len(r) for r in parts) == 1
