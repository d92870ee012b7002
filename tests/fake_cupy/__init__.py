"""A fake CuPy for the tests: the engine's GPU path run on the CPU, with CuPy's refusals.

:func:`install` (with pytest's ``monkeypatch``) puts a module named ``cupy`` (and ``cupyx``,
``cupy.cuda``, ``cupy.cuda.runtime``, ``cupy.random``, ``cupy.lib.stride_tricks``) into
``sys.modules``, so the engine's ``import cupy`` gets it and ``backend.set_mode_gpu()`` makes
blobs of :class:`ndarray`. Its arrays hold a NumPy array but are not NumPy arrays, and behave
like CuPy's where a real GPU run would fail or stall:

* implicit conversion to NumPy raises CuPy's TypeError (``numpy.asarray(dev)``,
  ``host[...] = dev``, ``numpy.float32(dev)``); NumPy functions and ufuncs called on them
  dispatch to this module as CuPy's ``__array_function__``/``__array_ufunc__`` do (recorded in
  :data:`stats` ``["numpy_calls"]``), and return ``NotImplemented`` (NumPy's TypeError) where
  CuPy has no such function or the ufunc method is not ``__call__``;
* mixing host arrays into device operations raises as CuPy does: a ``numpy.ndarray`` operand of
  a ufunc, function or operator is CuPy's ``TypeError: Unsupported type``; ``dev[...] = host``
  and ``copyto(dev, host)`` with more than one element raise CuPy's ValueError; NumPy scalars
  and Python scalars are fine;
* reductions and integer indexing return 0-d device arrays, not scalars (CuPy);
* ``float()``, ``int()``, ``bool()``, ``.item()``, ``.tolist()``, ``.get()`` (but an
  asynchronous ``get(stream=s, blocking=False)``), ``.tobytes()``, ``repr``/``str`` and
  :func:`asnumpy` work and are counted as host syncs (:func:`syncs`, where they came from in
  :data:`stats` ``["sync_sites"]``), and so are CuPy's implicit ones: functions whose output
  size depends on the data (``nonzero``, ``unique``, ``bincount``, boolean-mask indexing...);
  explicit synchronizes are counted apart (``["explicit_syncs"]``);
* only what real CuPy has exists: module functions are NumPy's of the names CuPy defines,
  array methods those of ``cupy.ndarray`` (``.ctypes``, ``.itemset``... raise
  AttributeError), both as recorded (below);
* :class:`RawModule` compiles the kernels' CUDA source with the emulator's g++ shim and runs a
  launch serially on the arrays' memory, checking it against the kernel's C signature: the
  argument count, device arrays (C-contiguous) for pointers, and for scalars a NumPy scalar of
  the parameter's size and kind (CuPy packs a scalar's own bytes: a Python int goes as a 64-bit
  ``long long``, so ``int32(n)`` is needed; ``int32`` bits for ``unsigned int`` are the same
  argument); pointers' element types that differ from the parameter's are recorded in
  ``stats["pointer_mismatches"]`` (CuPy passes any pointer); ``(grid,)``/``(block,)`` tuples
  within CUDA's limits;
* every call is bound to the real CuPy's signature, recorded in ``cupy_signatures.json``
  (:mod:`.signatures`; ``record_signatures.py`` writes it from a real CuPy), so a NumPy-only
  keyword, a misspelt one or a wrong number of arguments raises TypeError naming CuPy's
  signature, with or without CuPy installed here; the names that exist (module functions,
  ``ndarray``'s attributes) are the recorded CuPy's too;
* ``base`` of a view is the one owning device array, the same object each time (CuPy's).

Not imitated (absent, an AttributeError): CuPy's ``ElementwiseKernel``, ``ReductionKernel``
and ``fuse``, ``linalg``, ``fft`` and ``testing``; the engine launches its kernels through
``RawModule`` only.

What it cannot show: timing and races (streams and events are no-ops and global, not per
thread; copies happen at once, so a host buffer reused before its asynchronous copy ends, or a
device buffer read before the copy stream's event, looks fine); CuPy's memory pool; curand's
words (``random.RandomState`` is NumPy's MT19937); cuBLAS's summation order; NVRTC's compile
(``tests/kernels/test_cuda_compile.py`` does that). Where it follows its best knowledge of
CuPy 14 rather than the real thing: type promotion (NumPy 2's NEP 50, which CuPy adopted);
NumPy ufunc methods other than ``__call__`` (``reduce``, ``at``) on device arrays, refused here;
which keys ``cuda.runtime.getDeviceProperties`` has with CUDA 13 (the fake leaves out those
CUDA 13 dropped from ``cudaDeviceProp``, and ``memPitch``, set by CuPy only on ROCm).
"""
import collections
import ctypes
import os
import sys
import threading
import traceback
import types
import weakref

