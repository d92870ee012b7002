"""``CAFFE_ENGINE_NO_ALIAS=1``: ``import caffe`` loads another ``caffe`` package (BVLC's
pycaffe) from ``sys.path`` in place of caffe_engine's alias."""
import importlib.machinery
import importlib.util
import os
import sys


def load_other_caffe(name, own_root):
    """Replace ``sys.modules[name]`` with the next ``caffe`` package on ``sys.path`` whose folder
    is not ``own_root`` (this alias's), and run it.

    Raises:
        ImportError: there is no other ``caffe`` on ``sys.path``.
    """
    own = os.path.realpath(own_root)
    path = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != own]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("CAFFE_ENGINE_NO_ALIAS is set but no other 'caffe' package is on "
                          "sys.path (put BVLC Caffe's python/ folder on PYTHONPATH)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
