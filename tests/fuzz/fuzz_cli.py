"""A seeded fuzzer of the ``caffe`` command itself: malformed solvers, LMDB records and command
lines, each run through the command's entry point and judged by how the process ended.

Families (``--kinds``; the cases take them in turn), each a ``kind`` in the counts:

- ``solver``: the solver prototxts of ``models/`` and ``shared/caffe_reference/training``, cut
  to a few iterations of tests/tiny_train.py's MNIST net, then mutated 1-3 times with
  fuzz_nets.py's operators (an edge number, a line deleted, duplicated or swapped, a string
  renamed, a byte inserted, the text cut short) or solver ones (an enum value renamed, a field
  set to an edge number); run as ``train --solver S`` in the case's folder (snapshots land
  there). One case in four then gets a line BVLC Caffe refuses when it reads or builds the
  solver (an unknown field, solver type, solver_mode or snapshot_format, ``average_loss: 0``,
  a missing net): exit 0 on those is a bug.
- ``lmdb``: a new LMDB of 64 MNIST records (``shared/data/mnist_5k/mnist_test_lmdb``) with
  damaged values: the serialized bytes (fuzz_files.py's operators), garbage, nothing, or a
  Datum field at an edge (channels/height/width 0, negative, huge; ``data`` shorter or longer
  than C x H x W; ``float_data`` instead of ``data``; ``encoded`` with garbage or a real PNG;
  labels 10, -1, 2**31-1; another shape), in the first record, all (alike or not), the whole
  second batch or a few, sometimes under odd keys (a newline, an escape, invalid UTF-8, 500
  bytes); or a whole-database case (no records, keys without values, no data.mdb, an empty
  folder, a garbage data.mdb, a file instead of a folder). Never LMDB's pages: liblmdb trusts
  them, and a damaged one is a crash in C. A LeNet-like net reads it in ``train`` (2 iterations
  and a test), ``test --iterations 2`` or ``time --iterations 1``. A first record (in key
  order) that Caffe's contract refuses makes exit 0 a bug.
- ``flags``: command lines drawn by Hypothesis strategies (seeded, no example database, no
  shrinking): half a command over a valid base line (train's solver, with a snapshot or weights;
  test's and time's model, with 1 to 2**31-1 iterations) plus known flags, half anything
  (unknown commands and flags, words in any order); flags as ``--f=v``, ``-f v`` or a bare
  ``--f`` / ``--nof``, values from edge numbers, gflags' number forms, text, words and paths (a
  valid solver, model, weights or solver state; a missing file, a folder, an empty or garbage
  file, ``/dev/null``, a very long path, names with a newline or an escape). Exit 0 is a bug
  where gflags or tools/caffe.cpp refuses the line whatever the files hold (an unknown flag, a
  flag without its value, an int32 gflags does not take, not exactly one known command).

How a case runs: the parent imports the engine once and warms it up (a training run, a test
and a time of the nets the cases use, in this process, so Numba's kernels are compiled), then
forks one child per case, ``--jobs`` at a time. The child enters the case's folder, sends its
stdout and stderr to a file, runs ``caffe_engine.cli.main(argv)`` and leaves with its status
(``os._exit``); the parent waits with a deadline. The outcome of a case:

- ``ok``: exit 0 and no traceback: a valid mutant did its job;
- ``refused``: a non-zero exit whose last stderr line is one printable ``caffe: ...`` line of at
  most ``one_line``'s 300 characters, and no traceback;
- ``long``: still running at the deadline (``--deadline``; e.g. ``max_iter: 2147483647``, a
  valid long run), stopped as Caffe stops it: SIGINT (``--sigint_effect`` stop: ``train``
  snapshots and exits 0; ``test`` and ``time`` print ``caffe: interrupted`` and exit 130), or for
  a ``train`` whose flags make SIGINT not stop it, SIGHUP when ``--sighup_effect`` is stop, else
  SIGTERM (and death by it); it ends so within the grace time;
- ``bug``: anything else: a traceback, death by a signal, exit 0 on input known invalid, a last
  line that is not one printable ``caffe:`` line, a ``.tmp-`` file left half-written, or no end
  within the grace time after the stop signal (a hang).

The parent caps the address space (``--limit-gb``, inherited by every child), so a too large
allocation is a MemoryError the engine must turn into one line, not a machine out of memory.

    python tests/fuzz/fuzz_cli.py --cases 2100 --seed 1 [--kinds solver,lmdb,flags] [--jobs 2]

prints ``{"outcomes": {"solver:ok": n, ...}, ...}``, then one JSON line per bug (kind, case,
what was wrong, what was done to the input, a command that reproduces it in the case's kept
folder, the last lines of stderr); the status is 1 when there is a bug.
"""
import argparse
import collections
import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parents[1]
TESTS = ROOT / "tests"
SHARED = ROOT.parent / "shared"
MNIST_TEST = SHARED / "data/mnist_5k/mnist_test_lmdb"
KINDS = ("solver", "lmdb", "flags")
COMMANDS = ("train", "test", "time", "device_query")
#: Seconds a case may run before it gets its stop signal, and may then take to end.
DEADLINE_S, GRACE_S = 4.0, 15.0
#: The status a child leaves with when the command raised past ``main`` (a traceback).
UNCAUGHT = 70
#: Records copied into every fuzzed LMDB.
RECORDS = 64

