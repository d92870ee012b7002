"""tools/cost_model.py and tools/dag_model.py, the models' command lines: they print the tables of
docs/scaling.md line for line, and fit and save the models.

Oracles: docs/scaling.md itself (every line a command prints is in it), and a results.json
made from known alpha and beta (the fit must give them back).
"""
import json
import os
import subprocess
import sys

import pytest

from caffe_engine.perf.alpha_beta import AlphaBetaModel, shape_terms
from caffe_engine.perf.profiles import SHAPES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool(name, *args, check=True):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def _in_scaling_md(text):
    with open(os.path.join(ROOT, "docs", "scaling.md")) as f:
        doc = f.read()
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    missing = [line for line in lines if line not in doc]
    assert not missing, f"{len(missing)} of {len(lines)} lines not in docs/scaling.md: " \
        f"{missing[:3]}"


@pytest.mark.parametrize("args", [("--firecaffe",), ("--four-minutes",), ("--netlab",)])
def test_dag_model_prints_the_docs_tables(args):
    if args != ("--netlab",) and not os.path.isdir(SHAPES):
        pytest.skip("shared/realworld not present")
    _in_scaling_md(_tool("dag_model.py", *args).stdout)


def test_cost_model_prints_the_docs_firecaffe_table():
    _in_scaling_md(_tool("cost_model.py", "--firecaffe").stdout)


def test_dag_model_needs_a_table():
    out = _tool("dag_model.py", check=False)
    assert out.returncode == 2 and "give --firecaffe, --four-minutes or --netlab" in out.stderr


def test_cost_model_fits_and_saves(tmp_path):
    alpha, beta = {"tree": 2e-5, "ring": 1e-5}, {"tree": 1e-9, "ring": 2e-9}
    rows = [{"algorithm": a, "procs": p, "bytes": n,
             "seconds": alpha[a] * shape_terms(a, p)[0] + beta[a] * n * shape_terms(a, p)[1]}
            for a in alpha for p in (2, 4, 8) for n in (4096, 1 << 20)]
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"rows": rows}))
    text = _tool("cost_model.py", "--fit", str(results), "--save",
                 str(tmp_path / "m.json")).stdout
    assert "| ring | 10.0 | 2.000 | 0.50 |" in text and "| tree | 20.0 | 1.000 | 1.00 |" in text
    model = AlphaBetaModel.load(tmp_path / "m.json")
    assert model.params["ring"]["beta"] == pytest.approx(2e-9)


def test_cost_model_fits_the_link_model(tmp_path):
    results = os.path.join(ROOT, "docs", "bench", "netlab", "1gbit", "results.json")
    text = _tool("cost_model.py", "--fit-links", results, "--fit-min-bytes", "4194304",
                 "--save-links", str(tmp_path / "links.json")).stdout
    # docs/scaling.md, "The link model": alpha = 0.70 ms, beta = 8.437 ns/byte = 948 Mbit/s
    assert text.startswith("Link model: alpha = 701.1 us, beta = 8.437 ns/byte (1/beta = 948 "
                           "Mbit/s)")
    assert json.loads((tmp_path / "links.json").read_text())["alpha"] == pytest.approx(701.1e-6,
                                                                                      rel=1e-3)
    out = _tool("cost_model.py", "--report", results, check=False)
    assert out.returncode != 0 and "--report needs --links-model" in out.stderr
