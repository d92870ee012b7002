"""The seam between the solver and data parallelism (issue 16, item 4).

Oracles: Caffe's Solver::Step (src/caffe/solver.cpp) for where ``on_start`` and
``on_gradients_ready`` fall (after the iteration's tests, before its forward/backward passes;
after the ``iter_size`` passes, before ApplyUpdate); the solver module's own imports (it must
not import the communicator package); the registration order for the net's single hook list;
and a fake two-rank communicator, which records the collectives the data-parallel callback runs
and whose "mean" of identical ranks changes nothing.
"""
import ast
import logging
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.comm.data_parallel import DataParallel
from caffe_engine.errors import CaffeError
from caffe_engine.io.prototxt import read_solver_param
from caffe_engine.net import HOOK_EVENTS, TRAIN, Net
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import SolverAction, get_solver
from caffe_engine.solvers import CALLBACK_EVENTS, SolverCallback
from tiny_train import tiny_solver

ROOT = Path(__file__).resolve().parents[2]

# iter_size 2, a test every 2 iterations, a snapshot every 3, 4 iterations in all.
SEAM = "iter_size: 2\ntest_interval: 2\ntest_iter: 1\nsnapshot: 3\nmax_iter: 4\n"


def weights(solver):
    return numpy.concatenate([numpy.asarray(b.data).ravel().copy()
                              for b in solver.net.learnable_params])


class Recorder(SolverCallback):
    """Records every solver event, and the train net's forward and backward passes (a hook on
    the first layer's forward and on the last layer of backward)."""

    def __init__(self):
        self.events = []
        self.solver = None
        self.at_start = self.at_ready = None

    def on_init(self, solver):
        self.solver = solver
        self.events.append(("init", hasattr(solver, "net")))

    def on_nets_ready(self, solver):
        self.events.append(("nets_ready", hasattr(solver, "net")))
        solver.net.before_forward(lambda i: i == 0 and self.events.append("forward"))
        solver.net.after_backward(lambda i: i == 0 and self.events.append("backward"))

    def on_test(self, solver):
        self.events.append(("test", solver.iter))

    def on_start(self):
        self.events.append(("start", self.solver.iter))
        self.at_start = weights(self.solver)

    def on_pass(self, solver, k):
        self.events.append(("pass", k))

    def on_gradients_ready(self):
        self.events.append(("gradients_ready", self.solver.iter))
        self.at_ready = weights(self.solver)

    def on_update_done(self, solver, action):
        self.events.append(("update_done", solver.iter, action))
        assert numpy.array_equal(self.at_start, self.at_ready)      # no update before ready
        assert not numpy.array_equal(self.at_ready, weights(solver))  # the update came after
        return action

    def on_snapshot(self, solver):
        self.events.append(("snapshot", solver.iter))

    def on_root_done(self, solver):
        self.events.append(("root_done", solver.iter))


def iteration(i, test=False):
    return ([("test", i)] if test else []) + [
        ("start", i), ("pass", 0), "forward", "backward", ("pass", 1), "forward", "backward",
        ("gradients_ready", i), ("update_done", i + 1, SolverAction.NONE)]


def test_callbacks_come_in_caffes_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recorder = Recorder()
    solver = get_solver(str(tiny_solver(tmp_path, extra=SEAM)), callbacks=[recorder])
    assert recorder.events == [("init", False), ("nets_ready", True)]
    recorder.events.clear()
    solver.solve()
    want = (iteration(0, test=True) + iteration(1) + iteration(2, test=True)
            + [("snapshot", 3), ("root_done", 3)] + iteration(3)
            # solve(): snapshot_after_train (4 % 3 != 0), the root's final display forward and
            # tests (no hook on the test net), then the wait for the root
            + [("snapshot", 4), "forward", ("root_done", 4)])
    assert recorder.events == want


