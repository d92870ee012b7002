"""Gradient compression without MPI (caffe_engine/comm/compress.py): selection and its tie-break,
the sparse merge and its summation order, residual bookkeeping (error feedback on and off),
fp16's rounding points, the settings and their one-line errors, the solver block and the CLI
checks. The MPI side is tests/parallel/test_compressed_allreduce.py."""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import cli
from caffe_engine.comm import compress
from caffe_engine.comm.communicator import LocalCommunicator
from caffe_engine.comm.compress import (Compression, fp16_reference,
                                        gtopk_reference, k_for, merge_sparse, merge_topk,
                                        pack, topk_indices, unpack)
from caffe_engine.errors import CaffeError
from caffe_engine.proto import caffe_pb2

f32 = numpy.float32


def test_topk_picks_largest_magnitudes_sorted_by_index():
    v = numpy.array([0.1, -5, 3, 0, -0.2, 4, -3.5], f32)
    idx = topk_indices(v, 3)
    assert idx.dtype == numpy.int32
    assert idx.tolist() == [1, 5, 6]
    assert topk_indices(v, 7).tolist() == list(range(7))
    assert topk_indices(v, 99).tolist() == list(range(7))


def test_topk_tie_break_is_lowest_index():
    v = numpy.array([1, -2, 2, 1, -2, 2, 0.5], f32)
    assert topk_indices(v, 2).tolist() == [1, 2]        # four entries of magnitude 2
    assert topk_indices(v, 3).tolist() == [1, 2, 4]
    assert topk_indices(v, 5).tolist() == [0, 1, 2, 4, 5]
    ones = numpy.ones(1000, f32)
    assert topk_indices(ones, 10).tolist() == list(range(10))


def test_topk_nan_counts_as_largest():
    v = numpy.array([1, numpy.nan, 3, -4], f32)
    assert topk_indices(v, 2).tolist() == [1, 3]
    assert not numpy.isnan(v[0])          # the input is untouched


def test_k_for_density():
    proto_density = float(f32(0.001))     # what a prototxt's float holds: 0.0010000000475
    d = compress.check_density(proto_density)
    assert d == 0.001
    assert k_for(1000, d) == 1 and k_for(1001, d) == 2 and k_for(10, d) == 1
    assert k_for(431080, d) == 432
    assert k_for(7, 1.0) == 7 and k_for(0, 0.5) == 0


def test_settings_errors_are_one_line():
    for bad in ("zip", "", "TOPK"):
        with pytest.raises(CaffeError, match="must be none, fp16, topk or gtopk") as info:
            Compression(bad)
        assert "\n" not in str(info.value)
    for bad in (0, -0.1, 1.5, "x", float("nan")):
        with pytest.raises(CaffeError, match=r"density must be (in|a number in) \(0, 1\]"):
            Compression("topk", bad)


def test_merge_sparse_sums_in_part_order_and_keeps_negative_zero():
    a = (numpy.array([0, 3, 5], numpy.int32), numpy.array([-0.0, 1, 2], f32))
    b = (numpy.array([3, 4], numpy.int32), numpy.array([10, 20], f32))
    c = (numpy.array([0, 4], numpy.int32), numpy.array([7, 1], f32))
    idx, vals = merge_sparse([a, b, c])
    assert idx.tolist() == [0, 3, 4, 5]
    assert vals.tolist() == [7, 11, 21, 2]
    idx, vals = merge_sparse([a, b])
    assert numpy.signbit(vals[0]) and vals[0] == 0     # copied, not 0 + (-0) = +0
    # Summation order: (x + y) + z as the dense tree adds own + child 1 + child 2.
    x, y, z = f32(1e8), f32(-1e8), f32(1.0)
    one = numpy.array([0], numpy.int32)
    got = merge_sparse([(one, numpy.array([x], f32)), (one, numpy.array([y], f32)),
                        (one, numpy.array([z], f32))])[1][0]
    assert got == (x + y) + z == f32(1)


