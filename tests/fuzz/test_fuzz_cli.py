"""The command fuzzer (tests/fuzz/fuzz_cli.py) in CI: mutated solvers, damaged LMDB records and
Hypothesis-drawn command lines, each run through ``caffe``'s entry point in a forked child and
judged by how it ended: each family has cases refused in one line and cases that ran (or ran
long and stopped on SIGINT), and none may end in a traceback, a signal, a hang, a last line other
than one ``caffe: ...`` line, or exit 0 on input known invalid. It found a huge ``iter_size``
ignoring SIGINT, learning rates and Adam's correction raising where C's math gives NaN or inf,
error lines cut at a newline in a path or record key, and int32 flags taking what gflags
refuses. The longer run (2,100 cases) is marked slow;
``python tests/fuzz/fuzz_cli.py --cases N --seed S`` runs any size."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent / "fuzz_cli.py"
KINDS = ("solver", "lmdb", "flags")


def run(cases, seed, timeout):
    """The tool's (status, outcomes, bug lines) for ``cases`` cases from ``seed``."""
    done = subprocess.run([sys.executable, str(TOOL), "--cases", str(cases), "--seed", str(seed)],
                          capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    summary = json.loads(lines[0])
    return done.returncode, summary["outcomes"], "\n".join(lines[1:])


def count(outcomes, kind, *ends):
    """How many cases of ``kind`` ended in one of ``ends``."""
    return sum(n for key, n in outcomes.items()
               if key.partition(":")[0] == kind and key.partition(":")[2] in ends)


def test_six_hundred_commands_end_as_the_contract_says():
    status, outcomes, bugs = run(600, seed=2026, timeout=600)
    assert status == 0 and not any(key.endswith(":bug") for key in outcomes), bugs
    assert sum(outcomes.values()) == 600
    for kind in KINDS:
        assert count(outcomes, kind, "ok", "refused", "long") == 200, outcomes
        assert count(outcomes, kind, "refused") > 0 and count(outcomes, kind, "ok", "long") > 0, \
            outcomes


@pytest.mark.slow
def test_two_thousand_one_hundred_commands():
    status, outcomes, bugs = run(2100, seed=1, timeout=1800)
    assert status == 0 and not any(key.endswith(":bug") for key in outcomes), bugs
    assert sum(outcomes.values()) == 2100
    for kind in KINDS:
        assert count(outcomes, kind, "refused") > 0 and count(outcomes, kind, "ok") > 0, outcomes