if str(FUZZ) not in sys.path:
    sys.path.insert(0, str(FUZZ))
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


@dataclasses.dataclass
class Case:
    """One command to run: ``argv`` in ``folder``; ``invalid`` names why exit 0 would be a bug
    (empty when the case may be valid); ``note`` says what was done to the input; ``stop`` is
    the signal that ends it cleanly when it runs past the deadline."""

    kind: str
    index: int
    argv: list
    folder: Path
    invalid: str = ""
    note: str = ""
    stop: int = signal.SIGINT


# -- fixtures: the nets, solvers and files the cases start from ---------------------------------
LENET_LIKE = """name: "fuzz_lenet"
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: 8 backend: LMDB }} }}
layer {{ name: "mnist" type: "Data" top: "data" top: "label" include {{ phase: TEST }}
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: 8 backend: LMDB }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param {{ num_output: 4 kernel_size: 5 stride: 2
                      weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param {{ pool: MAX kernel_size: 2 stride: 2 }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy"
  include {{ phase: TEST }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }}
"""

LENET_SOLVER = """net: "{net}"
test_iter: 2
test_interval: 2
base_lr: 0.01
momentum: 0.9
lr_policy: "fixed"
display: 1
max_iter: {max_iter}
snapshot_prefix: "{prefix}"
random_seed: 5
solver_mode: CPU
"""


class Fixtures:
    """The files every case may use, written into ``folder``: the tiny net (``tiny_net``) and
    its solver, the 64 MNIST records (``records``) in a good LMDB, the LeNet-like net over it
    with its solver, weights and solver state from a warm-up run, and bad paths."""

    def __init__(self, folder):
        from tiny_train import tiny_net
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.tiny_net = self.folder / "tiny_net.prototxt"
        self.tiny_net.write_text(tiny_net())
        self.records = read_records(MNIST_TEST, RECORDS)
        self.lmdb = self.folder / "good_lmdb"
        write_lmdb(self.lmdb, self.records)
        self.model = self.folder / "lenet.prototxt"
        self.model.write_text(LENET_LIKE.format(source=self.lmdb))
        self.warm_solver = self.folder / "warm_solver.prototxt"
        self.warm_solver.write_text(LENET_SOLVER.format(net=self.model, max_iter=2,
                                                        prefix=self.folder / "warm"))
        self.solver = self.folder / "lenet_solver.prototxt"
        self.solver.write_text(LENET_SOLVER.format(net=self.model, max_iter=3, prefix="fz"))
        self.weights = self.folder / "warm_iter_2.caffemodel"
        self.state = self.folder / "warm_iter_2.solverstate"
        self.missing = self.folder / "missing" / "nothing.prototxt"
        self.empty = self.folder / "empty.prototxt"
        self.empty.write_bytes(b"")
        self.garbage = self.folder / "garbage.bin"
        self.garbage.write_bytes(bytes(random.Random(0).randrange(256) for _ in range(4096)))
        self.directory = self.folder / "a_folder"
        self.directory.mkdir()
        self.long_path = self.folder / ("d" * 200) / ("e" * 200) / "solver.prototxt"
        self.odd_paths = [self.folder / "new\nline.prototxt", self.folder / "\x1b[31mred"]

    def paths(self):
        """Path values for flags: valid ones and bad ones, as strings."""
        return [str(p) for p in (self.solver, self.model, self.weights, self.state, self.missing,
                                 self.empty, self.garbage, self.directory, self.long_path,
                                 self.lmdb, self.tiny_net, *self.odd_paths)] + [
            "/dev/null", "", "."]


def read_records(path, count):
    """The first ``count`` (key, value) records of the LMDB at ``path`` (read-only, no lock)."""
    import lmdb
    env = lmdb.open(str(path), readonly=True, lock=False, readahead=False)
    try:
        with env.begin(buffers=False) as txn:
            cursor = txn.cursor()
            return [item for item, _ in zip(cursor, range(count))]
    finally:
        env.close()


