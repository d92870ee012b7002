#!/usr/bin/env python
"""Train every case of shared/caffe_reference/training with the engine and compare with Caffe.

Each case folder is copied to ``<tmp>/x/y/<case>`` with ``<tmp>/data`` linking to shared/data
(as the fixtures' README prescribes), the snapshots Caffe wrote are removed from the copy, and
each run is trained from the copy with the command line Caffe used (``runs.<run>.command`` of
trajectory.json, ``caffe`` replaced by ``python -m caffe_engine``). The ``resume`` and
``finetune`` runs of ``lenet_snapshot_resume`` start from Caffe's own iteration-50 files, as
Caffe's did, in a second copy.

Printed per run: iterations, max |smoothed loss - Caffe's| (absolute and relative), the first
iteration whose loss differs by more than 1e-4 relative (engine, then Caffe's two BLAS
variants), the final test outputs (engine / Caffe), the final weights' distance from Caffe's
(max |diff| / max |w|, engine vs the order variant) and the wall time.

Usage: python tools/compare_training.py [case ...] [--keep DIR] [--json FILE]
"""
import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from caffe_engine.tools.repro_check import BLAS_THREADS  # noqa: E402
from caffe_engine.tools.training_log import parse_log  # noqa: E402,F401  (also the tests')
TRAINING = ROOT.parent / "shared" / "caffe_reference" / "training"
DATA = ROOT.parent / "shared" / "data"

SNAPSHOT_PATTERNS = ("*.caffemodel", "*.solverstate", "*.caffemodel.h5", "*.solverstate.h5")


def cases():
    """The case names, in manifest order."""
    manifest = json.loads((TRAINING / "manifest.json").read_text())
    return [c["name"] for c in manifest["cases"]]


def trajectory(case):
    return json.loads((TRAINING / case / "trajectory.json").read_text())


def missing_layer_types(case):
    """Layer types the case's nets use that the engine has not registered (sorted list)."""
    from caffe_engine.io import prototxt as pio
    from caffe_engine.layers import layer_type_list
    known = set(layer_type_list())
    used = set()
    for path in (TRAINING / case).glob("*.prototxt"):
        if path.name.startswith("solver"):
            continue
        used.update(layer.type for layer in pio.read_net_param(str(path)).layer)
    return sorted(used - known)


def prepare(case, root, keep=()):
    """Copy ``case`` to ``root/x/y/<case>`` without Caffe's snapshots (except ``keep``)."""
    root = Path(root)
    dest = root / "x" / "y" / case
    shutil.copytree(TRAINING / case, dest)
    for pattern in SNAPSHOT_PATTERNS:
        for f in dest.glob(pattern):
            if f.name not in keep:
                f.unlink()
    for f in dest.rglob("*"):
        f.chmod(0o644)
    link = root / "data"
    if not link.exists():
        link.symlink_to(DATA)
    return dest


def engine_argv(command, extra=()):
    """Caffe's recorded command line as an engine command line."""
    words = shlex.split(command)
    if words[0] != "caffe":
        raise ValueError(f"unexpected command {command!r}")
    return [sys.executable, "-m", "caffe_engine", *words[1:], *extra]




