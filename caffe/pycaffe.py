"""pycaffe's ``caffe.pycaffe`` module: Net, the solvers, NCCL and Timer (caffe_engine's own).

Caffe: python/caffe/pycaffe.py, which decorates the C++ Net with pycaffe's methods; in the
engine those methods are the Net class's own.
"""
from caffe_engine import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NCCL,  # noqa: F401
                          NesterovSolver, Net, RMSPropSolver, SGDSolver, Timer)