def test_merge_topk_keeps_global_top_k_of_union():
    a = (numpy.array([0, 1], numpy.int32), numpy.array([5, 1], f32))
    b = (numpy.array([1, 2], numpy.int32), numpy.array([3, -4], f32))
    idx, vals = merge_topk([a, b], 2)
    # The union: 0 -> 5, 1 -> 1 + 3 = 4, 2 -> -4; |4| ties and the lower index wins.
    assert idx.tolist() == [0, 1] and vals.tolist() == [5, 4]
    idx, vals = merge_topk([a, (b[0], numpy.array([3, -4.5], f32))], 2)
    assert idx.tolist() == [0, 2] and vals.tolist() == [5, -4.5]


def test_wire_format_round_trip():
    idx = numpy.array([2, 9, 11], numpy.int32)
    vals = numpy.array([-0.0, 1.5, numpy.inf], f32)
    wire = pack(idx, vals)
    assert wire.dtype == numpy.int32 and wire.nbytes == 3 * compress.ENTRY_BYTES
    back_i, back_v = unpack(wire)
    assert back_i.tolist() == idx.tolist() and back_v.tobytes() == vals.tobytes()


def _local_run(settings, grads):
    """Run one BucketCompressor alone (a world of one) over ``grads``; return what was sent
    each step (dense) and the compressor."""
    comp = settings.for_bucket(grads[0].size)
    sent = []
    for g in grads:
        buf = g.copy()
        LocalCommunicator().allreduce_compressed_(buf, comp, op="sum")
        sent.append(buf)
    return sent, comp


def test_error_feedback_conserves_every_gradient():
    r = numpy.random.default_rng(3)
    # Small integers: float32 sums are exact, so the bookkeeping can be checked exactly.
    grads = [r.integers(-20, 20, 50).astype(f32) for _ in range(12)]
    sent, comp = _local_run(Compression("topk", 0.1), grads)
    assert comp.k == 5
    for s in sent:
        assert numpy.count_nonzero(s) <= 5
    numpy.testing.assert_array_equal(sum(sent) + comp.residual, sum(grads))
    # Step 1: the top 5 of the gradient itself; the rest is in the residual.
    first = _local_run(Compression("topk", 0.1), grads[:1])
    top = topk_indices(grads[0], 5)
    assert numpy.flatnonzero(first[0][0]).tolist() == [i for i in top if grads[0][i] != 0]
    expect = grads[0].copy()
    expect[top] = 0
    numpy.testing.assert_array_equal(first[1].residual, expect)


def test_error_feedback_off_drops_what_is_not_sent():
    r = numpy.random.default_rng(4)
    grads = [r.standard_normal(40).astype(f32) for _ in range(3)]
    sent, comp = _local_run(Compression("topk", 0.1, error_feedback=False), grads)
    assert comp.residual is None
    for g, s in zip(grads, sent):
        keep = topk_indices(g, 4)
        want = numpy.zeros_like(g)
        want[keep] = g[keep]
        numpy.testing.assert_array_equal(s, want)


def test_density_one_is_the_gradient_bit_for_bit():
    g = numpy.array([-0.0, 1e-30, -3, 7.25], f32)
    for method in ("topk", "gtopk"):
        sent, comp = _local_run(Compression(method, 1.0), [g, g])
        assert comp.residual is None and comp.k == 4
        assert all(s.tobytes() == g.tobytes() for s in sent)


def test_gtopk_gives_back_what_the_global_set_dropped():
    comp = Compression("gtopk", 0.5).for_bucket(4)
    flat = numpy.array([4, -3, 2, 1], f32)
    idx, vals = comp.select(flat)
    assert idx.tolist() == [0, 1] and comp.residual.tolist() == [0, 0, 2, 1]
    comp.give_back(idx, vals, numpy.array([0, 2], numpy.int32))
    assert comp.residual.tolist() == [0, -3, 2, 1]


def test_gtopk_reference_at_density_one_is_the_tree_sum():
    r = numpy.random.default_rng(5)
    bufs = [(r.standard_normal(64) * 10.0 ** r.integers(-3, 3)).astype(f32) for _ in range(7)]
    sets = [(numpy.arange(64, dtype=numpy.int32), b) for b in bufs]
    idx, vals = gtopk_reference(sets, 64)

    def tree(rank):         # FireCaffe's tree order: own + child 1 + child 2, leaves first
        acc = bufs[rank].copy()
        for c in (2 * rank + 1, 2 * rank + 2):
            if c < 7:
                acc += tree(c)
        return acc

    assert vals.tobytes() == tree(0).tobytes()
    # Below density 1 the global set holds k entries, drawn from the ranks' own sets.
    sets = [(topk_indices(b, 4), b[topk_indices(b, 4)]) for b in bufs]
    idx, vals = gtopk_reference(sets, 4)
    assert idx.size == 4 and set(idx.tolist()) <= set(numpy.concatenate([s[0] for s in sets]))


