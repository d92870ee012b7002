"""Caffe's LevelDB backend: the cursor, the writer, the Data layer's ``backend: LEVELDB``, convert_db.

Oracles: the shared MNIST LMDBs (the records Caffe read) and LeNet trained on them through the
LMDB backend: a LevelDB copy made by convert_db must give the same records in the same order,
hence the same losses bit for bit. Bad and read-only inputs must give one line naming the path.
"""
import os
import shutil
import subprocess
import sys

import numpy
import pytest

import caffe_engine
from caffe_engine.backend import to_numpy
from caffe_engine.errors import CaffeError
from caffe_engine.io import db as dbio
from caffe_engine.io import leveldb_source
from caffe_engine.io.leveldb_source import LevelDBCursor, LevelDBWriter, write_leveldb
from caffe_engine.io.lmdb_source import read_all as lmdb_read_all
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2
from caffe_engine.tools import convert_db
from paths import ROOT, SHARED

pytest.importorskip("plyvel", reason="the LevelDB backend needs plyvel")

MNIST = SHARED / "data" / "mnist_5k"


@pytest.fixture(scope="module")
def mnist_leveldb(tmp_path_factory):
    """The shared MNIST LMDBs converted by convert_db: {"train": path, "test": path}."""
    folder = tmp_path_factory.mktemp("mnist_leveldb")
    out = {}
    for part in ("train", "test"):
        out[part] = folder / f"mnist_{part}_leveldb"
        assert convert_db.main([str(MNIST / f"mnist_{part}_lmdb"), str(out[part])]) == 0
    return out


def run_cli(argv, capsys):
    """(exit status, stderr); stderr's glog INFO lines (``I2026...``) left out."""
    try:
        status = convert_db.main([str(a) for a in argv])
    except SystemExit as exc:                # usage errors, as argparse (status 1, one line)
        status = exc.code
    captured = capsys.readouterr()
    err = "".join(line for line in captured.err.splitlines(True) if not line.startswith("I"))
    return status, err


def small_leveldb(path, count=5):
    write_leveldb(path, [(b"k%02d" % i, b"v%d" % i) for i in range(count)])
    return str(path)


