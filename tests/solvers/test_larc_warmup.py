"""NVCaffe's LARC and learning-rate warm-up: the per-param rate against a NumPy oracle written
from the formula (You et al. 2017 as NVCaffe's sgd_solver.cpp computes it), the warm-up
schedule at chosen iterations, the refused values, and an NVCaffe-style solver file that parses
and trains a tiny net."""
import math

import numpy as np
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver
from caffe_engine.solvers.larc import local_rate
from caffe_engine.solvers.lr_policy import learning_rate
from tiny_nets import SOFTMAX_DATA as DATA, SOFTMAX_LABEL as LABEL, SOFTMAX_NET as NET

f32 = np.float32


def make(text, net=NET):
    p = text_format.Parse(text, caffe_pb2.SolverParameter())
    p.net_param.CopyFrom(text_format.Parse(net, caffe_pb2.NetParameter()))
    p.random_seed = 1
    p.snapshot_after_train = False
    if not p.HasField("lr_policy"):
        p.lr_policy = "fixed"
    solver = get_solver(p)
    for n in [solver.net] + solver.test_nets:
        n.blobs["data"].data[...] = DATA
        n.blobs["label"].data[...] = LABEL
    return solver


def oracle_rate(rate, w, gr, momentum, eta, policy):
    """LARC's rate from the formula, in float64 NumPy."""
    wn, gn = np.linalg.norm(w.astype(np.float64)), np.linalg.norm(gr.astype(np.float64))
    trust = (1 - momentum) * eta * wn / gn if wn > 0 and gn > 0 else 1.0
    return min(rate, trust) if policy == "clip" else rate * trust


# ------------------------------------------------------------------------------------------------
# LARC's rate and norms
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["clip", "scale"])
def test_local_rate_matches_the_formula_on_blobs(policy, kernel_set):
    rng = np.random.default_rng(7)
    blobs = [(rng.normal(0, 0.1, (20, 1, 5, 5)), rng.normal(0, 1e-3, (20, 1, 5, 5))),  # small g
             (rng.normal(0, 1.0, (500, 80)), rng.normal(0, 0.5, (500, 80))),          # large g
             (rng.normal(0, 0.2, (7,)), rng.normal(0, 0.01, (7,))),
             (np.zeros((10,)), rng.normal(0, 1, (10,))),      # a zero-initialised bias: ||w|| = 0
             (rng.normal(0, 1, (10,)), np.zeros((10,))),      # no gradient: ||g|| = 0
             (np.zeros((3, 3)), np.zeros((3, 3)))]
    rate, momentum, eta = 0.5, 0.9, 0.02
    xp = backend.xp()           # CuPy for the ``cuda`` set (GPU mode): norms stay 0-d there
    for w, gr in blobs:
        w, gr = w.astype(f32), gr.astype(f32)
        wn, gn = kernel_set.param_norms(xp.asarray(w), xp.asarray(gr))
        got = local_rate(f32(rate), wn, gn, f32(momentum), f32(eta), policy)
        if xp is np:
            assert type(wn) is f32 and type(gn) is f32
            assert type(got) is f32
        else:
            assert wn.shape == gn.shape == got.shape == () and got.dtype == f32
            wn, gn, got = (backend.host_scalar(v) for v in (wn, gn, got))
        np.testing.assert_allclose([wn, gn], [np.linalg.norm(w.astype(np.float64)),
                                              np.linalg.norm(gr.astype(np.float64))], rtol=1e-6)
        assert got == pytest.approx(oracle_rate(rate, w, gr, momentum, eta, policy), rel=1e-5)
    # the zero-norm cases: trust 1, so "scale" keeps the rate and "clip" caps it at 1
    assert local_rate(f32(3), f32(0), f32(1), f32(0.9), f32(0.001), "scale") == f32(3)
    assert local_rate(f32(3), f32(1), f32(0), f32(0.9), f32(0.001), "clip") == f32(1)
    assert local_rate(f32(0.5), f32(0), f32(0), f32(0.9), f32(0.001), "clip") == f32(0.5)


@pytest.mark.parametrize("kind,policy", [("SGD", "clip"), ("SGD", "scale"),
                                         ("Nesterov", "scale")])
def test_one_larc_step_against_the_oracle(kind, policy):
    # iter_size 2 on identical batches doubles the summed gradient; LARC sees it normalised,
    # before weight decay; lr_mult 2 of the bias is replaced by LARC's rate (NVCaffe).
    text = (f'type: "{kind}" base_lr: 0.8 momentum: 0.9 weight_decay: 0.01 iter_size: 2 '
            f'larc: true larc_policy: "{policy}" larc_eta: 0.05 max_iter: 2')
    solver = make(text)
    probe = make(text)
    probe.net.clear_param_diffs()
    probe.net.forward_backward()
    grads = [np.array(b.diff) for b in probe.net.learnable_params]
    w0 = [np.array(b.data) for b in solver.net.learnable_params]
    solver.step(1)
    for b, w, gr, decay_mult in zip(solver.net.learnable_params, w0, grads, (1, 0)):
        rate = oracle_rate(0.8, w, gr, 0.9, 0.05, policy)
        d = gr.astype(np.float64) + 0.01 * decay_mult * w      # (2 g) / 2 + decay
        h = rate * d
        step = h if kind == "SGD" else 1.9 * h                  # Nesterov: (1 + m) h' - m h
        np.testing.assert_allclose(np.array(b.data), w - step, rtol=2e-5, atol=1e-7)