def write_lmdb(path, records):
    """A new LMDB folder ``path`` holding ``records`` ((key, value) bytes pairs)."""
    import lmdb
    env = lmdb.open(str(path), map_size=64 * 2 ** 20, subdir=True, lock=False, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            for key, value in records:
                txn.put(key, value)
    finally:
        env.close()


# -- family 1: solver prototxts -----------------------------------------------------------------
#: What makes a corpus solver quick: a few iterations and test batches (mutations may undo it).
QUICK = {"max_iter": "3", "test_iter": "1", "test_interval": "2", "display": "1",
         "snapshot": "0", "average_loss": "2", "stepsize": "2", "stepvalue": "2"}
ENUM_VALUES = {
    "type": ['"SGD"', '"Nesterov"', '"AdaGrad"', '"RMSProp"', '"AdaDelta"', '"Adam"', '"sgd"',
             '""', '"Bogus"'],
    "lr_policy": ['"fixed"', '"step"', '"exp"', '"inv"', '"multistep"', '"poly"', '"sigmoid"',
                  '"Fixed"', '""', '"bogus"'],
    "solver_mode": ["CPU", "GPU", "cpu", "2", "BOGUS"],
    "regularization_type": ['"L1"', '"L2"', '"L3"', '""'],
    "snapshot_format": ["HDF5", "BINARYPROTO", "2", "-1"],
    "solver_type": ["SGD", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM", "7"],
}
EXTRA_FIELDS = ["iter_size", "average_loss", "clip_gradients", "momentum", "momentum2", "delta",
                "rms_decay", "weight_decay", "power", "gamma", "stepsize", "stepvalue",
                "test_iter", "test_interval", "snapshot", "display", "max_iter", "base_lr",
                "device_id", "random_seed"]
#: Lines a mutation may add ({weights}, {garbage}, {net}: the fixtures' files).
EXTRA_LINES = ['weights: "{weights}"', 'weights: "{garbage}"', 'weights: "{weights},{weights}"',
               'weights: ""', 'train_state {{ stage: "x" level: 3 }}', 'test_state {{ level: 2 }}',
               'test_state {{ stage: "a" }} test_state {{ stage: "b" }}', 'test_net: "{net}"',
               'train_net: "{net}"', 'net_param {{ name: "inline" }}', "snapshot_diff: true",
               "snapshot_format: HDF5", "test_compute_loss: true", "test_initialization: false",
               "snapshot_after_train: false", "debug_info: true", "layer_wise_reduce: false",
               'snapshot_prefix: "no_such_folder/fz"', "test_iter: 1"]
#: SolverParameter's repeated fields among them: added, as the blocks; the others are set.
REPEATED_FIELDS = {"weights", "test_iter", "test_net"}
#: Changes BVLC Caffe refuses when it reads the solver or builds it (solver.cpp, solver_factory.hpp,
#: upgrade_proto.cpp): (line added last, why). Exit 0 after one of them is a bug.
INVALID_ENDINGS = [
    ("bogus_field: 1", "an unknown field"),
    ('type: "Bogus"', "an unknown solver type"),
    ("solver_mode: BOGUS", "an unknown solver_mode"),
    ("average_loss: 0", "average_loss below 1"),
    ('net: "no_such_net.prototxt"', "a missing net file"),
    ("snapshot_format: 7", "an unknown snapshot_format"),
]


def solver_corpus():
    """(name, text) of the solver prototxts of models/ and shared/caffe_reference/training."""
    files = sorted(ROOT.glob("models/*/*solver*.prototxt"))
    files += sorted((SHARED / "caffe_reference/training").glob("*/solver*.prototxt"))
    return [(f"{p.parent.name}/{p.name}", p.read_text()) for p in files]


def quick_solver(text, net):
    """``text`` with its net replaced by ``net`` and its counts cut to :data:`QUICK`'s, its
    snapshot prefix a bare name (snapshots land in the case's folder)."""
    lines = []
    for line in text.splitlines():
        field = line.split(":", 1)[0].strip()
        if field in ("net", "train_net", "test_net", "snapshot_prefix") or field in QUICK:
            continue
        lines.append(line)
    counts = [f"{field}: {value}" for field, value in QUICK.items()
              if re.search(rf"^\s*{field}\s*:", text, re.M) or field in ("max_iter", "snapshot")]
    return "\n".join([f'net: "{net}"', 'snapshot_prefix: "fz"'] + lines + counts) + "\n"


def mutate_solver(text, rng, fx):
    """One mutation of solver ``text``: fuzz_nets.py's (see there) or a solver one (an enum
    value renamed, a field set to an edge number, one of :data:`EXTRA_LINES` added)."""
    import fuzz_nets
    choice = rng.randrange(11)
    if choice < 6:
        return fuzz_nets.mutate(text, rng)
    if choice < 8:
        field = rng.choice(sorted(ENUM_VALUES))
        return set_field(text, field, rng.choice(ENUM_VALUES[field]))
    if choice < 10:
        return set_field(text, rng.choice(EXTRA_FIELDS), rng.choice(fuzz_nets.EDGE_NUMBERS))
    line = rng.choice(EXTRA_LINES).format(weights=fx.weights, garbage=fx.garbage,
                                          net=fx.tiny_net)
    field, colon, value = line.partition(": ")
    if colon and "{" not in line and field not in REPEATED_FIELDS:
        return set_field(text, field, value)
    return text + ("" if text.endswith("\n") else "\n") + line + "\n"


def set_field(text, field, value):
    """``text`` with top-level ``field``'s first line set to ``value`` (added when missing)."""
    pattern = re.compile(rf"^(\s*{field}\s*:).*$", re.M)
    if pattern.search(text):
        return pattern.sub(lambda m: m.group(1) + " " + value, text, count=1)
    return text + ("" if text.endswith("\n") else "\n") + f"{field}: {value}\n"


def solver_case(index, rng, fx, folder):
    """A ``train --solver`` case: a corpus solver made quick, mutated 1-3 times, and one case in
    four ending with one of :data:`INVALID_ENDINGS`."""
    name, text = rng.choice(solver_corpus_cached())
    text = quick_solver(text, fx.tiny_net)
    for _ in range(1 + rng.randrange(3)):
        text = mutate_solver(text, rng, fx)
    invalid = ""
    if rng.random() < 0.25:
        line, invalid = rng.choice(INVALID_ENDINGS)
        text = text + ("" if text.endswith("\n") else "\n") + line + "\n"
    (folder / "solver.prototxt").write_text(text, errors="surrogateescape")
    return Case("solver", index, ["train", "--solver", "solver.prototxt"], folder, invalid,
                f"mutant of {name}")


_SOLVERS = []


def solver_corpus_cached():
    """:func:`solver_corpus`, read once."""
    if not _SOLVERS:
        _SOLVERS.extend(solver_corpus())
    return _SOLVERS


# -- family 2: LMDB records ---------------------------------------------------------------------
EDGE_DIMS = [0, -1, 1, 2, 27, 29, 56, 65536, 2 ** 31 - 1, -2 ** 31]
EDGE_LABELS = [10, 11, -1, 2 ** 31 - 1, -2 ** 31, 9, 0]


def _png(width, height, mode):
    """A real PNG image's bytes (an ``encoded`` Datum's payload)."""
    import io

    from PIL import Image
    out = io.BytesIO()
    Image.new(mode, (width, height), 128).save(out, format="PNG")
    return out.getvalue()


def damage_datum(raw, rng):
    """``raw`` (a serialized Datum) with one field set to an edge value; returns (bytes, what,
    invalid) where ``invalid`` is true when Caffe's contract refuses the record."""
    import fuzz_files
    from caffe_engine.proto import caffe_pb2
    datum = caffe_pb2.Datum()
    datum.ParseFromString(raw)
    choice = rng.randrange(9)
    if choice == 0:
        field = rng.choice(["channels", "height", "width"])
        value = rng.choice(EDGE_DIMS)
        setattr(datum, field, value)
        what = f"{field}={value}"
        invalid = value != getattr(caffe_pb2.Datum.FromString(raw), field)
    elif choice == 1:
        cut = rng.choice([0, 1, 783, 785, 1568, 4096])
        datum.data = (datum.data * 6)[:cut]
        what, invalid = f"data of {cut} bytes", cut != 784
    elif choice == 2:
        count = rng.choice([784, 783, 785, 0])
        values = list(datum.data)[:count] + [0.5] * max(0, count - len(datum.data))
        datum.ClearField("data")
        datum.float_data.extend(float(v) for v in values)
        what, invalid = f"float_data of {count} values", count != 784
    elif choice == 3:
        datum.encoded = True
        payload = rng.choice(["nothing", "a PNG header", "garbage", "a PNG", "an RGB PNG"])
        datum.data = {"nothing": b"", "a PNG header": b"\x89PNG\r\n\x1a\n" + bytes(40),
                      "garbage": bytes(rng.randrange(256) for _ in range(64)),
                      "a PNG": _png(28, 28, "L"), "an RGB PNG": _png(20, 20, "RGB")}[payload]
        what, invalid = f"encoded, {payload}", "PNG" not in payload or "header" in payload
    elif choice == 4:
        value = rng.choice(EDGE_LABELS)
        datum.label = value
        what, invalid = f"label={value}", not 0 <= value < 10
    elif choice == 5:
        shape = rng.choice([(1, 14, 14), (3, 28, 28), (1, 28, 14), (1, 32, 32)])
        datum.channels, datum.height, datum.width = shape
        datum.data = bytes(shape[0] * shape[1] * shape[2])
        what, invalid = "shape {}x{}x{}".format(*shape), False
    elif choice == 6:
        return fuzz_files.mutate(raw, rng), "bytes mutated", False
    elif choice == 7:
        return b"", "empty value", True
    else:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 900))), "garbage", False
    return datum.SerializeToString(), what, invalid


