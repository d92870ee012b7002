"""Gradient compression over MPI (issue 17, item 1): ``none`` is the dense path bit for bit;
Top-k at density 1.0 is the parameter server's sum bit for bit (same rank order) and the tree's
within float32 rounding (bitwise for P <= 3); gTop-k at density 1.0 is the tree's sum bit for
bit; below density 1.0 every rank holds the same bits, runs repeat bit for bit, the sums match
the NumPy references, and the bytes counted meet the bounds.

Runs under ``mpiexec -n K python -m pytest tests/parallel/test_compressed_allreduce.py``
(K = 1..4) and without a launcher (one rank: the compressed path is not used, GradientSync has no
one to talk to, and the comparisons hold trivially).
"""
import hashlib
import logging
import math

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine.comm import compress, distributed
from caffe_engine.comm.buckets import GradientSync
from caffe_engine.comm.compress import Compression
from caffe_engine.comm.data_parallel import DataParallel
from caffe_engine.log import logger
from caffe_engine.proto import caffe_pb2
from caffe_engine import rng
from caffe_engine.net import TRAIN, Net
from caffe_engine.solvers import get_solver
from tiny_nets import MLP_NET, MLP_SOLVER, SYNC_NET

# SYNC_NET (tests/tiny_nets.py): a shared param, several buckets, rank-dependent data.


def setup_rank(comm):
    """The sync_net with rank 0's weights, forward done on this rank's own data."""
    rng.set_random_seed(1701)
    net = Net(text_format.Parse(SYNC_NET, caffe_pb2.NetParameter()), TRAIN)
    distributed.broadcast_params(net, comm)
    net.clear_param_diffs()
    r = numpy.random.default_rng(500 + comm.rank)
    net.blobs["data"].data[...] = r.standard_normal((4, 6)).astype(numpy.float32)
    net.blobs["label"].data[...] = r.standard_normal((4, 3)).astype(numpy.float32)
    net.forward_loss()
    return net


def diffs(net):
    return [b.diff.copy() for b in net.learnable_params]


