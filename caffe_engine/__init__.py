"""caffe_engine: BVLC Caffe's nets, solvers and weights, trained on NumPy or CuPy.

The top level has pycaffe's shape; the ``caffe`` package installed beside this one re-exports
it under pycaffe's own import name, so a script written for pycaffe runs unedited::

    net = caffe.Net("deploy.prototxt", caffe.TEST, weights="model.caffemodel")
    transformer = caffe.io.Transformer({"data": net.blobs["data"].data.shape})
    out = net.forward()
    solver = caffe.SGDSolver("solver.prototxt"); solver.step(100)
    n = caffe.NetSpec(); n.conv1 = caffe.layers.Convolution(n.data, num_output=20, kernel_size=5)

``caffe.proto.caffe_pb2`` is the protobuf schema, ``caffe.io`` pycaffe's conversions and
image preprocessing, ``caffe.layers`` / ``caffe.params`` / ``caffe.NetSpec`` / ``caffe.to_proto``
pycaffe's net_spec.
"""
from . import io, proto  # noqa: F401  (caffe.io, caffe.proto.caffe_pb2)
from .backend import (set_device, set_mode_cpu, set_mode_gpu, set_multiprocess,  # noqa: F401
                      set_solver_count, set_solver_rank, solver_count, solver_rank)
from .blob import Blob  # noqa: F401
from .errors import CaffeError  # noqa: F401
from .layers import layer_type_list  # noqa: F401
from .layers.python_layer import PythonLayerBase as Layer  # noqa: F401  (pycaffe's caffe.Layer)
from .net import TEST, TRAIN, Net  # noqa: F401
from .net_spec import NetSpec, params, to_proto  # noqa: F401  (caffe.layers is the subpackage)
from .detector import Detector  # noqa: F401
from .pycaffe import NCCL, Classifier, Timer, has_nccl, init_log, log  # noqa: F401
from .rng import set_random_seed  # noqa: F401
from .solvers import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver,  # noqa: F401
                      RMSPropSolver, SGDSolver, get_solver)

__version__ = "0.1.0"