import numpy

from .signatures import check as _check_call, imitates as _imitates, module_names, ndarray_has


def _fresh_stats():
    return {"syncs": 0, "sync_sites": [], "explicit_syncs": 0, "numpy_calls": [], "launches": 0,
            "h2d": 0, "pointer_mismatches": set(), "async_d2h": 0, "explicit_sites": [],
            "ops": collections.Counter()}


stats = _fresh_stats()
#: CuPy calls that make no kernel launch (views, metadata, allocation without a fill)
_NO_LAUNCH = {"reshape", "ravel", "view", "transpose", "swapaxes", "squeeze", "expand_dims",
              "broadcast_to", "atleast_1d", "atleast_2d", "atleast_3d", "empty", "empty_like",
              "result_type", "can_cast", "shape", "ndim", "size", "get", "set", "asarray",
              "get_array_module", "moveaxis", "rollaxis", "split", "array_split", "hsplit",
              "vsplit", "dtype", "isscalar", "iscomplexobj", "isrealobj"}
_lock = threading.Lock()
_owners = weakref.WeakValueDictionary()   # id(NumPy memory owner) -> its device array
_HERE = os.path.dirname(os.path.abspath(__file__))


def reset_stats():
    with _lock:
        stats.update(_fresh_stats())


def forget_device_state():
    """Drop what the engine made for the (fake) device -- the cuda kernel set, the device random
    streams, pending deferred checks -- with the rest of the process state
    (``caffe_engine.process.reset``; between tests, installed or not)."""
    from caffe_engine import process
    process.reset()


def _count_op(name):
    """One CuPy operation that launches a kernel (an estimate of CuPy's launches: one per
    elementwise op, reduction, copy, fill or product; views and metadata are free)."""
    if name not in _NO_LAUNCH:
        stats["ops"][name] += 1


def kernel_launches():
    """The estimate of all kernel launches since :func:`reset_stats`: the engine's own
    (``RawKernel``) plus the CuPy operations of :func:`_count_op`."""
    return stats["launches"] + sum(stats["ops"].values())


def syncs():
    """Host syncs (device values read on the host) counted since :func:`reset_stats`."""
    return stats["syncs"]


def _site():
    """``file:line`` of the first caller frame outside this package and NumPy."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(_HERE) and "/numpy/" not in frame.filename:
            return f"{os.path.relpath(frame.filename)}:{frame.lineno}"
    return "?"


def _count_sync(kind):
    with _lock:
        stats["syncs"] += 1
        stats["sync_sites"].append((kind, _site()))


def _count_explicit(what):
    with _lock:
        stats["explicit_syncs"] += 1
        stats["explicit_sites"].append((what, threading.current_thread().name, _site()))


# ------------------------------------------------------------------------------------------------
# arrays
# ------------------------------------------------------------------------------------------------
def _unsupported(value):
    return TypeError(f"Unsupported type {type(value)}")


def _unwrap(value, where="argument"):
    """A device array -> its NumPy storage; host arrays refused (CuPy's TypeError)."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, numpy.ndarray):
        raise _unsupported(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, where) for v in value)
    return value


