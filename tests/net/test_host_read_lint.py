"""Lint: no hidden host reads of array values in the layers, the solvers and the Net.

On the GPU every read of a device value into Python waits for the device (a round trip); the
engine reads only through ``backend.to_numpy`` / ``backend.host_scalar`` (counted, see
``tests/solvers/test_host_reads.py``) and only where it means to. This test parses
``caffe_engine/layers/*.py``, ``caffe_engine/solvers/*.py`` and ``caffe_engine/net.py`` and
flags, outside the allow-list below:

* ``x.item()``, ``x.get()`` (no arguments: CuPy's copy to the host), ``x.tolist()``,
  ``cupy.asnumpy(x)``;
* ``float(...)``, ``int(...)``, ``bool(...)`` and ``numpy.asarray/array/float32/...(...)`` of an
  expression that reads array values: one that mentions a blob's ``.data`` / ``.diff`` or calls
  an ``xp.*`` function or an array reduction (``any``, ``all``, ``sum``, ``max``, ``min``,
  ``dot``, ``vdot``, ``mean``, ``argmax``, ``argmin``);
* ``if`` / ``while`` / ``assert`` / conditional-expression tests that call ``any`` / ``all``
  or ``xp.*``;
* data-dependent shapes, which read on CuPy: ``nonzero``, ``argwhere``, ``flatnonzero``,
  ``unique``;
* ``for`` loops over a blob's ``.data`` / ``.diff``.

It is a heuristic on names (it does not know types): it catches the usual forms, and the
allow-list says why each remaining one is right.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "caffe_engine"

SCANNED = sorted(p for p in (PACKAGE / "layers").glob("*.py")) + \
    sorted(p for p in (PACKAGE / "solvers").glob("*.py")) + [PACKAGE / "net.py"]

REDUCTIONS = {"any", "all", "sum", "max", "min", "dot", "vdot", "mean", "argmax", "argmin"}
SHAPE_FROM_DATA = {"nonzero", "argwhere", "flatnonzero", "unique"}
CONVERTERS = {"float", "int", "bool"}
NUMPY_CONVERTERS = {"asarray", "array", "float32", "float64", "int32", "int64", "bool_"}

#: (file relative to caffe_engine, enclosing function's qualified name) -> why it may read.
ALLOWED = {
    ("layers/indexing.py", "FilterLayer.reshape"):
        "the top's shape is the count of non-zero selectors: Caffe reads the selector on the "
        "host too (filter_layer.cpp Reshape, cpu_data)",
    ("layers/prefetch.py", "BasePrefetchingDataLayer.next_batch"):
        "a queue's get() (the prefetch thread's batches), not an array",
    ("solvers/snapshot.py", "rng_state"):
        "host random-stream state (NumPy) written into the exact-resume side file at a "
        "snapshot, not per iteration",
}


def _mentions_array_values(node):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("data", "diff"):
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in REDUCTIONS:
                return True
            if isinstance(sub.func.value, ast.Name) and sub.func.value.id == "xp":
                return True
    return False


def _calls_reduction(node):
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in ("any", "all"):
                return True
            if isinstance(sub.func.value, ast.Name) and sub.func.value.id == "xp":
                return True
    return False


class _Finder(ast.NodeVisitor):
    def __init__(self):
        self.stack, self.found = [], []

    def _flag(self, node, what):
        self.found.append((".".join(self.stack) or "<module>", node.lineno, what))

    def _scope(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute):
            if f.attr in ("item", "tolist") or (f.attr == "get" and not node.args
                                                and not node.keywords):
                self._flag(node, f".{f.attr}()")
            if f.attr == "asnumpy":
                self._flag(node, "asnumpy")
            if f.attr in SHAPE_FROM_DATA:
                self._flag(node, f"{f.attr} (a shape from the data)")
            if (isinstance(f.value, ast.Name) and f.value.id == "numpy"
                    and f.attr in NUMPY_CONVERTERS and node.args
                    and _mentions_array_values(node.args[0])):
                self._flag(node, f"numpy.{f.attr}(array values)")
        elif isinstance(f, ast.Name) and f.id in CONVERTERS and node.args \
                and _mentions_array_values(node.args[0]):
            self._flag(node, f"{f.id}(array values)")
        self.generic_visit(node)

    def _test(self, node, test, what):
        if _calls_reduction(test):
            self._flag(node, what)
        self.generic_visit(node)

    def visit_If(self, node):
        self._test(node, node.test, "if on array values")

    def visit_While(self, node):
        self._test(node, node.test, "while on array values")

    def visit_IfExp(self, node):
        self._test(node, node.test, "conditional on array values")

    def visit_Assert(self, node):
        self._test(node, node.test, "assert on array values")

    def visit_For(self, node):
        for sub in ast.walk(node.iter):
            if isinstance(sub, ast.Attribute) and sub.attr in ("data", "diff"):
                self._flag(node, "for over array values")
                break
        self.generic_visit(node)


def host_reads_in(path):
    """[(function, line, what)] of the flagged reads of one file."""
    finder = _Finder()
    finder.visit(ast.parse(path.read_text(), str(path)))
    return finder.found


def _rel(path):
    return path.relative_to(PACKAGE).as_posix()


@pytest.mark.parametrize("path", SCANNED, ids=_rel)
def test_no_hidden_host_reads(path):
    rel = _rel(path)
    bad = [f"{rel}:{line} in {func}: {what}" for func, line, what in host_reads_in(path)
           if (rel, func) not in ALLOWED]
    assert not bad, ("host reads outside backend.to_numpy/host_scalar (read there, defer the "
                     "check, or allow-list with the reason):\n" + "\n".join(bad))


def test_allow_list_is_used():
    """Every allowed function still has a flagged read (else its entry is stale)."""
    flagged = {(_rel(p), func) for p in SCANNED for func, _, _ in host_reads_in(p)}
    assert set(ALLOWED) <= flagged, sorted(set(ALLOWED) - flagged)


def test_the_lint_sees_the_usual_forms(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(blob, xp, a, d):\n"
        "    x = float(xp.vdot(blob.diff, blob.diff))\n"
        "    y = blob.data.item()\n"
        "    z = a.get()\n"
        "    w = d.get('key')\n"
        "    if xp.any(a < 0):\n"
        "        pass\n"
        "    if a.any():\n"
        "        pass\n"
        "    n = int(blob.data[0])\n"
        "    for v in blob.data:\n"
        "        pass\n"
        "    k = xp.nonzero(a)\n"
        "    m = numpy.asarray(blob.data)\n"
        "    ok = int(len(a))\n")
    whats = [what for _, _, what in host_reads_in(sample)]
    assert whats == ["float(array values)", ".item()", ".get()", "if on array values",
                     "if on array values", "int(array values)", "for over array values",
                     "nonzero (a shape from the data)", "numpy.asarray(array values)"]
