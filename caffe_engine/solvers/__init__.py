"""Solvers: the training loop (``solver.Solver``) and the update rules, chosen by ``type``.

Caffe: src/caffe/solver_factory.cpp (the registry by type string). The deprecated
``solver_type`` enum is mapped onto ``type`` when the solver prototxt is read (io/upgrade.py).
"""
from ..errors import CaffeError
from ..io import prototxt as pio
from ..proto import caffe_pb2
from .callback import CALLBACK_EVENTS, SolverAction, SolverCallback  # noqa: F401  (re-exported)
from .sgd import AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver, RMSPropSolver, SGDSolver
from .solver import Solver  # noqa: F401  (re-exported)

SOLVERS = {cls.type: cls for cls in (SGDSolver, NesterovSolver, AdaGradSolver, RMSPropSolver,
                                     AdaDeltaSolver, AdamSolver)}


def get_solver(param, comm=None, bucket_mb=25.0, debug_sync=False, fc_parallel=None, **kwargs):
    """Build the solver that ``param.type`` names (a SolverParameter or a solver prototxt path;
    ``kwargs`` go to the solver class: ``source=`` the file a SolverParameter came from,
    ``callbacks=`` its :class:`~.callback.SolverCallback` objects).

    ``comm`` (a communicator of more than one rank), ``bucket_mb``, ``debug_sync`` and
    ``fc_parallel`` (PCL-DNN's hybrid InnerProduct layers: "data", "auto" or G; None: each
    layer's ``parallel`` field) are a shorthand kept for Python callers: they put a
    :class:`caffe_engine.comm.data_parallel.DataParallel` first among the callbacks, as
    ``caffe train`` does under ``mpiexec``. With ``comm`` None or of one rank they do nothing.
    (The communicator package is imported here, only then; the solver module never imports it.)

    Raises:
        CaffeError: unknown solver type (the message lists the known ones); a bad ``bucket_mb``
            or ``fc_parallel`` (one line).
    """
    if comm is not None and comm.size > 1:
        from ..comm.data_parallel import DataParallel
        kwargs["callbacks"] = [DataParallel(comm, bucket_mb=bucket_mb, debug_sync=debug_sync,
                                            fc_parallel=fc_parallel),
                               *kwargs.get("callbacks", ())]
    if not isinstance(param, caffe_pb2.SolverParameter):
        kwargs.setdefault("source", str(param))
        param = pio.read_solver_param(str(param))
    cls = SOLVERS.get(param.type)
    if cls is None:
        raise CaffeError(f"solver: Unknown solver type: '{param.type}' (known types: {', '.join(sorted(SOLVERS))})")
    return cls(param, **kwargs)