def _wrap(value):
    if isinstance(value, numpy.ndarray):
        return ndarray._of(value)
    if isinstance(value, numpy.generic):
        return ndarray._of(numpy.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


class _MemoryPointer:
    def __init__(self, array):
        self.ptr = array.ctypes.data if array.size else 0


def _binary(name, reflected=False, inplace=False):
    ufunc = getattr(numpy, name)

    def op(self, other):
        if isinstance(other, numpy.ndarray):
            raise _unsupported(other)
        if not isinstance(other, (ndarray, int, float, complex, bool, numpy.generic)):
            return NotImplemented
        o = _unwrap(other)
        _count_op(name)
        if inplace:
            ufunc(self._a, o, out=self._a)
            return self
        return _wrap(ufunc(o, self._a) if reflected else ufunc(self._a, o))
    return op


class ndarray:
    """A device array of the fake: a NumPy array behind CuPy's interface (see the module)."""

    __module__ = "cupy"
    __slots__ = ("_a", "_base", "__weakref__")
    __array_priority__ = 100
    __hash__ = None

    @_imitates("ndarray")
    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("fake cupy.ndarray: memptr/strides")
        self._a = numpy.empty(shape, dtype, order=order)
        self._base = None
        _owners[id(self._a)] = self

    @classmethod
    def _of(cls, array):
        """The device array over ``array``; a view's ``base`` is the one device array owning
        its memory, the same object every time (CuPy's; the engine keys buffers on it)."""
        obj = cls.__new__(cls)
        obj._a = array
        root = array
        while isinstance(root.base, numpy.ndarray):
            root = root.base
        if root is array:
            obj._base = None
            _owners[id(array)] = obj
        else:
            owner = _owners.get(id(root))
            if owner is None or owner._a is not root:
                owner = cls._of(root)
            obj._base = owner
        return obj

    # -- what NumPy may not do with it ------------------------------------------------------
    def __array__(self, dtype=None, copy=None):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        mine = _FUNCTIONS.get(ufunc.__name__)
        if method != "__call__" or mine is None:
            return NotImplemented
        with _lock:
            stats["numpy_calls"].append((f"numpy.{ufunc.__name__}", _site()))
        if "out" in kwargs:
            out = kwargs["out"]
            if isinstance(out, tuple):
                if len(out) != 1:
                    raise ValueError("The 'out' parameter must have exactly one array value")
                kwargs["out"] = out[0]
        return mine(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        module = _module_for(func.__module__)
        mine = getattr(module, func.__name__, None) if module is not None else None
        if mine is None or mine is func:
            return NotImplemented
        for t in types_:
            if not issubclass(t, (ndarray, numpy.ndarray)):
                return NotImplemented
        with _lock:
            stats["numpy_calls"].append((f"{func.__module__}.{func.__name__}", _site()))
        return mine(*args, **kwargs)

    # -- host reads (counted) ---------------------------------------------------------------
    @_imitates("ndarray.get")
    def get(self, stream=None, order="C", out=None, blocking=True):
        if blocking or stream is None:
            _count_sync("get")
        else:
            stats["async_d2h"] += 1     # an asynchronous copy on ``stream``: no wait here
        if out is not None:
            if not isinstance(out, numpy.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.dtype != self.dtype or out.shape != self.shape:
                raise ValueError("get: out must have the same dtype and shape")
            out[...] = self._a
            return out
        return numpy.array(self._a, order=order)

    @_imitates("ndarray.item")
    def item(self):
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        _count_sync("item")
        return self._a.item()

    @_imitates("ndarray.tolist")
    def tolist(self):
        _count_sync("tolist")
        return self._a.tolist()

    @_imitates("ndarray.tobytes")
    def tobytes(self, order="C"):
        _count_sync("tobytes")
        return self._a.tobytes(order)

    def __float__(self):
        _count_sync("float")
        return float(self._a)

    def __int__(self):
        _count_sync("int")
        return int(self._a)

    def __index__(self):
        _count_sync("index")
        return self._a.__index__()

    def __complex__(self):
        _count_sync("complex")
        return complex(self._a)

    def __bool__(self):
        _count_sync("bool")
        return bool(self._a)

    def __repr__(self):
        _count_sync("repr")
        return repr(self._a)

    def __str__(self):
        _count_sync("str")
        return str(self._a)

    def __format__(self, spec):
        _count_sync("format")
        return format(self._a.item() if self.ndim == 0 else self._a, spec)

    # -- host writes ------------------------------------------------------------------------
    @_imitates("ndarray.set")
    def set(self, arr, stream=None):
        if not isinstance(arr, numpy.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        stats["h2d"] += 1
        self._a[...] = arr

    # -- attributes -------------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: _wrap(self._a.T))
    data = property(lambda self: _MemoryPointer(self._a))
    device = property(lambda self: cuda.Device(0))

    @property
    def base(self):
        return self._base

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self._a)))

    def __getitem__(self, key):
        key = _unwrap_index(key)
        if any(isinstance(k, numpy.ndarray) and k.dtype == bool and k.ndim
               for k in (key if isinstance(key, tuple) else (key,))):
            _count_sync("implicit:boolean-mask indexing")   # CuPy reads the mask's count
        return _wrap(self._a[key])

    def __setitem__(self, key, value):
        key = _unwrap_index(key)
        if isinstance(value, numpy.ndarray):
            if value.size != 1:
                raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
            value = value.reshape(()).item()
        elif isinstance(value, (list, tuple)):
            raise ValueError("fake cupy: a sequence assigned to a device array")
        _count_op("setitem")
        self._a[key] = _unwrap(value)

    def __getattr__(self, name):
        if name.startswith("_") or not ndarray_has(name):
            raise AttributeError(f"'cupy.ndarray' object has no attribute '{name}'")
        method = getattr(self._a, name)
        if not callable(method):
            return _wrap(method)

        def call(*args, **kwargs):
            _check_call(f"ndarray.{name}", args, kwargs)
            if name in ("nonzero", "compress"):
                _count_sync(f"implicit:ndarray.{name}")
            _count_op(f"ndarray.{name}" if name not in _NO_LAUNCH else name)
            return _wrap(method(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))
        return call

    def __neg__(self):
        _count_op("negative")
        return _wrap(-self._a)

    def __pos__(self):
        return _wrap(+self._a)

    def __abs__(self):
        _count_op("absolute")
        return _wrap(abs(self._a))

    def __invert__(self):
        return _wrap(~self._a)

    __add__, __radd__, __iadd__ = _binary("add"), _binary("add", True), _binary("add", False, True)
    __sub__, __rsub__, __isub__ = (_binary("subtract"), _binary("subtract", True),
                                   _binary("subtract", False, True))
    __mul__, __rmul__, __imul__ = (_binary("multiply"), _binary("multiply", True),
                                   _binary("multiply", False, True))
    __truediv__, __rtruediv__, __itruediv__ = (_binary("true_divide"),
                                               _binary("true_divide", True),
                                               _binary("true_divide", False, True))
    __floordiv__, __rfloordiv__ = _binary("floor_divide"), _binary("floor_divide", True)
    __mod__, __rmod__ = _binary("remainder"), _binary("remainder", True)
    __pow__, __rpow__, __ipow__ = (_binary("power"), _binary("power", True),
                                   _binary("power", False, True))
    __matmul__, __rmatmul__ = _binary("matmul"), _binary("matmul", True)
    __and__, __rand__, __iand__ = (_binary("bitwise_and"), _binary("bitwise_and", True),
                                   _binary("bitwise_and", False, True))
    __or__, __ror__, __ior__ = (_binary("bitwise_or"), _binary("bitwise_or", True),
                                _binary("bitwise_or", False, True))
    __xor__, __rxor__ = _binary("bitwise_xor"), _binary("bitwise_xor", True)
    __lshift__, __rshift__ = _binary("left_shift"), _binary("right_shift")
    __lt__, __le__, __gt__, __ge__ = (_binary("less"), _binary("less_equal"),
                                      _binary("greater"), _binary("greater_equal"))
    __eq__, __ne__ = _binary("equal"), _binary("not_equal")


def _unwrap_index(key):
    if isinstance(key, tuple):
        return tuple(_unwrap_index(k) for k in key)
    if isinstance(key, ndarray):
        return key._a
    return key


# ------------------------------------------------------------------------------------------------
# module functions: NumPy's, for the names real CuPy has
# ------------------------------------------------------------------------------------------------
#: functions whose output shape depends on the data: CuPy reads a count back (a host sync;
#: bincount always reads ``max(x)``, cupy/_statistics/histogram.py)
_IMPLICIT_SYNC = {"nonzero", "argwhere", "flatnonzero", "unique", "bincount", "compress",
                  "extract"}


def _wrap_function(fn, name):
    ufunc = isinstance(fn, numpy.ufunc)

    def call(*args, **kwargs):
        _check_call(name, args, kwargs)
        if ufunc:
            for a in args:
                if isinstance(a, (list, tuple)):   # CuPy's ufuncs take no sequences
                    raise _unsupported(a)
        if name in _IMPLICIT_SYNC or (name == "where" and len(args) + len(kwargs) == 1):
            _count_sync(f"implicit:{name}")
        _count_op(name)
        args = _unwrap(args)
        kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
        return _wrap(fn(*args, **kwargs))
    call.__name__ = call.__qualname__ = name
    call.__module__ = "cupy"
    return call


def _populate(namespace):
    """NumPy's objects under the recorded CuPy module names: types, dtypes and constants as
    they are, functions wrapped (bound to CuPy's signature, arrays kept on the device)."""
    for name in module_names():
        if not hasattr(numpy, name):
            continue
        obj = getattr(numpy, name)
        if isinstance(obj, (type, numpy.dtype, types.ModuleType)) or not callable(obj):
            namespace[name] = obj            # dtypes, constants
        else:
            namespace[name] = _wrap_function(obj, name)


_FUNCTIONS = {}
_populate(_FUNCTIONS)


@_imitates("asarray")
def asarray(a, dtype=None, order=None, *, copy=None, blocking=False):
    if isinstance(a, ndarray):
        return a if dtype is None or a.dtype == dtype else a.astype(dtype)
    stats["h2d"] += 1
    return ndarray._of(numpy.array(_unwrap_host_ok(a), dtype=dtype, order=order or "K"))


@_imitates("array")
def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        return ndarray._of(numpy.array(obj._a, dtype=dtype, copy=copy, order=order, ndmin=ndmin))
    stats["h2d"] += 1
    return ndarray._of(numpy.array(_unwrap_host_ok(obj), dtype=dtype, order=order, ndmin=ndmin))


@_imitates("asanyarray")
def asanyarray(a, dtype=None, order=None, *, copy=None, blocking=False):
    return asarray(a, dtype, order, copy=copy, blocking=blocking)


def _unwrap_host_ok(value):
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap_host_ok(v) for v in value)
    return value


