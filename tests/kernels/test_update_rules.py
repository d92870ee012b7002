"""The update rules' declaration (caffe_engine/kernels/update_rules.py) against the kernel sets.

Every declared rule has a kernel in every set (reference, cpu, cuda); a rule declared without
kernels is refused by each set with a message naming the rule and the set, never run as another
rule. The cuda set is made on a stand-in device: asking for a step compiles nothing.
"""
import types

import numpy
import pytest

from caffe_engine import kernels
from caffe_engine.kernels.cuda import CudaKernels
from caffe_engine.kernels.cuda import solver as cuda_solver
from caffe_engine.kernels.reference import solver as reference_solver
from caffe_engine.kernels.update_rules import RULES, Hyper, UpdateRule, hyper_fields
from caffe_engine.proto import caffe_pb2

f32 = numpy.float32


def _kernel_sets():
    """(name, kernel set) for every set this machine can make; the cuda set on a stand-in."""
    sets = [("reference", kernels.get("reference")),
            ("cuda", CudaKernels(types.SimpleNamespace(xp=numpy)))]
    if "cpu" in kernels.available():
        from caffe_engine.kernels.cpu import CpuKernels
        from caffe_engine.kernels.cpu.tuning import CpuTuning
        sets.append(("cpu", CpuKernels(CpuTuning(threads=1))))
    return sets


def test_the_declaration_is_consistent():
    codes = [rule.code for rule in RULES.values()]
    assert codes == list(range(len(codes)))  # in code order, none skipped, none twice
    fields = caffe_pb2.SolverParameter.DESCRIPTOR.fields_by_name
    for name, rule in RULES.items():
        assert rule.name == name
        assert rule.history_sets in (1, 2), name  # the fused kernels hold h0 and h1
        assert all(field in fields for field in rule.hyper), name
        assert rule.source.startswith("src/caffe/solvers/"), name


def test_every_declared_rule_has_a_kernel_in_every_set():
    assert set(reference_solver.KERNELS) == set(RULES)
    assert set(cuda_solver.KERNELS) == set(RULES)
    if "cpu" in kernels.available():
        from caffe_engine.kernels.cpu import solver as cpu_solver
        assert set(cpu_solver.IMPLEMENTED) == set(RULES)
    for set_name, kernel_set in _kernel_sets():
        for rule in RULES:
            assert callable(kernel_set.update(rule)), f"{set_name} {rule}"


def test_the_cuda_source_switches_on_the_declared_codes():
    for rule, kernel in cuda_solver.KERNELS.items():
        macro = f"CE_SV_{rule.upper()}"
        assert f"#define {macro} {RULES[rule].code}\n" in cuda_solver.SOURCE.code
        two = int(RULES[rule].history_sets > 1)
        assert f"void {kernel}(" in cuda_solver.SOURCE.code
        assert f"ce_solver_step_body<{macro}, {two}>" in cuda_solver.SOURCE.code


@pytest.fixture
def lion(monkeypatch):
    """A rule declared with no kernel in any set (the next free code)."""
    monkeypatch.setitem(RULES, "Lion", UpdateRule("Lion", len(RULES), ("momentum history",),
                                                  ("momentum", "momentum2"),
                                                  "src/caffe/solvers/lion_solver.cpp"))
    return "Lion"


@pytest.mark.parametrize("set_name", ["reference", "cpu", "cuda"])
def test_a_declared_rule_without_kernels_is_refused_by_every_set(lion, set_name):
    sets = dict(_kernel_sets())
    if set_name not in sets:
        pytest.skip(f"the {set_name} kernel set is not available here")
    message = (f"update rule 'Lion' is declared in caffe_engine/kernels/update_rules.py but "
               f"the {set_name} kernel set has no kernel for it")
    with pytest.raises(ValueError, match=message):
        sets[set_name].update(lion)


def test_the_reference_step_refuses_the_rule_before_touching_the_arrays(lion):
    data, diff, history = numpy.ones(3, f32), numpy.ones(3, f32), [numpy.zeros(3, f32)]
    hyper = Hyper(caffe_pb2.SolverParameter())
    with pytest.raises(ValueError, match="reference kernel set has no kernel"):
        reference_solver.step(lion, data, diff, history, f32(0.1), hyper, f32(0.5), False,
                              f32(0.5))
    assert (data == 1).all() and (diff == 1).all() and (history[0] == 0).all()


@pytest.mark.parametrize("set_name", ["reference", "cpu", "cuda"])
def test_an_undeclared_rule_is_unknown_to_every_set(set_name):
    sets = dict(_kernel_sets())
    if set_name not in sets:
        pytest.skip(f"the {set_name} kernel set is not available here")
    with pytest.raises(ValueError, match="unknown update rule 'Lion' \\(known: SGD, Nesterov"):
        sets[set_name].update("Lion")


def test_hyper_reads_every_declared_field(monkeypatch):
    param = caffe_pb2.SolverParameter(momentum=0.9, momentum2=0.99, delta=1e-6, rms_decay=0.5,
                                      clip_gradients=3.5)
    hyper = Hyper(param)
    assert set(hyper_fields()) == {"momentum", "momentum2", "delta", "rms_decay"}
    for field in hyper_fields():
        value = getattr(hyper, field)
        assert type(value) is f32 and value == f32(getattr(param, field)), field
    assert hyper.t == 1
    monkeypatch.setitem(RULES, "Clipped", UpdateRule("Clipped", len(RULES), ("history",),
                                                     ("clip_gradients",), "none"))
    assert Hyper(param).clip_gradients == f32(3.5)
