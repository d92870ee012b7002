#!/usr/bin/env bash
# The GPU machine's check of caffe_engine's CuPy path, in one run from the repository root:
#
#   env     nvidia-smi, Python and the versions of the packages that matter
#   install what setup.cfg's install_requires needs and the image lacks, from the wheels in .whl/
#           (pip --no-index --target, no network); the project itself runs from the checkout
#           (PYTHONPATH: it is pure Python, caffe_engine/proto/caffe_pb2.py is committed)
#   nvrtc   tests/kernels/test_cuda_compile.py: every CUDA source compiles with NVRTC for sm_90
#   pytest  every test marked gpu, using the gpu_mode fixture, or the kernel_set param "cuda"
#           (tests/conftest.py), junit XML to $OUT/pytest_gpu.xml; tests/parallel is left out
#   lenet   LeNet trained on the GPU (caffe train --gpu 0, models/lenet's solver, 1,000
#           iterations) from the MNIST LMDBs in .gpu_data/: test accuracy must reach 0.96; then
#           100 iterations of the same run on the CPU (reference kernels: no Numba compile) and
#           the two loss curves side by side ($OUT/lenet_compare.txt)
#   bench   tools/bench_train.py --device gpu: LeNet, cifar10_quick, NiN, BVLC GoogLeNet (224x224,
#           batch 32) in the engine and in PyTorch (eager, float32) on the same GPU: ms/iter,
#           ratio, peak GPU memory, the engine's kernel launches per iteration ($OUT/bench_gpu.json)
#
# Each step runs under `timeout` (its own cap, and never past the whole run's budget); a failing
# step does not stop the later ones. Exit status 1 when a step failed or timed out. Into $OUT go
# exactly 8 files (what a device call brings back, at most): gpu_check.log (everything),
# summary.txt (one line per step: status, exit code, seconds, key figure), pytest_gpu.xml,
# pytest_nvrtc.xml, lenet_gpu.log, lenet_cpu.log, lenet_compare.txt, bench_gpu.json.
#
# The device call (the repository's working tree travels; .whl and .gpu_data are ignored
# through .git/info/exclude, so they are named in carry; together about 7 MiB):
#   carry:     [".whl", ".gpu_data"]
#   command:   bash tools/gpu_check.sh          ($OUT is set by the device tool)
#   timeout_s: 480                              (the script stops itself after 420 s)
# Made first, on the machine that calls the device, by `bash tools/gpu_check.sh --prepare`:
# .whl/ with the cp312 manylinux wheels of what the GPU image lacks (lmdb, plyvel, and protobuf
# >= 7.35.1 for the committed caffe_pb2.py), .gpu_data/ with the main job's MNIST LMDBs from
# ../shared (4,000 train and 1,000 test digits, 5 MiB), both added to .git/info/exclude.
#
# Environment: OUT (default ./gpu_out), PYTHON (default .venv/bin/python if present, else
# python3), GPU_CHECK_BUDGET (seconds for the whole run, default 420), GPU_CHECK_DRY=1 (act as
# if there were no GPU), GPU_CHECK_STEPS (default "env install nvrtc pytest lenet bench"),
# GPU_CHECK_WHEELS (default .whl), GPU_CHECK_NETS (default lenet,cifar10_quick,nin,
# bvlc_googlenet), GPU_CHECK_ITERS (bench iterations, default 20). Without a GPU every GPU step
# says why and skips, and the steps that can check their plumbing on the CPU do: the NVRTC
# compile, LeNet's CPU half and a 100-iteration CPU stand-in for the GPU run, bench_train's
# one-line refusal.
#
# The step functions run through `bash -c NAME` (export -f): not unreachable.
# shellcheck disable=SC2317
set -u
cd "$(dirname "$0")/.." || exit 2
REPO=$PWD

if [ "${1:-}" = --prepare ]; then
    set -e
    for path in /.whl/ /.gpu_data/; do
        grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
    done
    "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
        lmdb==3.0.0 plyvel==1.5.1 protobuf==7.36.2
    mkdir -p .gpu_data
    for db in mnist_train_lmdb mnist_test_lmdb; do
        [ -d ".gpu_data/$db" ] || cp -r "../shared/data/mnist_5k/$db" .gpu_data/
    done
    chmod -R u+w .gpu_data
    du -sh .whl .gpu_data
    exit 0