# ---------------------------------------------------------------------------------------------
# (a) LeNet on the LevelDB copy trains to the LMDB's losses, bit for bit
# ---------------------------------------------------------------------------------------------
def lenet_run(tmp_path, train, test, backend, caplog, iters=20):
    """Per-iteration train loss (float32 bytes), the test output lines and the final weights."""
    net = pio.read_net_param(str(ROOT / "models" / "lenet" / "lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            phase = layer.include[0].phase
            layer.data_param.source = str(train if phase == caffe_pb2.TRAIN else test)
            if backend == "LEVELDB":
                layer.data_param.ClearField("backend")       # LEVELDB is the proto default
            else:
                layer.data_param.backend = caffe_pb2.DataParameter.LMDB
    solver_param = pio.read_solver_param(str(ROOT / "models" / "lenet" / "lenet_solver.prototxt"))
    solver_param.ClearField("net")
    solver_param.net_param.CopyFrom(net)
    solver_param.max_iter = iters
    solver_param.test_iter[:] = [2]
    solver_param.test_interval = 10
    solver_param.display = 1
    solver_param.snapshot = 0
    solver_param.snapshot_prefix = str(tmp_path / f"lenet_{backend}")
    solver_param.random_seed = 1701
    caplog.clear()
    solver = caffe_engine.get_solver(solver_param)
    losses = []
    for _ in range(iters):
        solver.step(1)
        losses.append(to_numpy(solver.net.blobs["loss"].data).astype(numpy.float32).tobytes())
    tests = [r.getMessage() for r in caplog.records if "Test net output" in r.getMessage()]
    opened = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Opened ")]
    weights = [to_numpy(p.data).tobytes() for params in solver.net.params.values() for p in params]
    for net_ in [solver.net] + list(solver.test_nets):
        for layer in net_.layers:
            if layer.type == "Data":
                layer.close()
    return losses, tests, weights, opened


def test_lenet_on_leveldb_trains_as_on_lmdb(tmp_path, mnist_leveldb, caplog):
    caplog.set_level("INFO", logger="caffe_engine")
    lmdb_run = lenet_run(tmp_path, MNIST / "mnist_train_lmdb", MNIST / "mnist_test_lmdb", "LMDB", caplog)
    leveldb_run = lenet_run(tmp_path, mnist_leveldb["train"], mnist_leveldb["test"], "LEVELDB", caplog)
    assert len(lmdb_run[0]) == 20 and len(lmdb_run[1]) == 2 * 2     # tests at 0 and 10
    assert [m.split()[0] + " " + m.split()[1] for m in leveldb_run[3]] == ["Opened leveldb"] * 2
    assert leveldb_run[0] == lmdb_run[0], "per-iteration losses differ"
    assert leveldb_run[1] == lmdb_run[1], "test outputs differ"
    assert leveldb_run[2] == lmdb_run[2], "final weights differ"


def test_data_layer_logs_opened_leveldb(mnist_leveldb, caplog):
    from caffe_engine.blob import Blob
    from caffe_engine.layers.base import create_layer
    from google.protobuf import text_format
    caplog.set_level("INFO", logger="caffe_engine")
    param = text_format.Parse(f'name: "d" type: "Data" top: "data" top: "label" data_param {{ '
                              f'source: "{mnist_leveldb["test"]}" batch_size: 7 prefetch: 0 }}',
                              caffe_pb2.LayerParameter())
    layer = create_layer(param, caffe_pb2.TEST)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.forward([], top)
    assert f"Opened leveldb {mnist_leveldb['test']}" in caplog.text
    assert top[0].shape == (7, 1, 28, 28)
    layer.close()


def test_prefetching_from_leveldb_matches_loading_in_forward(mnist_leveldb):
    """The prefetch thread reads the LevelDB ahead; reading ``cursor`` stops it and rewinds
    (LevelDBCursor.seek) to the first record not yet forwarded."""
    from caffe_engine import rng
    from caffe_engine.blob import Blob
    from caffe_engine.layers.base import create_layer
    from google.protobuf import text_format
    batches, states = [], []
    for prefetch in (0, 3):
        rng.set_random_seed(5)
        param = text_format.Parse(
            f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ mirror: true '
            f'crop_size: 20 }} data_param {{ source: "{mnist_leveldb["test"]}" batch_size: 300 '
            f'prefetch: {prefetch} }}', caffe_pb2.LayerParameter())
        layer = create_layer(param, caffe_pb2.TRAIN)
        top = [Blob(), Blob()]
        layer.setup([], top)
        out = []
        for _ in range(5):                              # 1,500 records: wraps once
            layer.forward([], top)
            out.append((top[0].data.copy(), top[1].data.copy()))
        batches.append(out)
        states.append((layer.cursor.offset, layer.cursor.key()))
        layer.close()
    for (a, la), (b, lb) in zip(*batches):
        assert a.tobytes() == b.tobytes() and la.tobytes() == lb.tobytes()
    assert states[0] == states[1] == (1500, b"%08d" % 500)


# ---------------------------------------------------------------------------------------------
# (b) round trips, the cursor, the writer
# ---------------------------------------------------------------------------------------------
def test_round_trip_lmdb_leveldb_lmdb(tmp_path, mnist_leveldb, capsys):
    original = lmdb_read_all(str(MNIST / "mnist_test_lmdb"))
    assert dbio.read_all(mnist_leveldb["test"], "leveldb") == original
    status, err = run_cli([mnist_leveldb["test"], tmp_path / "back_lmdb", "--from", "leveldb",
                           "--to", "lmdb"], capsys)
    assert status == 0, err
    assert lmdb_read_all(str(tmp_path / "back_lmdb")) == original
    assert sorted(os.listdir(tmp_path)) == ["back_lmdb"]          # no temporary sibling left
    # Detected source backend; a LevelDB -> LevelDB copy is allowed too.
    assert run_cli([tmp_path / "back_lmdb", tmp_path / "again"], capsys)[0] == 0
    assert dbio.detect_backend(tmp_path / "again") == "leveldb"
    assert dbio.read_all(tmp_path / "again", "leveldb") == original


def test_keys_in_bytewise_order_whatever_the_put_order(tmp_path):
    keys = [b"b", b"a\xff", b"a", b"\x00z", b"B", b"a\x00"]
    with LevelDBWriter(tmp_path / "db", commit_every=2) as writer:
        for k in keys:
            writer.put(k, k * 2)
    assert [k for k, _ in dbio.read_all(tmp_path / "db", "leveldb")] == sorted(keys)
    write_lmdb(tmp_path / "l", [(k, k) for k in keys])
    assert [k for k, _ in dbio.read_all(tmp_path / "l", "lmdb")] == sorted(keys)


def test_cursor_wraps_counts_seeks_and_shares_the_database(tmp_path, caplog):
    caplog.set_level("INFO", logger="caffe_engine")
    path = small_leveldb(tmp_path / "db", 3)
    with dbio.open_db(path, "leveldb") as cursor, dbio.open_db(path, caffe_pb2.DataParameter.LEVELDB) as other:
        assert isinstance(cursor, LevelDBCursor) and len(cursor) == 3
        keys = []
        for _ in range(7):
            keys.append(cursor.key())
            cursor.next()
        assert keys == [b"k00", b"k01", b"k02"] * 2 + [b"k00"]
        assert cursor.offset == 7 and caplog.text.count("Restarting data prefetching from start.") == 2
        assert other.key() == b"k00" and other.value() == b"v0"       # its own position
        assert cursor.seek(b"k02") and cursor.value() == b"v2" and cursor.offset == 7
        assert not cursor.seek(b"k01x") and cursor.key() == b"k02"
        cursor.next()
        assert cursor.key() == b"k00"
        cursor.seek_to_first()
        assert cursor.key() == b"k00"
    assert not leveldb_source._shared                                 # closed with the last user
    assert LevelDBCursor(path).key() == b"k00"                         # and can be opened again


def test_writer_refuses_an_existing_path_and_commits_in_batches(tmp_path):
    small_leveldb(tmp_path / "db")
    with pytest.raises(CaffeError, match="already exists"):
        LevelDBWriter(tmp_path / "db")
    with pytest.raises(CaffeError, match="already exists"):
        dbio.open_writer(tmp_path / "db", "lmdb")
    writer = dbio.open_writer(tmp_path / "new", "leveldb", commit_every=2)
    for i in range(5):
        writer.put(b"%d" % i, b"x")
    assert writer.pending == 1 and writer.count == 5
    writer.close()
    writer.close()
    assert len(dbio.read_all(tmp_path / "new", "leveldb")) == 5


# ---------------------------------------------------------------------------------------------
# (c) a read-only folder
# ---------------------------------------------------------------------------------------------
READ_ONLY_SCRIPT = """
import logging, os, sys
sys.path.insert(0, {root!r})
logging.basicConfig(format="%(levelname)s %(message)s")
from caffe_engine.io import leveldb_source
cursor = leveldb_source.LevelDBCursor({path!r})
copy = next(iter(leveldb_source._shared.values())).copy_dir
print(len(cursor), cursor.key().decode(), cursor.value().decode())
cursor.close()
print("copy removed" if copy and not os.path.exists(copy) else "no copy: %r" % copy)
"""


def test_read_only_folder_is_read_through_a_copy(tmp_path):
    path = small_leveldb(tmp_path / "db", 4)
    before = sorted(os.listdir(path))
    script = READ_ONLY_SCRIPT.format(root=str(ROOT), path=path)
    if os.geteuid() == 0:   # root writes through permissions: mount the folder read-only
        if not shutil.which("unshare"):
            pytest.skip("running as root without unshare: cannot make a read-only folder")
        command = ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{path}" "{path}" && '
                   f'exec "{sys.executable}" -c "$0"', script]
        probe = subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{path}" "{path}"'],
                               capture_output=True)
        if probe.returncode:
            pytest.skip("cannot mount a read-only folder here")
    else:
        command = [sys.executable, "-c", script]
        for name in before:
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        os.chmod(path, 0o755)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["4 k00 v0", "copy removed"]
    warning = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warning) == 1 and path in warning[0] and "reading a copy in" in warning[0]
    assert "Traceback" not in done.stderr
    assert sorted(os.listdir(path)) == before