def run_command(folder, command, extra=(), timeout=1800):
    """Run ``command`` (as Caffe's) in ``folder``; returns (returncode, log, seconds)."""
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(name, BLAS_THREADS)
    start = time.perf_counter()
    r = subprocess.run(engine_argv(command, extra), cwd=folder, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r.returncode, r.stderr, time.perf_counter() - start


def _first_above(rel, its, threshold):
    idx = np.nonzero(rel > threshold)[0]
    return int(its[idx[0]]) if idx.size else None


def _weights(path):
    from caffe_engine.io.blobproto import proto_to_array
    from caffe_engine.proto import caffe_pb2
    msg = caffe_pb2.NetParameter()
    msg.ParseFromString(Path(path).read_bytes())
    return {(layer.name, k): proto_to_array(b) for layer in msg.layer for k, b in enumerate(layer.blobs)}


def weights_distance(mine, theirs):
    """max |mine - theirs| / max |theirs| over every param blob of two .caffemodel files."""
    a, b = _weights(mine), _weights(theirs)
    if a.keys() != b.keys():
        return math.inf
    diff = max(float(np.abs(a[k] - b[k]).max()) for k in b)
    scale = max(float(np.abs(b[k]).max()) for k in b)
    return diff / scale


def compare_run(ref, parsed, folder=None, case=None):
    """Metrics of an engine run (``parse_log`` output) against Caffe's run ``ref`` (trajectory)."""
    its = ref["iterations"]["iter"]
    caffe = np.array(ref["iterations"]["smoothed_loss"], dtype=float)
    m = {"iterations": len(parsed["iterations"]), "expected_iterations": len(its)}
    if sorted(parsed["iterations"]) != its:
        m["error"] = f"logged iterations differ ({len(parsed['iterations'])} vs {len(its)})"
        return m
    mine = np.array([parsed["iterations"][i] for i in its])
    rel = np.abs(mine - caffe) / np.maximum(np.abs(caffe), 1e-12)
    m["max_abs_smoothed"] = float(np.abs(mine - caffe).max())
    m["max_rel_smoothed"] = float(rel.max())
    m["last_rel_smoothed"] = float(rel[-1])
    m["first_smoothed_above_1e-4"] = _first_above(rel, its, 1e-4)
    # The iteration's own loss: the smoothed value with average_loss 1, else the train output.
    if ref["average_loss"] == 1:
        loss_mine, loss_caffe = mine, caffe
    else:
        loss_mine = np.array([parsed["train_outputs"][i].get("loss", np.nan) for i in its])
        loss_caffe = np.array(ref["iterations"]["train_outputs"]["loss"], dtype=float)
    lrel = np.abs(loss_mine - loss_caffe) / np.maximum(np.abs(loss_caffe), 1e-12)
    m["first_loss_above_1e-4"] = _first_above(lrel, its, 1e-4)
    m["max_rel_loss"] = float(np.nanmax(lrel))
    for name in ("blas_order_variant", "blas_threads_variant"):
        v = ref.get(name) or {}
        m[f"{name}_first_loss_above_1e-4"] = v.get("first_iter_loss_rel_diff_above_1e-4")
        m[f"{name}_first_smoothed_above_1e-4"] = v.get("first_iter_smoothed_loss_rel_diff_above_1e-4")
        m[f"{name}_smoothed_rel_max"] = v.get("smoothed_loss_rel_diff_max")
    m["lr_equal"] = [parsed["lr"].get(i) for i in its] == ref["iterations"]["lr"]
    exact0 = ref.get("train_outputs_exact", {}).get("loss")
    if exact0:
        m["iter0_rel"] = abs(parsed["train_outputs"][its[0]]["loss"] - exact0[0]) / abs(exact0[0])
    # Tests.
    ref_tests = ref["tests"]
    m["tests_schedule_equal"] = [(t["iter"], t["net"]) for t in parsed["tests"]] == \
        [(t["iter"], t["net"]) for t in ref_tests]
    diffs = {}
    for mt, rt in zip(parsed["tests"], ref_tests):
        for k, v in rt["outputs"].items():
            diffs[k] = max(diffs.get(k, 0.0), abs(mt["outputs"].get(k, math.inf) - v))
    m["test_abs_diff_max"] = diffs
    m["final_test_engine"] = parsed["tests"][-1]["outputs"] if parsed["tests"] else {}
    m["final_test_caffe"] = ref_tests[-1]["outputs"] if ref_tests else {}
    if ref.get("final_forward") and parsed["final_forward"]:
        ff = ref["final_forward"]["smoothed_loss"]
        m["final_forward_rel"] = abs(parsed["final_forward"][1] - ff) / abs(ff)
    # Schedules: clipping and multistep.
    if "gradient_clipping" in ref:
        m["clipping_engine"] = len(parsed["clipping"])
        m["clipping_caffe"] = len(ref["gradient_clipping"])
        first_div = m["first_loss_above_1e-4"] if m["first_loss_above_1e-4"] is not None else its[-1] + 1
        mine_early = [i for i in parsed["clipping"] if i < first_div]
        theirs_early = [c["iter"] for c in ref["gradient_clipping"] if c["iter"] < first_div]
        m["clipping_equal_until_divergence"] = mine_early == theirs_early
    if ref.get("multistep") is not None:
        m["multistep_equal"] = [list(x) for x in parsed["multistep"]] == \
            [[x["iter"], x["step"]] for x in ref["multistep"]]
    m["snapshots_engine"] = parsed["snapshots"]
    m["snapshots_equal"] = parsed["snapshots"] == ref["snapshots"]
    if folder is not None and case is not None:
        finals = [s for s in ref["snapshots"] if s.endswith(".caffemodel")]
        if finals and (Path(folder) / finals[-1]).exists():
            m["final_weights_rel"] = weights_distance(Path(folder) / finals[-1], TRAINING / case / finals[-1])
            v = ref.get("blas_order_variant") or {}
            m["blas_order_variant_final_weights_rel"] = v.get("final_weights_max_abs_diff_over_max_abs")
    return m


def run_case(case, root):
    """Run every run of ``case`` under ``root``; returns a list of dicts per run."""
    traj = trajectory(case)
    results = []
    missing = missing_layer_types(case)
    if missing:
        return [{"case": case, "run": run, "skipped": f"layer types not registered: {', '.join(missing)}"}
                for run in traj["runs"]]
    folder = prepare(case, Path(root) / "main")
    resume_folder = None
    for run, ref in traj["runs"].items():
        where = folder
        if run in ("resume", "finetune"):
            # Caffe resumed / finetuned from its own iteration-50 files.
            if resume_folder is None:
                inputs = {os.path.basename(w) for w in re.findall(r"--(?:snapshot|weights)=(\S+)",
                                                                   " ".join(r["command"] for r in traj["runs"].values()))}
                inputs |= {f.replace(".solverstate", ".caffemodel") for f in inputs}
                resume_folder = prepare(case, Path(root) / "from_caffe", keep=inputs)
            where = resume_folder
        code, log, seconds = run_command(where, ref["command"])
        (Path(where) / f"engine_{run}.log").write_text(log)
        entry = {"case": case, "run": run, "seconds": seconds, "returncode": code, "folder": str(where)}
        if code != 0:
            entry["error"] = log.strip().splitlines()[-1] if log.strip() else f"exit {code}"
        else:
            entry.update(compare_run(ref, parse_log(log), where, case))
        results.append(entry)
    return results


def _fmt(x, spec=".3g"):
    if x is None:
        return "-"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _outputs(d):
    return " ".join(f"{k}={v:g}" for k, v in sorted(d.items()))


def table(results):
    """The results as a Markdown table."""
    head = ("| case | run | iters | max abs smoothed | max rel smoothed | first loss rel>1e-4 "
            "(engine / order / threads) | first smoothed rel>1e-4 (engine / order / threads) | "
            "final test engine | final test Caffe | weights dist (engine / order var.) | s |")
    lines = [head, "|" + " --- |" * 11]
    for r in results:
        if "skipped" in r or "error" in r:
            lines.append(f"| {r['case']} | {r['run']} | {r.get('skipped') or r.get('error')} |" + " |" * 8)
            continue
        lines.append(
            f"| {r['case']} | {r['run']} | {r['iterations']} | {_fmt(r['max_abs_smoothed'])} | "
            f"{_fmt(r['max_rel_smoothed'])} | {_fmt(r['first_loss_above_1e-4'])} / "
            f"{_fmt(r['blas_order_variant_first_loss_above_1e-4'])} / "
            f"{_fmt(r['blas_threads_variant_first_loss_above_1e-4'])} | "
            f"{_fmt(r['first_smoothed_above_1e-4'])} / {_fmt(r['blas_order_variant_first_smoothed_above_1e-4'])} / "
            f"{_fmt(r['blas_threads_variant_first_smoothed_above_1e-4'])} | "
            f"{_outputs(r['final_test_engine'])} | {_outputs(r['final_test_caffe'])} | "
            f"{_fmt(r.get('final_weights_rel'))} / {_fmt(r.get('blas_order_variant_final_weights_rel'))} | "
            f"{r['seconds']:.0f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--keep", help="folder to run in and keep (default: a temporary folder)")
    ap.add_argument("--json", help="also write the full results as JSON here")
    args = ap.parse_args(argv)
    names = args.cases or cases()
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="compare_training-"))
    results = []
    try:
        for case in names:
            case_root = root / case
            case_root.mkdir(parents=True, exist_ok=True)
            for r in run_case(case, case_root):
                results.append(r)
                print(f"{r['case']}/{r['run']}: " + (r.get("skipped") or r.get("error") or
                      f"{r['iterations']} iterations, max rel smoothed {r['max_rel_smoothed']:.3g}, "
                      f"{r['seconds']:.0f} s"), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
