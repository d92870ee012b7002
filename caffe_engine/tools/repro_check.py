"""Check that the engine reproduces a real Caffe training run: same seed, same numbers.

Given the solver prototxt Caffe trained with and Caffe's training log (``caffe train ... 2>
caffe.log`` with ``GLOG_logtostderr=1``, ``display: 1`` recommended), the engine trains the same
solver (``python -m caffe_engine train --solver=...``, working directory: the solver's folder
unless ``--cwd``), and the two runs are compared:

- per logged iteration, the smoothed loss (``Iteration N (...), loss = X``) side by side, with
  its absolute and relative deviation; the first iteration whose relative deviation exceeds
  ``--tol`` is named;
- the lr printed per iteration (bit-exact in a reproducing run);
- per test (``Iteration N, Testing net (#k)``), the test outputs side by side;
- per snapshot ``.caffemodel`` of Caffe (``--caffemodel``, or those Caffe's log names that exist
  next to the log) and the engine's snapshot of the same name, per param blob the max absolute
  deviation and that divided by the blob's max |w| in Caffe's file (the max relative weight
  deviation; element-wise ratios are meaningless at weights near 0).

The engine's snapshots are written to a temporary folder (the solver's ``snapshot_prefix`` keeps
its file name but moves there), so Caffe's own snapshots next to the solver are never overwritten.

Only the smoothed loss up to ``--until`` decides the exit status: float32 training amplifies the
different summation orders of two BLAS kernels, so later iterations, tests and trained weights are
reported, not checked (docs/reproducibility.md gives the margins Caffe has against itself).

Exit status: 0 within tolerance; 1 beyond it (one line on stderr naming the first diverging
iteration) or the engine run failed; 2 bad input (one-line error on stderr).

Examples:
  caffe_repro_check examples/mnist/lenet_solver.prototxt --log caffe.log
  caffe_repro_check solver.prototxt --log caffe.log --until 50 --tol 1e-4
  caffe_repro_check solver.prototxt --log caffe.log --engine-log engine.log
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from .. import environment
from .training_log import parse_log

#: BLAS threads for the engine's runs (also tools/compare_training.py's). The float32 sums inside matrix products depend on how OpenBLAS
#: splits them between threads; with 2 threads the engine's per-iteration losses stay within
#: 1e-6 of the fixtures' for as long as Caffe's own re-runs do (lenet_adam: 80+ iterations),
#: with 1 thread they leave 1e-4 earlier (lenet_adam: iteration 66 instead of 77).
BLAS_THREADS = "2"

PROG = "repro_check"


class BadInput(Exception):
    """A file that is missing or unreadable, or a log without training iterations."""


def _read(path, what):
    try:
        return Path(path).read_text(errors="replace")
    except OSError as exc:
        raise BadInput(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_log(path, what):
    """Parse a Caffe-format training log; raises BadInput when it logs no iteration."""
    parsed = parse_log(_read(path, what))
    if not parsed["iterations"]:
        raise BadInput(f"{what} {path} has no 'Iteration N (...), loss = X' line "
                       "(a Caffe training log with display > 0 is needed)")
    return parsed


def read_caffemodel(path):
    """{(layer, k): float array} of a binary .caffemodel (or HDF5 by extension)."""
    from caffe_engine.io.blobproto import proto_to_array
    from caffe_engine.proto import caffe_pb2
    path = Path(path)
    if path.suffix == ".h5":
        try:
            import h5py
            with h5py.File(path, "r") as f:
                out = {}
                for layer in f["data"]:
                    for k in sorted(f["data"][layer], key=int):
                        out[(layer, int(k))] = np.asarray(f["data"][layer][k], dtype=np.float32)
                return out
        except (OSError, KeyError, ValueError) as exc:
            raise BadInput(f"cannot read HDF5 weights {path}: {exc}") from None
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read .caffemodel {path}: {exc.strerror or exc}") from None
    msg = caffe_pb2.NetParameter()
    try:
        msg.ParseFromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError
        raise BadInput(f"{path} is not a binary NetParameter: {exc}") from None
    out = {}
    for layer in list(msg.layer) + list(msg.layers):
        for k, bp in enumerate(layer.blobs):
            out[(layer.name, k)] = np.asarray(proto_to_array(bp), dtype=np.float64)
    return out


def weights_deviation(engine_path, caffe_path):
    """Per blob (layer, k, shape, max_abs_diff, max_abs_diff / max|w_caffe|); missing blobs as inf."""
    mine, theirs = read_caffemodel(engine_path), read_caffemodel(caffe_path)
    rows = []
    for key, w in theirs.items():
        m = mine.get(key)
        if m is None or m.shape != w.shape:
            rows.append((key[0], key[1], w.shape, math.inf, math.inf))
            continue
        diff = float(np.abs(m - w).max()) if w.size else 0.0
        scale = float(np.abs(w).max()) if w.size else 0.0
        rows.append((key[0], key[1], w.shape, diff, diff / scale if scale else (0.0 if diff == 0 else math.inf)))
    return rows


def net_deviation(engine_path, caffe_path):
    """max |w_engine - w_caffe| / max |w_caffe| over every blob (the fixtures'
    ``final_weights_max_abs_diff_over_max_abs``); inf when the blobs do not correspond."""
    mine, theirs = read_caffemodel(engine_path), read_caffemodel(caffe_path)
    if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in theirs):
        return math.inf
    diff = max((float(np.abs(mine[k] - w).max()) for k, w in theirs.items() if w.size), default=0.0)
    scale = max((float(np.abs(w).max()) for w in theirs.values() if w.size), default=0.0)
    return diff / scale if scale else (0.0 if diff == 0 else math.inf)


def engine_solver(solver, cwd, tmp):
    """Write a copy of ``solver`` into ``tmp`` whose net paths are absolute (resolved from ``cwd``,
    as Caffe resolves them) and whose snapshots go to ``tmp``; returns its path."""
    from caffe_engine.errors import CaffeError
    from caffe_engine.io import prototxt as pio
    try:
        param = pio.read_solver_param(str(solver))
    except (CaffeError, OSError) as exc:
        raise BadInput(str(exc).splitlines()[0]) from None
    for field in ("net", "train_net"):
        if param.HasField(field) and not os.path.isabs(getattr(param, field)):
            setattr(param, field, str(Path(cwd) / getattr(param, field)))
    nets = [n if os.path.isabs(n) else str(Path(cwd) / n) for n in param.test_net]
    del param.test_net[:]
    param.test_net.extend(nets)
    prefix = param.snapshot_prefix or Path(solver).stem
    param.snapshot_prefix = str(Path(tmp) / os.path.basename(prefix.rstrip("/")))
    out = Path(tmp) / Path(solver).name
    pio.write_text(str(out), param)
    return out


def run_engine(solver, cwd, tmp, weights=None, snapshot=None, gpu=None, timeout=None):
    """Train ``solver`` with the engine; returns (returncode, log text)."""
    argv = [sys.executable, "-m", "caffe_engine", "train", f"--solver={engine_solver(solver, cwd, tmp)}"]
    if weights:
        argv.append(f"--weights={weights}")
    if snapshot:
        argv.append(f"--snapshot={snapshot}")
    if gpu is not None:
        argv.append(f"--gpu={gpu}")
    env = environment.copy()
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.setdefault(name, BLAS_THREADS)
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)
    return r.returncode, r.stderr + r.stdout


def _g(x):
    return "-" if x is None else f"{x:.6g}"


def compare(caffe, engine, tol, until):
    """Iteration rows and the verdict.

    Returns:
        dict: ``rows`` [(iter, caffe, engine, abs, rel)], ``first_beyond`` (first iteration over
        ``tol`` anywhere), ``failure`` (first iteration over ``tol`` or missing, up to ``until``,
        as (iter, message)) or None, ``lr_first_diff``.
    """
    rows, first_beyond, failure, lr_first_diff = [], None, None, None
    for it in sorted(caffe["iterations"]):
        c = caffe["iterations"][it]
        e = engine["iterations"].get(it)
        checked = until is None or it <= until
        if e is None:
            rows.append((it, c, None, None, None))
            if checked and failure is None:
                failure = (it, "missing from the engine's log")
            continue
        d = abs(e - c)
        rel = d / abs(c) if c else (0.0 if d == 0 else math.inf)
        rows.append((it, c, e, d, rel))
        if not rel <= tol:
            if first_beyond is None:
                first_beyond = it
            if checked and failure is None:
                failure = (it, f"smoothed loss {e:.6g} vs Caffe's {c:.6g}, "
                               f"relative deviation {rel:.3g} > tolerance {tol:g}")
        if lr_first_diff is None and it in caffe["lr"] and engine["lr"].get(it) != caffe["lr"][it]:
            lr_first_diff = it
    return {"rows": rows, "first_beyond": first_beyond, "failure": failure,
            "lr_first_diff": lr_first_diff}


def report(caffe, engine, result, tol, until, snapshots, out):
    p = lambda *a: print(*a, file=out)  # noqa: E731
    scope = f"up to iteration {until}" if until is not None else "at every iteration"
    p(f"# smoothed loss (tolerance {tol:g} relative, checked {scope})")
    p(f"{'iter':>6} {'caffe':>12} {'engine':>12} {'abs_dev':>10} {'rel_dev':>10}")
    for it, c, e, d, rel in result["rows"]:
        flag = ""
        if rel is None:
            flag = "  missing"
        elif not rel <= tol:
            flag = "  *" if until is None or it <= until else "  (beyond, not checked)"
        p(f"{it:>6} {_g(c):>12} {_g(e):>12} {_g(d):>10} {_g(rel):>10}{flag}")
    extra = sorted(set(engine["iterations"]) - set(caffe["iterations"]))
    if extra:
        p(f"engine logged {len(extra)} iteration(s) Caffe did not: {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    rels = [r[4] for r in result["rows"] if r[4] is not None]
    if rels:
        p(f"max relative deviation {max(rels):.3g}, last {rels[-1]:.3g}")
    fb = result["first_beyond"]
    p(f"first iteration beyond {tol:g}: {fb if fb is not None else 'none'}")
    if caffe["final_forward"] or engine["final_forward"]:
        cf, ef = caffe["final_forward"], engine["final_forward"]
        p(f"final forward (Iteration N, loss = X): caffe {cf[1] if cf else '-'} at {cf[0] if cf else '-'}, "
          f"engine {ef[1] if ef else '-'} at {ef[0] if ef else '-'}")
    lrd = result["lr_first_diff"]
    p("lr: identical at every logged iteration" if lrd is None else f"lr: first differs at iteration {lrd}")

    p("\n# tests")
    if not caffe["tests"]:
        p("(none in Caffe's log)")
    else:
        p(f"{'iter':>6} {'net':>3} {'output':<20} {'caffe':>12} {'engine':>12} {'abs_dev':>10}")
        etests = {(t["iter"], t["net"]): t["outputs"] for t in engine["tests"]}
        for t in caffe["tests"]:
            eo = etests.get((t["iter"], t["net"]), {})
            for name, c in t["outputs"].items():
                e = eo.get(name)
                p(f"{t['iter']:>6} {t['net']:>3} {name:<20} {_g(c):>12} {_g(e):>12} "
                  f"{_g(abs(e - c) if e is not None else None):>10}")

    p("\n# snapshots (max_abs: max |w_engine - w_caffe|; max_rel: max_abs / max |w_caffe| of the blob)")
    if not snapshots:
        p("(no Caffe .caffemodel given or found next to the log)")
    for caffe_file, engine_file in snapshots:
        if engine_file is None or not Path(engine_file).exists():
            p(f"{Path(caffe_file).name}: the engine wrote no snapshot of that name")
            continue
        rows = weights_deviation(engine_file, caffe_file)
        p(f"{Path(caffe_file).name}:")
        p(f"  {'layer':<20} {'k':>2} {'shape':<18} {'max_abs':>10} {'max_rel':>10}")
        for layer, k, shape, d, r in rows:
            p(f"  {layer:<20} {k:>2} {str(tuple(shape)):<18} {_g(d):>10} {_g(r):>10}")
        if rows:
            p(f"  all blobs: max_abs {_g(max(r[3] for r in rows))}, max_rel {_g(max(r[4] for r in rows))}, "
              f"max_abs / max |w_caffe| over the net {_g(net_deviation(engine_file, caffe_file))}")


def caffe_snapshots(args, caffe, log_path, cwd):
    """Caffe's .caffemodel files to compare: --caffemodel, else those its log names that exist."""
    if args.caffemodel:
        files = [Path(f) for f in args.caffemodel]
        for f in files:
            if not f.exists():
                raise BadInput(f"--caffemodel {f} does not exist")
        return files
    found = []
    for name in caffe["snapshots"]:
        if not (name.endswith(".caffemodel") or name.endswith(".caffemodel.h5")):
            continue
        for folder in (Path(log_path).parent, Path(cwd)):
            if (folder / name).exists():
                found.append(folder / name)
                break
    return found


