"""Solvers: each update rule against a per-element transcription of Caffe's CPU code, and the
solver template (type selection, history layout, clipping, iter_size, L1/L2, test nets, HDF5
snapshots) on a tiny net."""
import math

import numpy as np
import pytest
from google.protobuf import text_format

from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from caffe_engine.kernels.reference import solver as updates
from caffe_engine.kernels.update_rules import RULES, Hyper
from caffe_engine.solvers import SOLVERS, SolverAction, get_solver
from tiny_nets import SOFTMAX_DATA as DATA, SOFTMAX_LABEL as LABEL, SOFTMAX_NET as NET

f32 = np.float32


# ------------------------------------------------------------------------------------------------
# The rules, element by element in float32 scalars, in the order of Caffe's CPU code
# (sscal then saxpy for axpby; every call rounds to float32).
# ------------------------------------------------------------------------------------------------
def axpby(a, x, b, y):
    return f32(f32(b * y) + f32(a * x))


def naive_sgd(g, h, lr, p):
    h0 = axpby(lr, g, p["momentum"], h[0])
    return h0, [h0]


def naive_nesterov(g, h, lr, p):
    m = p["momentum"]
    old = h[0]
    new = axpby(lr, g, m, old)
    return axpby(f32(f32(1) + m), new, f32(-m), old), [new]


def naive_adagrad(g, h, lr, p):
    hist = f32(h[0] + f32(g * g))
    upd = f32(g / f32(f32(np.sqrt(hist)) + p["delta"]))
    return f32(lr * upd), [hist]


def naive_rmsprop(g, h, lr, p):
    d = p["rms_decay"]
    hist = axpby(f32(f32(1) - d), f32(g * g), d, h[0])
    upd = f32(g / f32(f32(np.sqrt(hist)) + p["delta"]))
    return f32(lr * upd), [hist]


def naive_adadelta(g, h, lr, p):
    m, delta = p["momentum"], p["delta"]
    hg = axpby(f32(f32(1) - m), f32(g * g), m, h[0])
    ratio = f32(f32(h[1] + delta) / f32(hg + delta))
    step = f32(g * f32(np.sqrt(ratio)))
    hu = axpby(f32(f32(1) - m), f32(step * step), m, h[1])
    return f32(step * lr), [hg, hu]


def naive_adam(g, h, lr, p):
    b1, b2, t = p["momentum"], p["momentum2"], p["t"]
    m = axpby(f32(f32(1) - b1), g, b1, h[0])
    v = axpby(f32(f32(1) - b2), f32(g * g), b2, h[1])
    # Caffe: pow(float, int) is evaluated in double, so is the whole correction.
    corr = f32(math.sqrt(1.0 - float(b2) ** t) / (1.0 - float(b1) ** t))
    upd = f32(m / f32(f32(np.sqrt(v)) + p["delta"]))
    return f32(f32(lr * corr) * upd), [m, v]


NAIVE = {"SGD": naive_sgd, "Nesterov": naive_nesterov, "AdaGrad": naive_adagrad,
         "RMSProp": naive_rmsprop, "AdaDelta": naive_adadelta, "Adam": naive_adam}


@pytest.mark.parametrize("kind", sorted(NAIVE))
def test_rule_matches_caffes_elementwise_order_bit_for_bit(kind):
    rule, sets = updates.KERNELS[kind], RULES[kind].history_sets
    param = caffe_pb2.SolverParameter(momentum=0.0 if kind in ("AdaGrad", "RMSProp") else 0.9,
                                      momentum2=0.999, delta=1e-6, rms_decay=0.98)
    if kind == "AdaDelta":
        param.momentum = 0.95
    hyper = Hyper(param)
    p = {"momentum": hyper.momentum, "momentum2": hyper.momentum2, "delta": hyper.delta,
         "rms_decay": hyper.rms_decay}
    rs = np.random.RandomState(3)
    shape = (7, 5)
    hist = [np.zeros(shape, f32) for _ in range(sets)]
    ref_hist = [h.copy() for h in hist]
    work = [np.empty(shape, f32), np.empty(shape, f32)]
    for it in range(6):
        g = (rs.standard_normal(shape) * 10.0 ** rs.uniform(-4, 1, shape)).astype(f32)
        lr = f32(0.01 * (it + 1)) * f32(2.0)
        hyper.t = p["t"] = it + 1
        diff = g.copy()
        rule(diff, hist, lr, hyper, work)
        expected = np.empty(shape, f32)
        new_hist = [np.empty(shape, f32) for _ in range(sets)]
        for idx in np.ndindex(shape):
            value, hs = NAIVE[kind](g[idx], [h[idx] for h in ref_hist], lr, p)
            expected[idx] = value
            for s in range(sets):
                new_hist[s][idx] = hs[s]
        ref_hist = new_hist
        assert diff.tobytes() == expected.tobytes(), f"{kind} update differs at step {it}"
        for s in range(sets):
            assert hist[s].tobytes() == ref_hist[s].tobytes(), f"{kind} history {s} at step {it}"


