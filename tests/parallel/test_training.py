"""Data-parallel training through the solver (issue 6): P ranks with batch b follow the loss
trajectory of one process with batch P*b on the same records, and every rank holds bitwise
identical weights after every update.

Runs under ``mpiexec -n K python -m pytest tests/parallel`` (K = 1..4, tests/parallel/run_all.sh)
and with no launcher (size 1). Rank 0 writes one tiny LMDB that every rank reads (60 records,
divisible by 1..4 and by every batch used here, so the dealt records line up with the big batch:
rank r of P reads records r, r + P, ..., and the P ranks' batches at one iteration together are
exactly the big batch of the one-process run).
"""

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend, cli
from caffe_engine.comm import distributed
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver
from tiny_nets import MLP_NET, MLP_SOLVER


NUM_RECORDS = 60
BATCH = 3


def _size(world):
    return 1 if world is None else world.Get_size()


@pytest.fixture
def source(tiny_lmdb):
    """An LMDB of NUM_RECORDS Datum records (1x4x4 bytes, label 0..2) written by rank 0 in a
    folder every rank sees (the solvers' prototxts must be identical, source path included)."""
    return tiny_lmdb(seed=6, num_records=NUM_RECORDS)


def solver_param(source, batch, iter_size=1):
    param = text_format.Parse(MLP_SOLVER % {"iter_size": iter_size}, caffe_pb2.SolverParameter())
    text_format.Parse(MLP_NET % {"source": source, "batch": batch}, param.net_param)
    return param


def weights(solver):
    return [backend.to_numpy(b.data).copy() for b in solver.net.learnable_params]


def pairs(world):
    """Node labels making 2-rank nodes of this world (4 ranks: 2 nodes of 2; 3: 2 and 1)."""
    return [r // 2 for r in range(_size(world))]


@pytest.mark.parametrize("algorithm", ["tree", "hier"])
def test_p_ranks_match_one_process_with_p_times_the_batch(world, make, source, algorithm):
    size = _size(world)
    iters = 50
    # The reference: one process (no communicator), batch size * BATCH, on every rank.
    ref = get_solver(solver_param(source, size * BATCH))
    ref_losses = []
    for _ in range(iters):
        ref.step(1)
        ref_losses.append(float(ref.smoothed_loss))
    ref_weights = weights(ref)
    # The data-parallel run: this rank's share of the records, batch BATCH.
    comm = make("tree") if algorithm == "tree" else make("hier", nodes=pairs(world))
    par = get_solver(solver_param(source, BATCH), comm=comm, bucket_mb=0.001)
    assert par.solver_count == size
    losses = []
    for _ in range(iters):
        par.step(1)
        mine = float(par.smoothed_loss)
        losses.append(numpy.mean(comm.allgather_object(mine)) if size > 1 else mine)
    numpy.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-5)
    for got, want in zip(weights(par), ref_weights):
        numpy.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-5)
    # The loss went down: the comparison is not between two runs that did nothing.
    assert numpy.mean(ref_losses[-10:]) < 0.8 * numpy.mean(ref_losses[:5])


@pytest.mark.parametrize("algorithm", ["ring", "ps", "hier:tree"])
def test_every_rank_holds_identical_weights_after_every_update(world, make, source, algorithm):
    size = _size(world)
    if size < 2:
        pytest.skip("bitwise agreement between ranks needs at least 2 ranks (mpiexec -n K>=2)")
    opts = {"nodes": pairs(world)} if algorithm.startswith("hier") else {}
    comm = make(algorithm, **opts)
    # iter_size 2 and one bucket per param: the overlap path with accumulated gradients.
    par = get_solver(solver_param(source, BATCH, iter_size=2), comm=comm, bucket_mb=0,
                     debug_sync=True)
    start = distributed.param_digests(par.net)
    assert len(set(map(tuple, comm.allgather_object(start)))) == 1  # rank 0's weights everywhere
    for it in range(20):
        par.step(1)  # debug_sync raises on every rank if the weights differ
        digests = comm.allgather_object(distributed.param_digests(par.net))
        assert all(d == digests[0] for d in digests), f"iteration {it + 1}: {digests}"
    assert distributed.param_digests(par.net) != start


