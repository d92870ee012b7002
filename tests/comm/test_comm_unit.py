"""Communication pieces that need no mpiexec: tree shape, chunking, selection, buckets, watchdog
(the cost model's tests are tests/perf/)."""
import time
import types

import numpy
import pytest

from caffe_engine.comm import distributed
from caffe_engine.comm.buckets import plan_buckets
from caffe_engine.comm.communicator import (Handle, LocalCommunicator, Watchdog, check_buffer,
                                            get_communicator)
from caffe_engine.comm.launcher import launcher_rank_size
from caffe_engine.comm.ring import ring_segments
from caffe_engine.comm.tree import (ceil_log, chunk_bounds, tree_children, tree_depth,
                                    tree_level, tree_parent)
from caffe_engine.errors import CaffeError


# -- tree shape --------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("size", range(1, 18))
def test_tree_reaches_every_rank_once_within_log_depth(size, k):
    seen = []
    frontier = [0]
    while frontier:
        seen += frontier
        frontier = [c for r in frontier for c in tree_children(r, size, k)]
    assert sorted(seen) == list(range(size))              # every rank, once
    assert len(seen) == len(set(seen))
    for r in range(1, size):
        assert r in tree_children(tree_parent(r, k), size, k)
    assert tree_parent(0, k) is None
    depth = max(tree_level(r, k) for r in range(size))
    assert depth == tree_depth(size, k)
    assert depth <= ceil_log(size, k)
    exact = 0 if size == 1 else int(numpy.ceil(numpy.log(size) / numpy.log(k) - 1e-12))
    assert ceil_log(size, k) == exact


def test_binary_tree_of_seven():
    assert [tree_children(r, 7) for r in range(7)] == [[1, 2], [3, 4], [5, 6], [], [], [], []]
    assert tree_depth(7) == 2 and tree_depth(8) == 3 and tree_depth(1) == 0


@pytest.mark.parametrize("count, chunk", [(0, 4), (1, 4), (4, 4), (5, 4), (1009, 64), (10, 1)])
def test_chunks_cover_buffer_in_order(count, chunk):
    b = chunk_bounds(count, chunk)
    assert [lo for lo, _ in b] == list(range(0, count, chunk))
    assert all(0 < hi - lo <= chunk for lo, hi in b)
    assert (b[-1][1] if b else 0) == count


@pytest.mark.parametrize("count, size", [(0, 3), (1, 4), (10, 3), (1009, 4), (7, 7), (5, 8)])
def test_ring_segments_partition_evenly(count, size):
    seg = ring_segments(count, size)
    assert len(seg) == size and seg[0][0] == 0 and seg[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(seg, seg[1:]))
    lengths = [hi - lo for lo, hi in seg]
    assert max(lengths) - min(lengths) <= 1


# -- selection and the single-process communicator ----------------------------------------------
def test_unknown_name_is_one_line_error():
    with pytest.raises(CaffeError) as info:
        get_communicator("butterfly")
    msg = str(info.value)
    assert "\n" not in msg and "butterfly" in msg
    assert msg.endswith("(known: tree, ring, ps, mpi, hier, nccl)")


@pytest.mark.parametrize("name", ["tree", "ring", "ps", "mpi", "hier", "nccl", "hybrid",
                                  "hier:tree"])
def test_single_process_gets_local_communicator(name, monkeypatch):
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    comm = get_communicator(name)
    assert isinstance(comm, LocalCommunicator) and (comm.rank, comm.size) == (0, 1)
    buf = numpy.arange(5, dtype=numpy.float32)
    before = buf.copy()
    assert comm.allreduce_(buf, op="mean") is buf
    assert comm.allreduce_async_(buf).wait() is buf
    comm.bcast_(buf, 0)
    comm.barrier()
    numpy.testing.assert_array_equal(buf, before)
    assert comm.allgather_object("x") == ["x"]