def test_adam_bias_correction_uses_iter_plus_one():
    hyper = Hyper(caffe_pb2.SolverParameter(momentum=0.9, momentum2=0.999))
    b1, b2 = float(f32(0.9)), float(f32(0.999))  # the proto's floats, then double math
    for iteration in (0, 1, 9):
        hyper.t = iteration + 1
        expected = math.sqrt(1 - b2 ** (iteration + 1)) / (1 - b1 ** (iteration + 1))
        assert updates.adam_correction(hyper) == f32(expected)


# ------------------------------------------------------------------------------------------------
# A tiny net (tests/tiny_nets.py SOFTMAX_NET): fixed inputs in Input blobs, one InnerProduct,
# a softmax loss.
# ------------------------------------------------------------------------------------------------


def solver_param(text="", net=NET):
    p = text_format.Parse(text, caffe_pb2.SolverParameter())
    if not (p.HasField("net_param") or p.HasField("train_net_param")):
        p.net_param.CopyFrom(text_format.Parse(net, caffe_pb2.NetParameter()))
    p.random_seed = 1
    p.snapshot_after_train = p.snapshot_after_train and p.HasField("snapshot_prefix")
    if not p.HasField("lr_policy"):
        p.lr_policy = "fixed"
    return p


def feed(solver):
    for net in [solver.net] + solver.test_nets:
        net.blobs["data"].data[...] = DATA
        net.blobs["label"].data[...] = LABEL
    return solver


def make(text="", **kw):
    return feed(get_solver(solver_param(text, **kw)))


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_chosen_by_type_and_by_legacy_solver_type(kind, tmp_path):
    legacy = {"SGD": "SGD", "Nesterov": "NESTEROV", "AdaGrad": "ADAGRAD", "RMSProp": "RMSPROP",
              "AdaDelta": "ADADELTA", "Adam": "ADAM"}[kind]
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    for line in (f'type: "{kind}"', f"solver_type: {legacy}"):
        path = tmp_path / "solver.prototxt"
        path.write_text(f'net: "{net}"\n{line}\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 1\n'
                        "snapshot_after_train: false\n")
        solver = get_solver(str(path))
        assert type(solver) is SOLVERS[kind] and solver.type == kind
        sets = 2 if kind in ("AdaDelta", "Adam") else 1
        assert [h.shape for h in solver.history] == [b.shape for b in solver.net.learnable_params] * sets


def test_unknown_type_and_refused_hyper_parameters():
    with pytest.raises(CaffeError, match="Unknown solver type: 'Foo'.*Adam"):
        make('type: "Foo"')
    with pytest.raises(CaffeError, match="Momentum cannot be used with AdaGrad"):
        make('type: "AdaGrad" momentum: 0.9')
    with pytest.raises(CaffeError, match="Momentum cannot be used with RMSProp"):
        make('type: "RMSProp" momentum: 0.9')
    with pytest.raises(CaffeError, match="rms_decay"):
        make('type: "RMSProp" rms_decay: 1.0')
    with pytest.raises(CaffeError, match="regularization type"):
        s = make('base_lr: 0.1 weight_decay: 0.1 regularization_type: "L3" max_iter: 1')
        s.step(1)


def grads(solver):
    """Param diffs after one forward/backward (from the engine's layers)."""
    solver.net.clear_param_diffs()
    solver.net.forward_backward()
    return [np.array(b.diff) for b in solver.net.learnable_params]