@_imitates("copyto")
def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(dst, ndarray):
        raise TypeError(f"Argument 'dst' has incorrect type (expected cupy.ndarray, got "
                        f"{type(dst).__name__})")
    if isinstance(src, numpy.ndarray):
        if src.size != 1:
            raise ValueError("non-scalar numpy.ndarray cannot be used for copyto")
        src = src.squeeze()[()]
    _count_op("copyto")
    numpy.copyto(dst._a, _unwrap(src), casting=casting,
                 where=True if where is None else _unwrap(where))


@_imitates("asnumpy")
def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return numpy.asarray(a, order=order)


@_imitates("get_array_module")
def get_array_module(*args):
    import sys as _sys
    for a in args:
        if isinstance(a, ndarray):
            return _sys.modules.get("cupy", _this())
    return numpy


def _this():
    return sys.modules[__name__]


# ------------------------------------------------------------------------------------------------
# RawModule: CUDA sources run by the emulator's shim, launches checked against the signatures
# ------------------------------------------------------------------------------------------------
_C_TYPES = {"float": numpy.float32, "int": numpy.int32, "unsigned int": numpy.uint32,
            "unsigned": numpy.uint32, "unsigned char": numpy.uint8,
            "unsigned long long": numpy.uint64, "double": numpy.float64,
            "long long": numpy.int64, "char": numpy.int8, "signed char": numpy.int8,
            "bool": numpy.bool_, "uint8_t": numpy.uint8, "uint32_t": numpy.uint32,
            "int32_t": numpy.int32, "uint64_t": numpy.uint64}


