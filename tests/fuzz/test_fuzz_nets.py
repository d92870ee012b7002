"""The net fuzzer (tests/fuzz/fuzz_nets.py) in CI: a few hundred seeded mutants of real nets,
each refused in one line or built; none may raise anything else. The longer run (2,000 cases)
is marked slow; ``python tests/fuzz/fuzz_nets.py --cases N --seed S`` runs any size."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent / "fuzz_nets.py"


def run(cases, seed):
    done = subprocess.run([sys.executable, str(TOOL), "--cases", str(cases), "--seed", str(seed),
                           "--limit-gb", "6"], capture_output=True, text=True, timeout=1200)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    summary = json.loads(lines[0])
    return done.returncode, summary["outcomes"], "\n".join(lines[1:])


def test_three_hundred_mutants_are_refused_in_one_line_or_built():
    status, outcomes, bugs = run(300, seed=2026)
    assert status == 0 and outcomes.get("bug", 0) == 0, bugs
    assert sum(outcomes.values()) == 300
    assert outcomes.get("refused", 0) > 0 and outcomes.get("ok", 0) > 0


@pytest.mark.slow
def test_two_thousand_mutants():
    status, outcomes, bugs = run(2000, seed=1)
    assert status == 0 and outcomes.get("bug", 0) == 0, bugs