def test_read_only_folder_that_cannot_be_copied_is_one_line(tmp_path, monkeypatch):
    path = small_leveldb(tmp_path / "db")
    plyvel = leveldb_source._plyvel()
    real_open = leveldb_source._open_db

    def open_read_only(p, create=False):
        if p == path:
            raise plyvel.IOError(f"IO error: {p}/LOCK: Read-only file system".encode())
        return real_open(p, create)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(leveldb_source, "_open_db", open_read_only)
    monkeypatch.setattr(leveldb_source.shutil, "copytree", no_space)
    with pytest.raises(CaffeError) as info:
        LevelDBCursor(path)
    message = str(info.value)
    assert path in message and "read-only" in message and "No space left" in message
    assert "\n" not in message and not leveldb_source._shared


# ---------------------------------------------------------------------------------------------
# (d) bad input: one line naming the path, never a half-written destination
# ---------------------------------------------------------------------------------------------
def corrupt_table(tmp_path):
    """A LevelDB whose table file has damaged bytes in the middle."""
    plyvel = leveldb_source._plyvel()
    path = str(tmp_path / "corrupt_table")
    db = plyvel.DB(path, create_if_missing=True)
    for i in range(2000):
        db.put(b"%06d" % i, bytes([i % 251]) * 300)
    db.compact_range()
    db.close()
    table = next(name for name in os.listdir(path) if name.endswith((".ldb", ".sst")))
    data = bytearray((tmp_path / "corrupt_table" / table).read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    (tmp_path / "corrupt_table" / table).write_bytes(bytes(data))
    return path


def corrupt_manifest(tmp_path):
    path = small_leveldb(tmp_path / "corrupt_manifest")
    manifest = (tmp_path / "corrupt_manifest" / "CURRENT").read_text().strip()
    (tmp_path / "corrupt_manifest" / manifest).write_bytes(b"garbage" * 10)
    return path


def bad_inputs(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("not a database")
    (tmp_path / "a_file").write_text("not a database")
    write_lmdb(tmp_path / "an_lmdb", [(b"a", b"1")])
    small_leveldb(tmp_path / "empty", 0)
    return {str(tmp_path / "missing"): "no such file",
            str(tmp_path / "plain"): "not a LevelDB",
            str(tmp_path / "a_file"): "not a LevelDB",
            str(tmp_path / "an_lmdb"): "is an LMDB, not a LevelDB",
            str(tmp_path / "empty"): "holds no records",
            corrupt_manifest(tmp_path): "is corrupt",
            corrupt_table(tmp_path): "is corrupt"}


def test_bad_leveldb_inputs_raise_one_line_caffe_errors(tmp_path):
    cases = bad_inputs(tmp_path)
    for path, expected in cases.items():
        with pytest.raises(CaffeError) as info:
            with LevelDBCursor(path) as cursor:
                for _ in range(3000):       # the damaged table shows when its block is read
                    cursor.next()
        message = str(info.value)
        assert path in message and expected in message and "\n" not in message, message
    # LevelDB was kept from littering what is not a database.
    assert sorted(os.listdir(tmp_path / "plain")) == ["notes.txt"]
    assert not (tmp_path / "missing").exists()
    assert not leveldb_source._shared
    with pytest.raises(CaffeError, match="unknown database backend"):
        dbio.open_db(tmp_path / "plain", "rocksdb")
    with pytest.raises(CaffeError, match="is a LevelDB, not an LMDB"):
        dbio.open_db(tmp_path / "empty", "lmdb")


def test_data_layer_names_the_backend_of_a_mismatched_source():
    from caffe_engine.layers.base import create_layer
    from google.protobuf import text_format
    param = text_format.Parse(f'name: "d" type: "Data" top: "data" data_param {{ '
                              f'source: "{MNIST / "mnist_train_lmdb"}" batch_size: 4 }}',
                              caffe_pb2.LayerParameter())
    with pytest.raises(CaffeError) as info:
        create_layer(param, caffe_pb2.TRAIN)
    message = str(info.value)
    assert "layer 'd'" in message and "LEVELDB, the default when unset" in message
    assert "is an LMDB, not a LevelDB" in message and "\n" not in message


def test_convert_db_bad_inputs_one_line_and_no_destination(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    cases = bad_inputs(tmp_path / "in")
    del cases[str(tmp_path / "in" / "empty")]        # an empty database converts to an empty one
    (tmp_path / "out").mkdir()
    for path, expected in cases.items():
        argv = [path, tmp_path / "out" / "dst"]
        if "an_lmdb" in path:
            argv += ["--from", "leveldb"]
        status, err = run_cli(argv, capsys)
        assert status == 1 and err.startswith("convert_db: error:") and err.count("\n") == 1, err
        assert path in err and "Traceback" not in err
        assert os.listdir(tmp_path / "out") == [], f"{path} left {os.listdir(tmp_path / 'out')}"
    status, err = run_cli([tmp_path / "in" / "empty", tmp_path / "out" / "empty"], capsys)
    assert status == 0 and dbio.read_all(tmp_path / "out" / "empty", "lmdb") == []
    for argv, expected in [([tmp_path / "in" / "empty", tmp_path / "out" / "empty"], "already exists"),
                           ([tmp_path / "in" / "empty", tmp_path / "nowhere" / "x"], "does not exist"),
                           ([tmp_path / "in" / "plain", tmp_path / "out" / "y"], "neither an LMDB"),
                           ([tmp_path / "in" / "empty", tmp_path / "out" / "z", "--to", "zip"],
                            "invalid choice")]:
        status, err = run_cli(argv, capsys)
        assert status == 1 and expected in err and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path / "out")) == ["empty"]


def test_convert_db_interrupted_leaves_no_destination(tmp_path, monkeypatch, capsys):
    from caffe_engine.io import leveldb_source as module
    real_put = module.LevelDBWriter.put

    def failing_put(self, key, value):
        if self.count == 500:
            raise CaffeError(f"cannot write LevelDB '{self.path}': IO error: disk full")
        real_put(self, key, value)
    monkeypatch.setattr(module.LevelDBWriter, "put", failing_put)
    status, err = run_cli([MNIST / "mnist_test_lmdb", tmp_path / "dst"], capsys)
    assert status == 1 and err == f"convert_db: error: cannot write LevelDB '{tmp_path / 'dst'}': " \
        "IO error: disk full\n"
    assert os.listdir(tmp_path) == []


def test_convert_db_script_runs_from_a_checkout(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_db.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--from" in done.stdout
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "convert_db.py"),
                           str(tmp_path / "missing"), str(tmp_path / "dst")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "missing" in done.stderr