def _parse_params(text):
    """kernel name -> [(C type, is pointer)] of every ``extern "C" __global__`` function."""
    import re
    found = {}
    for m in re.finditer(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', text):
        params = []
        for p in m.group(2).split(","):
            p = p.strip()
            if not p:
                continue
            p = re.sub(r"\b(const|__restrict__|__restrict)\b", " ", p)
            pointer = "*" in p
            words = p.replace("*", " ").split()
            params.append((" ".join(words[:-1]), pointer))
        found[m.group(1)] = params
    return found


class RawModule:
    """CuPy's ``RawModule(code=..., options=...)``: the code compiled by g++ with the
    emulator's shim; :meth:`get_function` gives a launchable :class:`RawKernel`."""

    @_imitates("RawModule")
    def __init__(self, *, code=None, path=None, options=(), backend="nvrtc",
                 translate_cucomplex=False, enable_cooperative_groups=False,
                 name_expressions=None, jitify=False):
        if code is None or path is not None:
            raise NotImplementedError("fake RawModule: code= only")
        if not isinstance(code, str):
            raise TypeError("Argument 'code' has incorrect type (expected str)")
        if not isinstance(options, tuple):
            raise TypeError(f"Argument 'options' has incorrect type (expected tuple, got "
                            f"{type(options).__name__})")
        from caffe_engine.kernels.cuda.emulator import build_library
        library = build_library(code, "caffe_engine_fake_cupy")
        self._library = ctypes.CDLL(library)
        self._params = _parse_params(code)

    @_imitates("RawModule.get_function")
    def get_function(self, name):
        if name not in self._params:
            raise RuntimeError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name})")
        return RawKernel._of(getattr(self._library, name), name, self._params[name])