def build_parser():
    ap = argparse.ArgumentParser(
        prog="repro_check.py",
        description="Train a solver with the engine and compare it with real Caffe's run of the "
                    "same solver and seed (log, test outputs, snapshot weights).",
        epilog="Exit status: 0 within tolerance, 1 beyond it (first diverging iteration on stderr) "
               "or the engine failed, 2 bad input.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("solver", help="the solver prototxt Caffe trained with")
    ap.add_argument("--log", help="Caffe's training log (default: caffe.log next to the solver)")
    ap.add_argument("--caffemodel", action="append", metavar="FILE",
                    help="a Caffe snapshot to compare with the engine's of the same name "
                         "(repeatable; default: the snapshots Caffe's log names, found next to it)")
    ap.add_argument("--engine-log", metavar="FILE",
                    help="compare this existing engine log instead of training (its snapshots are "
                         "looked up next to it)")
    ap.add_argument("--tol", type=float, default=1e-4,
                    help="relative tolerance on the smoothed loss (default 1e-4)")
    ap.add_argument("--until", type=int, metavar="N",
                    help="check the tolerance only up to iteration N; later iterations are reported")
    ap.add_argument("--cwd", help="working directory Caffe ran in (default: the solver's folder); "
                                  "relative net and data paths resolve from it")
    ap.add_argument("--weights", help="pass --weights=FILE to the engine (as Caffe was run)")
    ap.add_argument("--snapshot", help="pass --snapshot=FILE to the engine (as Caffe was run)")
    ap.add_argument("--gpu", help="pass --gpu=ID to the engine")
    ap.add_argument("--save-engine-log", metavar="FILE", help="write the engine's log here")
    ap.add_argument("--keep", metavar="DIR", help="write the engine's snapshots to DIR and keep them")
    return ap


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if not args.tol >= 0:
            raise BadInput(f"--tol must be >= 0, got {args.tol}")
        solver = Path(args.solver)
        if not solver.is_file():
            raise BadInput(f"solver prototxt {solver} does not exist")
        cwd = Path(args.cwd) if args.cwd else solver.resolve().parent
        if not cwd.is_dir():
            raise BadInput(f"--cwd {cwd} is not a folder")
        log_path = Path(args.log) if args.log else solver.parent / "caffe.log"
        caffe = read_log(log_path, "Caffe log")
        snaps = caffe_snapshots(args, caffe, log_path, cwd)
        with tempfile.TemporaryDirectory(prefix="repro_check-") as tmp:
            if args.engine_log:
                engine = read_log(args.engine_log, "engine log")
                engine_dir = Path(args.engine_log).parent
            else:
                engine_dir = Path(args.keep) if args.keep else Path(tmp)
                engine_dir.mkdir(parents=True, exist_ok=True)
                code, text = run_engine(solver, cwd, engine_dir.resolve(), args.weights,
                                        args.snapshot, args.gpu)
                if args.save_engine_log:
                    Path(args.save_engine_log).write_text(text)
                if code != 0:
                    last = text.strip().splitlines()[-1] if text.strip() else f"exit status {code}"
                    print(f"{PROG}: engine run failed: {last}", file=sys.stderr)
                    return 1
                engine = parse_log(text)
                if not engine["iterations"]:
                    print(f"{PROG}: engine run logged no iteration (is display 0?)", file=sys.stderr)
                    return 1
            result = compare(caffe, engine, args.tol, args.until)
            pairs = [(c, engine_dir / c.name) for c in snaps]
            report(caffe, engine, result, args.tol, args.until, pairs, sys.stdout)
    except BadInput as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    if result["failure"]:
        it, detail = result["failure"]
        print(f"{PROG}: first diverging iteration {it}: {detail}", file=sys.stderr)
        return 1
    scope = f"up to iteration {args.until}" if args.until is not None else "at every iteration"
    print(f"{PROG}: within {args.tol:g} relative {scope}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