def digest(arrays):
    return hashlib.sha1(b"".join(numpy.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()


NUM_RECORDS = 60
BATCH = 3


def _size(world):
    return 1 if world is None else world.Get_size()


@pytest.fixture
def source(tiny_lmdb):
    """A tiny LMDB (60 records of 1x4x4, labels 0..2) written by rank 0 where all ranks see it."""
    return tiny_lmdb(seed=17, num_records=NUM_RECORDS)


def solver_param(source, block=""):
    param = text_format.Parse(MLP_SOLVER % {"iter_size": 1}, caffe_pb2.SolverParameter())
    text_format.Merge(block, param)
    text_format.Parse(MLP_NET % {"source": source, "batch": BATCH}, param.net_param)
    return param


def train(comm, source, iters=8, block="", bucket_mb=25, **options):
    """``iters`` iterations of the tiny net on ``comm`` with DataParallel(``options``); returns
    (param digests, solver). debug_sync checks after every update that all ranks agree."""
    dp = DataParallel(comm, bucket_mb=bucket_mb, debug_sync=True, **options)
    solver = get_solver(solver_param(source, block), callbacks=[dp])
    solver.step(iters)
    return distributed.param_digests(solver.net), solver


def synced(comm, bucket_mb, compress_=None):
    """The sync_net's diffs after one GradientSync (fresh net, rank-dependent data)."""
    net = setup_rank(comm)
    net.backward_from_to()
    sync = GradientSync(net, comm, bucket_mb=bucket_mb, compress=compress_)
    sync.finish()
    return net, sync


def same_everywhere(comm, value):
    return len(set(comm.allgather_object(value))) == 1


# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tree", "ring"])
def test_none_is_the_dense_path_bit_for_bit(make, source, name):
    comm = make(name)
    net, sync = synced(comm, 0, "none")
    assert sync.compression is None and all(b.compressor is None for b in sync.buckets)
    plain = digest(diffs(synced(comm, 0)[0]))
    assert digest(diffs(net)) == plain
    with_none, solver = train(comm, source, compress="none")
    assert solver.callbacks[0].compression is None
    assert train(comm, source)[0] == with_none


@pytest.mark.parametrize("bucket_mb", [0, 25])
def test_density_one_equals_dense(make, bucket_mb):
    """Top-k: rank order = ps's order, bitwise; gTop-k: the tree's order, bitwise. Between the
    two (and Top-k vs tree) float32 rounding only: bitwise where the tree's order is the rank
    order (P <= 3), within a few ulps at P = 4 (tree: g0 + (g1 + g3) + g2)."""
    ps, tree = make("ps"), make("tree")
    size = tree.size
    dense_ps = diffs(synced(ps, bucket_mb)[0])
    dense_tree = diffs(synced(tree, bucket_mb)[0])
    topk = diffs(synced(tree, bucket_mb, Compression("topk", 1.0))[0])
    gtopk = diffs(synced(ps, bucket_mb, Compression("gtopk", 1.0))[0])   # --comm is moot
    assert digest(topk) == digest(dense_ps)
    assert digest(gtopk) == digest(dense_tree)
    for a, b in zip(topk, gtopk):
        if size <= 3:
            assert a.tobytes() == b.tobytes()
        else:
            numpy.testing.assert_allclose(a, b, rtol=4 * numpy.finfo(numpy.float32).eps,
                                          atol=1e-7)
    assert same_everywhere(tree, digest(topk)) and same_everywhere(tree, digest(gtopk))


def test_training_at_density_one_equals_dense(make, source):
    """Through the solver, with error feedback on (at k = n it keeps no residual)."""
    ps, tree = make("ps"), make("tree")
    assert train(tree, source, compress="topk", density=1.0)[0] == train(ps, source)[0]
    assert train(ps, source, compress="gtopk", density=1.0)[0] == train(tree, source)[0]


@pytest.mark.parametrize("method", ["topk", "gtopk"])
@pytest.mark.parametrize("feedback", [True, False])
def test_sparse_training_is_identical_on_every_rank_and_repeats(make, source, method,
                                                                feedback):
    comm = make("tree")
    # debug_sync inside train() raises on every rank at the first iteration where they differ.
    first, solver = train(comm, source, compress=method, density=0.05, error_feedback=feedback)
    sync = solver.callbacks[0].grad_sync
    assert sync.compression == Compression(method, 0.05, feedback)
    assert all(b.compressor.k == compress.k_for(b.count, 0.05) for b in sync.buckets)
    if comm.size > 1:
        assert sync.iterations == 8
        has_residual = [b.compressor.residual is not None for b in sync.buckets]
        assert all(has_residual) if feedback else not any(has_residual)
    assert train(comm, source, compress=method, density=0.05, error_feedback=feedback)[0] == first
    assert same_everywhere(comm, tuple(first))


def test_error_feedback_changes_the_result(make, source):
    comm = make("tree")
    on = train(comm, source, compress="gtopk", density=0.05)[0]
    off = train(comm, source, compress="gtopk", density=0.05, error_feedback=False)[0]
    if comm.size > 1:
        assert on != off


def test_fp16_training_is_identical_on_every_rank(make, source):
    comm = make("ring")
    first = train(comm, source, compress="fp16")[0]
    assert train(comm, source, compress="fp16")[0] == first


@pytest.mark.parametrize("bucket_mb", [0, 25])
def test_sums_match_the_numpy_references(make, bucket_mb):
    comm = make("tree")
    size = comm.size
    scale = numpy.float32(1.0 / size)
    net = setup_rank(comm)
    net.backward_from_to()
    everyone = comm.allgather_object(diffs(net))
    for settings in (Compression("gtopk", 0.3), Compression("topk", 0.3), Compression("fp16")):
        net = setup_rank(comm)
        net.backward_from_to()
        sync = GradientSync(net, comm, bucket_mb=bucket_mb, compress=settings)
        sync.finish()
        if size == 1:
            continue
        for bucket in sync.buckets:
            flats = [numpy.concatenate([d[k].reshape(-1) for k in bucket.params])
                     for d in everyone]
            if bucket.compressor.residual is not None:
                # What a rank selects from: its residual (zeros) + its gradient (-0.0 -> +0.0).
                flats = [numpy.zeros(bucket.count, numpy.float32) + f for f in flats]
            k = bucket.compressor.k
            if settings.method == "fp16":
                want = compress.fp16_reference(flats)
            else:
                sets = [(compress.topk_indices(f, k), f[compress.topk_indices(f, k)])
                        for f in flats]
                if settings.method == "gtopk":
                    idx, vals = compress.gtopk_reference(sets, k)
                else:
                    idx, vals = compress.merge_sparse(sets)
                want = numpy.zeros(bucket.count, numpy.float32)
                want[idx] = vals
            want *= scale
            got = numpy.concatenate([b.diff.reshape(-1) for b in bucket.blobs])
            assert got.tobytes() == want.tobytes(), settings


@pytest.mark.parametrize("method", ["gtopk", "topk", "fp16"])
def test_bytes_counted_meet_the_bounds(make, method):
    comm = make("tree")
    size, rank = comm.size, comm.rank
    net, sync = synced(comm, 0, Compression(method, 0.25))
    sent, received, messages = sync.traffic
    parent = 1 if rank > 0 else 0
    children = len([c for c in (2 * rank + 1, 2 * rank + 2) if c < size])
    if size == 1:
        assert sync.traffic == (0, 0, 0)
        return
    for bucket in sync.buckets:
        assert (bucket.compressor.count, bucket.compressor.k) == (
            bucket.count, compress.k_for(bucket.count, 0.25) if method != "fp16"
            else bucket.count)
    ks = [b.compressor.k for b in sync.buckets]
    if method == "gtopk":
        assert sent == sum(8 * k * (parent + children) for k in ks)
        assert received == sent
        bound = sum(compress.gtopk_bound(k, size) for k in ks)
        assert sent <= bound and received <= bound
    elif method == "topk":
        assert sent == received == sum(compress.topk_bytes(k, size) for k in ks)
    else:
        assert sent == received == sum(2 * b.count * (parent + children) for b in sync.buckets)
    assert messages == len(ks) * ((parent + children) if method != "topk" else size - 1)


def test_solver_block_sets_compression_and_flags_override(make, source):
    comm = make("tree")
    block = 'comm_param { compress: "gtopk" density: 0.05 error_feedback: false }'
    _, solver = train(comm, source, iters=2, block=block)
    assert solver.callbacks[0].compression == Compression("gtopk", 0.05, False)
    _, solver = train(comm, source, iters=2, block=block, compress="topk", error_feedback=True)
    assert solver.callbacks[0].compression == Compression("topk", 0.05, True)
    _, solver = train(comm, source, iters=2, block=block, compress="none")
    assert solver.callbacks[0].compression is None


def test_log_lines(make, source):
    comm = make("tree")
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        _, solver = train(comm, source, iters=4, block="display: 2", compress="gtopk",
                          density=0.05)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    n = sum(b.count for b in solver.net.learnable_params)     # 203 in one bucket
    k = compress.k_for(n, 0.05)                                 # 11
    start = [x for x in lines if x.startswith("Data parallel:")]
    assert start and start[0].endswith(
        f"gradients compressed: gtopk, density 0.05, error feedback on (k = {k} of {n} values)")
    traffic = [x for x in lines if "gradient traffic" in x]
    if comm.size > 1:
        assert [x.split(",")[0] for x in traffic] == ["Iteration 2", "Iteration 4"]
        busiest = float(traffic[0].split(": ")[1].split()[0])
        assert 0 < busiest <= compress.gtopk_bound(k, comm.size)
        assert traffic[0].endswith("a dense ring allreduce sends %.0f"
                                   % compress.dense_ring_bytes(n, comm.size))
    else:
        assert traffic == []


def test_bound_formula():
    assert compress.gtopk_bound(10, 8) == 2 * 10 * 3 * 8
    assert compress.dense_ring_bytes(1000, 8) == 2 * 7 / 8 * 1000 * 4
    assert math.isclose(compress.gtopk_bound(1, 3), 16 * math.log2(3))