class RawKernel:
    @classmethod
    def _of(cls, function, name, params):
        k = cls.__new__(cls)
        k._function, k.name, k._params = function, name, params
        k._function.restype = None
        return k

    @_imitates("RawKernel.__call__")
    def __call__(self, grid, block, args, *, shared_mem=0, stream=None):
        for what, dims in (("grid", grid), ("block", block)):
            if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3 or \
                    not all(isinstance(d, (int, numpy.integer)) and d >= 1 for d in dims):
                raise ValueError(f"{self.name}: {what} must be a tuple of 1-3 positive ints, "
                                 f"got {dims!r}")
        if numpy.prod(block) > 1024 or block[0] > 1024:
            raise ValueError(f"{self.name}: {block} threads per block exceed 1024")
        if grid[0] >= 2 ** 31 or any(g > 65535 for g in grid[1:]):
            raise ValueError(f"{self.name}: grid {grid} beyond CUDA's limits")
        if not isinstance(args, tuple):
            raise TypeError(f"{self.name}: args must be a tuple, got {type(args).__name__}")
        if stream is not None and not isinstance(stream, _Stream):
            raise TypeError(f"{self.name}: stream must be a cupy.cuda.Stream, got "
                            f"{type(stream).__name__}")
        if len(args) != len(self._params):
            raise TypeError(f"{self.name}: {len(args)} arguments for {len(self._params)} "
                            "parameters")
        c_args = []
        for i, (arg, (ctype, pointer)) in enumerate(zip(args, self._params)):
            want = _C_TYPES.get(ctype)
            if pointer:
                if not isinstance(arg, ndarray):
                    raise TypeError(f"{self.name}: argument {i} ({ctype}*) must be a device "
                                    f"array, got {type(arg).__name__}")
                if not arg._a.flags.c_contiguous:
                    raise ValueError(f"{self.name}: argument {i} is not C-contiguous")
                if want is not None and arg.dtype != want:
                    # CuPy passes the pointer whatever its type: a real bug when the kernel
                    # reads it, harmless for a placeholder it never reads; recorded
                    with _lock:
                        stats["pointer_mismatches"].add((self.name, i, str(arg.dtype), ctype))
                c_args.append(ctypes.c_void_p(arg._a.ctypes.data))
            else:
                if isinstance(arg, (ndarray, numpy.ndarray)) or type(arg) in (int, float, bool):
                    raise TypeError(f"{self.name}: argument {i} ({ctype}) must be a NumPy "
                                    f"scalar of its type, got {type(arg).__name__} (CuPy "
                                    "passes Python ints as long long, floats as double)")
                # CuPy packs a NumPy scalar's own bytes: the kernel reads them as its type,
                # so a scalar of the same size and kind (int32 for unsigned int) is the same
                # argument, and any other is a corrupted one
                if want is None or not isinstance(arg, numpy.generic) or \
                        arg.dtype.itemsize != numpy.dtype(want).itemsize or \
                        (arg.dtype.kind in "iub") != (numpy.dtype(want).kind in "iub"):
                    raise TypeError(f"{self.name}: argument {i} is {type(arg).__name__}, the "
                                    f"kernel takes {ctype}")
                bits = numpy.asarray(arg).view(want)[()]
                c_args.append(numpy.ctypeslib.as_ctypes_type(want)(bits))
        self._function(*c_args)
        stats["launches"] += 1


# ------------------------------------------------------------------------------------------------
# cupy.random, cupy.lib.stride_tricks, cupyx
# ------------------------------------------------------------------------------------------------
class RandomState:
    """``cupy.random.RandomState``: NumPy's MT19937 standing in for curand (other words)."""

    @_imitates("random.RandomState")
    def __init__(self, seed=None, method=None):
        self._rs = numpy.random.RandomState(seed)

    @_imitates("random.RandomState.randint")
    def randint(self, low, high=None, size=None, dtype=int):
        return _wrap(numpy.asarray(self._rs.randint(low, high, size=size, dtype=dtype)))

    @_imitates("random.RandomState.random_sample")
    def random_sample(self, size=None, dtype=float):
        return _wrap(numpy.asarray(self._rs.random_sample(size)).astype(dtype))

    @_imitates("random.RandomState.uniform")
    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return _wrap(numpy.asarray(self._rs.uniform(low, high, size)).astype(dtype))

    @_imitates("random.RandomState.normal")
    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return _wrap(numpy.asarray(self._rs.normal(loc, scale, size)).astype(dtype))


