"""Solvers: the training loop (``solver.Solver``) and the update rules, chosen by ``type``."""
from ..errors import CaffeError
from ..io import prototxt as pio
from ..proto import caffe_pb2
from .sgd import SGDSolver
from .solver import Solver  # noqa: F401

SOLVERS = {"SGD": SGDSolver}


def get_solver(param, **kwargs):
    """Build the solver that ``param.type`` names (a SolverParameter or a solver prototxt path).

    Raises:
        CaffeError: unknown or not yet supported solver type.
    """
    if not isinstance(param, caffe_pb2.SolverParameter):
        param = pio.read_solver_param(str(param))
    cls = SOLVERS.get(param.type)
    if cls is None:
        raise CaffeError(f"solver: unknown solver type '{param.type}' (supported: {', '.join(sorted(SOLVERS))})")
    return cls(param, **kwargs)
