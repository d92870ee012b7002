"""Learning-rate policies reproduce every ``lr`` BVLC Caffe printed in the training fixtures."""
import json

import pytest

from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.log import g
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers.lr_policy import learning_rate
from paths import SHARED

TRAINING = SHARED / "caffe_reference" / "training"
CASES = sorted(p.name for p in TRAINING.iterdir() if (p / "trajectory.json").exists())


@pytest.mark.parametrize("case", CASES)
def test_printed_rates_match_caffe(case):
    runs = json.loads((TRAINING / case / "trajectory.json").read_text())["runs"]
    for run in runs.values():
        param = pio.read_solver_param(str(TRAINING / case / run["solver"]))
        state = {"current_step": 0}
        its, lrs = run["iterations"]["iter"], run["iterations"]["lr"]
        printed = [g(learning_rate(param, it, state)) for it in its]
        assert printed == [g(x) for x in lrs]


def test_poly_reaches_zero_and_unknown_policy_is_an_error():
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="poly", power=1.0, max_iter=100)
    assert learning_rate(p, 0, {}) == pytest.approx(0.1)
    assert learning_rate(p, 50, {}) == pytest.approx(0.05)
    assert learning_rate(p, 100, {}) == 0
    p.lr_policy = "cosine"
    with pytest.raises(CaffeError, match="unknown lr_policy 'cosine'"):
        learning_rate(p, 0, {})