@pytest.mark.parametrize("reg", ["L1", "L2"])
def test_one_step_order_clip_then_normalize_then_regularize(reg):
    # iter_size 2 on identical batches doubles the accumulated gradient; clipping sees that
    # sum (before the 1/iter_size scaling), then weight decay (times decay_mult) is added.
    text = (f'base_lr: 0.5 momentum: 0 weight_decay: 0.01 regularization_type: "{reg}" '
            "clip_gradients: 0.05 iter_size: 2 max_iter: 1")
    solver = make(text)
    w0 = [np.array(b.data) for b in solver.net.learnable_params]
    g = grads(make(text))
    acc = [2 * x for x in g]
    norm = f32(math.sqrt(sum(f32(np.vdot(a.ravel(), a.ravel())) for a in acc)))
    assert norm > 0.05  # the case clips
    scale = f32(f32(0.05) / norm)
    expected = []
    for a, w, lr_mult, decay_mult in zip(acc, w0, (1, 2), (1, 0)):
        d = (a * scale) * (f32(1) / f32(2))
        if decay_mult:
            d = d + f32(0.01) * (w if reg == "L2" else np.sign(w))
        expected.append(w - f32(f32(0.5) * f32(lr_mult)) * d)
    solver.step(1)
    for b, e in zip(solver.net.learnable_params, expected):
        np.testing.assert_allclose(np.array(b.data), e, rtol=2e-6, atol=1e-7)


def test_clipping_logged_as_caffe(caplog):
    solver = make("base_lr: 0.1 clip_gradients: 1e-4 max_iter: 1 display: 1")
    with caplog.at_level("INFO", logger="caffe_engine"):
        solver.step(1)
    assert any(r.getMessage().startswith("Gradient clipping: scaling down gradients (L2 norm ")
               and "> 0.0001) by scale factor " in r.getMessage() for r in caplog.records)


def test_several_test_nets_with_states_and_test_loss(caplog):
    test_net = NET.replace('top: "loss" }', 'top: "loss" include { stage: "scored" } }')
    text = f"""
    base_lr: 0.1 max_iter: 2 test_interval: 1 test_compute_loss: true
    test_iter: 1 test_iter: 2
    test_net_param {{ {test_net} }}
    test_net_param {{ {test_net} }}
    test_state {{ stage: "scored" }}
    test_state {{ }}
    train_net_param {{ {NET} }}
    """
    solver = make(text)
    assert len(solver.test_nets) == 2
    assert "loss" in solver.test_nets[0].outputs and "loss" not in solver.test_nets[1].blobs
    with caplog.at_level("INFO", logger="caffe_engine"):
        solver.solve()
    msgs = [r.getMessage() for r in caplog.records]
    assert [m for m in msgs if "Testing net" in m] == [
        f"Iteration {i}, Testing net (#{k})" for i in (0, 1, 2) for k in (0, 1)]
    assert sum(m.startswith("Test loss: ") for m in msgs) == 6
    assert any(m.startswith("    Test net output #0: loss = ") and m.endswith(" loss)") for m in msgs)


def test_train_state_and_generic_net_for_tests():
    net = NET + 'layer { name: "extra" type: "ReLU" bottom: "ip" top: "r" include { stage: "x" } }'
    solver = make('base_lr: 0.1 max_iter: 1 test_iter: 1 test_interval: 5 train_state { stage: "x" }',
                  net=net)
    assert "extra" in solver.net.layer_names
    assert "extra" not in solver.test_nets[0].layer_names
    with pytest.raises(CaffeError, match="test_iter must be specified"):
        make(f"base_lr: 0.1 train_net_param {{ {NET} }} test_net_param {{ {NET} }}")


def test_requested_actions_snapshot_and_stop(tmp_path):
    prefix = tmp_path / "tiny"
    solver = make(f'base_lr: 0.1 max_iter: 10 snapshot_prefix: "{prefix}"')
    requests = iter([SolverAction.NONE, SolverAction.SNAPSHOT, SolverAction.NONE, SolverAction.STOP])
    solver.action_request_function = lambda: next(requests, SolverAction.NONE)
    solver.solve()
    # SNAPSHOT after the 2nd update, STOP after the 4th: the stop still writes its snapshot.
    assert solver.iter == 4 and solver.requested_early_exit
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "tiny_iter_2.caffemodel", "tiny_iter_2.solverstate",
        "tiny_iter_4.caffemodel", "tiny_iter_4.solverstate"]


