"""caffe: BVLC pycaffe's import name, over caffe_engine.

Scripts written for pycaffe run unedited: ``import caffe``, ``from caffe import layers as L,
params as P``, ``from caffe.proto import caffe_pb2``, ``import caffe.draw``, Python layers
written as ``class MyLayer(caffe.Layer)``. Every name and submodule here is caffe_engine's own
object (``caffe.Net is caffe_engine.Net``, ``caffe.io is caffe_engine.io``); nothing is copied.

The names are those of BVLC Caffe's python/caffe/__init__.py (master). To use BVLC's own
pycaffe from the same environment, put its ``python/`` folder first on ``PYTHONPATH`` (it is
then found before this package), or set ``CAFFE_ENGINE_NO_ALIAS=1``: ``import caffe`` then
loads the next ``caffe`` package on ``sys.path`` instead of this one, or fails with an
ImportError saying there is none.
"""
import os as _os
import sys as _sys

# Read here, not through caffe_engine.environment (where it is declared): importing that would
# import the engine this switch is there to avoid.
if _os.environ.get("CAFFE_ENGINE_NO_ALIAS", "") not in ("", "0"):
    from ._elsewhere import load_other_caffe as _load_other_caffe
    _load_other_caffe(__name__, _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))))
else:
    import caffe_engine as _engine
    from caffe_engine import coord_map, detector, draw, io, net_spec, proto  # noqa: F401
    from caffe_engine import pycaffe as _pycaffe_impl
    from caffe_engine.proto import caffe_pb2 as _caffe_pb2

    # Submodules by their pycaffe names, so that ``import caffe.io`` and
    # ``from caffe.proto import caffe_pb2`` give the engine's modules.
    for _name, _module in {"io": io, "proto": proto, "proto.caffe_pb2": _caffe_pb2,
                           "net_spec": net_spec, "draw": draw, "coord_map": coord_map,
                           "detector": detector, "classifier": _pycaffe_impl}.items():
        _sys.modules[f"{__name__}.{_name}"] = _module

    from caffe_engine import (TEST, TRAIN, AdaDeltaSolver, AdaGradSolver,  # noqa: F401
                              AdamSolver, Blob, Classifier, Detector, Layer, NCCL,
                              NesterovSolver, Net, NetSpec, RMSPropSolver, SGDSolver, Timer,
                              get_solver, has_nccl, init_log, layer_type_list, log, params,
                              set_device, set_mode_cpu, set_mode_gpu, set_multiprocess,
                              set_random_seed, set_solver_count, set_solver_rank, solver_count,
                              solver_rank, to_proto)
    from caffe_engine.net_spec import layers  # noqa: F401  (pycaffe's L, not the engine's layers/)
    from . import pycaffe  # noqa: F401

    __version__ = _engine.__version__