def test_fp16_rounding_points():
    # 1 + 2**-11 is not a float16 (half-way: rounds to even, 1.0); 2**-11 alone is one.
    tiny = f32(2.0 ** -11)
    leaf = numpy.array([tiny], f32)
    root = numpy.array([1.0], f32)
    # Two ranks: rank 1 (a leaf) rounds its own value onto the wire: 2**-11 exactly; the root
    # adds in float32 (1 + 2**-11, exact) and rounds the total once for the broadcast: 1.0.
    assert fp16_reference([root, leaf])[0] == f32(1.0)
    # The root's own value is not rounded before the add: 1 + 2**-11 + 2**-11 = 1 + 2**-10,
    # a float16, survives.
    assert fp16_reference([root, leaf, leaf])[0] == f32(1 + 2.0 ** -10)
    # A leaf's own value is rounded: 2**-25 flushes to 0 in float16 (below its subnormals).
    assert fp16_reference([numpy.array([0.0], f32), numpy.array([2.0 ** -25], f32)])[0] == 0
    # The one-rank path: the total is rounded once (the root's broadcast rounding).
    comp = Compression("fp16").for_bucket(2)
    buf = numpy.array([1 + 2.0 ** -12, 70000], f32)
    with pytest.warns(RuntimeWarning, match="overflow"):    # numpy's, once per place
        LocalCommunicator().allreduce_compressed_(buf, comp, op="sum")
    assert buf[0] == 1 and numpy.isinf(buf[1])
    assert comp.sent == comp.received == 0


def test_from_param_block_and_overrides():
    param = caffe_pb2.SolverParameter()
    assert compress.from_param(param) is None
    assert param.comm_param.compress == "none" and param.comm_param.error_feedback
    assert abs(param.comm_param.density - 0.001) < 1e-9
    field = caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name["comm_param"]
    assert field.number >= 1000
    text_format.Parse('comm_param { compress: "gtopk" density: 0.01 error_feedback: false }',
                      param)
    got = compress.from_param(param)
    assert got == Compression("gtopk", 0.01, False)
    want = Compression("topk", 1.0, False)
    assert compress.from_param(param, method="topk", density=1.0) == want
    assert compress.from_param(param, method="none") is None
    param.comm_param.compress = "zip"
    with pytest.raises(CaffeError, match="comm_param: compress must be none, fp16"):
        compress.from_param(param)
    param.comm_param.compress = "topk"
    param.comm_param.density = 0
    with pytest.raises(CaffeError, match=r"comm_param: density must be in \(0, 1\]"):
        compress.from_param(param)


@pytest.mark.parametrize("args, message", [
    (["--comm_compress", "zip"], "caffe: --comm_compress must be none, fp16, topk or gtopk, "
                                 "got 'zip'"),
    (["--comm_density", "0"], "caffe: --comm_density must be in (0, 1], got 0.0"),
    (["--comm_density", "2"], "caffe: --comm_density must be in (0, 1], got 2.0"),
    (["--comm_compress", "gtopk", "--comm", "nccl"],
     "caffe: --comm_compress needs an MPI communicator (tree, ring, ps, mpi, hier), not nccl"),
])
def test_cli_rejects_bad_compression_before_mpi(capsys, args, message):
    status = cli.main(["train", "--solver", "whatever.prototxt", *args])
    assert status == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [message], err


def test_cli_flags_parse():
    _, flags = cli.parse_flags(["--comm_compress=gtopk", "--comm_density", "0.01",
                                "--nocomm_error_feedback"])
    assert (flags["comm_compress"], flags["comm_density"], flags["comm_error_feedback"]) == (
        "gtopk", 0.01, False)
    _, flags = cli.parse_flags([])
    assert flags["comm_compress"] is None and flags["comm_density"] is None