#: Which records are damaged: the first, all alike, all each its own way, the whole second
#: batch alike (a batch of another shape), or a few.
WHERE = ("first", "all", "all-mixed", "second batch", "few", "few")
ODD_KEYS = [b"bad\nkey", b"\xff\xfe\x00", b"k" * 500, b" ", b"\x1b[31m"]


def damage_records(records, rng):
    """``records`` with damaged values (see :data:`WHERE`), and in one case of four odd keys
    (a newline, non-UTF-8 bytes, 500 bytes); returns (records, note, invalid): ``invalid`` when
    the record read first (in key order) is damaged in a way Caffe refuses."""
    records = list(records)
    where = rng.choice(WHERE)
    picks = {"first": [0], "all": range(len(records)), "all-mixed": range(len(records)),
             "second batch": range(8, 16),
             "few": sorted(rng.sample(range(len(records)), rng.randrange(1, 4)))}[where]
    alike = rng.random() if where in ("all", "second batch") else None
    odd_key = rng.choice(ODD_KEYS) if rng.random() < 0.25 else None
    whats, bad = [], set()
    for i in picks:
        value, what, invalid = damage_datum(records[i][1],
                                            rng if alike is None else random.Random(alike))
        key = records[i][0] if odd_key is None else odd_key + b"%05d" % i
        records[i] = (key, value)
        whats.append(f"#{i} {what}")
        if invalid:
            bad.add(key)
    note = f"{where}: {', '.join(whats[:4])}" + (f", keys {odd_key[:8]!r}..." if odd_key else "")
    return records, note, min(records)[0] in bad


