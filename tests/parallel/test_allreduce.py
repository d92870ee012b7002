"""Allreduce of every algorithm, any number of ranks: exact sums, identical bits, async, bcast.

The hierarchical allreduce ("hier") also runs on node groupings made up for the K ranks of this
one machine (``nodes=`` and per-rank ``CAFFE_NODE``): pairs (4 ranks: 2 nodes of 2; 3 ranks: 2
and 1), interleaved nodes, one rank per node, and one node for all.
"""
import hashlib

import numpy
import pytest

ALGORITHMS = ["tree", "ring", "ps", "mpi", "hier"]

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
    return {"chunk_bytes": SMALL_CHUNK} if name in ("tree", "hier") else {}


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


# -- the hierarchical allreduce on made-up nodes --------------------------------------------------
LAYOUTS = {
    "pairs": lambda r, size: r // 2,                 # 4 ranks: [0 0 1 1]; 3 ranks: [0 0 1]
    "interleaved": lambda r, size: f"h{r % 2}",      # [h0 h1 h0 h1]: a node's ranks not adjacent
    "one_per_node": lambda r, size: r,               # the inter-node algorithm alone
    "one_node": lambda r, size: 0,                   # reduce to rank 0, broadcast
}


def layout(name, size):
    return [LAYOUTS[name](r, size) for r in range(size)]


def make_hier(make, world, layout_name, inter, **opts):
    size = 1 if world is None else world.Get_size()
    return make(f"hier:{inter}", nodes=layout(layout_name, size), **opts)


def check_grouping(comm, labels):
    """The communicator's view of the nodes matches ``labels`` (one per rank)."""
    if comm.size == 1:
        return
    first = {}
    for r, label in enumerate(labels):
        first.setdefault(label, r)
    assert comm.leader == first[labels[comm.rank]]
    assert comm.members == [r for r, label in enumerate(labels) if label == labels[comm.rank]]
    assert comm.leaders == sorted(first.values())


@pytest.mark.parametrize("lanes", [None, 1])
@pytest.mark.parametrize("inter", ["ring", "tree"])
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_hier_sums_are_exact_on_any_grouping(world, make, layout_name, inter, lanes):
    """Every grouping, with a slice per rank of the smallest node (default) and with the
    paper's single leader per node (lanes=1)."""
    comm = make_hier(make, world, layout_name, inter, chunk_bytes=SMALL_CHUNK, lanes=lanes)
    check_grouping(comm, layout(layout_name, comm.size))
    if comm.size > 1:
        sizes = [layout(layout_name, comm.size).count(label)
                 for label in set(layout(layout_name, comm.size))]
        assert comm.lanes == (1 if lanes == 1 else min(sizes))
        assert comm.owners == comm.members[:comm.lanes]
    for n in SIZES + [5000]:
        buf = integer_data(n, comm.rank)
        comm.allreduce_(buf)
        numpy.testing.assert_array_equal(buf, expected_sum(n, comm.size))
    buf = integer_data(PRIME, comm.rank)
    comm.allreduce_(buf, op="mean")
    numpy.testing.assert_array_equal(
        buf, expected_sum(PRIME, comm.size) * numpy.float32(1.0 / comm.size))


@pytest.mark.parametrize("inter", ["ring", "tree"])
@pytest.mark.parametrize("layout_name", ["pairs", "interleaved"])
def test_hier_random_data_identical_bits_and_async(world, make, layout_name, inter):
    comm = make_hier(make, world, layout_name, inter, chunk_bytes=SMALL_CHUNK, window=1)
    rng = numpy.random.default_rng(4321 + comm.rank)
    data = rng.standard_normal(3001).astype(numpy.float32)
    blocking, in_flight = data.copy(), data.copy()
    handle = comm.allreduce_async_(in_flight)          # the progress thread's stream ...
    other = integer_data(77, comm.rank)
    comm.allreduce_(other)                             # ... beside a blocking call
    comm.allreduce_(blocking)
    assert handle.wait() is in_flight
    digests = comm.allgather_object((digest(blocking), digest(in_flight)))
    assert len(set(digests)) == 1, f"ranks disagree: {digests}"
    assert digest(blocking) == digest(in_flight)       # async and blocking: the same bits
    inputs = comm.allgather_object(data.astype(numpy.float64))
    numpy.testing.assert_allclose(blocking, sum(inputs), rtol=1e-5, atol=1e-5)
    numpy.testing.assert_array_equal(other, expected_sum(77, comm.size))


