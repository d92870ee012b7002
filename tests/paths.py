"""Where things are, for every test folder: the repository, its tests, and ../shared."""
from pathlib import Path

#: This folder (tests/).
TESTS = Path(__file__).resolve().parent
#: The repository root.
ROOT = TESTS.parent
#: The read-only reference data beside the repository.
SHARED = ROOT.parent / "shared"
#: BVLC Caffe's whole training runs.
TRAINING = SHARED / "caffe_reference" / "training"


def copy_training_case(case, tmp_path):
    """Copy the training fixture ``case`` to ``tmp_path/x/y/<case>`` without Caffe's snapshots,
    with ``tmp_path/data`` linking to ``shared/data``, as ``shared/caffe_reference/training/
    README.md`` prescribes; returns the copy's folder."""
    import shutil
    dest = tmp_path / "x" / "y" / case
    shutil.copytree(TRAINING / case, dest)
    for f in list(dest.glob("*.caffemodel")) + list(dest.glob("*.solverstate")):
        f.unlink()
    for f in dest.rglob("*"):
        f.chmod(0o644)
    (tmp_path / "data").symlink_to(SHARED / "data")
    return dest
