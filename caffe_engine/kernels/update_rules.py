"""Caffe's update rules, declared once: name, code, history sets, hyper-parameters read.

Caffe: src/caffe/solvers/{sgd,nesterov,adagrad,rmsprop,adadelta,adam}_solver.cpp. Each rule
turns one learnable param's gradient into the step subtracted from its weights, keeping one or
two *history sets* (arrays of the param's shape, what the ``.solverstate`` holds). The
declaration below is read by every kernel set (``reference``, ``cpu``, ``cuda``), each of which
holds its own table of the rules it implements, and by :mod:`caffe_engine.solvers.sgd` (the
number of history blobs, the hyper-parameters of :class:`Hyper`).

To add a rule: declare it here with the next free code, then write its kernel in each set
(``kernels/reference/solver.py``, ``kernels/cpu/solver.py``, ``kernels/cuda/solver.py``) and its
solver class (``solvers/sgd.py``). Until a set has its kernel, asking that set for the rule
raises a ValueError naming both (:func:`require`); no set runs another rule in its place.

Codes never change once given: the cpu set's Numba kernel is cached on disk with the codes
compiled in, and a cached kernel does not see a renumbered declaration.
"""
import dataclasses

import numpy

f32 = numpy.float32


@dataclasses.dataclass(frozen=True)
class UpdateRule:
    """One update rule.

    Attributes:
        name: the SolverParameter ``type`` that selects it ("SGD", "Adam", ...).
        code: the integer the fused kernels of the cpu and cuda sets switch on.
        history: what each history set holds, in ``.solverstate`` order (all of the first set's
            blobs, one per learnable param, then all of the second's).
        hyper: the SolverParameter fields the rule reads (besides the rate), each a float32
            attribute of :class:`Hyper`.
        source: the Caffe source file of the rule.
    """

    name: str
    code: int
    history: tuple
    hyper: tuple
    source: str

    @property
    def history_sets(self):
        """The number of history sets (1 or 2): history blobs per learnable param."""
        return len(self.history)


def _declare(*rules):
    return {rule.name: rule for rule in rules}


#: SolverParameter.type -> its :class:`UpdateRule`, in code order.
RULES = _declare(
    UpdateRule("SGD", 0, ("momentum history",), ("momentum",),
               "src/caffe/solvers/sgd_solver.cpp"),
    UpdateRule("Nesterov", 1, ("momentum history",), ("momentum",),
               "src/caffe/solvers/nesterov_solver.cpp"),
    UpdateRule("AdaGrad", 2, ("sum of squared gradients",), ("delta",),
               "src/caffe/solvers/adagrad_solver.cpp"),
    UpdateRule("RMSProp", 3, ("running mean of squared gradients",), ("rms_decay", "delta"),
               "src/caffe/solvers/rmsprop_solver.cpp"),
    UpdateRule("AdaDelta", 4, ("running mean of squared gradients",
                               "running mean of squared updates"), ("momentum", "delta"),
               "src/caffe/solvers/adadelta_solver.cpp"),
    UpdateRule("Adam", 5, ("first moments (m)", "second moments (v)"),
               ("momentum", "momentum2", "delta"), "src/caffe/solvers/adam_solver.cpp"),
)


def require(name, kernel_set, implemented):
    """The declared rule ``name``, checked to be among the rules ``kernel_set`` implements.

    Args:
        name: a SolverParameter ``type``.
        kernel_set: the set's name, for the message ("reference", "cpu", "cuda").
        implemented: the names of the rules the set has kernels for (a tuple or a dict's keys).

    Raises:
        ValueError: ``name`` is not declared in :data:`RULES` ("unknown update rule ..."), or
            is declared but the set has no kernel for it.
    """
    rule = RULES.get(name)
    if rule is None:
        raise ValueError(f"unknown update rule {name!r} (known: {', '.join(RULES)})")
    if name not in implemented:
        raise ValueError(f"update rule {name!r} is declared in caffe_engine/kernels/"
                         f"update_rules.py but the {kernel_set} kernel set has no kernel for it "
                         f"(it has: {', '.join(implemented)})")
    return rule


def hyper_fields():
    """The SolverParameter fields read by any declared rule, in declaration order."""
    return tuple(dict.fromkeys(field for rule in RULES.values() for field in rule.hyper))


class Hyper:
    """The float32 hyper-parameters the update rules read, from a SolverParameter.

    One float32 attribute per field of :func:`hyper_fields`: ``momentum`` (default 0; Adam's
    beta1), ``delta`` (1e-8), ``rms_decay`` (0.99), ``momentum2`` (0.999; Adam's beta2); and
    ``t``, the 1-based step count of Adam's bias correction (``iter + 1``), set per iteration.
    """

    def __init__(self, param):
        for field in hyper_fields():
            setattr(self, field, f32(getattr(param, field)))
        self.t = 1