@pytest.mark.parametrize("inter", ["ring", "tree"])
def test_hier_buffer_larger_than_default_chunk(world, make, inter):
    comm = make_hier(make, world, "pairs", inter)      # default 4 MiB chunks: 2 of them
    n = (4 << 20) // 4 + 3
    buf = integer_data(n, comm.rank)
    comm.allreduce_(buf)
    numpy.testing.assert_array_equal(buf, expected_sum(n, comm.size))


def test_hier_groups_by_caffe_node(world, make, monkeypatch):
    """CAFFE_NODE per rank, as tools/netlab.py sets it: 4 ranks make 2 nodes of 2, 3 ranks 2
    nodes of 2 and 1 (all on this one machine, which the shared-memory split alone would make
    one node)."""
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    monkeypatch.setenv("CAFFE_NODE", f"h{rank * 2 // size}")
    comm = make("hier", chunk_bytes=SMALL_CHUNK)
    if size == 1:
        return
    assert comm.node_source == "CAFFE_NODE"
    check_grouping(comm, [f"h{r * 2 // size}" for r in range(size)])
    assert len(comm.leaders) == 2
    buf = integer_data(PRIME, comm.rank)
    comm.allreduce_(buf)
    numpy.testing.assert_array_equal(buf, expected_sum(PRIME, comm.size))


def test_hier_groups_by_host_without_caffe_node(world, make, monkeypatch):
    monkeypatch.delenv("CAFFE_NODE", raising=False)
    comm = make("hybrid")
    if comm.size > 1:
        assert comm.node_source == "host" and comm.leaders == [0]   # mpiexec on one machine
        assert comm.members == list(range(comm.size))


def test_hier_caffe_node_on_some_ranks_only_is_one_line_error_on_every_rank(world, make,
                                                                            monkeypatch):
    from caffe_engine.errors import CaffeError
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    if rank == 0:
        monkeypatch.setenv("CAFFE_NODE", "h0")
    else:
        monkeypatch.delenv("CAFFE_NODE", raising=False)
    if size == 1:
        make("hier")
        return
    with pytest.raises(CaffeError) as info:
        make("hier")
    assert str(info.value).startswith("CAFFE_NODE is set on rank(s) 0 but not on rank(s) 1")


def test_hier_lanes_from_the_environment_and_differing_lanes(world, make, monkeypatch):
    from caffe_engine.errors import CaffeError
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    monkeypatch.setenv("CAFFE_HIER_LANES", "2")
    comm = make("hier", nodes=[0] * size)             # one node: reduce-scatter, all-gather
    if size > 1:
        assert comm.lanes == 2 and comm.lane == (rank if rank < 2 else None)
    buf = integer_data(PRIME, comm.rank)
    comm.allreduce_(buf)
    numpy.testing.assert_array_equal(buf, expected_sum(PRIME, comm.size))
    if size == 1:
        return
    monkeypatch.setenv("CAFFE_HIER_LANES", str(1 + rank % 2))
    with pytest.raises(CaffeError, match="lanes differ between ranks"):
        make("hier", nodes=[0] * size)


def test_hier_nodes_differing_between_ranks_is_an_error_on_every_rank(world, make):
    from caffe_engine.errors import CaffeError
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    nodes = list(range(size)) if rank == 0 else [0] * size
    if size == 1:
        make("hier", nodes=nodes)
        return
    with pytest.raises(CaffeError, match="the nodes option differs between ranks"):
        make("hier", nodes=nodes)