def write_damaged_database(path, records, rng):
    """Write the case's database at ``path``: damaged records (most cases) or a whole-database
    case; returns (note, invalid)."""
    choice = rng.randrange(18)
    if choice == 0:
        write_lmdb(path, [])
        return "an LMDB without records", "an empty database"
    if choice == 1:
        write_lmdb(path, [(key, b"") for key, _ in records])
        return "keys without values", "records with no Datum"
    if choice == 2:
        path.mkdir()
        return "an empty folder", "no data.mdb"
    if choice == 3:
        write_lmdb(path, records)
        (path / "data.mdb").unlink()
        return "data.mdb deleted", "no data.mdb"
    if choice == 4:
        path.mkdir()
        (path / "data.mdb").write_bytes(bytes(rng.randrange(256) for _ in range(8192)))
        return "a garbage data.mdb", "not an LMDB"
    if choice == 5:
        path.write_bytes(rng.choice([b"", bytes(rng.randrange(256) for _ in range(4096))]))
        return "a file instead of a folder", "not an LMDB"
    records, note, bad = damage_records(records, rng)
    write_lmdb(path, records)
    return note, ("a damaged first record" if bad else "")


def lmdb_case(index, rng, fx, folder):
    """``train`` (2 iterations and a test), ``test --iterations 2`` or ``time --iterations 1``
    of the LeNet-like net over a damaged copy of the 64 records."""
    database = folder / "db"
    note, invalid = write_damaged_database(database, fx.records, rng)
    (folder / "net.prototxt").write_text(LENET_LIKE.format(source=database))
    command = rng.choice(["train", "train", "test", "time"])
    if command == "train":
        (folder / "solver.prototxt").write_text(
            LENET_SOLVER.format(net="net.prototxt", max_iter=2, prefix="fz"))
        argv = ["train", "--solver", "solver.prototxt"]
    elif command == "test":
        argv = ["test", "--model", "net.prototxt", "--weights", str(fx.weights),
                "--iterations", "2"]
    else:
        argv = ["time", "--model", "net.prototxt", "--iterations", "1"]
    return Case("lmdb", index, argv, folder, invalid, note)


# -- family 3: command lines (Hypothesis) -------------------------------------------------------
#: tools/caffe.cpp's flags and glog's, written out here (not read from the engine under test).
PATH_FLAGS = ["solver", "model", "weights", "snapshot"]
WORD_FLAGS = {"phase": ["TRAIN", "TEST", "", "train", "VAL"],
              "stage": ["", "deploy", "a,b", ",", "a,,b"],
              "gpu": ["", "0", "all", "0,1", "-1", "1", "x", "0,", "2147483648"],
              "sigint_effect": ["stop", "snapshot", "none", "", "Stop", "kill"],
              "sighup_effect": ["stop", "snapshot", "none", "", "exit"],
              "comm": ["tree", "ring", "ps", "mpi", "nccl", "", "star"]}
NUMBER_FLAGS = ["iterations", "level", "bucket_mb", "stderrthreshold", "minloglevel", "v"]
BOOL_FLAGS = ["exact_resume", "debug_sync", "logtostderr", "alsologtostderr"]
VALUED_FLAGS = set(PATH_FLAGS) | set(WORD_FLAGS) | set(NUMBER_FLAGS) | {"log_dir"}
KNOWN_FLAGS = VALUED_FLAGS | set(BOOL_FLAGS) | {f"no{b}" for b in BOOL_FLAGS}
UNKNOWN_FLAGS = ["bogus", "help", "solvers", "Solver", "iteration", "noiterations", "no",
                 "weights_", "gpus", "", "-"]
BOOL_VALUES = ["true", "false", "1", "0", "yes", "no", "T", "maybe", "", "2"]
SMALL_NUMBERS = ["1", "2", "3", "0", "-1", "0.5", "1e-3", "25", "+2", "0x10", " 2", "2 ", "1_0",
                 "\u0662", "0x", "-0x2", "1e3", "0X1f"]
#: gflags' int32 grammar (gflags.cc FlagValue::ParseFrom: strtoll, base 16 after a leading
#: 0x, the whole value consumed, in range), written out here rather than read from the engine.
GFLAGS_INT32 = re.compile(r"0[xX][0-9a-fA-F]+|[ \t\n\v\f\r]*[+-]?[0-9]+")
INT32_FLAGS = {"iterations", "level", "stderrthreshold", "minloglevel", "v"}


def gflags_int32(value):
    """Whether gflags takes ``value`` for an int32 flag."""
    if not GFLAGS_INT32.fullmatch(value):
        return False
    number = int(value, 16) if value[:2] in ("0x", "0X") else int(value)
    return -2 ** 31 <= number < 2 ** 31


def _text():
    """A Hypothesis strategy of short texts a command line can hold (no NUL, no surrogate)."""
    from hypothesis import strategies as st
    return st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                   max_size=16)


def flag_value(fx, name):
    """A Hypothesis strategy of values for flag ``name``: plausible ones and edge ones."""
    from hypothesis import strategies as st
    import fuzz_nets
    anything = st.one_of(st.sampled_from(fx.paths()), st.sampled_from(fuzz_nets.EDGE_NUMBERS),
                         _text())
    if name in PATH_FLAGS:
        plausible = st.sampled_from(fx.paths())
    elif name in WORD_FLAGS:
        plausible = st.sampled_from(WORD_FLAGS[name])
    elif name in NUMBER_FLAGS:
        plausible = st.one_of(st.sampled_from(SMALL_NUMBERS + fuzz_nets.EDGE_NUMBERS),
                              st.integers(-2 ** 40, 2 ** 40).map(str))
    elif name == "log_dir":
        plausible = st.sampled_from([str(fx.directory), str(fx.missing.parent), "logs", "",
                                     str(fx.garbage)])
    else:
        plausible = st.sampled_from(BOOL_VALUES)
    return st.one_of(plausible, plausible, plausible, anything)


