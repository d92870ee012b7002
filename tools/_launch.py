"""Run one of the package's commands from a source checkout, without installing it.

``tools/<name>.py`` scripts call :func:`run`: it puts the repository root on ``sys.path`` (so the
checkout's ``caffe_engine`` is the one imported) and calls the command's entry function, whose
return value is the exit status. Installed, the same functions are console scripts (setup.cfg).
"""
import importlib
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module, function="main", *args):
    """``module.function(*args)`` with the checkout importable; returns its exit status."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return getattr(importlib.import_module(module), function)(*args)


def load_tool(name):
    """``tools/<name>.py`` as a module (a script beside this one, not part of the package), e.g.
    ``load_tool("netlab")`` for the benchmarks' emulated network."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