def test_update_done_callbacks_chain_and_decide_the_action(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)

    class StopAt2:
        def on_update_done(self, solver, action):
            return SolverAction.STOP if solver.iter == 2 else action

    class Seen:
        actions = []

        def on_update_done(self, solver, action):
            self.actions.append(action)
            return action

    solver = get_solver(str(tiny_solver(tmp_path, extra=SEAM)), callbacks=[StopAt2(), Seen()])
    caplog.set_level(logging.INFO, logger="caffe_engine")
    solver.solve()
    assert solver.iter == 2 and solver.requested_early_exit
    assert Seen.actions == [SolverAction.NONE, SolverAction.STOP]
    assert "Optimization stopped early." in caplog.text


def test_added_callbacks_follow_the_constructors_and_miss_construction(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, later = Recorder(), Recorder()
    solver = get_solver(str(tiny_solver(tmp_path, extra=SEAM)), callbacks=[first])
    later.solver = solver
    solver.add_callback(later)
    assert solver.callbacks == [first, later]
    solver.step(1)
    assert later.events[0] == ("test", 0)
    assert later.events == [e for e in first.events[2:] if isinstance(e, tuple)]


def test_the_solver_module_does_not_import_the_communicators():
    for name in ("solver.py", "sgd.py", "snapshot.py", "net_factory.py", "callback.py",
                 "lr_policy.py"):
        tree = ast.parse((ROOT / "caffe_engine" / "solvers" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [a.name for a in node.names]
                assert "comm" not in module.split(".") and "comm" not in names, (name, module)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("caffe_engine.comm") for a in node.names), name
    code = ("import sys, caffe_engine.solvers, caffe_engine.net; "
            "print(sorted(m for m in sys.modules if m.startswith('caffe_engine.comm')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    assert out == "[]"


# -- DataParallel over a fake communicator --------------------------------------------------------
class FakeComm:
    """``size`` ranks holding identical values: an allgather repeats this rank's object, the
    "mean" leaves the buffer alone. Records every collective."""

    name = "fake"

    def __init__(self, rank=0, size=2):
        self.rank, self.size = rank, size
        self.calls = []

    def allgather_object(self, obj):
        self.calls.append("allgather")
        return [obj] * self.size

    def bcast_(self, buf, root=0):
        self.calls.append("bcast")

    def allreduce_async_(self, buf, op="mean"):
        self.calls.append("allreduce")

        class Handle:
            def wait(self):
                return None
        return Handle()

    def barrier(self, timeout="default"):
        self.calls.append(("barrier", timeout))


def test_data_parallel_on_the_seam(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    path = str(tiny_solver(tmp_path, extra=SEAM))
    caplog.set_level(logging.INFO, logger="caffe_engine")
    comm = FakeComm(rank=0)
    solver = get_solver(path, comm=comm, bucket_mb=25, debug_sync=True)   # the shim
    dp = solver.callbacks[0]
    assert isinstance(dp, DataParallel) and dp.solver is solver
    assert (solver.rank, solver.solver_count, solver.dealt_layers) == (0, 2, ["mnist"])
    assert solver.net.layers[0].solver_count == 2
    messages = [r.getMessage() for r in caplog.records]
    line = ("Data parallel: rank 0 of 2 (fake), 1 gradient bucket(s) of at most 25 MB, records "
            "dealt to mnist")
    assert messages.index(line) == messages.index("Solver scaffolding done.") - 1
    # construction: solver config check, learnable shapes check, broadcast, debug_sync at 0
    assert comm.calls == ["allgather", "allgather", "bcast", "allgather"]
    comm.calls.clear()
    solver.solve()
    barriers = [c for c in comm.calls if isinstance(c, tuple)]
    assert barriers == [("barrier", None)] * 4       # tests at 0 and 2, snapshot at 3, the end
    assert comm.calls.count("allreduce") == 4         # one bucket, once per iteration
    # on_update_done: debug_sync's digests (no action function: nothing to agree on);
    # on_test: the root's stop request
    assert comm.calls.count("allgather") == 4 + 2


def test_data_parallel_rank_seed_and_root_gating(tmp_path, monkeypatch):
    """Rank 1 seeds with random_seed + 1 (Caffe's Solver::Init), does not test or snapshot,
    and still takes part in every collective; its weights are rank 0's (the broadcast is a
    no-op here, so they are its own: compare the seed's effect on the fillers)."""
    monkeypatch.chdir(tmp_path)
    path = str(tiny_solver(tmp_path, extra=SEAM))
    plain = get_solver(path)
    one = get_solver(path, comm=FakeComm(rank=1))
    assert not one.is_root and one.rank == 1
    param = read_solver_param(path)
    param.random_seed += 1
    shifted = get_solver(param)
    assert numpy.array_equal(weights(one), weights(shifted))
    assert not numpy.array_equal(weights(one), weights(plain))
    one.solve()
    assert not list(tmp_path.glob("tiny_iter_*"))    # only the root snapshots


def test_data_parallel_rejects_a_bad_bucket_size():
    with pytest.raises(CaffeError, match="bucket_mb must be a size in MiB or 'auto', got 'big'"):
        DataParallel(FakeComm(), bucket_mb="big")


def test_callback_events_are_documented_on_the_base_class():
    for event in CALLBACK_EVENTS:
        assert callable(getattr(SolverCallback, event)) and getattr(SolverCallback, event).__doc__


# -- the net's single hook list ------------------------------------------------------------------
NET = """
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "out"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "label" top: "loss" }
"""


def test_one_hook_list_keeps_registration_order_within_each_event():
    rng.set_random_seed(3)
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), TRAIN)
    seen = []

    def hook(tag):
        return lambda i: seen.append((tag, i))

    adders = [(net.after_backward, "a"), (net.before_forward, "b"),
              (net.after_backward, "c"), (net.before_backward, "d"),
              (net.after_forward, "e"), (net.before_forward, "f"),
              (net.before_backward, "g"), (net.after_forward, "h"),
              (lambda fn: net.after_backward(fn, sees_blobs=False), "i")]
    for add, tag in adders:
        add(hook(tag))
    assert [event for event, _ in net.hooks] == [
        "after_backward", "before_forward", "after_backward", "before_backward", "after_forward",
        "before_forward", "before_backward", "after_forward", "after_backward"]
    net.forward_backward()
    layers = range(len(net.layers))
    assert seen == ([(t, i) for i in layers for t in ("b", "f", "e", "h")]
                    + [(t, i) for i in reversed(layers) for t in ("d", "g", "a", "c", "i")])


def test_bad_hooks_are_one_line_errors():
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), TRAIN)
    with pytest.raises(CaffeError, match="net hook: the after_backward callback must be callable"):
        net.after_backward(None)
    with pytest.raises(CaffeError, match="net hook: the before_forward callback must be callable"):
        net.before_forward("print", sees_blobs=False)
    assert net.hooks == () and HOOK_EVENTS[0] == "before_forward"


def test_an_inherited_no_op_does_not_stop_asking_between_passes(tmp_path, monkeypatch, caplog):
    """Only a callback's own ``on_update_done`` makes the solver leave the passes of an
    ``iter_size`` iteration uninterrupted (the callback then decides what every rank does)."""
    monkeypatch.chdir(tmp_path)
    path = str(tiny_solver(tmp_path, extra="iter_size: 3\ntest_interval: 1000\n"
                                           "test_initialization: false\n"
                                           "snapshot_after_train: false\nmax_iter: 4\n"))

    class Starts(SolverCallback):
        def on_start(self):
            pass

    class Decides(SolverCallback):
        def on_update_done(self, solver, action):
            return action

    caplog.set_level(logging.INFO, logger="caffe_engine")
    for callback, stopped_at in ((Starts(), 0), (Decides(), 1)):
        solver = get_solver(path, callbacks=[callback])
        solver.action_request_function = lambda: SolverAction.STOP
        caplog.clear()
        solver.solve()
        assert solver.iter == stopped_at
        between = "Iteration 0 stopped after 1 of 3 forward/backward passes; not applied."
        assert (between in caplog.text) == (stopped_at == 0)
