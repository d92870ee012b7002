"""Where things are, for every test folder: the repository, its tests, and ../shared."""
from pathlib import Path

#: This folder (tests/).
TESTS = Path(__file__).resolve().parent
#: The repository root.
ROOT = TESTS.parent
#: The read-only reference data beside the repository.
SHARED = ROOT.parent / "shared"
