"""PCL-DNN's hybrid InnerProduct under MPI: for every group size G dividing the world size
(G = 1..4 under ``mpiexec -n 1..4``), each rank's top and bottom diff equal its rows of one plain
layer on the concatenation of every rank's batch, and the param diffs, gathered over the group
and summed over the replicas, equal that layer's; the group collectives and HybridGroups alone.

Tolerance: tests/hybrid_ip.py (rtol 1e-5, atol 1e-5: float32 reordering).
"""
import numpy
import pytest

import fake_cupy
from caffe_engine import backend
from caffe_engine.comm.hier import group_nodes
from caffe_engine.comm.model_parallel import HybridGroups
from caffe_engine.errors import CaffeError
from hybrid_ip import ATOL, CASES, RTOL, assert_rows, make_ip, rank_data, reference, run_layer

GROUP_SIZES = [1, 2, 3, 4]


def hybrid_pass(comm, group_size, ip, shape, propagate_down=True, lr=(True, True)):
    """One rank's hybrid layer: (top, bottom diff, param diffs summed over the world, params)."""
    groups = HybridGroups(comm, group_size)
    try:
        layer, bottom, top = make_ip(ip, shape)
        layer.param_propagate_down = list(lr[:len(layer.blobs)])
        layer.set_model_parallel(groups.collectives)
        x, dy = rank_data(shape, top.shape, comm.rank)
        y, dx = run_layer(layer, bottom, top, x, dy, propagate_down)
        diffs = layer.gather_params(diff=True)
        for d in diffs:
            groups.replicas.allreduce_(d, op="sum")
        return y, dx, diffs, layer.gather_params()
    finally:
        groups.close()


def check_against_one_layer(comm, group_size, case, propagate_down=True, lr=(True, True)):
    ip, shape = CASES[case]
    y, dx, diffs, params = hybrid_pass(comm, group_size, ip, shape, propagate_down, lr)
    want_y, want_dx, want_diffs, top_shape = reference(ip, shape, comm.size, propagate_down, lr)
    full, _, _ = make_ip(ip, shape)
    assert y.shape == top_shape
    assert_rows(y, want_y, comm.rank, shape[0])
    assert_rows(dx, want_dx, comm.rank, shape[0])
    assert propagate_down or (dx == 7.0).all()
    for got, want, need in zip(diffs, want_diffs, lr):
        numpy.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        assert need or not got.any()
    for got, blob in zip(params, full.blobs):
        assert numpy.array_equal(got, blob.data)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_hybrid_equals_one_layer_on_the_whole_batch(make, group_size, case):
    comm = make("tree")
    if comm.size % group_size:
        pytest.skip(f"G = {group_size} does not divide {comm.size} ranks")
    check_against_one_layer(comm, group_size, case)


@pytest.mark.parametrize("propagate_down, lr", [(False, (True, True)), (True, (False, False)),
                                                (False, (False, True))])
def test_hybrid_skips_what_is_not_asked(make, propagate_down, lr):
    comm = make("tree")
    check_against_one_layer(comm, comm.size, "uneven", propagate_down, lr)


def test_hybrid_on_device_arrays_stages_through_the_host(make, monkeypatch):
    """GPU mode on the fake CuPy (tests/fake_cupy: refuses implicit host/device mixing): the
    layer's exchanges take device arrays, the MPI group stages them through host memory."""
    from caffe_engine.kernels.cuda.emulator import compiler_missing
    comm = make("tree")
    missing = compiler_missing()
    if missing:
        pytest.skip(missing)
    ip, shape = CASES["transpose_axis2_uneven"]
    fake_cupy.install(monkeypatch)
    fake_cupy.forget_device_state()
    assert backend.set_mode_gpu()
    try:
        y, dx, diffs, params = hybrid_pass(comm, comm.size, ip, shape)
        y, dx, diffs, params = (y.get(), dx.get(), [d.get() for d in diffs],
                                [p.get() for p in params])
    finally:
        backend.set_mode_cpu()
        fake_cupy.forget_device_state()
    want_y, want_dx, want_diffs, _ = reference(ip, shape, comm.size)
    assert_rows(y, want_y, comm.rank, shape[0])
    assert_rows(dx, want_dx, comm.rank, shape[0])
    for got, want in zip(diffs, want_diffs):
        numpy.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["ring", "ps", "mpi", "hier"])
