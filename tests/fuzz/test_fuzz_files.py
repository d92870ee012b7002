"""The binary-file fuzzer (tests/fuzz/fuzz_files.py) in CI: damaged caffemodels (binary and
HDF5), solver states (binary and HDF5) and mean binaryprotos are read or refused in one line;
nothing else may come out (it found h5py's RuntimeError on a damaged symbol table)."""
import json
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent / "fuzz_files.py"


def test_five_hundred_damaged_files_are_read_or_refused_in_one_line():
    done = subprocess.run([sys.executable, str(TOOL), "--cases", "500", "--seed", "2026"],
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    outcomes = json.loads(lines[0])["outcomes"]
    assert done.returncode == 0 and not any(k.endswith(":bug") for k in outcomes), lines[1:]
    assert sum(outcomes.values()) == 500
    kinds = {k.split(":")[0] for k in outcomes}
    assert kinds == {"caffemodel", "caffemodel.h5", "solverstate", "solverstate.h5", "binaryproto"}
    assert any(k.endswith(":refused") for k in outcomes)