def test_lars_trust_ratio_is_you_et_al_with_the_blob_s_weight_decay():
    # larc_trust "lars": eta ||w|| / (||g|| + wd ||w||), no momentum factor; the bias has
    # decay_mult 0 in NET, so its ratio is eta ||w|| / ||g||
    assert local_rate(f32(1), f32(2), f32(0.5), f32(0.9), f32(0.1), "scale", "lars",
                      f32(0.25)) == pytest.approx(0.1 * 2 / (0.5 + 0.25 * 2), rel=1e-6)
    assert local_rate(f32(0.01), f32(2), f32(0.5), f32(0.9), f32(0.1), "clip", "lars",
                      f32(0.25)) == f32(0.01)
    text = ('base_lr: 0.8 momentum: 0.9 weight_decay: 0.01 larc: true larc_trust: "lars" '
            'larc_eta: 0.05 max_iter: 1')
    solver, probe = make(text), make(text)
    probe.net.clear_param_diffs()
    probe.net.forward_backward()
    grads = [np.array(b.diff, np.float64) for b in probe.net.learnable_params]
    w0 = [np.array(b.data, np.float64) for b in solver.net.learnable_params]
    solver.step(1)
    for b, w, gr, decay_mult in zip(solver.net.learnable_params, w0, grads, (1, 0)):
        wd = 0.01 * decay_mult
        wn, gn = np.linalg.norm(w), np.linalg.norm(gr)
        rate = 0.8 * (0.05 * wn / (gn + wd * wn) if wn > 0 and gn > 0 else 1.0)
        np.testing.assert_allclose(np.array(b.data), w - rate * (gr + wd * w), rtol=2e-5,
                                   atol=1e-7)


def test_larc_leaves_frozen_params_frozen():
    net = NET.replace("param { lr_mult: 1 }", "param { lr_mult: 0 }")
    solver = make('base_lr: 0.5 momentum: 0.9 larc: true larc_policy: "scale" max_iter: 1', net)
    w0, b0 = (np.array(b.data) for b in solver.net.learnable_params)
    solver.step(1)
    w1, b1 = (np.array(b.data) for b in solver.net.learnable_params)
    np.testing.assert_array_equal(w1, w0)
    assert not np.array_equal(b1, b0)


@pytest.mark.parametrize("text,match", [
    ('larc: true larc_eta: -0.001', "larc_eta must be > 0"),
    ('larc: true larc_eta: 0', "larc_eta must be > 0"),
    ('larc: true larc_policy: "trim"', "unknown larc_policy 'trim'"),
    ('larc: true larc_turbo: true', "larc_turbo"),
    ('larc: true larc_trust: "adam"', "unknown larc_trust 'adam' \\(known: nvcaffe, lars\\)"),
    ('larc: true type: "Adam"', "larc applies to type SGD or Nesterov, not 'Adam'"),
    ('min_lr: -1', "min_lr must be >= 0"),
    ('rampup_interval: -5', "rampup_interval must be >= 0"),
    ('rampup_interval: 5 rampup_power: 0', "rampup_power must be > 0"),
])
def test_bad_values_are_one_line_errors_naming_the_field(text, match):
    with pytest.raises(CaffeError, match=match) as info:
        make("base_lr: 0.1 max_iter: 1 " + text)
    assert "\n" not in str(info.value)


def test_larc_off_ignores_its_fields():
    make('base_lr: 0.1 larc_policy: "trim" larc_eta: -1 type: "Adam"').step(1)


# ------------------------------------------------------------------------------------------------
# Warm-up and min_lr
# ------------------------------------------------------------------------------------------------
def rates(text, its):
    p = text_format.Parse(text, caffe_pb2.SolverParameter())
    state = {"current_step": 0}
    return [float(learning_rate(p, it, state)) for it in its]


def test_nvcaffe_quadratic_rampup_then_the_policy_at_the_true_iteration():
    text = ('base_lr: 2 lr_policy: "poly" power: 2 max_iter: 100 '
            'rampup_interval: 10 rampup_lr: 0.5')
    got = rates(text, [0, 1, 5, 9, 10, 50, 100])
    ramp = [0.5 + 1.5 * (it / 10) ** 2 for it in (0, 1, 5, 9)]
    poly = [2 * (1 - it / 100) ** 2 for it in (10, 50, 100)]
    np.testing.assert_allclose(got, ramp + poly, rtol=1e-6)


def test_linear_warmup_and_rampup_lr_default_zero():
    got = rates('base_lr: 0.4 lr_policy: "fixed" rampup_interval: 8 rampup_power: 1',
                [0, 2, 4, 7, 8, 20])
    np.testing.assert_allclose(got, [0, 0.1, 0.2, 0.35, 0.4, 0.4], rtol=1e-6)