@_imitates("lib.stride_tricks.as_strided")
def _as_strided(x, shape=None, strides=None):
    return _wrap(numpy.lib.stride_tricks.as_strided(_unwrap(x), shape, strides))


@_imitates("cupyx.scatter_add")
def _scatter_add(a, slices, value):
    numpy.add.at(_unwrap(a), _unwrap_index(slices), _unwrap(value))


# ------------------------------------------------------------------------------------------------
# cupy.cuda: one device, no-op streams and events
# ------------------------------------------------------------------------------------------------
class _Device:
    @_imitates("cuda.Device")
    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise RuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    @_imitates("cuda.Device.use")
    def use(self):
        pass

    @_imitates("cuda.Device.synchronize")
    def synchronize(self):
        _count_explicit(type(self).__name__)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __int__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, _Device) and other.id == self.id

    def __hash__(self):
        return self.id


class _Event:
    @_imitates("cuda.Event")
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.done = True

    @_imitates("cuda.Event.record")
    def record(self, stream=None):
        if stream is not None and not isinstance(stream, _Stream):
            raise TypeError(f"Event.record: stream must be a Stream, got {type(stream)}")

    @_imitates("cuda.Event.synchronize")
    def synchronize(self):
        _count_explicit(type(self).__name__)


class _Stream:
    null = None

    @_imitates("cuda.Stream")
    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.ptr = 0 if null else id(self)

    @_imitates("cuda.Stream.wait_event")
    def wait_event(self, event):
        if not isinstance(event, _Event):
            raise TypeError(f"Stream.wait_event: an Event, got {type(event).__name__}")

    @_imitates("cuda.Stream.record")
    def record(self, event=None):
        event = event or _Event()
        event.record(self)
        return event

    @_imitates("cuda.Stream.synchronize")
    def synchronize(self):
        _count_explicit(type(self).__name__)

    @_imitates("cuda.Stream.use")
    def use(self):
        _current["stream"] = self
        return self

    def __enter__(self):
        self._previous = _current["stream"]
        _current["stream"] = self
        return self

    def __exit__(self, *exc):
        _current["stream"] = self._previous
        return False


_Stream.null = _Stream(null=True)
_current = {"stream": _Stream.null}


class PinnedMemoryPointer(bytearray):
    """``alloc_pinned_memory``'s result: a host buffer (the buffer protocol, ``ptr``)."""

    @property
    def ptr(self):
        return ctypes.addressof(ctypes.c_char.from_buffer(self)) if len(self) else 0


@_imitates("cuda.alloc_pinned_memory")
def _alloc_pinned_memory(size):
    return PinnedMemoryPointer(int(size))


class _MemoryPool:
    @_imitates("cuda.MemoryPool.used_bytes")
    def used_bytes(self):
        return 0

    @_imitates("cuda.MemoryPool.total_bytes")
    def total_bytes(self):
        return 0

    @_imitates("cuda.MemoryPool.free_all_blocks")
    def free_all_blocks(self, stream=None):
        pass

    @_imitates("cuda.MemoryPool.set_limit")
    def set_limit(self, size=None, fraction=None):
        pass


_POOL = _MemoryPool()


@_imitates("get_default_memory_pool")
def get_default_memory_pool():
    return _POOL


@_imitates("get_default_pinned_memory_pool")
def get_default_pinned_memory_pool():
    return _POOL


@_imitates("cuda.get_current_stream")
def _get_current_stream(device_id=-1):
    return _current["stream"]


@_imitates("cuda.is_available")
def _is_available():
    return True


def _constant(key, value):
    """``cupy.<key>()``, returning ``value``."""
    return _imitates(key)(lambda: value)


@_imitates("cuda.runtime.deviceSynchronize")
def _device_synchronize():
    _Device().synchronize()


def _runtime_module():
    rt = types.ModuleType("cupy.cuda.runtime")
    rt.getDeviceCount = _constant("cuda.runtime.getDeviceCount", 1)
    rt.driverGetVersion = _constant("cuda.runtime.driverGetVersion", 13000)
    rt.runtimeGetVersion = _constant("cuda.runtime.runtimeGetVersion", 13000)
    rt.getDevice = _constant("cuda.runtime.getDevice", 0)
    rt.deviceSynchronize = _device_synchronize
    rt.getDeviceProperties = _device_properties
    rt.CUDARuntimeError = RuntimeError
    return rt


