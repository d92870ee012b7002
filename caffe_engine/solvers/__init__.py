"""Solvers: the training loop (``solver.Solver``) and the update rules, chosen by ``type``.

Caffe: src/caffe/solver_factory.cpp (the registry by type string). The deprecated
``solver_type`` enum is mapped onto ``type`` when the solver prototxt is read (io/upgrade.py).
"""
from ..errors import CaffeError
from ..io import prototxt as pio
from ..proto import caffe_pb2
from .sgd import AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver, RMSPropSolver, SGDSolver
from .solver import Solver, SolverAction  # noqa: F401  (re-exported)

SOLVERS = {cls.type: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                     AdaDeltaSolver, AdamSolver)}


def get_solver(param, **kwargs):
    """Build the solver that ``param.type`` names (a SolverParameter or a solver prototxt path;
    ``kwargs`` go to the solver class, e.g. ``source=`` the file a SolverParameter came from).

    Raises:
        CaffeError: unknown solver type (the message lists the known ones).
    """
    if not isinstance(param, caffe_pb2.SolverParameter):
        kwargs.setdefault("source", str(param))
        param = pio.read_solver_param(str(param))
    cls = SOLVERS.get(param.type)
    if cls is None:
        raise CaffeError(f"solver: Unknown solver type: '{param.type}' (known types: {', '.join(sorted(SOLVERS))})")
    return cls(param, **kwargs)
