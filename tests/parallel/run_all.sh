#!/usr/bin/env bash
# Run tests/parallel without a launcher (includes the fault tests, which start their own
# mpiexec) and then under `mpiexec -n K` for K = 1..4. Exits non-zero if any run fails.
# Usage: bash tests/parallel/run_all.sh [max K, default 4] [extra pytest args...]
# Needs: pip install mpich mpi4py   (mpiexec comes with the mpich wheel)
set -u
cd "$(dirname "$0")/../.."
MAXK="${1:-4}"; shift || true
PYTEST=(python -m pytest -q -p no:cacheprovider tests/parallel "$@")
command -v mpiexec >/dev/null || { echo "run_all.sh: mpiexec not found (pip install mpich mpi4py)"; exit 2; }
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
status=0
start=$SECONDS
echo "== tests/parallel, no launcher"
"${PYTEST[@]}" || status=1
for K in $(seq 1 "$MAXK"); do
  t0=$SECONDS
  # Each rank writes its own log; rank 0's is shown, the others only on failure.
  timeout 600 mpiexec -n "$K" bash -c \
    'exec "$@" > "'"$LOGS"'/rank${PMI_RANK:-0}.log" 2>&1' _ "${PYTEST[@]}"
  rc=$?
  echo "== mpiexec -n $K: exit $rc, $((SECONDS - t0)) s"
  tail -n 3 "$LOGS/rank0.log"
  if [ $rc -ne 0 ]; then
    status=1
    for f in "$LOGS"/rank*.log; do echo "---- $f"; tail -n 40 "$f"; done
  fi
done
echo "== run_all.sh: $((SECONDS - start)) s in all, $([ $status -eq 0 ] && echo PASSED || echo FAILED)"
exit $status
