"""The communicator registry: algorithms register themselves by name; nothing here imports them.

An algorithm module decorates its class::

    @register("hier", aliases=("hybrid",), option="inter")
    class HierarchicalCommunicator(MPICommunicator): ...

and ``caffe_engine/comm/__init__.py`` imports every algorithm module, so the registry is full as
soon as any part of the package is imported. :mod:`.communicator` looks classes up here and never
imports an algorithm module (no import cycle: this module imports nothing of the package but
the errors).

A *spec* names an algorithm, optionally with one option after a colon: ``"tree"``, ``"hybrid"``
(an alias), ``"hier:tree"`` (the algorithm's ``option``, here ``inter="tree"``). That is the
form ``caffe train --comm`` takes.

``ALGORITHMS`` is a live, read-only view of the canonical names in registration order (the
import order of ``comm/__init__.py``: tree, ring, ps, mpi, hier, nccl); aliases are not in it.
"""
from collections.abc import Sequence

from ..errors import CaffeError

_CLASSES = {}   # canonical name -> class, in registration order
_ALIASES = {}   # alias -> canonical name
_OPTIONS = {}   # canonical name -> the constructor option a ":value" suffix sets (or None)


class _Names(Sequence):
    """The registered canonical names, in registration order (a live view)."""

    def __getitem__(self, index):
        return tuple(_CLASSES)[index]

    def __len__(self):
        return len(_CLASSES)

    def __repr__(self):
        return repr(tuple(_CLASSES))


#: Canonical names of the registered algorithms (see the module docstring).
ALGORITHMS = _Names()


def _same_class(a, b):
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def register(name, aliases=(), option=None):
    """Class decorator: make ``cls`` available as ``name`` (and each alias).

    Args:
        name: canonical name (no ':'); it becomes ``cls.name``.
        aliases: further names for the same class.
        option: the constructor keyword that a spec's ``:value`` suffix sets (None: the
            algorithm takes no suffix).

    Raises:
        ValueError: a name with ':' or one already taken by another class (a programming error,
            not user input). Registering the same class again (a module reload) replaces it.
    """
    def decorate(cls):
        for n in (name, *aliases):
            if ":" in n:
                raise ValueError(f"communicator name {n!r} must not contain ':'")
            owner = _CLASSES.get(_ALIASES.get(n, n))
            if owner is not None and not _same_class(owner, cls):
                raise ValueError(f"communicator name {n!r} is already registered by "
                                 f"{owner.__module__}.{owner.__qualname__}")
        cls.name = name
        _CLASSES[name] = cls
        _OPTIONS[name] = option
        for alias in aliases:
            _ALIASES[alias] = name
        return cls
    return decorate


def known():
    """``"tree, ring, ..."``: the canonical names for error messages."""
    return ", ".join(ALGORITHMS)


def canonical(name):
    """The canonical name of ``name`` (an alias or a canonical name).

    Raises:
        CaffeError: an unknown name, one line listing the known ones.
    """
    name = _ALIASES.get(name, name)
    if name not in _CLASSES:
        raise CaffeError(f"unknown communicator '{name}' (known: {known()})")
    return name


def algorithm_class(name):
    """The class registered as ``name`` (canonical or alias; no ':' suffix).

    Raises:
        CaffeError: unknown name (one line).
    """
    return _CLASSES[canonical(name)]


def resolve(spec, **opts):
    """Parse a spec (``"name"`` or ``"name:value"``) and check its options.

    Args:
        spec: the algorithm's name or alias, optionally ``:value`` for its ``option``.
        **opts: constructor options; they override the one a suffix sets.

    Returns:
        (cls, opts): the class and the merged keyword options for its constructor.

    Raises:
        CaffeError: one line for an unknown name, a suffix on an algorithm that takes none, an
            empty suffix, or an option value the class's ``validate_options`` rejects.
    """
    if not isinstance(spec, str):
        raise CaffeError(f"communicator name must be a string, got {type(spec).__name__}")
    name, colon, value = spec.partition(":")
    name = canonical(name)
    cls = _CLASSES[name]
    merged = {}
    if colon:
        option = _OPTIONS[name]
        if option is None:
            raise CaffeError(f"communicator '{name}' takes no ':' option, got '{spec}'")
        if not value:
            raise CaffeError(f"communicator '{spec}': empty {option} after ':'")
        merged[option] = value
    merged.update(opts)
    validate = getattr(cls, "validate_options", None)
    if validate is not None:
        validate(**merged)
    return cls, merged
