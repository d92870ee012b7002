#!/usr/bin/env bash
# The test command: the whole single-process suite, then tests/parallel under mpiexec -n 1..4.
# Slow cases (@pytest.mark.slow) are left out unless RUN_SLOW=1.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${RUN_SLOW:-0}" = 1 ]; then marks=(); else marks=(-m "not slow"); fi
python -m pytest -q "${marks[@]}"
bash tests/parallel/run_all.sh 4 "${marks[@]}"
