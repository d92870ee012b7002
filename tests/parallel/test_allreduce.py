"""Allreduce of every algorithm, any number of ranks: exact sums, identical bits, async, bcast."""
import hashlib

import numpy
import pytest

ALGORITHMS = ["tree", "ring", "ps", "mpi"]

PRIME = 1009
# Sizes: empty, one element, a prime, more than one tree chunk (tree gets 256-byte chunks here),
# and a buffer above the default 4 MiB chunk (exercised once per algorithm).
SIZES = [0, 1, PRIME, 3 * 64 + 5]
SMALL_CHUNK = 256


def integer_data(n, rank):
    """Small integers (exact in float32 whatever the summation order)."""
    return ((numpy.arange(n) * 7 + rank * 13) % 101).astype(numpy.float32)


def expected_sum(n, size):
    return sum(integer_data(n, r).astype(numpy.float64) for r in range(size)).astype(numpy.float32)


def opts_for(name):
    return {"chunk_bytes": SMALL_CHUNK} if name == "tree" else {}


def digest(a):
    return hashlib.sha1(numpy.ascontiguousarray(a).tobytes()).hexdigest()


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("n", SIZES)
def test_sum_is_exact(make, name, n):
    comm = make(name, **opts_for(name))
    buf = integer_data(n, comm.rank)
    out = comm.allreduce_(buf)
    assert out is buf
    numpy.testing.assert_array_equal(buf, expected_sum(n, comm.size))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_mean_scales_by_one_over_size(make, name):
    comm = make(name, **opts_for(name))
    buf = integer_data(PRIME, comm.rank)
    comm.allreduce_(buf, op="mean")
    want = expected_sum(PRIME, comm.size) * numpy.float32(1.0 / comm.size)
    numpy.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_buffer_larger_than_default_chunk(make, name):
    comm = make(name)                                    # default 4 MiB tree chunks
    n = (4 << 20) // 4 + 3
    buf = integer_data(n, comm.rank)
    comm.allreduce_(buf)
    numpy.testing.assert_array_equal(buf, expected_sum(n, comm.size))


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("n", [PRIME, 5000])
def test_random_data_identical_bits_on_every_rank(make, name, n):
    comm = make(name, **opts_for(name))
    rng = numpy.random.default_rng(1234 + comm.rank)
    buf = rng.standard_normal(n).astype(numpy.float32)
    mine = buf.astype(numpy.float64)
    comm.allreduce_(buf)
    digests = comm.allgather_object(digest(buf))
    inputs = comm.allgather_object(mine)
    assert len(set(digests)) == 1, f"ranks disagree: {digests}"
    numpy.testing.assert_allclose(buf, sum(inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_runs_are_reproducible(make, name):
    comm = make(name, **opts_for(name))
    rng = numpy.random.default_rng(99 + comm.rank)
    data = rng.standard_normal(777).astype(numpy.float32)
    a, b = data.copy(), data.copy()
    comm.allreduce_(a)
    comm.allreduce_(b)
    assert digest(a) == digest(b)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_async_several_in_flight(make, name):
    comm = make(name, **opts_for(name))
    sizes = [PRIME, 0, 1, 3000]
    bufs = [integer_data(n, comm.rank) for n in sizes]
    handles = [comm.allreduce_async_(b) for b in bufs]
    # A blocking call on the main thread while the progress thread works (separate comms).
    other = integer_data(50, comm.rank)
    comm.allreduce_(other)
    results = [h.wait() for h in handles]
    for n, b, r in zip(sizes, bufs, results):
        assert r is b
        numpy.testing.assert_array_equal(b, expected_sum(n, comm.size))
    numpy.testing.assert_array_equal(other, expected_sum(50, comm.size))
    assert all(h.done() for h in handles)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_async_mean_matches_blocking_mean(make, name):
    comm = make(name, **opts_for(name))
    rng = numpy.random.default_rng(7 + comm.rank)
    data = rng.standard_normal(PRIME).astype(numpy.float32)
    a, b = data.copy(), data.copy()
    comm.allreduce_async_(a, op="mean").wait()
    comm.allreduce_(b, op="mean")
    assert digest(a) == digest(b)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_bcast_barrier_allgather(make, name):
    comm = make(name)
    buf = numpy.full(17, comm.rank + 1, numpy.float32)
    root = comm.size - 1
    comm.bcast_(buf, root=root)
    comm.barrier()
    ranks = comm.allgather_object(comm.rank)
    numpy.testing.assert_array_equal(buf, numpy.full(17, root + 1, numpy.float32))
    assert ranks == list(range(comm.size))


@pytest.mark.parametrize("branching", [2, 3, 4])
def test_tree_branching(make, branching):
    comm = make("tree", branching=branching, chunk_bytes=64)
    buf = integer_data(PRIME, comm.rank)
    comm.allreduce_(buf)
    numpy.testing.assert_array_equal(buf, expected_sum(PRIME, comm.size))


def test_bad_buffers_are_one_line_errors(make):
    from caffe_engine.errors import CaffeError
    comm = make("tree")
    with pytest.raises(CaffeError, match="float32"):
        comm.allreduce_(numpy.zeros(3, numpy.float64))
    with pytest.raises(CaffeError, match="contiguous"):
        comm.allreduce_(numpy.zeros((4, 4), numpy.float32)[:, 1])
    with pytest.raises(CaffeError, match="op"):
        comm.allreduce_(numpy.zeros(3, numpy.float32), op="max")