def test_replicas_run_the_worlds_algorithm(make, name):
    comm = make(name)
    group_size = 2 if comm.size % 2 == 0 else 1
    groups = HybridGroups(comm, group_size)
    try:
        replicas = groups.replicas
        assert replicas.size == comm.size // group_size
        if group_size == 1:
            assert replicas is comm
        else:
            assert replicas.name == (name if replicas.size > 1 else "local")
        buf = numpy.full(3, comm.rank, numpy.float32)
        replicas.allreduce_(buf, op="sum")
        assert (buf == sum(groups.replica_members)).all()
    finally:
        groups.close()
    check_against_one_layer(comm, group_size, "transpose")


@pytest.mark.parametrize("name, opts, kept", [
    ("tree", {"branching": 3, "chunk_bytes": 4096, "window": 3},
     {"branching": 3, "chunk_elems": 1024, "window": 3}),
    ("hier", {"inter": "tree", "chunk_bytes": 8192, "window": 4},
     {"inter": "tree", "chunk_bytes": 8192, "window": 4})])
def test_replicas_keep_the_worlds_options(make, name, opts, kept):
    comm = make(name, **opts)
    group_size = 2 if comm.size % 2 == 0 else 1
    groups = HybridGroups(comm, group_size)
    try:
        replicas = groups.replicas
        if replicas.size > 1:
            assert replicas.name == name
            assert {key: getattr(replicas, key) for key in kept} == kept
            assert replicas.timeout == comm.timeout
            if name == "hier":   # replicas on one world node share a node (renumbered)
                assert replicas.node_of == group_nodes(
                    [comm.node_of[r] for r in groups.replica_members])
        buf = numpy.full(5, comm.rank + 1, numpy.float32)
        replicas.allreduce_(buf, op="sum")
        assert (buf == sum(r + 1 for r in groups.replica_members)).all()
    finally:
        groups.close()


@pytest.mark.parametrize("group_size", GROUP_SIZES)
def test_group_collectives(make, group_size):
    comm = make("tree")
    if comm.size % group_size:
        pytest.skip(f"G = {group_size} does not divide {comm.size} ranks")
    groups = HybridGroups(comm, group_size)
    try:
        g = groups.collectives
        assert (g.rank, g.size) == (comm.rank % group_size, group_size)
        assert (groups.group_index, groups.group_rank) == divmod(comm.rank, group_size)
        assert groups.members == list(range(groups.group_index * group_size,
                                            (groups.group_index + 1) * group_size))
        x = numpy.full((2, 3), comm.rank, numpy.float32)
        rows = g.allgather_rows(x)
        assert (rows[:, 0] == numpy.repeat(groups.members, 2)).all()
        # blocks[j] to rank j: (j + 1) rows of my rank + 10 * j
        got = g.alltoall_rows([numpy.full((j + 1, 2), comm.rank + 10 * j, numpy.float32)
                               for j in range(group_size)])
        for j, block in enumerate(got):
            assert block.shape == (g.rank + 1, 2)
            assert (block == groups.members[j] + 10 * g.rank).all()
        total = g.reduce_scatter_rows(numpy.arange(group_size * 6, dtype=numpy.float32)
                                      .reshape(group_size * 2, 3) * (comm.rank + 1))
        weight = sum(r + 1 for r in groups.members)
        want = numpy.arange(g.rank * 6, g.rank * 6 + 6, dtype=numpy.float32).reshape(2, 3)
        assert numpy.array_equal(total, want * weight)
        uneven = numpy.full((2, g.rank + 1), g.rank, numpy.float32)
        cat = g.allgather_arrays(uneven, axis=1)
        assert cat.shape == (2, group_size * (group_size + 1) // 2) and cat.flags.c_contiguous
        assert numpy.array_equal(cat[0], numpy.repeat(range(group_size), range(1, group_size + 1)))
    finally:
        groups.close()


def test_group_size_must_divide_the_world(make):
    comm = make("tree")
    for bad in (0, comm.size + 1):
        with pytest.raises(CaffeError, match=f"group of {bad} ranks does not divide the "
                                             f"{comm.size} ranks"):
            HybridGroups(comm, bad, what="layer 'fc6': parallel")