def flag_words(fx, names):
    """A Hypothesis strategy of one flag of ``names`` (a strategy) as command-line words:
    ``--f=v``, ``-f=v``, ``--f v`` or a bare ``--f``."""
    from hypothesis import strategies as st

    @st.composite
    def words(draw):
        dashes, name = draw(st.sampled_from(["--", "-"])), draw(names)
        form = draw(st.sampled_from(["eq", "eq", "space", "bare"]))
        if form == "bare":
            return [f"{dashes}{name}"]
        value = draw(flag_value(fx, name))
        return [f"{dashes}{name}={value}"] if form == "eq" else [f"{dashes}{name}", value]
    return words()


def argv_strategy(fx):
    """A Hypothesis strategy of command lines (lists of str) over the fixtures' paths: half of
    them a command with a valid base line and a few known flags, half anything (unknown
    commands and flags, words in any order)."""
    from hypothesis import strategies as st
    bases = {
        "train": [["--solver", str(fx.solver)],
                  ["--solver", str(fx.solver), "--snapshot", str(fx.state)],
                  ["--solver", str(fx.solver), "--weights", str(fx.weights)]],
        "test": [["--model", str(fx.model), "--weights", str(fx.weights), "--iterations"]],
        "time": [["--model", str(fx.model), "--iterations"]],
        "device_query": [[]],
    }
    iterations = st.sampled_from(["1", "2", "3", "5", "10", "2147483647"])     # the last: long
    known = flag_words(fx, st.sampled_from(sorted(KNOWN_FLAGS)))
    any_flag = flag_words(fx, st.one_of(st.sampled_from(sorted(KNOWN_FLAGS)),
                                        st.sampled_from(UNKNOWN_FLAGS)))

    @st.composite
    def structured(draw):
        command = draw(st.sampled_from(["train", "train", "test", "time", "device_query"]))
        base = draw(st.sampled_from(bases[command]))
        base = base + [draw(iterations)] if base[-1:] == ["--iterations"] else base
        flags = draw(st.lists(known, max_size=3))
        return [command] + base + [w for f in flags for w in f]

    @st.composite
    def anything(draw):
        command = draw(st.one_of(st.sampled_from(COMMANDS),
                                 st.sampled_from(["", "Train", "bogus", "-", "--", "train train"]),
                                 _text()))
        base = draw(st.sampled_from(bases.get(command, [[]]) + [[]]))
        base = base + ["1"] if base[-1:] == ["--iterations"] else base
        flags = draw(st.lists(any_flag, max_size=4))
        tail = draw(st.lists(st.sampled_from(["extra", "train", "--", "-"]), max_size=1))
        words = [command] + base + [w for f in flags for w in f] + tail
        return list(draw(st.permutations(words))) if draw(st.booleans()) else words

    return st.one_of(structured(), anything())


