"""Device buckets through the pinned host mirror (caffe_engine/comm/pinned_mirror.py), any ranks.

Without a GPU the "device" is the emulated one (``Staging("emulate")``: NumPy buffers copied
through a host mirror filled with NaN, copies to the host run as late as a GPU may, copies back
as early or as late): every algorithm must give bitwise the result of the unstaged path, so a
chunk read before its copy landed, or written after it was copied back, fails the test. The
GPU-marked cases run the same on CuPy buffers, and ``--comm nccl``; they are skipped here with
the reason. With one process (no launcher) the allreduce is a no-op and the checks are trivial.
"""
import hashlib

import numpy
import pytest

from caffe_engine.comm import nccl as nccl_module
from caffe_engine.comm.pinned_mirror import EmulatedOps, Staging
from caffe_engine.errors import CaffeError
from cuda_env import cuda_missing

ALGORITHMS = ["tree", "ring", "ps", "mpi", "hier", "hier:tree"]
PRIME = 1009
SIZES = [1, 7, PRIME, 3 * 64 + 5, 5000]
SMALL_CHUNK = 256


def opts_for(name):
    return {"chunk_bytes": SMALL_CHUNK} if name.startswith(("tree", "hier")) else {}


def digest(a):
    return hashlib.sha1(numpy.ascontiguousarray(a).tobytes()).hexdigest()


def random_data(n, rank, seed=0):
    return numpy.random.default_rng(1000 * seed + rank).standard_normal(n).astype(numpy.float32)


def emulated(chunk_bytes, lazy_h2d=False):
    return Staging("emulate", chunk_bytes=chunk_bytes,
                   emulator=lambda: EmulatedOps(lazy_h2d=lazy_h2d))


