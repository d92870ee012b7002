"""tools/bench_allreduce.py's --netlab bookkeeping, without MPI or a lab: merging rows of several
runs, and --replot's table, model report and plot from a results.json.

Oracles: rows made by the link model itself (the report must then say 1.00 everywhere and the
fit must give back the model's alpha and beta), and cells written by hand for the merge.
"""
import importlib.util
import json

import pytest

from caffe_engine.perf.link_model import LinkModel
from paths import ROOT

SPEC = importlib.util.spec_from_file_location("bench_allreduce",
                                              ROOT / "tools" / "bench_allreduce.py")
bench = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench)

LAB = {"hosts": 2, "ranks_per_host": 1, "link": 1e9, "intra": "shm", "latency": None,
       "intra_latency": None, "netmod": "ofi"}


def test_merge_replaces_a_cell_of_the_same_lab_only():
    old = [{"algorithm": "tree", "procs": 2, "bytes": 4096, "seconds": 1.0, "netlab": LAB},
           {"algorithm": "ring", "procs": 2, "bytes": 4096, "seconds": 2.0, "netlab": LAB}]
    new = [{"algorithm": "tree", "procs": 2, "bytes": 4096, "seconds": 3.0, "netlab": LAB},
           {"algorithm": "tree", "procs": 2, "bytes": 4096, "seconds": 4.0,
            "netlab": dict(LAB, link=1e10)}]
    merged = bench.merge_rows(old, new)
    assert [r["seconds"] for r in merged] == [2.0, 3.0, 4.0]


def test_replot_fits_and_reports(tmp_path):
    truth = LinkModel(alpha=500e-6, beta=8.4e-9)
    rows = [{"algorithm": a, "procs": p, "bytes": n, "seconds": truth.predict(a, n, p),
             "min_seconds": truth.predict(a, n, p), "reps": 3,
             "netlab": dict(LAB, hosts=p)}
            for a in ("tree", "ring", "ps", "mpi") for p in (2, 4, 8)
            for n in (1 << 20, 4 << 20, 32 << 20)]
    runs = [{"argv": [], "labs": [{"procs": p, "describe": f"{p} hosts x 1 ranks: host links "
                                   "1 Gbit/s, no delay"} for p in (2, 4, 8)]}]
    (tmp_path / "results.json").write_text(json.dumps({"rows": rows, "runs": runs}))
    assert bench.main(["--netlab", "--replot", "--out", str(tmp_path)]) == 0
    model = LinkModel.load(tmp_path / "links_model.json")
    assert model.alpha == pytest.approx(500e-6, rel=1e-6)
    assert model.beta == pytest.approx(8.4e-9, rel=1e-6)
    assert "24 rows" in model.source                     # --fit-min-bytes 4M: 1 MiB left out
    report = (tmp_path / "model.md").read_text()
    assert report.count("| 1.00 |") == len(rows)
    assert "host links 1 Gbit/s" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "plot.png").stat().st_size > 0