fi
OUT=${OUT:-$REPO/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/gpu_check.log
SUMMARY=$OUT/summary.txt
: >"$LOG"
: >"$SUMMARY"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
BUDGET=${GPU_CHECK_BUDGET:-420}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
STEPS=${GPU_CHECK_STEPS:-env install nvrtc pytest lenet bench}
NETS=${GPU_CHECK_NETS:-lenet,cifar10_quick,nin,bvlc_googlenet}
ITERS=${GPU_CHECK_ITERS:-20}
if [ -n "${PYTHON:-}" ]; then
    PY=$PYTHON
elif [ -x "$REPO/.venv/bin/python" ]; then
    PY=$REPO/.venv/bin/python
else
    PY=python3
fi
SITE=$WORK/site
mkdir -p "$SITE"
export PYTHONPATH="$SITE:$REPO:$WORK${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 GLOG_logtostderr=1
export REPO OUT WORK PY SITE NETS ITERS
FAILED=0

say() { printf '%s\n' "$*"; }

record() {  # record STEP STATUS DETAIL: one line of the summary
    printf '%-12s %-8s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"
}

want() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# run_step NAME CAP FUNCTION: FUNCTION (exported) under timeout, capped by the budget left.
run_step() {
    local name=$1 cap=$2 fn=$3 left limit t0 rc dt status
    left=$((DEADLINE - $(date +%s) - 10))
    limit=$((cap < left ? cap : left))
    if [ "$limit" -lt 5 ]; then
        record "$name" SKIP "no time left in the ${BUDGET}s budget"
        return 0
    fi
    say ""
    say "=== [$name] $(date -u +%H:%M:%S) limit ${limit}s"
    t0=$(date +%s)
    STEP_DEADLINE=$((t0 + limit)) timeout -k 10 "$limit" bash -c "$fn"
    rc=$?
    dt=$(($(date +%s) - t0))
    case $rc in
        0) status=OK ;;
        77) status=SKIP ;;
        124 | 137) status=TIMEOUT; FAILED=1 ;;
        *) status=FAIL; FAILED=1 ;;
    esac
    local note=""
    [ -s "$WORK/$name.note" ] && note=": $(head -c 600 "$WORK/$name.note" | tr '\n' ' ')"
    record "$name" "$status" "rc=$rc ${dt}s$note"
    return 0
}

# ---------------------------------------------------------------------------------------------
step_env() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi || true
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
    else
        echo "nvidia-smi: not on PATH"
    fi
    echo "python: $PY ($(command -v "$PY" || true))"
    "$PY" - <<'EOF'
import importlib.metadata as md
import platform
import sys
print("Python", sys.version.split()[0], platform.machine())
for dist in ("numpy", "cupy-cuda13x", "cupy-cuda12x", "cupy", "torch", "numba", "llvmlite",
             "protobuf", "lmdb", "plyvel", "h5py", "pillow", "threadpoolctl", "pytest",
             "pytest-timeout", "hypothesis", "mpi4py", "nvidia-cuda-nvrtc"):
    try:
        print(f"  {dist:18} {md.version(dist)}")
    except md.PackageNotFoundError:
        pass