@pytest.mark.parametrize("kind", sorted(SOLVERS))
def test_binaryproto_snapshot_restores_history_and_iter(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    momentum = 0 if kind in ("AdaGrad", "RMSProp") else 0.9
    text = (f'type: "{kind}" base_lr: 0.05 momentum: {momentum} lr_policy: "multistep" '
            'stepvalue: 2 gamma: 0.5 max_iter: 3 snapshot_prefix: "tiny"')
    solver = make(text)
    solver.solve()
    state = pio.read_binary("tiny_iter_3.solverstate", caffe_pb2.SolverState())
    assert (state.iter, state.learned_net, state.current_step) == (3, "tiny_iter_3.caffemodel", 1)
    assert len(state.history) == len(solver.history)
    resumed = make(text)
    resumed.restore("tiny_iter_3.solverstate")
    assert resumed.iter == 3 and resumed.current_step == 1
    for a, b in zip(resumed.history + [*resumed.net.learnable_params],
                    solver.history + [*solver.net.learnable_params]):
        assert np.array_equal(a.data, b.data)
    with pytest.raises(CaffeError, match="Incorrect length of history"):
        other_kind = "Nesterov" if kind in ("AdaDelta", "Adam") else "Adam"  # 1 vs 2 sets
        other = make(text.replace(f'type: "{kind}"', f'type: "{other_kind}"')
                     .replace("momentum: 0 ", "momentum: 0.9 "))
        other.restore("tiny_iter_3.solverstate")


def test_hdf5_snapshot_layout_and_restore(tmp_path, monkeypatch):
    h5py = pytest.importorskip("h5py")
    monkeypatch.chdir(tmp_path)
    text = ('type: "Adam" base_lr: 0.05 momentum: 0.9 max_iter: 2 snapshot_prefix: "tiny" '
            "snapshot_format: HDF5 snapshot_diff: true")
    solver = make(text)
    solver.solve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny_iter_2.caffemodel.h5", "tiny_iter_2.solverstate.h5"]
    with h5py.File("tiny_iter_2.caffemodel.h5", "r") as f:
        assert sorted(f["data"]) == ["data", "ip", "loss"] and sorted(f["diff"]) == ["data", "ip", "loss"]
        assert sorted(f["data/ip"]) == ["0", "1"] and f["data/ip/0"].shape == (3, 3)
        assert f["data/ip/0"].dtype == np.float32
        np.testing.assert_array_equal(f["data/ip/1"][()], solver.net.params["ip"][1].data)
        np.testing.assert_array_equal(f["diff/ip/0"][()], solver.net.params["ip"][0].diff)
    with h5py.File("tiny_iter_2.solverstate.h5", "r") as f:
        assert sorted(f) == ["current_step", "history", "iter", "learned_net"]
        assert f["iter"][0] == 2 and f["current_step"][0] == 0 and f["iter"].shape == (1,)  # Caffe's
        assert f["learned_net"][()] == b"tiny_iter_2.caffemodel.h5"
        assert sorted(f["history"], key=int) == [str(i) for i in range(4)]
        np.testing.assert_array_equal(f["history/3"][()], solver.history[3].data)
    resumed = make(text)
    resumed.restore("tiny_iter_2.solverstate.h5")
    assert resumed.iter == 2
    for a, b in zip(resumed.history + [*resumed.net.learnable_params],
                    solver.history + [*solver.net.learnable_params]):
        assert np.array_equal(a.data, b.data)


def test_snapshot_after_train_false_writes_nothing(tmp_path):
    solver = make(f'base_lr: 0.1 max_iter: 2 snapshot_prefix: "{tmp_path}/t" snapshot_after_train: false')
    solver.solve()
    assert list(tmp_path.iterdir()) == []


def test_weights_field_finetunes_train_and_test_nets(tmp_path, caplog):
    donor = make("base_lr: 0.1 max_iter: 3")
    donor.step(3)
    path = tmp_path / "w.caffemodel"
    donor.net.save(path)
    with caplog.at_level("INFO", logger="caffe_engine"):
        solver = make(f'base_lr: 0.1 max_iter: 1 test_iter: 1 test_interval: 1 weights: "{path}"')
    assert [r.getMessage() for r in caplog.records if "Finetuning" in r.getMessage()] == \
        [f"Finetuning from {path}"] * 2
    for net in (solver.net, solver.test_nets[0]):
        assert np.array_equal(net.params["ip"][0].data, donor.net.params["ip"][0].data)


def test_every_declared_rule_has_a_solver_and_a_naive_oracle():
    # caffe_engine/kernels/update_rules.py declares the rules; each needs its solver class
    # (Caffe's type string) and its naive loop here
    assert set(SOLVERS) == set(RULES) == set(NAIVE)
    for name, cls in SOLVERS.items():
        assert cls.type == name
