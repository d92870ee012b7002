"""tools/import_graph.py: the package's imports have no cycle but the allowed ones, keep layers/,
io/ and kernels/ below the solver, comm, perf and the command line, and docs/architecture.md's
generated section matches them; and the graph code on tiny packages written here.

Oracles: the real package through ``--check`` (a subprocess, as a developer runs it); for the
graph code, packages of a few files whose imports, cycles and layers are worked out by hand.
"""
import importlib.util
import subprocess
import sys

import pytest

from paths import ROOT

SPEC = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
ig = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ig)


def test_the_package_passes_the_check():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "import_graph.py"), "--check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr.strip().endswith(": ok")


def write_package(root, files):
    """Files ``{relative path: source}`` under ``root``; returns the package folder."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def edges(imports):
    return {(i.source, i.target, i.lazy) for i in imports}


def test_imports_are_resolved_to_the_package_modules(tmp_path):
    src = write_package(tmp_path, {
        "pkg/__init__.py": "from .a import thing\n",
        "pkg/a.py": "import os\nimport pkg.sub.c\nfrom . import b, missing_name\n",
        "pkg/b.py": "def f():\n    from .sub import c\n    from pkg.sub.c import value\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": ("from .. import thing\nfrom ..a import x, y\n"
                         "class K:\n    from . import d\n"),
        "pkg/sub/d.py": "from . import *\n",
    })
    modules, imports = ig.scan(str(src), "pkg")
    assert modules == ["pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c", "pkg.sub.d"]
    assert edges(imports) == {
        ("pkg", "pkg.a", False),
        ("pkg.a", "pkg.sub.c", False), ("pkg.a", "pkg.b", False), ("pkg.a", "pkg", False),
        ("pkg.b", "pkg.sub.c", True),                   # inside a function: lazy, counted once
        ("pkg.sub.c", "pkg", False), ("pkg.sub.c", "pkg.a", False),
        ("pkg.sub.c", "pkg.sub.d", False),              # a class body runs at import
        ("pkg.sub.d", "pkg.sub", False),
    }
    assert len([i for i in imports if i.source == "pkg.sub.c" and i.target == "pkg.a"]) == 1


def test_strongly_connected_components_and_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}, "f": {"d", "zz"}}
    components = ig.strongly_connected("abcdef", graph)
    assert sorted(components) == [["a", "b", "c"], ["d"], ["e"], ["f"]]
    assert ig.cycles("abcdef", graph) == [["a", "b", "c"], ["e"]]
    chain = {str(i): {str(i + 1)} for i in range(5000)}       # deep: no recursion limit
    assert ig.cycles([str(i) for i in range(5001)], chain) == []
    assert ig.levels("abcdef", graph) == {"a": 1, "b": 1, "c": 1, "d": 0, "e": 0, "f": 1}
    assert ig.reduced_edges("xyz", {"x": {"y", "z"}, "y": {"z"}}) == {"x": {"y"}, "y": {"z"}}


LAYERED = {
    "pkg/__init__.py": "",
    "pkg/layers/__init__.py": "",
    "pkg/layers/conv.py": "from ..kernels import gemm\n",
    "pkg/kernels/__init__.py": "",
    "pkg/kernels/gemm.py": "",
    "pkg/solvers/__init__.py": "",
    "pkg/solvers/sgd.py": "from ..layers import conv\n",
    "pkg/comm/__init__.py": "",
    "pkg/comm/ring.py": "",
    "pkg/cli.py": "from .solvers import sgd\nfrom .comm import ring\n",
}


def check(tmp_path, changes, allowed=None):
    modules, imports = ig.scan(str(write_package(tmp_path, {**LAYERED, **changes})), "pkg")
    return ig.problems(modules, imports, {} if allowed is None else allowed)


def test_a_layered_package_passes(tmp_path):
    assert check(tmp_path, {}) == ([], [])


def test_an_eager_module_cycle_fails_even_when_allowed(tmp_path):
    allowed = {("module", ("pkg.comm.ring", "pkg.comm.tree")): "a reason"}
    failures, _ = check(tmp_path, {"pkg/comm/ring.py": "from . import tree\n",
                                   "pkg/comm/tree.py": "from .ring import x\n"}, allowed)
    assert failures == ["module import cycle (eager imports): pkg.comm.ring -> pkg.comm.tree"]


def test_a_lazy_module_cycle_fails_unless_allowed(tmp_path):
    files = {"pkg/comm/ring.py": "from . import tree\n",
             "pkg/comm/tree.py": "def f():\n    from .ring import x\n"}
    failures, notes = check(tmp_path, files)
    assert failures == [
        "module import cycle (through lazy imports): pkg.comm.ring -> pkg.comm.tree"]
    allowed = {("module", ("pkg.comm.ring", "pkg.comm.tree")): "why"}
    failures, notes = check(tmp_path, files, allowed)
    assert failures == [] and len(notes) == 1 and notes[0].endswith("-- why")


def test_a_lazy_package_cycle_fails(tmp_path):
    failures, _ = check(tmp_path, {"pkg/comm/ring.py": "def f():\n    from ..solvers import sgd\n",
                                   "pkg/solvers/sgd.py": "from ..comm import ring\n"})
    assert failures == [
        "module import cycle (through lazy imports): pkg.comm.ring -> pkg.solvers.sgd",
        "package cycle comm <-> solvers: pkg.comm.ring:2 (lazy) -> pkg.solvers.sgd; "
        "pkg.solvers.sgd:1 -> pkg.comm.ring"]
    failures, _ = check(tmp_path, {"pkg/comm/ring.py": "def f():\n    from ..solvers import sgd\n",
                                   "pkg/solvers/sgd.py": "",
                                   "pkg/solvers/lr.py": "from ..comm import tree\n",
                                   "pkg/comm/tree.py": ""})
    assert failures == ["package cycle comm <-> solvers: pkg.comm.ring:2 (lazy) -> "
                        "pkg.solvers.sgd; pkg.solvers.lr:1 -> pkg.comm.tree"]   # no module cycle


def test_lower_packages_must_not_import_the_upper_ones(tmp_path):
    failures, _ = check(tmp_path, {"pkg/kernels/gemm.py": "def f():\n    from .. import cli\n",
                                   "pkg/layers/conv.py": "from ..comm.ring import x\n"})
    assert failures == [
        "layering: pkg.kernels.gemm:2 (lazy) imports pkg.cli (layers/io/kernels must not import "
        "solvers, comm, perf, tools, cli, flags, devices, signal_handler, __main__)",
        "layering: pkg.layers.conv:1 imports pkg.comm.ring (layers/io/kernels must not import "
        "solvers, comm, perf, tools, cli, flags, devices, signal_handler, __main__)"]


def test_an_allowed_cycle_no_longer_found_is_reported(tmp_path):
    _, notes = check(tmp_path, {}, {("package", ("comm", "perf")): "why"})
    assert notes == ["allowed package cycle comm -> perf is no longer found: delete it from "
                     "ALLOWED in tools/import_graph.py"]


def test_the_generated_section_is_replaced_between_its_markers(tmp_path):
    text = f"# Title\n\nprose\n\n{ig.BEGIN}\nold\n{ig.END}\n\nmore prose\n"
    assert ig.replace_section(text, f"{ig.BEGIN}\nnew\n{ig.END}\n") == \
        f"# Title\n\nprose\n\n{ig.BEGIN}\nnew\n{ig.END}\nmore prose\n"
    with pytest.raises(ValueError, match="markers"):
        ig.replace_section("no markers", "x")


def test_a_stale_document_fails_the_check_and_write_regenerates_it(tmp_path, capsys):
    doc = tmp_path / "architecture.md"
    doc.write_text(f"# Architecture\n\n{ig.BEGIN}\nstale\n{ig.END}\n")
    assert ig.main(["--check", "--doc", str(doc)]) == 1
    assert "the generated section is stale" in capsys.readouterr().out
    assert ig.main(["--write", "--doc", str(doc)]) == 0
    assert ig.main(["--check", "--doc", str(doc)]) == 0
    assert doc.read_text().startswith("# Architecture\n\n" + ig.BEGIN)