# -- the registry -------------------------------------------------------------------------------
def test_registry_names_order_aliases_and_specs():
    from caffe_engine.comm import ALGORITHMS, registry
    from caffe_engine.comm.hier import HierarchicalCommunicator
    from caffe_engine.comm.tree import TreeCommunicator
    assert tuple(ALGORITHMS) == ("tree", "ring", "ps", "mpi", "hier", "nccl")
    assert "hier" in ALGORITHMS and "hybrid" not in ALGORITHMS     # aliases are not listed
    assert registry.algorithm_class("hybrid") is HierarchicalCommunicator
    assert registry.resolve("tree") == (TreeCommunicator, {})
    assert registry.resolve("hier:tree") == (HierarchicalCommunicator, {"inter": "tree"})
    assert registry.resolve("hybrid:ring", chunk_bytes=64) == (
        HierarchicalCommunicator, {"inter": "ring", "chunk_bytes": 64})
    assert registry.resolve("hier:tree", inter="ring")[1] == {"inter": "ring"}  # keyword wins


@pytest.mark.parametrize("spec, message", [
    ("butterfly", "unknown communicator 'butterfly' (known: tree, ring, ps, mpi, hier, nccl)"),
    ("butterfly:tree", "unknown communicator 'butterfly'"),
    ("ring:tree", "communicator 'ring' takes no ':' option, got 'ring:tree'"),
    ("hier:", "communicator 'hier:': empty inter after ':'"),
    ("hier:star", "communicator 'hier': the leaders' algorithm must be ring or tree, got 'star'"),
    ("hybrid:ps", "the leaders' algorithm must be ring or tree, got 'ps'"),
])
def test_bad_specs_are_one_line_errors_even_on_one_process(spec, message, monkeypatch):
    for var in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CaffeError) as info:
        get_communicator(spec)
    assert "\n" not in str(info.value) and message in str(info.value)


def test_bad_hier_options_are_one_line_errors():
    with pytest.raises(CaffeError, match="chunk_bytes must be >= 4, got 2"):
        get_communicator("hier", chunk_bytes=2)
    with pytest.raises(CaffeError, match="window must be >= 1, got 0"):
        get_communicator("hier:tree", window=0)
    with pytest.raises(CaffeError, match="lanes must be >= 1, got 0"):
        get_communicator("hier", lanes=0)


def test_a_name_cannot_be_registered_twice():
    from caffe_engine.comm import registry

    class Impostor:
        pass
    with pytest.raises(ValueError, match="already registered"):
        registry.register("ring")(Impostor)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("mine", aliases=("hybrid",))(Impostor)
    assert "mine" not in registry.ALGORITHMS


def test_communicator_module_imports_no_algorithm():
    import ast
    import caffe_engine.comm.communicator as mod
    tree = ast.parse(open(mod.__file__).read())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(a.name for a in node.names)
    assert not imported & {"tree", "ring", "ps", "mpi", "hier", "nccl"}, imported


# -- hierarchical allreduce: node grouping --------------------------------------------------------
def test_group_nodes_numbers_nodes_by_lowest_rank():
    from caffe_engine.comm.hier import group_nodes, node_leaders, node_members
    assert group_nodes(["h1", "h1", "h0", "h0"]) == [0, 0, 1, 1]
    assert group_nodes([5, 7, 5, 7, 9]) == [0, 1, 0, 1, 2]
    node_of = group_nodes(["a", "b", "a", "b", "a"])
    assert node_leaders(node_of) == [0, 1]
    assert node_members(node_of, 4) == [0, 2, 4] and node_members(node_of, 3) == [1, 3]
    assert node_leaders(group_nodes(range(4))) == [0, 1, 2, 3]          # one rank per node
    assert node_members(group_nodes("xxx"), 2) == [0, 1, 2]              # one node


@pytest.mark.parametrize("labels, members, leaders", [
    ([0, 0, 1, 1], [[0, 1], [0, 1], [2, 3], [2, 3]], [0, 2]),              # 2 nodes of 2
    (["h0", "h0", "h1"], [[0, 1], [0, 1], [2]], [0, 2]),                   # uneven: 3 on 2
    ([1, 0, 1, 0, 2], [[0, 2], [1, 3], [0, 2], [1, 3], [4]], [0, 1, 4]),   # interleaved
])
def test_every_rank_is_in_exactly_one_node_led_by_its_lowest_rank(labels, members, leaders):
    from caffe_engine.comm.hier import group_nodes, node_leaders, node_members
    node_of = group_nodes(labels)
    assert [node_members(node_of, r) for r in range(len(labels))] == members
    assert node_leaders(node_of) == leaders
    assert sorted(r for lead in leaders for r in node_members(node_of, lead)) == \
        list(range(len(labels)))