def flag_argvs(fx, count, seed):
    """``count`` command lines from :func:`argv_strategy`, as Hypothesis draws them from
    ``seed`` (generation only: no database, no shrinking, no deadline)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.configuration import set_hypothesis_home_dir
    set_hypothesis_home_dir(fx.folder / "hypothesis")      # its caches, not in the project
    drawn = []
    round_seed = seed
    while len(drawn) < count:
        @hypothesis_seed(round_seed)
        @settings(max_examples=count - len(drawn), database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(argv_strategy(fx))
        def collect(argv):
            drawn.append(argv)
        before = len(drawn)
        collect()
        if len(drawn) == before:
            raise RuntimeError("hypothesis drew no command line")
        round_seed += 1
    return drawn[:count]


def parse_argv(argv):
    """``argv`` read as gflags reads it: (positional words, {flag: [values in order]}, problem)
    where ``problem`` names an unknown flag or a flag without its value ('' when none)."""
    positional, values, i = [], {}, 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--":
            positional += argv[i:]
            break
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, eq, value = word.lstrip("-").partition("=")
        if name not in KNOWN_FLAGS:
            return positional, values, f"unknown flag {word!r}"
        if name in VALUED_FLAGS and not eq:
            if i >= len(argv):
                return positional, values, f"{word} without a value"
            value = argv[i]
            i += 1
        values.setdefault(name, []).append(value)
    return positional, values, ""


def known_invalid(argv):
    """Why gflags and tools/caffe.cpp refuse ``argv`` whatever its files hold ('' when it may be
    valid): an unknown flag, a flag without its value, not exactly one command or an unknown one."""
    positional, values, problem = parse_argv(argv)
    if problem:
        return problem
    for name in INT32_FLAGS & set(values):
        for value in values[name]:
            if not gflags_int32(value):
                return f"--{name}={value!r} is not an int32 to gflags"
    if len(positional) != 1 or positional[0] not in COMMANDS:
        return f"commands {positional}"
    return ""


def stop_signal(argv):
    """The signal that stops the command ``argv`` cleanly (Caffe's SignalHandler): SIGINT, or
    for ``train`` the one whose ``--sig*_effect`` is ``stop`` (defaults: SIGINT stop, SIGHUP
    snapshot); SIGTERM (death expected) when the flags make the run ignore both."""
    positional, values, _ = parse_argv(argv)
    if positional[:1] != ["train"]:
        return signal.SIGINT
    if values.get("sigint_effect", ["stop"])[-1] == "stop":
        return signal.SIGINT
    if values.get("sighup_effect", ["snapshot"])[-1] == "stop":
        return signal.SIGHUP
    return signal.SIGTERM


def flag_case(index, argv, folder):
    """A command line case (see :func:`argv_strategy`)."""
    return Case("flags", index, list(argv), folder, known_invalid(argv), "", stop_signal(argv))


# -- running a case in a forked child -----------------------------------------------------------
def child(case, log_path):
    """In the forked child: run the command of ``case`` and leave with its status."""
    status = UNCAUGHT
    try:
        os.chdir(case.folder)
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from caffe_engine.cli import main
        try:
            status = main(case.argv)
        except SystemExit as exc:
            status = exc.code
        status = 0 if status is None else status if isinstance(status, int) else 1
    except BaseException:  # noqa: BLE001 - a traceback is what the parent looks for
        import traceback
        traceback.print_exc()
        status = UNCAUGHT
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status if 0 <= status <= 255 else UNCAUGHT)


@dataclasses.dataclass
class Running:
    """A started case: its child, its log, when it started and when it was interrupted."""

    case: Case
    pid: int
    log: Path
    started: float
    interrupted: float = 0.0


def start(case):
    """Fork a child for ``case`` (its argv and note written to case.json in its folder);
    returns its :class:`Running`."""
    log = case.folder / "stderr.txt"
    (case.folder / "case.json").write_text(json.dumps(dataclasses.asdict(case), default=str))
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(case, log)
    return Running(case, pid, log, time.monotonic())


def ending(status):
    """('exit', code) or ('signal', name) from a ``waitpid`` status."""
    if os.WIFSIGNALED(status):
        return "signal", signal.Signals(os.WTERMSIG(status)).name
    return "exit", os.WEXITSTATUS(status)


def half_written(folder):
    """Temporary files of an atomic write left in ``folder`` (none may stay)."""
    return sorted(p.name for p in Path(folder).rglob(".tmp-*"))


def classify(case, how, code, interrupted, stderr, leftovers):
    """The outcome of a finished case: ('ok' | 'refused' | 'long' | 'bug', detail)."""
    from caffe_engine.errors import MAX_LINE
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if how == "signal":
        if interrupted and code == "SIGTERM" and case.stop == signal.SIGTERM:
            return "long", ""
        return "bug", f"died of {code}"
    if "Traceback" in stderr:
        return "bug", "a traceback"
    if leftovers:
        return "bug", f"half-written files left: {leftovers[:3]}"
    if interrupted and (code == 0 or (code == 130 and last == "caffe: interrupted")):
        return "long", ""
    if code == 0:
        if case.invalid:
            return "bug", f"exit 0 on invalid input ({case.invalid})"
        return "ok", ""
    if last.startswith("caffe: ") and len(last) <= len("caffe: ") + MAX_LINE:
        if not last.isprintable():
            return "bug", "control characters in the error line"
        return "refused", last
    return "bug", f"exit {code}, last stderr line not one 'caffe: ...' line"


def finish(run, status):
    """The outcome of ``run`` that ended with ``status``: (outcome, detail, stderr tail)."""
    how, code = ending(status)
    stderr = run.log.read_text(errors="replace") if run.log.exists() else ""
    leftovers = [] if how == "signal" else half_written(run.case.folder)
    outcome, detail = classify(run.case, how, code, bool(run.interrupted), stderr, leftovers)
    return outcome, detail, stderr.splitlines()[-4:]


def run_all(cases, jobs, deadline=DEADLINE_S, grace=GRACE_S):
    """Run ``cases`` (an iterator of :class:`Case`), ``jobs`` at a time; yields (case, outcome,
    detail, stderr tail) as they end."""
    pending, running = iter(cases), {}
    exhausted = False
    while running or not exhausted:
        while not exhausted and len(running) < jobs:
            case = next(pending, None)
            if case is None:
                exhausted = True
            else:
                run = start(case)
                running[run.pid] = run
        for pid, run in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del running[pid]
                yield (run.case,) + finish(run, status)
                continue
            now = time.monotonic()
            if not run.interrupted and now - run.started > deadline:
                os.kill(pid, run.case.stop)
                run.interrupted = now
            elif run.interrupted and now - run.interrupted > grace:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                del running[pid]
                tail = run.log.read_text(errors="replace").splitlines()[-4:]
                yield run.case, "bug", (f"hang: still running {grace:g} s after "
                                        f"{signal.Signals(run.case.stop).name}"), tail
        time.sleep(0.005)


# -- the parent: warm-up, the cases, the counts -------------------------------------------------
def warm_up(fx):
    """Train, test and time the LeNet-like net and train the tiny one in this process, so that
    Numba's kernels are compiled once, before any fork; the training leaves ``fx.weights`` and
    ``fx.state``. Raises SystemExit with the log when a warm-up run fails, or when a thread or
    an LMDB environment of the runs outlives them (a child must not inherit either)."""
    import gc
    import threading

    from tiny_train import tiny_solver
    from caffe_engine.io import lmdb_source
    tiny = tiny_solver(fx.folder / "tiny", max_iter=2)
    in_process(["train", "--solver", str(fx.warm_solver)], fx.folder)
    in_process(["test", "--model", str(fx.model), "--weights", str(fx.weights),
                "--iterations", "1"], fx.folder)
    in_process(["time", "--model", str(fx.model), "--iterations", "1"], fx.folder)
    in_process(["train", "--solver", str(tiny)], tiny.parent)
    deadline = time.monotonic() + 10            # a prefetch thread loading a batch holds its
    while time.monotonic() < deadline:          # layer: collect again once it has let go
        gc.collect()
        if not any(t.name.startswith("prefetch") for t in threading.enumerate()):
            break
        time.sleep(0.01)
    left = [t.name for t in threading.enumerate() if t.name.startswith("prefetch")]
    if left or lmdb_source._shared_envs:
        raise SystemExit(f"fuzz_cli: the warm-up left threads {left} or LMDB environments "
                         f"{list(lmdb_source._shared_envs)} open")


def in_process(argv, folder):
    """Run the command ``argv`` in this process from ``folder``, its log in warm-up.log there.

    Raises:
        SystemExit: the command failed (with the end of its log).
    """
    from caffe_engine.cli import main
    here, log = os.getcwd(), Path(folder) / "warm-up.log"
    saved = os.dup(2)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.chdir(folder)
        sys.stderr.flush()
        os.dup2(out, 2)
        status = main(argv)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(out)
        os.chdir(here)
    if status != 0:
        raise SystemExit(f"fuzz_cli: warm-up {shlex.join(argv)} exited {status}:\n"
                         + log.read_text(errors="replace")[-3000:])


def make_cases(kinds, count, seed, fx, root):
    """``count`` cases, the ``kinds`` in turn, each in a new folder under ``root``."""
    rng = random.Random(seed)
    order = [kinds[i % len(kinds)] for i in range(count)]
    argvs = iter(flag_argvs(fx, order.count("flags"), seed) if "flags" in kinds else [])
    makers = {"solver": lambda i, f: solver_case(i, rng, fx, f),
              "lmdb": lambda i, f: lmdb_case(i, rng, fx, f),
              "flags": lambda i, f: flag_case(i, next(argvs), f)}
    for index, kind in enumerate(order):
        folder = Path(root) / f"case{index}"
        folder.mkdir()
        yield makers[kind](index, folder)


def reproduction(case):
    """The shell command that reruns ``case`` (its folder is kept when it is a bug)."""
    return f"cd {shlex.quote(str(case.folder))} && python -m caffe_engine {shlex.join(case.argv)}"


def fuzz(cases, seed, kinds=KINDS, jobs=2, keep=None, log=None, deadline=DEADLINE_S):
    """Run ``cases`` cases of ``kinds`` from ``seed``, ``jobs`` at a time; returns (Counter of
    'kind:outcome', list of bugs, seconds). The cases' folders are removed unless ``keep`` (a
    folder to run in) is given; the folders of bugs stay (their path is in the bug)."""
    began = time.monotonic()
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="fuzz_cli."))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = str(root)           # glog's log files of --logtostderr=0 cases
    tempfile.tempdir = None
    fx = Fixtures(root / "fixtures")
    warm_up(fx)
    counts, bugs = collections.Counter(), []
    for n, (case, outcome, detail, tail) in enumerate(
            run_all(make_cases(list(kinds), cases, seed, fx, root), jobs, deadline), 1):
        counts[f"{case.kind}:{outcome}"] += 1
        if outcome == "bug":
            bugs.append({"kind": case.kind, "case": case.index, "seed": seed, "detail": detail,
                         "note": case.note, "reproduce": reproduction(case), "stderr": tail})
        elif not keep:
            shutil.rmtree(case.folder, ignore_errors=True)
        if log and n % 250 == 0:
            log(f"{n} cases: {dict(sorted(counts.items()))}")
    if not keep and not bugs:
        shutil.rmtree(root, ignore_errors=True)
    return counts, bugs, time.monotonic() - began


def limit_memory(gigabytes):
    """Cap the address space of this process and its children."""
    import resource
    limit = int(gigabytes * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=600)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated families: " + ", ".join(KINDS))
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--deadline", type=float, default=DEADLINE_S,
                        help="seconds before a case is interrupted")
    parser.add_argument("--limit-gb", type=float, default=6.0)
    parser.add_argument("--keep", help="run in this folder and keep every case's files")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        parser.error(f"--kinds: choose from {', '.join(KINDS)}")
    os.environ.setdefault("GLOG_logtostderr", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT))
    limit_memory(args.limit_gb)
    counts, bugs, seconds = fuzz(args.cases, args.seed, kinds, args.jobs, args.keep,
                                 log=lambda s: print(s, file=sys.stderr, flush=True),
                                 deadline=args.deadline)
    print(json.dumps({"cases": args.cases, "seed": args.seed, "kinds": kinds,
                      "seconds": round(seconds, 1), "outcomes": dict(sorted(counts.items()))}))
    for bug in bugs:
        print(json.dumps(bug))
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
