"""Model-parallel (PCL-DNN hybrid) InnerProduct on one process: the slicing helpers, G = 1 (the
plain layer's bits), and G = 2..4 ranks emulated by threads over an in-process group, each
compared with one plain layer on the concatenated batch (the MPI version of the last is
tests/parallel/test_hybrid_inner_product.py).

Tolerance for G > 1: see tests/hybrid_ip.py (rtol 1e-5, atol 1e-5).
"""
import threading

import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.errors import CaffeError
from caffe_engine.layers.model_parallel import (GroupCollectives, LocalGroup, gather_param,
                                                slice_bounds, slice_param)
from hybrid_ip import ATOL, CASES, RTOL, assert_rows, make_ip, rank_data, reference, run_layer


# -- slice_bounds / slice_param / gather_param -------------------------------------------------
@pytest.mark.parametrize("size", range(1, 7))
def test_slice_bounds_follow_array_split(size):
    for n in range(0, 14):
        want = [(int(p[0]), int(p[-1]) + 1) if len(p) else None
                for p in numpy.array_split(numpy.arange(n), size)]
        got = [slice_bounds(n, size, s) for s in range(size)]
        assert [b for b, w in zip(got, want) if w is not None] == [w for w in want if w]
        assert got[0][0] == 0 and got[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))


@pytest.mark.parametrize("args", [(5, 0, 0), (5, 2, 2), (5, 2, -1), (-1, 2, 0)])
def test_slice_bounds_refuses_undefined_slices(args):
    with pytest.raises(CaffeError, match="undefined"):
        slice_bounds(*args)


@pytest.mark.parametrize("transpose", [False, True])
def test_slice_param_cuts_the_neuron_axis(transpose):
    n, k, size = 7, 3, 3
    w = numpy.arange(n * k, dtype=numpy.float32).reshape((k, n) if transpose else (n, k))
    b = numpy.arange(n, dtype=numpy.float32)
    parts = [slice_param(w, n, size, s, transpose, "weight") for s in range(size)]
    assert all(p.flags.c_contiguous for p in parts)
    assert numpy.array_equal(numpy.concatenate(parts, axis=1 if transpose else 0), w)
    biases = [slice_param(b, n, size, s, transpose, "bias") for s in range(size)]
    assert [len(p) for p in biases] == [3, 2, 2]
    assert numpy.array_equal(numpy.concatenate(biases), b)
    with pytest.raises(CaffeError, match="num_output 8"):
        slice_param(w, 8, size, 0, transpose, "weight")
    with pytest.raises(CaffeError, match="which"):
        slice_param(b, n, size, 0, transpose, "filter")


def test_gather_param_on_one_rank_is_the_param():
    w = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    for transpose in (False, True):
        got = gather_param(LocalGroup(), w, transpose, "weight")
        assert numpy.array_equal(got, w) and got is not w


# -- an in-process group: G threads, one per rank -------------------------------------------
class ThreadGroup(GroupCollectives):
    """GroupCollectives over G threads of this process (a test double of the MPI group)."""

    def __init__(self, board, rank):
        self.board, self.rank, self.size = board, rank, board["size"]

    def _exchange(self, item):
        board = self.board
        board["slots"][self.rank] = item
        board["barrier"].wait()
        items = list(board["slots"])
        board["barrier"].wait()
        return items

    def allgather_rows(self, x, out=None):
        rows = numpy.concatenate(self._exchange(x.copy()))
        return _into(out, rows)

    def alltoall_rows(self, blocks, out=None):
        sent = self._exchange([b.copy() for b in blocks])
        got = [sent[j][self.rank] for j in range(self.size)]
        return got if out is None else [_into(o, g) for o, g in zip(out, got)]

    def reduce_scatter_rows(self, x, out=None):
        everyone = self._exchange(x.copy())
        m = x.shape[0] // self.size
        total = everyone[0][self.rank * m:(self.rank + 1) * m].copy()
        for other in everyone[1:]:
            total += other[self.rank * m:(self.rank + 1) * m]
        return _into(out, total)

    def allgather_arrays(self, x, axis):
        return numpy.concatenate(self._exchange(x.copy()), axis=axis)


def _into(out, x):
    if out is None:
        return x
    out[...] = x
    return out


def thread_groups(size):
    board = {"size": size, "slots": [None] * size, "barrier": threading.Barrier(size, timeout=60)}
    return [ThreadGroup(board, r) for r in range(size)]


