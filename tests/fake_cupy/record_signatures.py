"""Record the real CuPy's signatures that the fake imitates, into ``cupy_signatures.json``.

Regenerate (after a CuPy upgrade, or when the fake imitates a new API) from the repository
root, with a real CuPy installed (the ``cuda-compile`` extra; importing CuPy needs no GPU)::

    pip install 'cupy-cuda13x>=14'        # or: pip install -e '.[cuda-compile]'
    python tests/fake_cupy/record_signatures.py

and commit the JSON. ``tests/test_fake_cupy_signatures.py`` checks, where CuPy is installed,
that the recorded file still matches it.

What is recorded, as Python parameter lists with every default written ``...`` (only a
default's presence matters to binding a call):

* ``module``: each public name of ``cupy`` that NumPy also has (the names the fake serves,
  NumPy's functions under CuPy's names): its signature when it is a function, ``null`` for
  types, dtypes, modules and constants;
* ``ndarray``: each public attribute of ``cupy.ndarray``: a method's signature without
  ``self``, ``null`` for a property;
* ``imitated``: the other APIs the fake writes by hand (``RawModule``, ``RawKernel.__call__``,
  ``cuda.Stream``...), keyed by their path under ``cupy``;
* ``classes`` and ``modules``: the public names of the classes and modules the fake writes
  by hand (``cupy`` itself, ``cuda``, ``cuda.runtime``...).

Signatures come from ``inspect`` where CuPy's object has one, else from the first line of its
Cython docstring (``Device(device=None)``); :data:`OVERRIDES` holds the few where neither
tells what CuPy accepts, each with the CuPy source that does.
"""
import inspect
import json
import os
import re
import sys
import types

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "cupy_signatures.json")

#: names under ``cupy`` the fake does not serve from NumPy (its own classes and submodules)
SPECIAL = {"ndarray", "asarray", "array", "asanyarray", "copyto", "asnumpy", "get_array_module",
           "RawModule", "RawKernel", "cuda", "random", "lib", "ElementwiseKernel",
           "ReductionKernel", "fuse", "testing", "linalg", "fft"}

#: the hand-written APIs of the fake: key -> path of the real object under ``cupy``
#: (``cupyx.`` for cupyx); a key ending in a method name is recorded without ``self``
IMITATED = (
    "ndarray", "asarray", "array", "asanyarray", "copyto", "asnumpy", "get_array_module",
    "get_default_memory_pool", "get_default_pinned_memory_pool",
    "RawModule", "RawModule.get_function", "RawKernel.__call__",
    "cuda.Device", "cuda.Device.use", "cuda.Device.synchronize",
    "cuda.Stream", "cuda.Stream.wait_event", "cuda.Stream.record", "cuda.Stream.synchronize",
    "cuda.Stream.use",
    "cuda.Event", "cuda.Event.record", "cuda.Event.synchronize",
    "cuda.alloc_pinned_memory", "cuda.get_current_stream", "cuda.is_available",
    "cuda.MemoryPool.used_bytes", "cuda.MemoryPool.total_bytes",
    "cuda.MemoryPool.free_all_blocks", "cuda.MemoryPool.set_limit",
    "cuda.runtime.getDeviceCount", "cuda.runtime.driverGetVersion",
    "cuda.runtime.runtimeGetVersion", "cuda.runtime.getDevice",
    "cuda.runtime.deviceSynchronize", "cuda.runtime.getDeviceProperties",
    "random.RandomState", "random.RandomState.randint", "random.RandomState.random_sample",
    "random.RandomState.uniform", "random.RandomState.normal",
    "lib.stride_tricks.as_strided", "cupyx.scatter_add",
)

#: the classes whose public attribute names are recorded (the fake's have no others)
CLASSES = ("cuda.Device", "cuda.Stream", "cuda.Event", "cuda.MemoryPool", "random.RandomState",
           "RawModule", "RawKernel")
#: the modules whose public names are recorded (the fake's have no others)
MODULES = ("cupy", "cuda", "cuda.runtime", "random", "lib", "lib.stride_tricks", "cupyx")

OVERRIDES = {
    # cupy/_core/core.pyx: the class's docstring, ``__init__(shape, dtype=float, memptr=None,
    # strides=None, order='C')``; inspect sees the Python subclass's ``(*args, **kwargs)``
    "ndarray": "(shape, dtype=..., memptr=..., strides=..., order=...)",
    # cupy/_core/raw.pyx: ``def __init__(self, *, str code=None, str path=None, ...)``; the
    # docstring's first line shows ``code`` positional, but CuPy refuses
    # ``RawModule(source)`` ("takes exactly 0 positional arguments")
    "RawModule": "(*, code=..., path=..., options=..., backend=..., translate_cucomplex=..., "
                 "enable_cooperative_groups=..., name_expressions=..., jitify=...)",
    # cupy/_core/raw.pyx: ``__call__(self, grid, block, args, **kwargs)`` passes its keywords
    # to cupy/cuda/function.pyx ``Function.__call__(self, tuple grid, tuple block, args,
    # size_t shared_mem=0, stream=None, enable_cooperative_groups=False)``, the last given
    # by RawKernel itself (so a caller's is a duplicate keyword)
    "RawKernel.__call__": "(grid, block, args, *, shared_mem=..., stream=...)",
}


