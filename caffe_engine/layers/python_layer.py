"""Python layers: a layer whose setup, reshape, forward and backward are the user's Python class.

Caffe: include/caffe/layers/python_layer.hpp, src/caffe/layer_factory.cpp (``GetPythonLayer``),
python/caffe/_caffe.cpp (``caffe.Layer``, ``BlobVec.add_blob``).

In prototxt::

    layer { name: "mine" type: "Python" bottom: "data" top: "out"
            python_param { module: "my_layers" layer: "MyLayer" param_str: "{'k': 3}" } }

``module`` is imported (the current directory is searched first, then ``sys.path``, as a pycaffe
user running from the net's directory expects) and ``layer`` is instantiated with the
LayerParameter, as pycaffe does. The class may derive from :class:`PythonLayerBase` (what
``caffe.Layer`` is in pycaffe) or be any class with ``setup``, ``reshape``, ``forward`` and
``backward`` methods. Before ``setup`` the instance gets ``param_str`` (str), ``phase`` (int: 0
TRAIN, 1 TEST) and ``blobs`` (a list of Blobs with ``add_blob(*shape)``); the net treats those
blobs as the layer's learnable parameters. The methods receive lists of
:class:`~caffe_engine.blob.Blob` (``.data``, ``.diff``, ``.reshape(*shape)``, ``.shape``,
``.count``) and, for backward, ``propagate_down`` as a list of bools.
"""
import importlib
import inspect
import os
import sys

from ..blob import Blob
from .base import Layer, register


class BlobVec(list):
    """The ``blobs`` list a Python layer owns (pycaffe's BlobVec): Blobs, plus ``add_blob``."""

    def add_blob(self, *shape):
        """Append a zero-filled Blob of ``shape`` (ints, or one tuple) and return it."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        blob = Blob(tuple(int(d) for d in shape))
        self.append(blob)
        return blob


class PythonLayerBase:
    """Base class for user layers (pycaffe's ``caffe.Layer``).

    Args:
        param: the caffe_pb2.LayerParameter of the layer (pycaffe passes it too).

    Attributes set by the engine before ``setup``: ``param_str``, ``phase``, ``blobs``.
    Subclasses override ``setup(bottom, top)``, ``reshape(bottom, top)``,
    ``forward(bottom, top)`` and ``backward(top, propagate_down, bottom)``; the defaults do
    nothing.
    """

    def __init__(self, param=None):
        self.param = param
        self.layer_param = param
        self.param_str = param.python_param.param_str if param is not None else ""
        self.phase = param.phase if param is not None else 0
        self.blobs = BlobVec()
        self.type = "Python"

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


def _import_module(name):
    """Import ``name`` with the current directory searched first (pycaffe users expect it)."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()  # a module file written since the last import is found
    try:
        return importlib.import_module(name)
    finally:
        if added:
            try:
                sys.path.remove(cwd)
            except ValueError:
                pass


@register("Python")
class PythonLayer(Layer):
    """Runs a user-written Python class as a layer (see the module docstring).

    Any number of bottoms and tops. ``loss_weight`` may be given in the prototxt; the layer is
    not a loss by default. Attribute lookups the engine's layer does not answer are passed on to
    the user's instance (``net.layers[i].my_attribute`` works as in pycaffe).

    Fields read (python_param): module (required), layer (required), param_str (""),
    share_in_parallel (false; kept as :attr:`share_in_parallel`, no effect with one process).

    Raises:
        CaffeError naming the layer: module or layer missing; the module cannot be imported; it
        has no such class; the class's constructor fails (one line with the module, class,
        exception type and message; the original exception chained as ``__cause__``).
        The user's own exception from ``setup``/``reshape``/``forward``/``backward``
        propagates unchanged, as in pycaffe (python_layer.hpp calls the method and Boost.Python
        hands the Python error back to the caller); on Python 3.11+ it carries a note naming
        the layer, the module, class and method.

    Caffe: include/caffe/layers/python_layer.hpp, src/caffe/layer_factory.cpp.
    """

    #: The net passes this layer's exceptions on as raised, not as its one-line CaffeError
    #: (:func:`caffe_engine.graph.wrapped_failures`).
    own_errors_propagate = True

    def __init__(self, param, phase):
        super().__init__(param, phase)
        pp = param.python_param
        self.module_name = pp.module
        self.class_name = pp.layer
        self.share_in_parallel = bool(pp.share_in_parallel)
        if not self.module_name or not self.class_name:
            raise self.error("python_param.module and python_param.layer are required")
        try:
            module = _import_module(self.module_name)
        except Exception as exc:  # ImportError, or an error at the module's import time
            raise self._user_error("import", exc) from exc
        cls = getattr(module, self.class_name, None)
        if cls is None or not callable(cls):
            raise self.error(f"module '{self.module_name}' has no layer class '{self.class_name}'")
        try:
            self.impl = cls(param) if _takes_argument(cls) else cls()
        except Exception as exc:
            raise self._user_error("__init__", exc) from exc
        for method in ("setup", "reshape", "forward", "backward"):
            if not callable(getattr(self.impl, method, None)):
                raise self.error(f"class '{self.module_name}.{self.class_name}' has no "
                                 f"{method}() method")
        # The user's blobs list is the layer's param list: what they add is learned.
        existing = getattr(self.impl, "blobs", None)
        self.blobs = existing if isinstance(existing, BlobVec) else BlobVec(existing or [])

    def __getattr__(self, name):
        # Only called when normal lookup fails: pass on to the user's instance.
        impl = self.__dict__.get("impl")
        if impl is None:
            raise AttributeError(name)
        return getattr(impl, name)

    def _user_error(self, method, exc):
        message = " ".join(str(exc).split()) or "(no message)"
        return self.error(f"Python layer {self.module_name}.{self.class_name}.{method}() raised "
                          f"{type(exc).__name__}: {message}")

    def _call(self, method, *args):
        try:
            return getattr(self.impl, method)(*args)
        except Exception as exc:
            if hasattr(exc, "add_note"):  # PEP 678, Python 3.11+: shown under the traceback
                exc.add_note(f"in Python layer '{self.name}' "
                             f"({self.module_name}.{self.class_name}.{method}())")
            raise

    def layer_setup(self, bottom, top):
        self.impl.param_str = self.param.python_param.param_str
        self.impl.phase = int(self.phase)
        self.impl.blobs = self.blobs
        self._call("setup", bottom, top)
        if self.impl.blobs is not self.blobs:   # the user replaced the list: adopt theirs
            self.blobs = BlobVec(self.impl.blobs)
            self.impl.blobs = self.blobs

    def reshape(self, bottom, top):
        self._call("reshape", bottom, top)

    def forward(self, bottom, top):
        self._call("forward", bottom, top)

    def backward(self, top, propagate_down, bottom):
        self._call("backward", top, list(propagate_down), bottom)


def _takes_argument(cls):
    """Whether ``cls(param)`` is a valid call (pycaffe always passes the LayerParameter)."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return True
    try:
        sig.bind(None)
        return True
    except TypeError:
        return False