def check_stagers_idle(staging):
    for stager in staging.stagers:
        assert not stager.busy
        assert stager.ops.d2h.pending == 0 and stager.ops.h2d.pending == 0


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("stage_chunk", [64, 1000])
@pytest.mark.parametrize("lazy_h2d,op", [(False, "sum"), (True, "mean")])
def test_staged_equals_unstaged(make, name, n, stage_chunk, lazy_h2d, op):
    comm = make(name, **opts_for(name))
    comm.staging = Staging("auto")                        # NumPy: unstaged, whatever the env
    x = random_data(n, comm.rank)
    plain = x.copy()
    comm.allreduce_(plain, op=op)
    comm.staging = emulated(stage_chunk, lazy_h2d)
    staged = x.copy()
    assert comm.allreduce_(staged, op=op) is staged
    assert staged.tobytes() == plain.tobytes()
    assert len(set(comm.allgather_object(digest(staged)))) == 1
    check_stagers_idle(comm.staging)
    assert len(comm.staging.stagers) == (1 if comm.size > 1 else 0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_staged_async_several_in_flight(make, name):
    comm = make(name, **opts_for(name))
    xs = [random_data(n, comm.rank, seed=k) for k, n in enumerate([3000, PRIME, 5, 777])]
    plain = [x.copy() for x in xs]
    comm.staging = Staging("auto")
    for buf in plain:
        comm.allreduce_(buf, op="mean")
    comm.staging = emulated(64)
    staged = [x.copy() for x in xs]
    handles = [comm.allreduce_async_(staged[0], op="mean"),
               comm.allreduce_async_(staged[1], op="mean")]
    comm.allreduce_(staged[2], op="mean")          # blocking, on the other duplicate
    handles.append(comm.allreduce_async_(staged[3], op="mean"))
    assert [h.wait() is b for h, b in zip(handles, [staged[0], staged[1], staged[3]])] == \
        [True] * 3
    for got, want in zip(staged, plain):
        assert got.tobytes() == want.tobytes()
    check_stagers_idle(comm.staging)
    # one stager per duplicate (blocking, progress thread); one mirror each (largest first)
    assert len(comm.staging.stagers) == (2 if comm.size > 1 else 0)
    assert all(s.ops.allocations == 1 for s in comm.staging.stagers)


@pytest.mark.parametrize("name", ["tree", "hier"])
def test_results_go_back_while_later_chunks_are_staged(make, name):
    """The pipelined algorithms copy a chunk's result back before they wait for the copies of
    the last chunks (40 chunks of 256 bytes)."""
    comm = make(name, **opts_for(name))
    comm.staging = emulated(SMALL_CHUNK)
    buf = random_data(64 * 40, comm.rank)
    comm.allreduce_(buf)
    if comm.size == 1:
        return
    log = comm.staging.stagers[0].ops.log
    d2h = [i for i, e in enumerate(log) if e[:2] == ("enqueue", "d2h")]
    waits = [i for i, e in enumerate(log) if e[0] == "wait"]
    h2d = [i for i, e in enumerate(log) if e[:3] == ("enqueue", "h2d", "h2d")]
    assert len(d2h) == 40 and max(d2h) < min(waits)        # every copy queued at once
    assert len(waits) == 40
    assert min(h2d) < max(waits)                           # results flow back mid-way


def test_ring_stages_in_its_own_order(make):
    comm = make("ring")
    comm.staging = emulated(1 << 20)
    n = 10 * max(comm.size, 1)
    comm.allreduce_(random_data(n, comm.rank))
    if comm.size == 1:
        return
    log = comm.staging.stagers[0].ops.log
    got = [e[3:] for e in log if e[:2] == ("enqueue", "d2h")]
    r, p = comm.rank, comm.size
    assert got == [((r - s) % p * 10, (r - s) % p * 10 + 10) for s in range(p)]


# --------------------------------------------------------------------------------------------
# NCCL's start-up errors: the same line on every rank
# --------------------------------------------------------------------------------------------


CUDA_MISSING = cuda_missing()


def test_nccl_without_a_device_is_the_same_line_on_every_rank(world):
    if world is None or CUDA_MISSING is None:
        pytest.skip("needs mpi4py and no CUDA device")
    with pytest.raises(CaffeError) as e:
        nccl_module.NCCLCommunicator(world, timeout=120)
    msg = str(e.value)
    assert msg.startswith("communicator 'nccl' needs CuPy with NCCL and a CUDA device")
    assert "\n" not in msg
    assert len(set(world.allgather(msg))) == 1


def test_nccl_error_on_one_rank_is_raised_on_every_rank(world, monkeypatch):
    if world is None or world.Get_size() < 2:
        pytest.skip("needs 2 ranks or more")

    def load():
        if world.Get_rank() == 1:
            raise CaffeError("communicator 'nccl': broken on this rank")
        return None, None, 64
    monkeypatch.setattr(nccl_module, "_load_nccl", load)
    with pytest.raises(CaffeError) as e:
        nccl_module.NCCLCommunicator(world, timeout=120)
    want = f"rank 1 of {world.Get_size()}: communicator 'nccl': broken on this rank"
    assert str(e.value) == want


# --------------------------------------------------------------------------------------------
# On GPUs (skipped here): CuPy buffers through the stagers, and NCCL
# --------------------------------------------------------------------------------------------
def _local(world):
    from mpi4py import MPI
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ALGORITHMS)
def test_cupy_buckets_equal_numpy_buckets(make, world, name):
    if CUDA_MISSING:
        pytest.skip(CUDA_MISSING)
    import cupy
    local_rank, _ = _local(world) if world is not None else (0, 1)
    cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    comm = make(name, **opts_for(name))
    comm.staging = Staging("auto", chunk_bytes=4096)
    for n in (1, PRIME, 300_001):
        x = random_data(n, comm.rank)
        host = x.copy()
        comm.allreduce_(host, op="mean")
        dev = cupy.asarray(x)
        comm.allreduce_(dev, op="mean")
        assert dev.get().tobytes() == host.tobytes()
        dev = cupy.asarray(x)
        dev *= 1                                           # queued on the compute stream
        comm.allreduce_async_(dev, op="mean").wait()
        assert dev.get().tobytes() == host.tobytes()


@pytest.mark.gpu
def test_nccl_allreduce_on_gpus(world):
    if CUDA_MISSING:
        pytest.skip(CUDA_MISSING)
    if world is None:
        pytest.skip("needs mpi4py")
    import cupy
    _, local_size = _local(world)
    if local_size > cupy.cuda.runtime.getDeviceCount():
        pytest.skip(f"{local_size} ranks on this machine, fewer GPUs")
    comm = nccl_module.NCCLCommunicator(world, timeout=120)
    try:
        rank, size = comm.rank, comm.size
        ints = ((numpy.arange(100_003) * 7 + rank * 13) % 101).astype(numpy.float32)
        want = sum(((numpy.arange(100_003) * 7 + r * 13) % 101).astype(numpy.float64)
                   for r in range(size)).astype(numpy.float32)
        dev = cupy.asarray(ints)
        comm.allreduce_(dev)
        assert dev.get().tobytes() == want.tobytes()
        dev = cupy.asarray(ints)
        comm.allreduce_async_(dev, op="mean").wait()
        assert dev.get().tobytes() == (want * numpy.float32(1.0 / size)).tobytes()
        x = cupy.asarray(random_data(5000, rank))
        comm.allreduce_(x)
        assert len(set(comm.allgather_object(digest(x.get())))) == 1
        b = cupy.asarray(numpy.full(9, rank, numpy.int64))
        comm.bcast_(b, root=size - 1)
        assert (b.get() == size - 1).all()
    finally:
        comm.close()