def run_ranks(size, fn):
    """``fn(group)`` on ``size`` threads; their results in rank order (re-raises a failure)."""
    groups = thread_groups(size)
    results, errors = [None] * size, []

    def body(r):
        try:
            results[r] = fn(groups[r])
        except BaseException as exc:  # noqa: BLE001 -- handed to the test
            errors.append(exc)
            groups[r].board["barrier"].abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


# -- the layer ---------------------------------------------------------------------------------
@pytest.fixture
def reference_kernels():
    """The threads share one kernel set: the stateless reference set."""
    previous = kernels.use("reference")
    yield
    kernels.use(previous)


def hybrid_rank(ip, shape, propagate_down=True, lr=(True, True)):
    def fn(group):
        layer, bottom, top = make_ip(ip, shape)
        layer.param_propagate_down = list(lr[:len(layer.blobs)])
        layer.set_model_parallel(group)
        x, dy = rank_data(shape, top.shape, group.rank)
        y, dx = run_layer(layer, bottom, top, x, dy, propagate_down)
        return y, dx, layer.gather_params(diff=True), layer.gather_params(), layer
    return fn


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_threaded_group_equals_one_layer_on_the_whole_batch(case, size, reference_kernels):
    ip, shape = CASES[case]
    want_y, want_dx, want_diffs, top_shape = reference(ip, shape, size)
    full, _, _ = make_ip(ip, shape)
    results = run_ranks(size, hybrid_rank(ip, shape))
    m = shape[0]
    for r, (y, dx, diffs, params, layer) in enumerate(results):
        assert y.shape == top_shape
        assert_rows(y, want_y, r, m)
        assert_rows(dx, want_dx, r, m)
        for got, want in zip(diffs, want_diffs):
            numpy.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        for got, blob in zip(params, full.blobs):
            assert numpy.array_equal(got, blob.data)
        assert layer.full_num_output == full.num_output and layer.model_parallel is not None


@pytest.mark.parametrize("propagate_down, lr", [(False, (True, True)), (True, (False, False)),
                                                (False, (False, True))])
def test_threaded_group_skips_what_is_not_asked(propagate_down, lr, reference_kernels):
    ip, shape = CASES["uneven"]
    want_y, want_dx, want_diffs, _ = reference(ip, shape, 3, propagate_down, lr)
    for r, (y, dx, diffs, _, _) in enumerate(run_ranks(3, hybrid_rank(ip, shape,
                                                                      propagate_down, lr))):
        assert_rows(y, want_y, r, 3)
        assert_rows(dx, want_dx, r, 3)
        assert propagate_down or (dx == 7.0).all()
        for got, want, need in zip(diffs, want_diffs, lr):
            numpy.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
            assert need or not got.any()


@pytest.mark.parametrize("group", [None, LocalGroup()], ids=["none", "local"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_group_of_one_is_the_plain_layer_bit_for_bit(case, group, kernel_set):
    ip, shape = CASES[case]
    plain, pb, pt = make_ip(ip, shape)
    one, ob, ot = make_ip(ip, shape)
    one.set_model_parallel(group)
    assert one.model_parallel is None
    x, dy = rank_data(shape, pt.shape, 0)   # the blobs may live on the GPU (kernel_set "cuda")
    for got, want in zip(run_layer(one, ob, ot, x, dy), run_layer(plain, pb, pt, x, dy)):
        assert numpy.array_equal(_host(got), _host(want))
    for a, b, gathered in zip(one.blobs, plain.blobs, one.gather_params(diff=True)):
        assert numpy.array_equal(_host(a.diff), _host(b.diff))
        assert numpy.array_equal(_host(gathered), _host(b.diff))


def _host(a):
    return a.get() if hasattr(a, "get") else a


def test_set_model_parallel_refuses_a_second_group_and_too_many_ranks():
    layer, _, _ = make_ip("num_output: 3", (2, 4))
    groups = thread_groups(2)
    layer.set_model_parallel(groups[0])
    layer.set_model_parallel(groups[0])            # the same group again: nothing happens
    assert layer.blobs[0].shape == (2, 4) and layer.blobs[1].shape == (2,)
    for other in (None, LocalGroup(), thread_groups(2)[0]):
        with pytest.raises(CaffeError, match="already model parallel over a group of 2"):
            layer.set_model_parallel(other)
    small, _, _ = make_ip("num_output: 3", (2, 4))
    with pytest.raises(CaffeError, match="larger than num_output 3"):
        small.set_model_parallel(thread_groups(4)[0])