def _resolve(path):
    """The real object at ``path`` under ``cupy`` (``cupy`` itself, or ``cupyx...``)."""
    import cupy
    import cupyx
    parts = path.split(".")
    root = {"cupyx": cupyx, "cupy": cupy}.get(parts[0])
    obj = root or cupy
    for part in parts[1:] if root else parts:
        obj = getattr(obj, part)
    return obj


def _split(text):
    """``text`` split at its top-level commas (not those inside brackets or quotes)."""
    parts, part, depth, quote = [], "", 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        part += ch
    return [p.strip() for p in parts + [part] if p.strip()]


def _from_docstring(obj):
    """The parameter list on the first line of a Cython docstring, or None."""
    first = (getattr(obj, "__doc__", None) or "").strip().splitlines()[:1]
    m = re.match(r"[\w.]+\((.*)\)(\s*->.*)?$", first[0].strip()) if first else None
    if not m:
        return None
    text = m.group(1).replace("\\*", "*")
    # ``x[, out1, out2]``: optional positionals (CuPy's two-output ufuncs)
    text = re.sub(r"\s*\[,\s*(.*?)\]", lambda g: "".join(
        f", {p}" if "=" in p else f", {p}=..." for p in _split(g.group(1))), text)
    params = []
    for raw in _split(text):
        if raw in ("*", "/") or raw.startswith("*"):
            params.append(raw.split()[-1] if " " in raw else raw)
            continue
        lhs, eq, _ = raw.partition("=")
        params.append(lhs.split()[-1] + ("=..." if eq else ""))
    if params and params[0] == "self":
        params = params[1:]
    return "(" + ", ".join(params) + ")"


def canonical(sig, method=False):
    """``sig`` (an ``inspect.Signature``) as the recorded text: no annotations, defaults
    ``...``, no ``self`` for a method."""
    params = list(sig.parameters.values())[1 if method else 0:]
    out, slash, star = [], False, False
    for p in params:
        if p.kind is p.POSITIONAL_ONLY:
            slash = True
        elif slash:
            out.append("/")
            slash = False
        if p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        if p.kind is p.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        else:
            out.append(p.name + ("=..." if p.default is not p.empty else ""))
    if slash:
        out.append("/")
    return "(" + ", ".join(out) + ")"


def signature_text(obj, key=None, method=False):
    """CuPy's parameter list of ``obj`` as recorded text (see the module), or None."""
    if key in OVERRIDES:
        return OVERRIDES[key]
    try:
        return canonical(inspect.signature(obj), method)
    except (TypeError, ValueError):
        return _from_docstring(obj)


def _is_function(obj):
    return callable(obj) and not isinstance(obj, (type, numpy.dtype, types.ModuleType))


def _is_method_key(key):
    """A key naming a method (``cuda.Stream.record``): the part before its last is a class."""
    parts = key.split(".")
    return len(parts) > 1 and parts[-2][:1].isupper()


def _public(cls):
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def record():
    """The recording of the installed CuPy (a dict, as written to the JSON file).

    Raises:
        ImportError: CuPy is not installed. ValueError: an imitated API without a signature.
    """
    import cupy
    module = {}
    for name in sorted(dir(cupy)):
        if name.startswith("_") or name in SPECIAL or not hasattr(numpy, name):
            continue
        obj = getattr(cupy, name)
        module[name] = signature_text(obj, name) if _is_function(obj) else None
    ndarray = {name: signature_text(getattr(cupy.ndarray, name), f"ndarray.{name}", True)
               if callable(getattr(cupy.ndarray, name)) else None
               for name in _public(cupy.ndarray)}
    imitated = {}
    for key in IMITATED:
        text = signature_text(_resolve(key), key, _is_method_key(key))
        if text is None:
            raise ValueError(f"{key}: no signature found; add it to OVERRIDES from CuPy's source")
        imitated[key] = text
    unknown = sorted([k for k, v in module.items() if v is None and
                      _is_function(getattr(cupy, k))] +
                     [f"ndarray.{k}" for k, v in ndarray.items() if v is None and
                      callable(getattr(cupy.ndarray, k))])
    if unknown:
        raise ValueError(f"no signature found for {unknown}; add them to OVERRIDES")
    return {"cupy_version": cupy.__version__,
            "regenerate": "python tests/fake_cupy/record_signatures.py",
            "module": module, "ndarray": ndarray, "imitated": imitated,
            "classes": {key: _public(_resolve(key)) for key in CLASSES},
            "modules": {key: _public(_resolve(key)) for key in MODULES}}


def main():
    data = record()
    with open(PATH, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    print(f"{PATH}: CuPy {data['cupy_version']}, {len(data['module'])} module names, "
          f"{len(data['ndarray'])} ndarray attributes, {len(data['imitated'])} imitated APIs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