def test_node_labels_come_from_nodes_then_caffe_node_then_the_host():
    from caffe_engine.comm.hier import choose_labels
    env = ["h0", "h0", "h1", "h1"]
    shared = [0, 0, 0, 0]
    assert choose_labels(4, [3, 3, 4, 4], env, shared) == ([3, 3, 4, 4], "nodes")
    assert choose_labels(4, None, env, shared) == (env, "CAFFE_NODE")
    assert choose_labels(4, None, [None, "", None, None], [0, 0, 2, 2]) == ([0, 0, 2, 2], "host")
    assert choose_labels(2, None, None, None) == ([0, 0], "host")


def test_node_label_mistakes_are_one_line_errors():
    from caffe_engine.comm.hier import choose_labels
    with pytest.raises(CaffeError, match=r"^communicator 'hier': nodes has 3 entries for 4 ranks$"):
        choose_labels(4, [0, 0, 1], None, [0] * 4)
    with pytest.raises(CaffeError) as info:
        choose_labels(4, None, ["h0", None, "h1", None], [0] * 4)
    assert str(info.value) == ("CAFFE_NODE is set on rank(s) 0, 2 but not on rank(s) 1, 3; set "
                               "it on every rank or on none")
    with pytest.raises(CaffeError, match=r"rank\(s\) 0, 1, 2, 3, 4, 5, 6, 7 \(and 2 more\)"):
        choose_labels(11, None, [None] * 10 + ["h0"], [0] * 11)


@pytest.mark.parametrize("labels, lanes, expected", [
    ([0, 0, 0, 0, 1, 1, 1, 1], None, 4),        # 2 nodes of 4: every rank owns a slice
    ([0, 0, 0, 0, 1, 1, 1, 1], 1, 1),           # the paper's single leader per node
    ([0, 0, 0, 0, 1, 1, 1, 1], 9, 4),           # capped at the node size
    (["a", "a", "b"], None, 1),                 # uneven: the smallest node decides
    ([0, 1, 2], None, 1),                       # one rank per node
    ([0, 0, 0], 2, 2),                          # one node, two slices
])
def test_lane_count_is_the_smallest_node_capped_by_the_option(labels, lanes, expected):
    from caffe_engine.comm.hier import group_nodes, lane_count
    assert lane_count(group_nodes(labels), lanes) == expected


def test_slices_cover_the_chunk_and_lanes_come_from_the_environment():
    from caffe_engine.comm.hier import lanes_from_env, slice_bounds
    assert slice_bounds(10, 21, 4) == [(10, 12), (12, 15), (15, 18), (18, 21)]
    assert slice_bounds(0, 3, 4) == [(0, 0), (0, 1), (1, 2), (2, 3)]     # some slices empty
    assert lanes_from_env({}) is None and lanes_from_env({"CAFFE_HIER_LANES": "3"}) == 3
    for bad in ("0", "-2", "two"):
        with pytest.raises(CaffeError, match=r"^CAFFE_HIER_LANES must be a positive integer"):
            lanes_from_env({"CAFFE_HIER_LANES": bad})


def test_launcher_environment():
    assert launcher_rank_size({}) == (0, 1)
    assert launcher_rank_size({"PMI_RANK": "2", "PMI_SIZE": "4"}) == (2, 4)
    assert launcher_rank_size({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}) == (1, 3)


def test_buffer_checks():
    assert check_buffer(numpy.zeros((2, 3), numpy.float32)).shape == (6,)
    with pytest.raises(CaffeError, match="float32"):
        check_buffer(numpy.zeros(3))
    with pytest.raises(CaffeError, match="contiguous"):
        check_buffer(numpy.zeros((3, 3), numpy.float32).T)
    ro = numpy.zeros(3, numpy.float32)
    ro.flags.writeable = False
    with pytest.raises(CaffeError, match="read-only"):
        check_buffer(ro)


def test_nccl_without_cupy_is_a_clear_error():
    pytest.importorskip("mpi4py", exc_type=ImportError)
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed")
    except ImportError:
        pass
    from caffe_engine.comm.nccl import NCCLCommunicator
    with pytest.raises(CaffeError, match="needs CuPy with NCCL"):
        NCCLCommunicator()


def test_handle_timeout_and_error():
    h = Handle(numpy.zeros(1, numpy.float32))
    with pytest.raises(CaffeError, match="within 0.01 s"):
        h.wait(0.01)
    h._finish(ValueError("x"))
    with pytest.raises(ValueError):
        h.wait()


