"""The models' algorithms are the registry's (caffe_engine/comm/registry.py), and the runtime loads
nothing of caffe_engine/perf (the alpha-beta model it reads is caffe_engine/comm/allreduce_cost.py;
caffe_engine/perf/alpha_beta.py fits it).

Oracles: the registry itself (every registered algorithm has a formula or schedule, or is listed
as not modelled with a reason; no formula for an unregistered name), and sys.modules of a fresh
interpreter.
"""
import json
import os
import subprocess
import sys

from caffe_engine.comm import registry
from caffe_engine.perf import alpha_beta, schedules

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _covers(modelled, not_modelled):
    names = set(registry.ALGORITHMS)
    assert set(modelled) | set(not_modelled) == names, \
        f"registered but neither modelled nor listed: {names - set(modelled) - set(not_modelled)}"
    assert not set(modelled) & set(not_modelled)
    assert all(reason.strip() for reason in not_modelled.values())


def test_every_registered_algorithm_has_a_formula_or_is_listed_as_not_modelled():
    _covers(alpha_beta.SHAPE_TERMS, alpha_beta.NOT_MODELLED)
    assert alpha_beta.ALGORITHMS == tuple(n for n in registry.ALGORITHMS
                                          if n in alpha_beta.SHAPE_TERMS)
    assert alpha_beta.ALGORITHMS == ("tree", "ring", "ps", "mpi")


def test_every_registered_algorithm_has_a_schedule_or_is_listed_as_not_modelled():
    _covers({**schedules.FLAT_SCHEDULES, **schedules.COMPOSED_SCHEDULES},
            schedules.NOT_MODELLED)
    assert schedules.LINK_ALGORITHMS == ("tree", "ring", "ps", "mpi")


def test_every_formula_gives_positive_terms_from_two_ranks():
    for name in alpha_beta.ALGORITHMS:
        for p in (2, 3, 8, 17):
            a, b = alpha_beta.shape_terms(name, p)
            assert a > 0 and b > 0
        assert alpha_beta.shape_terms(name, 1) == (0.0, 0.0)
    for name in schedules.LINK_ALGORITHMS + tuple(schedules.COMPOSED_SCHEDULES):
        assert schedules.link_schedule(name, 1 << 20, 4, 2)


def test_the_runtime_loads_no_performance_model(tmp_path):
    model = tmp_path / "model.json"
    alpha_beta.AlphaBetaModel({"tree": {"alpha": 1e-5, "beta": 1e-9}}).save(model)
    code = (
        "import sys, json\n"
        "import caffe_engine.comm, caffe_engine.solvers, caffe_engine.cli\n"
        "from caffe_engine.comm.bucket_plan import model_alpha_beta\n"
        "perf = lambda: sorted(m for m in sys.modules if m.startswith('caffe_engine.perf'))\n"
        "before = perf()\n"
        f"terms = model_alpha_beta({str(model)!r}, 'tree', 4)\n"
        "print(json.dumps([before, perf(), terms]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after, terms = json.loads(out.stdout.splitlines()[-1])
    assert before == []
    assert after == []
    assert terms[0] == 1e-5 * 4 and abs(terms[1] - 1e-9 * 4) < 1e-18