def test_step_policy_counts_steps_only_after_the_ramp():
    p = text_format.Parse('base_lr: 1 lr_policy: "multistep" gamma: 0.1 stepvalue: 2 '
                          'stepvalue: 6 rampup_interval: 4 rampup_power: 1',
                          caffe_pb2.SolverParameter())
    state = {"current_step": 0}
    got = [float(learning_rate(p, it, state)) for it in range(8)]
    # NVCaffe: multistep is not consulted during the ramp, then advances one step per iteration
    np.testing.assert_allclose(got, [0, 0.25, 0.5, 0.75, 0.1, 0.1, 0.01, 0.01], rtol=1e-6)


def test_min_lr_floor_and_nvcaffe_poly():
    got = rates('base_lr: 1 lr_policy: "poly" power: 1 max_iter: 10 min_lr: 0.2', [0, 5, 10])
    np.testing.assert_allclose(got, [1, 0.6, 0.2], rtol=1e-6)        # (1 - 0.2) * frac + 0.2
    got = rates('base_lr: 1 lr_policy: "step" gamma: 0.1 stepsize: 1 min_lr: 0.05', [0, 1, 2])
    np.testing.assert_allclose(got, [1, 0.1, 0.05], rtol=1e-6)
    got = rates('base_lr: 1 lr_policy: "fixed" rampup_interval: 4 rampup_power: 1 min_lr: 0.3',
                [0, 1, 2])
    np.testing.assert_allclose(got, [0.3, 0.3, 0.5], rtol=1e-6)
    with pytest.raises(CaffeError, match="base_lr >= min_lr"):
        rates('base_lr: 0.1 lr_policy: "poly" power: 1 max_iter: 10 min_lr: 0.2', [0])


def test_defaults_leave_bvlc_rates_alone():
    p = caffe_pb2.SolverParameter()
    assert (p.larc, p.larc_policy, p.larc_eta, p.larc_turbo) == (False, "scale", f32(0.001), False)
    assert (p.rampup_interval, p.rampup_lr, p.min_lr, p.rampup_power) == (0, 0, 0, 2)
    got = rates('base_lr: 0.01 lr_policy: "inv" gamma: 0.0001 power: 0.75', [0, 1000])
    np.testing.assert_allclose(got, [0.01, 0.01 * 1.1 ** -0.75], rtol=1e-6)


def test_nvcaffe_field_numbers():
    fields = caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name
    assert {k: fields[k].number for k in ("min_lr", "larc", "larc_policy", "larc_eta",
                                          "larc_turbo")} == \
        {"min_lr": 43, "larc": 49, "larc_policy": 50, "larc_eta": 51, "larc_turbo": 55}
    # NVCaffe's 41 and 42 are BVLC's layer_wise_reduce and weights: those stay BVLC's
    assert fields["layer_wise_reduce"].number == 41 and fields["weights"].number == 42
    assert fields["rampup_interval"].number not in (41, 42)


# ------------------------------------------------------------------------------------------------
# An NVCaffe solver file
# ------------------------------------------------------------------------------------------------
NVCAFFE_SOLVER = """# as NVCaffe's models/alexnet_bn solvers write them
net: "{net}"
max_iter: 6
display: 1
base_lr: 4
min_lr: 0.001
larc: true
larc_policy: "clip"
larc_eta: 0.2
rampup_lr: 0.5
rampup_interval: 3      # iterations
lr_policy: "poly"
power: 2.
momentum: 0.9
weight_decay: 0.0005
snapshot_after_train: false
solver_mode: GPU
random_seed: 1
"""


def test_nvcaffe_solver_file_parses_and_trains(tmp_path, caplog):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    path = tmp_path / "solver.prototxt"
    path.write_text(NVCAFFE_SOLVER.format(net=net))
    parsed = text_format.Parse(path.read_text(), caffe_pb2.SolverParameter())
    assert (parsed.larc, parsed.larc_policy, parsed.rampup_interval) == (True, "clip", 3)
    param = pio.read_solver_param(str(path))
    assert param.larc_eta == f32(0.2) and param.rampup_lr == 0.5 and param.min_lr == f32(0.001)
    solver = get_solver(str(path))
    for n in [solver.net] + solver.test_nets:
        n.blobs["data"].data[...] = DATA
        n.blobs["label"].data[...] = LABEL
    losses = []
    with caplog.at_level("INFO", logger="caffe_engine"):
        for _ in range(6):
            solver.step(1)
            losses.append(float(solver.net.forward_loss()))
    assert solver.iter == 6
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    lrs = [float(r.getMessage().split("lr = ")[1]) for r in caplog.records
           if ", lr = " in r.getMessage()]
    expected = [0.5 + 3.5 * (it / 3) ** 2 for it in range(3)] + \
        [3.999 * (1 - it / 6) ** 2 + 0.001 for it in range(3, 6)]    # NVCaffe's poly to min_lr
    np.testing.assert_allclose(lrs, expected, rtol=1e-5)