@pytest.mark.parametrize("spec, message", [
    ("carrier_pigeon", "--comm: unknown communicator 'carrier_pigeon' (known: tree, ring, ps, "
                       "mpi, hier, nccl)"),
    ("hier:star", "--comm: communicator 'hier': the leaders' algorithm must be ring or tree, "
                  "got 'star'"),
    ("ring:tree", "--comm: communicator 'ring' takes no ':' option, got 'ring:tree'"),
])
def test_cli_rejects_unknown_comm(capsys, spec, message):
    status = cli.main(["train", "--solver", "whatever.prototxt", "--comm", spec])
    assert status == 1
    err = capsys.readouterr().err.strip().splitlines()
    from caffe_engine.comm.launcher import launcher_rank_size
    if launcher_rank_size()[0] == 0:
        assert len(err) == 1 and err[0].startswith("caffe: " + message), err
    else:  # under mpiexec only rank 0 prints a command-line error
        assert err == []


def test_exact_resume_on_p_ranks_continues_bit_for_bit(world, make, source):
    """--exact_resume under mpiexec: rank 0 writes every rank's cursor and streams into the side
    file, each rank restores its own, so 6 + resume + 6 iterations = 12 straight, bit for bit."""
    size = _size(world)
    prefix = source.rsplit("/", 1)[0] + "/resume_case"

    def run(comm, restore_from=None, iters=12):
        param = solver_param(source, BATCH)
        param.snapshot, param.snapshot_prefix = 6, prefix
        solver = get_solver(param, comm=comm, bucket_mb=0.001)
        solver.exact_resume = True
        if restore_from:
            solver.restore(restore_from)
        solver.step(iters - solver.iter)
        return distributed.param_digests(solver.net), float(solver.smoothed_loss)

    straight = run(make("tree"))
    state = f"{prefix}_iter_6.solverstate"
    resumed = run(make("tree"), restore_from=state)
    assert resumed == straight
    if size > 1:
        import json
        with open(state + ".resume") as f:
            assert len(json.load(f)["ranks"]) == size


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_bucket_mb_auto_tries_its_plan_on_every_rank_alike(world, make, source, algorithm,
                                                           monkeypatch):
    """--bucket_mb auto under MPI: a cost model file with a free start-up (alpha 0) makes the
    MG-WFBP plan one bucket per layer (2) against the single 25 MiB bucket in use, so the ranks
    alternate plans for 8 iterations (6..13) and then keep one; every rank must switch at the
    same iteration (else the buckets' sizes differ and the sums are wrong or hang), and the
    weights stay bitwise identical throughout (debug_sync raises on any difference)."""
    from caffe_engine.perf.alpha_beta import AlphaBetaModel
    size = _size(world)
    if size < 2:
        pytest.skip("the planner's collectives need at least 2 ranks (mpiexec -n K>=2)")
    model = source.rsplit("/", 1)[0] + f"/cost_model_{algorithm}.json"
    if world.Get_rank() == 0:
        AlphaBetaModel({algorithm: {"alpha": 0.0, "beta": 1e-6}}).save(model)
    world.Barrier()
    monkeypatch.setenv("CAFFE_COST_MODEL", model)
    par = get_solver(solver_param(source, BATCH), comm=make(algorithm), bucket_mb="auto",
                     debug_sync=True)
    planner = par.callbacks[0].planner
    sync = par.callbacks[0].grad_sync
    buckets_per_iteration = []
    for _ in range(24):
        par.step(1)
        buckets_per_iteration.append(len(sync.buckets))
    everyone = par.callbacks[0].comm.allgather_object(buckets_per_iteration)
    assert all(b == everyone[0] for b in everyone), everyone
    assert [label for label, _, _ in planner.trials][:2] == ["in use", "MG-WFBP"]
    assert [len(plan) for _, plan, _ in planner.trials][:2] == [1, 2]
    assert set(buckets_per_iteration[5:13]) == {1, 2}          # the trial alternated
    assert planner.plan_info is not None and len(set(buckets_per_iteration[-5:])) == 1
