"""A seeded fuzzer of Caffe's binary files: byte mutations of real .caffemodel, .caffemodel.h5,
.solverstate, .solverstate.h5 and mean .binaryproto files, each read by the engine as a user's
command would.

Each case takes one file, flips, inserts, deletes or overwrites a few bytes or cuts it short,
writes it to a temporary folder and reads it: weights into the net they belong to
(``Net.copy_from``), the mean with ``read_blobproto``, solver states as a restore reads them. Outcomes as in fuzz_nets.py: ``ok``
(the damage hit nothing that mattered, e.g. a float's bits), ``refused`` (one-line CaffeError),
``bug`` (anything else).

    python tests/fuzz/fuzz_files.py --cases 1000 --seed 1
"""
import argparse
import collections
import json
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
REALWORLD = SHARED / "realworld"
TARGETS = {
    "caffemodel": (REALWORLD / "yuvval__nn_ex1/examples/cifar10/cifar10_full_iter_70000.caffemodel",
                   REALWORLD / "yuvval__nn_ex1/examples/cifar10/cifar10_full.prototxt"),
    "caffemodel.h5": (REALWORLD / "leetonfreestyle__DMSH/examples/cifar10/cifar10_quick_iter_5000.caffemodel.h5",
                      REALWORLD / "reference/substituted/leetonfreestyle__DMSH__examples__cifar10__"
                      "cifar10_quick_train_test.prototxt"),
    "binaryproto": (REALWORLD / "leetonfreestyle__DMSH/examples/cifar10/mean.binaryproto", None),
    "solverstate.h5": (REALWORLD / "leetonfreestyle__DMSH/examples/cifar10/"
                       "cifar10_quick_iter_5000.solverstate.h5", None),
    "solverstate": (REALWORLD / "yuvval__nn_ex1/examples/cifar10/cifar10_full_iter_70000.solverstate",
                    None),
}


def mutate(data, rng):
    """A few byte-level changes of ``data`` (bytes)."""
    data = bytearray(data)
    for _ in range(1 + rng.randrange(4)):
        kind = rng.randrange(5)
        i = rng.randrange(len(data)) if data else 0
        if kind == 0 and data:                                      # flip a bit
            data[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and data:                                    # overwrite a run
            n = rng.randrange(1, 16)
            data[i:i + n] = bytes(rng.randrange(256) for _ in range(n))
        elif kind == 2:                                             # insert bytes
            data[i:i] = bytes(rng.choice([0, 0xff, 0x08, 0x0a, 0x12]) for _ in range(rng.randrange(1, 9)))
        elif kind == 3 and data:                                    # delete a run
            del data[i:i + rng.randrange(1, 64)]
        else:                                                       # cut short
            del data[rng.randrange(len(data) + 1):]
    return bytes(data)


class Readers:
    """The nets the weights go into, built once; ``read(kind, path)`` does one case."""

    def __init__(self):
        from caffe_engine.net import TEST, Net
        self.nets = {kind: Net(str(net), TEST) for kind, (_, net) in TARGETS.items() if net}

    def read(self, kind, path):
        if kind == "binaryproto":
            from caffe_engine.io.blobproto import read_blobproto
            read_blobproto(path)
        elif kind == "solverstate.h5":
            from caffe_engine.io.hdf5_snapshot import load_solver_state_hdf5
            load_solver_state_hdf5(str(path))
        elif kind == "solverstate":
            from caffe_engine.io import prototxt as pio
            from caffe_engine.io.blobproto import proto_to_array
            from caffe_engine.proto import caffe_pb2
            state = pio.read_binary(str(path), caffe_pb2.SolverState(), "solverstate")
            for blob in state.history:
                proto_to_array(blob, what=str(path))
        else:
            self.nets[kind].copy_from(str(path))


def fuzz(cases, seed):
    """``cases`` mutants from ``seed``: (Counter of (kind, outcome), list of bugs)."""
    import logging
    from caffe_engine.errors import CaffeError
    logging.getLogger("caffe_engine").setLevel(logging.CRITICAL)
    rng = random.Random(seed)
    readers = Readers()
    originals = {kind: file.read_bytes() for kind, (file, _) in TARGETS.items()}
    counts, bugs = collections.Counter(), []
    with tempfile.TemporaryDirectory() as folder:
        for case in range(cases):
            kind = rng.choice(sorted(TARGETS))
            path = Path(folder) / f"case.{kind}"
            path.write_bytes(mutate(originals[kind], rng))
            try:
                readers.read(kind, path)
                outcome, detail = "ok", ""
            except CaffeError as exc:
                one = str(exc) and "\n" not in str(exc)
                outcome, detail = ("refused", "") if one else ("bug", f"not one line: {exc!r}")
            except Exception as exc:  # noqa: BLE001 - what the fuzzer is for
                outcome, detail = "bug", f"{type(exc).__name__}: {str(exc)[:300]}"
            counts[f"{kind}:{outcome}"] += 1
            if outcome == "bug":
                bugs.append({"case": case, "kind": kind, "detail": detail})
    return counts, bugs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--limit-gb", type=float, default=6.0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import resource
    limit = int(args.limit_gb * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    counts, bugs = fuzz(args.cases, args.seed)
    print(json.dumps({"cases": args.cases, "seed": args.seed, "outcomes": dict(sorted(counts.items()))}))
    for bug in bugs[:20]:
        print(f"bug in case {bug['case']} ({bug['kind']}): {bug['detail']}")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
