"""Environment variables: declared once (``caffe_engine/environment.py``), read there only, and
listed in the README under the same names; read when used, so ``monkeypatch.setenv`` counts."""
import ast
import re
from pathlib import Path

import pytest

from caffe_engine import environment, kernels, rng
from caffe_engine.comm import communicator
from caffe_engine.errors import CaffeError

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "caffe_engine"
#: ``os.environ``, ``os.getenv`` / ``putenv`` / ``unsetenv``, ``from os import environ``
DIRECT = re.compile(r"\b_*os\s*\.\s*(environ|getenv|putenv|unsetenv)\b|\bgetenv\s*\(|"
                    r"from\s+os\s+import\s+[^\n]*\benviron\b")


def test_only_the_environment_module_touches_the_environment():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "environment.py"
             for n, line in enumerate(path.read_text().splitlines(), 1) if DIRECT.search(line)]
    assert found == [], "read it through caffe_engine.environment:\n" + "\n".join(found)


def test_the_caffe_alias_reads_only_its_own_switch():
    """``caffe/__init__.py`` decides before the engine is imported: its one read is the
    declared ``CAFFE_ENGINE_NO_ALIAS``."""
    reads = [line.strip() for path in sorted((ROOT / "caffe").rglob("*.py"))
             for line in path.read_text().splitlines() if DIRECT.search(line)]
    assert len(reads) == 1 and '"CAFFE_ENGINE_NO_ALIAS"' in reads[0]
    assert environment.variable("CAFFE_ENGINE_NO_ALIAS").kind == "engine"


def _readme_names():
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and line.startswith("| `"):
            names.update(re.findall(r"`([A-Za-z][A-Za-z0-9_]*)`", cells[1]))
    return names


def test_the_readme_lists_every_declared_variable_and_no_other():
    declared = {v.name for v in environment.VARIABLES}
    listed = _readme_names()
    assert sorted(declared - listed) == [], "declared but not in README.md's table"
    assert sorted(listed - declared) == [], "in README.md's table but not declared"


def test_every_variable_is_declared_once_with_a_kind_default_and_meaning():
    names = [v.name for v in environment.VARIABLES]
    assert len(names) == len(set(names))
    for v in environment.VARIABLES:
        assert v.kind in ("engine", "launcher", "glog", "library"), v.name
        assert v.default and v.meaning, v.name


def _literal_reads():
    """(file, name) of every ``environment.read/raw/export("NAME", ...)`` and module constant
    ``*_VAR`` / ``*_ENV`` naming a variable in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "environment"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                yield path.name, node.args[0].value
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)
                  and re.fullmatch(r"[A-Z_]+_(VAR|ENV)", node.targets[0].id)
                  and isinstance(node.value, ast.Constant)):
                yield path.name, node.value.value


def test_every_name_the_package_reads_is_declared():
    reads = list(_literal_reads())
    assert len(reads) > 15
    assert [r for r in reads if r[1] not in environment.BY_NAME] == []


def test_reading_an_undeclared_variable_fails_loudly(monkeypatch):
    monkeypatch.setenv("CAFFE_NOT_A_SWITCH", "1")
    with pytest.raises(KeyError, match="CAFFE_NOT_A_SWITCH is not declared"):
        environment.raw("CAFFE_NOT_A_SWITCH")


def test_variables_are_read_when_used(monkeypatch):
    monkeypatch.delenv("CAFFE_ENGINE_SHARE_DIFFS", raising=False)
    assert environment.read("CAFFE_ENGINE_SHARE_DIFFS") is True
    monkeypatch.setenv("CAFFE_ENGINE_SHARE_DIFFS", "0")
    assert environment.read("CAFFE_ENGINE_SHARE_DIFFS") is False
    monkeypatch.setenv("CAFFE_COMM_TIMEOUT", "7.5")
    assert communicator.default_timeout() == 7.5
    monkeypatch.delenv("CAFFE_COMM_TIMEOUT")
    assert communicator.default_timeout() == communicator.DEFAULT_TIMEOUT
    monkeypatch.setenv("CAFFE_ENGINE_GPU_KERNELS", " reference ")
    assert kernels.gpu_default() == "reference"
    monkeypatch.setenv(rng.EXACT_RNG_ENV, "1")
    assert rng.exact_rng()


@pytest.mark.parametrize("name, text, message", [
    ("CAFFE_COMM_TIMEOUT", "soon", "CAFFE_COMM_TIMEOUT must be a number of seconds, got 'soon'"),
    ("CAFFE_ENGINE_DATA_THREADS", "0", "CAFFE_ENGINE_DATA_THREADS must be a positive integer"),
    ("CAFFE_HIER_LANES", "two", "CAFFE_HIER_LANES must be a positive integer, got 'two'"),
])
def test_bad_values_are_one_line_naming_the_variable(name, text, message):
    with pytest.raises(CaffeError, match=re.escape(message)):
        environment.read(name, {name: text})


def test_the_flags_keep_their_readings():
    read = environment.read
    assert [read("CAFFE_PEER_WATCH", {"CAFFE_PEER_WATCH": t}) for t in (None, "", "1", "0")] \
        == [True, True, True, False]
    assert [read("CAFFE_ENGINE_EXACT_RNG", {"CAFFE_ENGINE_EXACT_RNG": t})
            for t in ("", " 0 ", "1", "yes")] == [False, False, True, True]
    assert read("CAFFE_ENGINE_EXACT_RNG", {}) is False
    assert [read("CAFFE_SUPERVISED", {"CAFFE_SUPERVISED": t}) for t in ("1", "0", "")] \
        == [True, False, False]
    assert read("CAFFE_SUPERVISED", {}) is False
    assert read("CAFFE_NODE", {"CAFFE_NODE": ""}) is None
    assert read("CAFFE_NODE", {"CAFFE_NODE": "h1"}) == "h1"
    assert read("CAFFE_COMM_STAGING", {"CAFFE_COMM_STAGING": " EMULATE"}) == "emulate"
    assert read("CAFFE_COMM_STAGING", {}) == "auto"
    assert read("OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_RANK": "3"}) == 3


def test_export_sets_a_declared_variable_for_child_processes(monkeypatch):
    monkeypatch.setenv("CAFFE_SUPERVISED", "0")          # put back (unset) after the test
    environment.export("CAFFE_SUPERVISED", "1")
    assert environment.read("CAFFE_SUPERVISED") is True
    assert environment.copy()["CAFFE_SUPERVISED"] == "1"
    with pytest.raises(KeyError):
        environment.export("NOT_DECLARED_HERE", "1")