def test_watchdog_fires_on_a_late_wait_only():
    fired = []
    dog = Watchdog(on_timeout=fired.append)
    with dog.watch("quick op", 5.0, rank=1, size=4):
        pass
    with dog.watch("allreduce of 8 bytes (tree)", 0.2, rank=3, size=4):
        time.sleep(0.8)
    assert len(fired) == 1
    assert fired[0].startswith("caffe_engine: rank 3 of 4: allreduce of 8 bytes (tree) waited "
                               "more than 0.2 s")
    with dog.watch("no timeout", 0):
        pass


# -- buckets and distributed helpers -----------------------------------------------------------
def test_plan_buckets_reverse_layer_order_and_cap():
    counts = [100, 10, 300, 30, 50]            # elements
    ready = [1, 1, 3, 3, 5]
    assert plan_buckets(counts, ready, 0) == [[4], [2], [3], [0], [1]]
    assert plan_buckets(counts, ready, 4 * 380) == [[4, 2, 3], [0, 1]]
    assert plan_buckets(counts, ready, 4 * 10) == [[4], [2], [3], [0], [1]]   # oversize alone
    assert plan_buckets(counts, ready, 1 << 30) == [[4, 2, 3, 0, 1]]


def test_rank_seed_and_record_dealing():
    assert distributed.rank_seed(1701, 3) == 1704
    assert distributed.rank_seed(-1, 3) == -1
    assert list(distributed.record_indices(10, 1, 4)) == [1, 5, 9]
    data = types.SimpleNamespace(solver_count=1, solver_rank=0)
    conv = types.SimpleNamespace()
    net = types.SimpleNamespace(layer_names=["data", "conv"], layers=[data, conv])
    assert distributed.deal_records(net, 2, 3) == ["data"]
    assert (data.solver_count, data.solver_rank) == (3, 2)


def test_config_check_single_process_passes():
    from caffe_engine.proto import caffe_pb2
    comm = LocalCommunicator()
    distributed.check_same_config(comm, net=caffe_pb2.NetParameter(name="x"), text="abc")
    a = distributed.message_digest(caffe_pb2.NetParameter(name="x"))
    assert a == distributed.message_digest(caffe_pb2.NetParameter(name="x"))
    assert a != distributed.message_digest(caffe_pb2.NetParameter(name="y"))


def test_an_mpi_error_stack_becomes_one_line_naming_its_cause():
    """mpi4py's MPI.Exception carries MPICH's multi-line error stack: the failure line keeps its
    class and innermost cause, says the rank saw another fail, and has no newline."""
    from caffe_engine.comm import distributed

    class MPIException(Exception):
        pass
    MPIException.__module__ = "mpi4py.MPI"
    stack = MPIException("Other MPI error, error stack:\n"
                         "internal_Wait(105).....: MPI_Wait(request=0x7f, status=0x1) failed\n"
                         "MPIR_Wait(745).........: \n"
                         "copy_iovs(224).........: process_vm_readv failed (errno 3)")
    line = distributed._failure_line(0, 2, stack)
    assert line == ("caffe_engine: rank 0 of 2: an MPI call failed: Other MPI error "
                    "(process_vm_readv failed (errno 3)); another rank has probably died; "
                    "aborting all ranks")
    assert distributed._failure_line(1, 4, RuntimeError("boom\nmore")) == \
        "caffe_engine: rank 1 of 4 failed: RuntimeError: boom\\nmore; aborting all ranks"


def test_the_supervisor_is_wanted_only_for_a_multi_rank_launch(monkeypatch):
    import sys
    from caffe_engine.comm import supervisor
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())    # MPI may be running: never fork
    assert not supervisor.wanted({"PMI_RANK": "0", "PMI_SIZE": "2"})
    monkeypatch.delitem(sys.modules, "mpi4py.MPI")
    assert not supervisor.wanted({})
    assert not supervisor.wanted({"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert supervisor.wanted({"PMI_RANK": "0", "PMI_SIZE": "2"})
    assert not supervisor.wanted({"PMI_RANK": "0", "PMI_SIZE": "2", "CAFFE_SUPERVISED": "1"})
    assert not supervisor.wanted({"PMI_RANK": "0", "PMI_SIZE": "2", "CAFFE_SUPERVISE": "0"})
    assert supervisor.describe_signal(9) == "signal 9 (SIGKILL)"