try:
    import cupy
    rt = cupy.cuda.runtime
    print("CuPy", cupy.__version__, "CUDA runtime", rt.runtimeGetVersion(), end=" ")
    try:
        from cupy.cuda import nvrtc
        print("NVRTC", nvrtc.getVersion(), end=" ")
    except Exception as exc:  # noqa: BLE001
        print("NVRTC unavailable:", exc, end=" ")
    print("driver", rt.driverGetVersion(), "devices", rt.getDeviceCount())
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    print("device 0:", name, f"sm_{props['major']}{props['minor']}",
          props["totalGlobalMem"] // 2 ** 20, "MiB", props["multiProcessorCount"], "SMs")
except Exception as exc:  # noqa: BLE001
    print("CuPy/CUDA:", type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
try:
    import torch
    print("torch", torch.__version__, "CUDA", torch.version.cuda, "available",
          torch.cuda.is_available(), "cuDNN", torch.backends.cudnn.version())
except Exception as exc:  # noqa: BLE001
    print("torch:", type(exc).__name__, exc)
EOF
}

step_install() {
    # The unmet requirements of setup.cfg's install_requires (markers applied), and the wheel in
    # .whl/ that meets each; one line per requirement to the log.
    "$PY" - "$REPO/setup.cfg" "${GPU_CHECK_WHEELS:-$REPO/.whl}" "$WORK/install.note" \
        >"$WORK/wheels" <<'EOF' || return 1
import configparser
import importlib.metadata as md
import os
import re
import sys

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

cfg = configparser.ConfigParser()
cfg.read(sys.argv[1])
wheel_dir = sys.argv[2]
wheels = sorted(os.listdir(wheel_dir)) if os.path.isdir(wheel_dir) else []
norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()  # noqa: E731
missing_no_wheel = []
for line in cfg["options"]["install_requires"].strip().splitlines():
    req = Requirement(line.strip())
    if req.marker is not None and not req.marker.evaluate():
        print(f"  {req}: not needed here (marker)", file=sys.stderr)
        continue
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        have = None
    if have is not None and req.specifier.contains(Version(have), prereleases=True):
        print(f"  {req}: have {have}", file=sys.stderr)
        continue
    matches = [w for w in wheels if norm(w.split("-")[0]) == norm(req.name)
               and req.specifier.contains(Version(w.split("-")[1]), prereleases=True)]
    if matches:
        print(f"  {req}: have {have or 'none'}, installing {matches[-1]}", file=sys.stderr)
        print(os.path.join(wheel_dir, matches[-1]))
    else:
        print(f"  {req}: have {have or 'none'} and no wheel in .whl/", file=sys.stderr)
        missing_no_wheel.append(str(req))
if missing_no_wheel:
    print("unmet, no wheel carried: " + ", ".join(missing_no_wheel), file=sys.stderr)
    with open(sys.argv[3], "w") as note:
        note.write("unmet, no wheel carried: " + ", ".join(missing_no_wheel) + "; ")
EOF
    if [ -s "$WORK/wheels" ]; then
        mapfile -t wheels <"$WORK/wheels"
        PIP_ROOT_USER_ACTION=ignore "$PY" -m pip install -q --no-index --no-deps --no-compile \
            --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" || return 1
        printf 'installed %s; ' "$(basename -a "${wheels[@]}" | cut -d- -f1,2 | tr '\n' ' ')" \
            >>"$WORK/install.note"
        echo "installed into $SITE:" "$(find "$SITE" -mindepth 1 -maxdepth 1 -printf '%f ')"
    else
        echo "nothing to install"
    fi
    # The project runs from the checkout; its schema module is committed (generated by
    # tools/gen_proto.py, which needs grpcio-tools: not needed here).
    "$PY" - <<'EOF'
import caffe_engine
from caffe_engine.proto import caffe_pb2
import google.protobuf
import lmdb
print("caffe_engine", caffe_engine.__version__, "from", caffe_engine.__file__)
print("caffe_pb2 OK with protobuf", google.protobuf.__version__, "; lmdb", lmdb.version())
EOF
}

step_nvrtc() {
    "$PY" -c "
from caffe_engine.kernels.cuda.device import compile_check
for name, size in compile_check('sm_90'):
    print(f'  {name}.cu -> sm_90 cubin, {size} bytes')
" || echo "compile_check failed (above); the tests say why"
    "$PY" -m pytest -q -rfEs -p no:cacheprovider tests/kernels/test_cuda_compile.py \
        --junitxml="$OUT/pytest_nvrtc.xml"
    local rc=$?
    junit_counts "$OUT/pytest_nvrtc.xml" >"$WORK/nvrtc.note"
    return "$rc"
}

junit_counts() {  # junit_counts FILE -> "N tests, F failed, E errors, S skipped"
    "$PY" - "$1" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
except Exception as exc:  # noqa: BLE001
    print(f"no junit XML ({type(exc).__name__})")
    raise SystemExit
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print(f"{n['tests']} tests, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
EOF
}

step_pytest() {
    # A plugin keeping the GPU tests: marked gpu, using the gpu_mode fixture, or the cuda
    # kernel_set param (which carries the gpu mark too); past the step's deadline less 20 s it
    # skips the tests left, so that pytest still ends and writes its junit XML.
    cat >"$WORK/gpu_select.py" <<'EOF'
import os
import time

import pytest

DEADLINE = float(os.environ.get("GPU_CHECK_PYTEST_DEADLINE", "inf"))


def pytest_runtest_setup(item):
    if time.time() > DEADLINE:
        pytest.skip("gpu_check: the pytest step's time ran out before this test")


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        gpu = (item.get_closest_marker("gpu") is not None
               or "gpu_mode" in getattr(item, "fixturenames", ())
               or params.get("kernel_set") == "cuda")
        (keep if gpu else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
EOF
    local extra=()
    export GPU_CHECK_PYTEST_DEADLINE=$((STEP_DEADLINE - 20))
    "$PY" -c "import pytest_timeout" 2>/dev/null && extra+=(--timeout=60)
    # four workers on the one GPU where pytest-xdist is there (the image has it)
    [ -z "$GPU_REASON" ] && "$PY" -c "import xdist" 2>/dev/null && extra+=(-n 4)
    "$PY" -m pytest -q -rfE -p gpu_select -p no:cacheprovider --continue-on-collection-errors \
        --ignore=tests/parallel --junitxml="$OUT/pytest_gpu.xml" "${extra[@]}" tests
    local rc=$?
    junit_counts "$OUT/pytest_gpu.xml" | tee "$WORK/pytest.note"
    local late
    late=$(grep -o "time ran out before this test" "$OUT/pytest_gpu.xml" 2>/dev/null | wc -l)
    [ "${late:-0}" -gt 0 ] && echo "; $late tests not run: the step's time ran out" \
        | tee -a "$WORK/pytest.note" && rc=1
    if [ -n "$GPU_REASON" ] && [ "$rc" -eq 0 ]; then
        echo "(no GPU: $GPU_REASON)" >>"$WORK/pytest.note"
        return 77
    fi
    [ "$rc" -eq 5 ] && { echo "no GPU test collected" >>"$WORK/pytest.note"; return 77; }
    return "$rc"
}

# LeNet: a folder whose data/mnist holds the carried LMDBs, models/ the repository's.
lenet_folder() {  # $1: the step's note file, for the summary line
    local dir=$WORK/lenet
    mkdir -p "$dir/data/mnist" "$dir/data/lenet"
    ln -sfn "$REPO/models" "$dir/models"
    ln -sfn "$REPO/.gpu_data/mnist_train_lmdb" "$dir/data/mnist/mnist_train_lmdb"
    ln -sfn "$REPO/.gpu_data/mnist_test_lmdb" "$dir/data/mnist/mnist_test_lmdb"
    if [ ! -d "$REPO/.gpu_data/mnist_train_lmdb" ]; then
        echo ".gpu_data/mnist_train_lmdb is missing: run 'bash tools/gpu_check.sh --prepare'" \
            "first (it copies ../shared's MNIST LMDBs there; a device call carries .gpu_data)" \
            | tee "$WORK/$1.note" >&2
        return 1
    fi
    echo "$dir"
}

step_lenet_gpu() {
    local dir
    dir=$(lenet_folder lenet_gpu) || return 1
    cd "$dir" || return 1
    # models/lenet's solver, displaying every iteration (the curve to compare), no mid-run
    # snapshots.
    sed -e 's/^display: .*/display: 1/' -e 's/^snapshot: .*/snapshot: 0/' \
        models/lenet/lenet_solver.prototxt >solver_gpu.prototxt
    local flags=(--gpu 0)
    if [ -n "$GPU_REASON" ]; then
        # No GPU: check the plumbing with a short CPU stand-in (same log, same parsing).
        echo "no GPU ($GPU_REASON): 100-iteration CPU stand-in, not a GPU result" \
            | tee "$WORK/lenet_gpu.note"
        sed -i -e 's/^max_iter: .*/max_iter: 100/' -e 's/^test_interval: .*/test_interval: 100/' \
            solver_gpu.prototxt
        flags=()
    fi
    local t0 rc
    t0=$(date +%s)
    "$PY" -m caffe_engine train --solver solver_gpu.prototxt "${flags[@]}" >"$OUT/lenet_gpu.log" 2>&1
    rc=$?
    echo "caffe train exited $rc after $(($(date +%s) - t0)) s; last lines:"
    grep -v "Train net output\|, lr = " "$OUT/lenet_gpu.log" | tail -n 12
    [ "$rc" -eq 0 ] && [ -n "$GPU_REASON" ] && return 77
    return "$rc"
}

step_lenet_cpu() {
    local dir
    dir=$(lenet_folder lenet_cpu) || return 1
    cd "$dir" || return 1
    sed -e 's/^display: .*/display: 1/' -e 's/^snapshot: .*/snapshot: 0/' \
        -e 's/^max_iter: .*/max_iter: 100/' -e 's/^snapshot_prefix: .*/snapshot_prefix: "data\/lenet\/cpu"/' \
        models/lenet/lenet_solver.prototxt >solver_cpu.prototxt
    local t0 rc
    t0=$(date +%s)
    CAFFE_ENGINE_KERNELS=reference "$PY" -m caffe_engine train --solver solver_cpu.prototxt \
        >"$OUT/lenet_cpu.log" 2>&1
    rc=$?
    echo "caffe train (CPU, reference kernels) exited $rc after $(($(date +%s) - t0)) s"
    tail -n 3 "$OUT/lenet_cpu.log"
    return "$rc"
}

step_lenet_compare() {
    "$PY" - "$OUT/lenet_gpu.log" "$OUT/lenet_cpu.log" "${GPU_REASON:-}" \
        >"$OUT/lenet_compare.txt" 2>&1 <<'EOF'
import math
import re
import sys

NUM = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf))"
LOSS = re.compile(r"\] Iteration (\d+)(?: \([^)]*\))?, loss = " + NUM)
SPEED = re.compile(r"\] Iteration (\d+) \(([0-9.]+) iter/s")
ACC = re.compile(r"Test net output #\d+: accuracy = " + NUM)


def read(path):
    losses, accs, speeds = {}, [], []
    try:
        text = open(path, errors="replace").read()
    except OSError as exc:
        return None, [], []
    for m in LOSS.finditer(text):
        losses.setdefault(int(m.group(1)), float(m.group(2)))
    accs = [float(a) for a in ACC.findall(text)]
    speeds = [float(m.group(2)) for m in SPEED.finditer(text) if int(m.group(1)) > 10]
    return losses, accs, speeds


gpu_path, cpu_path, no_gpu = sys.argv[1], sys.argv[2], sys.argv[3]
gpu, gpu_acc, gpu_speed = read(gpu_path)
cpu, cpu_acc, _ = read(cpu_path)
label = "stand-in" if no_gpu else "GPU"
status = 0
if no_gpu:
    print(f"no GPU ({no_gpu}): the 'GPU' run is a 100-iteration CPU stand-in (checks the plumbing)")
if gpu is None:
    print(f"{label} run wrote no log ({gpu_path}): see its step in gpu_check.log")
    status = 1
elif not gpu:
    print(f"{label} log has no loss lines ({gpu_path})")
    status = 1
else:
    last = max(gpu)
    speed = sorted(gpu_speed)[len(gpu_speed) // 2] if gpu_speed else float("nan")
    print(f"{label}: {last} iterations, median {speed:.1f} iter/s (display lines after 10), "
          f"test accuracy {' -> '.join(f'{a:.4f}' for a in gpu_acc) or 'none'}")
    final = gpu_acc[-1] if gpu_acc else float("nan")
    ok = final >= 0.96
    print(f"final test accuracy {final:.4f} {'>=' if ok else '<'} 0.96"
          + ("" if not no_gpu else " (stand-in run: 100 iterations, not judged)"))
    if not ok and not no_gpu:
        status = 1
if gpu and cpu:
    common = sorted(set(gpu) & set(cpu) & set(range(101)))
    diffs = [(i, gpu[i], cpu[i], abs(gpu[i] - cpu[i])) for i in common]
    rel = [(d / max(abs(c), 1e-12)) for _, _, c, d in diffs]
    first = next((i for (i, _, _, _), r in zip(diffs, rel) if r > 1e-3), None)
    print(f"loss curves over iterations {common[0]}..{common[-1]} ({len(common)} points), "
          f"{label} vs CPU (reference kernels): max |diff| {max(d for *_, d in diffs):.3g}, "
          f"max relative {max(rel):.3g}, first relative diff > 1e-3 at "
          f"{'none' if first is None else first}")
    print(f"{'iter':>5} {label + ' loss':>14} {'CPU loss':>12} {'|diff|':>10}")
    for i, g, c, d in diffs:
        if i % 10 == 0 or i < 5:
            print(f"{i:>5} {g:>14.6f} {c:>12.6f} {d:>10.2e}")
    if cpu_acc and gpu_acc:
        print(f"test accuracy at iteration 0: {label} {gpu_acc[0]:.4f}, CPU {cpu_acc[0]:.4f}")
elif cpu is None:
    print(f"CPU run wrote no log ({cpu_path}): see its step in gpu_check.log")
    status = 1
elif not cpu:
    print(f"CPU log has no loss lines ({cpu_path})")
    status = 1
sys.exit(77 if status == 0 and no_gpu else status)
EOF
    local rc=$?
    cat "$OUT/lenet_compare.txt"
    grep -m1 "final test accuracy" "$OUT/lenet_compare.txt" >"$WORK/lenet_compare.note"
    grep -m1 "max |diff|" "$OUT/lenet_compare.txt" | sed 's/.*\(max |diff|\)/\1/' \
        >>"$WORK/lenet_compare.note"
    return "$rc"
}

step_bench() {
    if [ -n "$GPU_REASON" ]; then
        echo "no GPU ($GPU_REASON): bench_train --device gpu must refuse in one line:"
        "$PY" tools/bench_train.py --device gpu --nets lenet
        local rc=$?
        echo "(exit $rc); the CPU path, 2 iterations of LeNet, engine only:"
        "$PY" tools/bench_train.py --nets lenet --iters 2 --warmup 1 --no-torch
        echo "no GPU: $GPU_REASON" >"$WORK/bench.note"
        return 77
    fi
    "$PY" tools/bench_train.py --device gpu --nets "$NETS" --iters "$ITERS" --warmup 5 \
        --json "$OUT/bench_gpu.json" | tee "$WORK/bench.txt"
    local rc=${PIPESTATUS[0]}
    return "$rc"
}

export -f step_env step_install step_nvrtc step_pytest step_lenet_gpu step_lenet_cpu \
    step_lenet_compare step_bench junit_counts lenet_folder

# ---------------------------------------------------------------------------------------------
main() {
    say "gpu_check: $(date -u '+%Y-%m-%d %H:%M:%S') UTC on $(hostname), repo $REPO, out $OUT"
    say "steps: $STEPS; budget ${BUDGET}s; python $PY"
    want env && run_step env 45 step_env
    want install && run_step install 60 step_install

    GPU_REASON=""
    if [ "${GPU_CHECK_DRY:-0}" = 1 ]; then
        GPU_REASON="GPU_CHECK_DRY=1"
    else
        # One line "REASON:<why not>" from the probe; "REASON:" alone when a device is there.
        GPU_REASON=$(timeout 60 "$PY" - 2>>"$LOG" <<'EOF' | sed -n 's/^REASON://p' | tail -n 1
try:
    from caffe_engine.backend import gpu_missing
    print("REASON:" + (gpu_missing() or ""))
except Exception as exc:  # noqa: BLE001
    print(f"REASON:the engine does not import: {type(exc).__name__}: {exc}")
EOF
        )
        if [ -z "$GPU_REASON" ] && ! timeout 60 "$PY" -c "import cupy" 2>/dev/null; then
            GPU_REASON="CuPy does not import"
        fi
    fi
    export GPU_REASON
    if [ -n "$GPU_REASON" ]; then
        say "GPU: none ($GPU_REASON); GPU steps skip, their CPU plumbing runs"
        record gpu NONE "$GPU_REASON"
    else
        say "GPU: yes"
    fi

    want nvrtc && run_step nvrtc 60 step_nvrtc
    want pytest && run_step pytest 110 step_pytest
    if want lenet; then
        run_step lenet_gpu 150 step_lenet_gpu
        run_step lenet_cpu 90 step_lenet_cpu
        run_step lenet_compare 20 step_lenet_compare
    fi
    want bench && run_step bench 210 step_bench

    say ""
    say "=== summary ($(($(date +%s) - START)) s)"
    if [ -s "$WORK/bench.txt" ]; then
        grep -E "^(GPU float32|launch/it|net |---|[a-z0-9_]+ +[0-9]+ |[a-z0-9_]+ +engine run failed)" \
            "$WORK/bench.txt" | sed 's/^/bench  /' >>"$SUMMARY"
    fi
    [ -s "$OUT/lenet_compare.txt" ] && sed 's/^/lenet  /' "$OUT/lenet_compare.txt" \
        | head -n 4 >>"$SUMMARY"
    cat "$SUMMARY"
    local files
    files=$(find "$OUT" -type f | wc -l)
    say "files in $OUT: $files (at most 8 come back from the device)"
    find "$OUT" -mindepth 2 -type f | sed 's/^/  nested, will not come back: /'
    [ "$files" -le 8 ] || say "WARNING: more than 8 files in $OUT"
    [ "$FAILED" = 0 ]
}

main 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
rm -rf "$WORK"
exit "$rc"
