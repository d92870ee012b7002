"""The real CuPy's signatures, as recorded in ``cupy_signatures.json``: what the fake binds
every call to, whether or not CuPy is installed here.

The file is written by ``record_signatures.py`` from a real CuPy (its docstring says how to
regenerate it); ``tests/test_fake_cupy_signatures.py`` checks it against the installed CuPy
where there is one. A key is a name under ``cupy``: ``zeros`` (a module function),
``ndarray.sum`` (a method), ``cuda.Stream.record`` (an API the fake writes by hand).
"""
import functools
import inspect
import json
import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cupy_signatures.json")

with open(PATH) as _f:
    RECORDED = json.load(_f)

#: the CuPy version the signatures were recorded from
VERSION = RECORDED["cupy_version"]
#: key -> the fake's own function for each hand-written API (:func:`imitates`)
IMITATIONS = {}
_KINDS = inspect.Parameter
_parsed = {}


def parse(text):
    """A recorded parameter list (``"(x1, x2, /, out=..., *, dtype=...)"``) as an
    ``inspect.Signature`` whose defaults are all ``...``."""
    params, kind = [], _KINDS.POSITIONAL_OR_KEYWORD
    words = [w.strip() for w in text.strip()[1:-1].split(",") if w.strip()]
    if "/" in words:
        kind = _KINDS.POSITIONAL_ONLY
    for word in words:
        if word == "/":
            kind = _KINDS.POSITIONAL_OR_KEYWORD
        elif word == "*":
            kind = _KINDS.KEYWORD_ONLY
        elif word.startswith("**"):
            params.append(_KINDS(word[2:], _KINDS.VAR_KEYWORD))
        elif word.startswith("*"):
            params.append(_KINDS(word[1:], _KINDS.VAR_POSITIONAL))
            kind = _KINDS.KEYWORD_ONLY
        else:
            name, eq, _ = word.partition("=")
            params.append(_KINDS(name, kind, default=... if eq else _KINDS.empty))
    return inspect.Signature(params)


def text_of(key):
    """The recorded parameter list of ``key``; None for a type, constant or property.

    Raises:
        KeyError: ``key`` is not recorded (regenerate the file, see the module).
    """
    if key in RECORDED["imitated"]:
        return RECORDED["imitated"][key]
    table, name = ("ndarray", key[8:]) if key.startswith("ndarray.") else ("module", key)
    try:
        return RECORDED[table][name]
    except KeyError:
        raise KeyError(f"cupy.{key} is not in {os.path.basename(PATH)} (CuPy {VERSION}); "
                       f"record it: {RECORDED['regenerate']}") from None


def signature(key):
    """``key``'s recorded signature (an ``inspect.Signature``), or None (see :func:`text_of`)."""
    if key not in _parsed:
        text = text_of(key)
        _parsed[key] = None if text is None else parse(text)
    return _parsed[key]


def check(key, args, kwargs):
    """Bind a call of ``cupy.<key>`` (``self`` left out) to CuPy's recorded signature.

    Raises:
        TypeError: CuPy would refuse the call (an unknown keyword, too many or too few
            arguments), naming the call and CuPy's signature.
    """
    sig = signature(key)
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"cupy.{key}: {exc}; CuPy {VERSION} takes {text_of(key)} "
                        f"(tests/fake_cupy/{os.path.basename(PATH)})") from None


def imitates(key):
    """Decorate the fake's own function (or method, or ``__init__``) for ``cupy.<key>``: each
    call is bound to CuPy's recorded signature first (:func:`check`).

    Raises:
        KeyError: at import, ``key`` is not recorded.
    """
    text_of(key)

    def decorate(fn):
        skip = 1 if next(iter(inspect.signature(fn).parameters), None) == "self" else 0

        @functools.wraps(fn)
        def call(*args, **kwargs):
            check(key, args[skip:], kwargs)
            return fn(*args, **kwargs)
        IMITATIONS[key] = fn
        return call
    return decorate


def module_names():
    """CuPy's names that the fake serves from NumPy, with their recorded parameter lists
    (None for types, dtypes and constants)."""
    return RECORDED["module"]


def ndarray_has(name):
    """Whether ``cupy.ndarray`` has the public attribute ``name``."""
    return name in RECORDED["ndarray"]


def class_attributes(key):
    """The public attribute names of the CuPy class ``key`` (``cuda.Stream``)."""
    return RECORDED["classes"][key]


def module_attributes(key):
    """The public names of the CuPy module ``key`` (``cupy``, ``cuda.runtime``, ``cupyx``)."""
    return RECORDED["modules"][key]