@_imitates("cuda.runtime.getDeviceProperties")
def _device_properties(device):
    """The keys CuPy's getDeviceProperties always has on CUDA (cupy_backends/cuda/api/
    runtime.pyx: memPitch only on ROCm); clockRate, memoryClockRate, deviceOverlap,
    kernelExecTimeoutEnabled and computeMode left CUDA 13's cudaDeviceProp, so they are left
    out here too (whether CuPy 14 fills them in from device attributes is not known)."""
    return {
        "name": b"Fake CuPy (CPU)", "major": 9, "minor": 0, "totalGlobalMem": 1 << 30,
        "multiProcessorCount": 1, "maxThreadsPerBlock": 1024, "warpSize": 32,
        "sharedMemPerBlock": 49152, "regsPerBlock": 65536,
        "memoryBusWidth": 1, "l2CacheSize": 0, "totalConstMem": 65536,
        "maxThreadsDim": (1024, 1024, 64), "maxGridSize": (2 ** 31 - 1, 65535, 65535),
        "pciBusID": 0, "pciDeviceID": 0, "pciDomainID": 0, "textureAlignment": 512,
        "texturePitchAlignment": 32, "integrated": 0, "canMapHostMemory": 1,
        "asyncEngineCount": 1, "ECCEnabled": 0, "unifiedAddressing": 1}


cuda = types.ModuleType("cupy.cuda")
cuda.Device = _Device
cuda.Stream = _Stream
cuda.Event = _Event
cuda.runtime = _runtime_module()
cuda.alloc_pinned_memory = _alloc_pinned_memory
cuda.PinnedMemoryPointer = PinnedMemoryPointer
cuda.MemoryPool = _MemoryPool
cuda.get_current_stream = _get_current_stream
cuda.is_available = _is_available

random = types.ModuleType("cupy.random")
random.RandomState = RandomState

lib = types.ModuleType("cupy.lib")
lib.stride_tricks = types.ModuleType("cupy.lib.stride_tricks")
lib.stride_tricks.as_strided = _as_strided

cupyx = types.ModuleType("cupyx")
cupyx.scatter_add = _scatter_add


def _module_for(numpy_module):
    """This fake's counterpart of a NumPy submodule name (``numpy.linalg`` -> None here)."""
    if numpy_module in ("numpy", "numpy._core.multiarray", "numpy._core.fromnumeric",
                        "numpy._core.numeric", "numpy._core.shape_base", "numpy.lib",
                        "numpy._core.function_base", "numpy._core.umath"):
        return _NAMESPACE
    if numpy_module.startswith("numpy.") and "linalg" not in numpy_module \
            and "fft" not in numpy_module and "random" not in numpy_module:
        return _NAMESPACE   # NumPy's private submodules of public functions
    return None


_NAMESPACE = types.SimpleNamespace(
    **_FUNCTIONS, ndarray=ndarray, asarray=asarray, array=array, asanyarray=asanyarray,
    copyto=copyto, asnumpy=asnumpy, get_array_module=get_array_module, RawModule=RawModule,
    RawKernel=RawKernel, cuda=cuda, random=random, lib=lib,
    get_default_memory_pool=get_default_memory_pool,
    get_default_pinned_memory_pool=get_default_pinned_memory_pool)


def install(monkeypatch):
    """Make ``import cupy`` (and ``cupyx``, ``cupy.cuda``...) give this fake, until
    ``monkeypatch`` undoes it; ``cupy.cuda.nccl`` stays missing (ImportError)."""
    module = _this()
    cupy = types.ModuleType("cupy")
    for name, value in vars(_NAMESPACE).items():
        setattr(cupy, name, value)
    cupy.__version__ = "14.0.0-fake"
    cupy.__file__ = module.__file__
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.runtime", cuda.runtime),
                      ("cupy.random", random), ("cupy.lib", lib),
                      ("cupy.lib.stride_tricks", lib.stride_tricks), ("cupyx", cupyx),
                      ("cupy.cuda.nccl", None), ("cupy.cuda.nvrtc", None)):
        monkeypatch.setitem(sys.modules, name, mod)
    return cupy
