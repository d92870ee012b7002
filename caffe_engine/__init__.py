"""caffe_engine: BVLC Caffe's nets, solvers and weights, trained on NumPy or CuPy.

The top level has pycaffe's shape, so that ``import caffe_engine as caffe`` serves scripts
written for pycaffe::

    net = caffe_engine.Net("deploy.prototxt", caffe_engine.TEST, weights="model.caffemodel")
    out = net.forward()
"""
from .backend import set_device, set_mode_cpu, set_mode_gpu  # noqa: F401
from .blob import Blob  # noqa: F401
from .errors import CaffeError  # noqa: F401
from .layers import layer_type_list  # noqa: F401
from .layers.python_layer import PythonLayerBase as Layer  # noqa: F401  (pycaffe's caffe.Layer)
from .net import TEST, TRAIN, Net  # noqa: F401
from .rng import set_random_seed  # noqa: F401
from .solvers import SGDSolver, get_solver  # noqa: F401

__version__ = "0.1.0"
