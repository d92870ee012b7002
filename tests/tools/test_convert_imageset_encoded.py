"""convert_imageset against BVLC Caffe's ``ReadImageToDatum`` (src/caffe/util/io.cpp) and
tools/convert_imageset.cpp, through OpenCV.

Oracles: OpenCV itself (``cv2.imread`` / ``cv2.resize`` / ``cv2.imencode`` with its default
parameters: what Caffe calls), the files' own bytes, Caffe's ``matchExt`` rule written out case
by case, ``caffe_shuffle`` over ``CaffeRNG(seed)``, and the engine's Data layer reading an
encoded and a raw database of the same lossless PNGs.
"""
import os

import cv2
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine.blob import Blob
from caffe_engine.io import db as dbio
from caffe_engine.layers import create_layer
from caffe_engine.layers.image_data import caffe_shuffle
from caffe_engine.proto import caffe_pb2
from caffe_engine.rng import CaffeRNG
from caffe_engine.tools import convert_imageset

from test_tools import keep_logging, records, run_tool  # noqa: F401  (keep_logging: autouse)

H, W = 20, 24


def picture(seed, grey=False, size=(H, W)):
    """A smooth BGR (or grey) uint8 picture with some noise."""
    h, w = size
    rs = numpy.random.RandomState(seed)
    yy, xx = numpy.mgrid[0:h, 0:w]
    image = numpy.stack([(xx * 9 + 20 * seed) % 256, (yy * 11 + 7 * seed) % 256,
                         (xx * yy + rs.randint(0, 40, (h, w))) % 256], -1).astype(numpy.uint8)
    return cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if grey else image


def make_files(folder, specs):
    """Write ``specs`` [(name, seed, grey)] with cv2.imwrite; returns the folder as ROOTFOLDER/."""
    folder.mkdir(exist_ok=True)
    for name, seed, grey in specs:
        path = str(folder / name)
        if name.lower().endswith((".jpg", ".jpeg")) or "." not in name:
            ok, buf = cv2.imencode(".jpg", picture(seed, grey))   # also: names with no extension
            assert ok
            (folder / name).write_bytes(buf.tobytes())
        else:
            assert cv2.imwrite(path, picture(seed, grey))
    return str(folder) + "/"


STANDARD = [("a.jpg", 1, False), ("b.jpeg", 2, False), ("c.png", 3, False), ("d.JPG", 4, False),
            ("g.png", 5, True)]


def write_list(path, names, labels=None):
    labels = labels or list(range(len(names)))
    path.write_text("".join(f"{n} {lab}\n" for n, lab in zip(names, labels)))
    return path


def convert(tmp_path, flags, names=None, db="db", root=None):
    """Run the tool on STANDARD's files (or ``names``); returns (status, stderr, records)."""
    root = root or make_files(tmp_path / "images", STANDARD)
    list_file = write_list(tmp_path / f"{db}.txt", names or [n for n, _, _ in STANDARD])
    status, _, err = run_tool(convert_imageset, [*flags, root, list_file, tmp_path / db], capsys_holder[0])
    stored = records(tmp_path / db) if status == 0 else None
    return status, err, stored


capsys_holder = [None]


@pytest.fixture(autouse=True)
def _capsys(capsys):
    capsys_holder[0] = capsys
    yield
    capsys_holder[0] = None


def file_bytes(tmp_path, name):
    return (tmp_path / "images" / name).read_bytes()


def imread(tmp_path, name, gray=False):
    return cv2.imread(str(tmp_path / "images" / name), cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR)


def imencode(ext, image):
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def assert_encoded_only(datum):
    """An encoded Datum as Caffe writes one: encoded, no sizes."""
    assert datum.encoded and not datum.HasField("channels") and not datum.HasField("height") \
        and not datum.HasField("width") and not datum.float_data


def one_error_line(err):
    """The tool's error: its last stderr line, one line, no traceback."""
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("convert_imageset: error: ")
    return last


# ---------------------------------------------------------------------------------------------
# matchExt: the file's own bytes, or cv2.imencode
# ---------------------------------------------------------------------------------------------
def test_encode_type_jpg_keeps_jpg_and_jpeg_files_and_reencodes_the_rest(tmp_path):
    status, err, stored = convert(tmp_path, ["--encode_type=jpg"])
    assert status == 0, err
    assert "encode_type specified, assuming encoded=true." in err
    by_name = {key.split("_", 1)[1]: datum for key, datum in stored}
    for name in ("a.jpg", "b.jpeg", "d.JPG"):           # jpg, jpeg -> jpg, upper case
        assert_encoded_only(by_name[name])
        assert by_name[name].data == file_bytes(tmp_path, name)
    for name in ("c.png", "g.png"):                     # png -> jpg: re-encoded by OpenCV
        assert_encoded_only(by_name[name])
        assert by_name[name].data == imencode(".jpg", imread(tmp_path, name))
    assert [d.label for _, d in stored] == [0, 1, 2, 3, 4]


def test_encode_type_jpeg_reencodes_jpg_files(tmp_path):
    # Caffe's matchExt takes "jpeg" files for the encoding "jpg", not "jpg" files for "jpeg".
    status, err, stored = convert(tmp_path, ["--encode_type=JPEG"])
    assert status == 0, err
    by_name = {key.split("_", 1)[1]: datum for key, datum in stored}
    assert by_name["b.jpeg"].data == file_bytes(tmp_path, "b.jpeg")
    for name in ("a.jpg", "d.JPG", "c.png"):
        assert by_name[name].encoded
        assert by_name[name].data == imencode(".JPEG", imread(tmp_path, name))
        assert by_name[name].data != file_bytes(tmp_path, name)


def test_encode_type_png_reencodes_jpegs_losslessly(tmp_path):
    status, err, stored = convert(tmp_path, ["--encode_type=png"])
    assert status == 0, err
    by_name = {key.split("_", 1)[1]: datum for key, datum in stored}
    assert by_name["c.png"].data == file_bytes(tmp_path, "c.png")
    assert by_name["g.png"].data == file_bytes(tmp_path, "g.png")
    for name in ("a.jpg", "b.jpeg", "d.JPG"):
        datum = by_name[name]
        assert_encoded_only(datum)
        assert datum.data[:8] == b"\x89PNG\r\n\x1a\n"
        assert datum.data == imencode(".png", imread(tmp_path, name))
        # The record's pixels are OpenCV's decode of the file, bit for bit.
        numpy.testing.assert_array_equal(cv2.imdecode(numpy.frombuffer(datum.data, numpy.uint8),
                                                      cv2.IMREAD_UNCHANGED), imread(tmp_path, name))


def test_encoded_alone_guesses_each_files_encoding(tmp_path):
    status, err, stored = convert(tmp_path, ["--encoded"])
    assert status == 0, err
    assert "assuming encoded=true" not in err
    for (key, datum), (name, _, _) in zip(stored, STANDARD):
        assert key.split("_", 1)[1] == name
        assert_encoded_only(datum)
        assert datum.data == file_bytes(tmp_path, name)     # every extension matches itself
        numpy.testing.assert_array_equal(
            cv2.imdecode(numpy.frombuffer(datum.data, numpy.uint8), cv2.IMREAD_COLOR),
            imread(tmp_path, name))


def test_grey_file_in_colour_mode_and_colour_file_with_gray_keep_their_bytes(tmp_path):
    # Caffe's test `(cv_img.channels() == 3) == is_color` looks at the image imread decoded in
    # the asked mode, which always passes: the files' own bytes are stored, whatever their
    # channels (the Data layer then decodes them natively unless force_color / force_gray).
    status, err, stored = convert(tmp_path, ["--encoded"], db="colour")
    assert status == 0, err
    grey = dict((k.split("_", 1)[1], d) for k, d in stored)["g.png"]
    assert grey.data == file_bytes(tmp_path, "g.png")
    assert cv2.imdecode(numpy.frombuffer(grey.data, numpy.uint8), cv2.IMREAD_UNCHANGED).ndim == 2
    status, err, stored = convert(tmp_path, ["--encoded", "--gray"], db="gray")
    assert status == 0, err
    colour = dict((k.split("_", 1)[1], d) for k, d in stored)["a.jpg"]
    assert colour.data == file_bytes(tmp_path, "a.jpg")


def test_gray_reencoded_records_have_one_channel(tmp_path):
    status, err, stored = convert(tmp_path, ["--gray", "--encode_type=png"])
    assert status == 0, err
    for (_, datum), (name, _, _) in zip(stored, STANDARD):
        if name.endswith(".png"):           # matchExt: the file's own bytes, colour or not
            assert datum.data == file_bytes(tmp_path, name)
            continue
        assert datum.data == imencode(".png", imread(tmp_path, name, gray=True))
        image = cv2.imdecode(numpy.frombuffer(datum.data, numpy.uint8), cv2.IMREAD_UNCHANGED)
        assert image.ndim == 2
        numpy.testing.assert_array_equal(image, imread(tmp_path, name, gray=True))


def test_any_resize_reencodes(tmp_path):
    status, err, stored = convert(tmp_path, ["--encoded", "--resize_height=7", "--resize_width=9"])
    assert status == 0, err
    for (_, datum), (name, _, _) in zip(stored, STANDARD):
        assert_encoded_only(datum)
        resized = cv2.resize(imread(tmp_path, name), (9, 7), interpolation=cv2.INTER_LINEAR)
        ext = "." + name.rsplit(".", 1)[1].lower()
        assert datum.data == imencode(ext, resized)
        if ext == ".png":                     # lossless: the record's pixels are the resize's
            numpy.testing.assert_array_equal(
                cv2.imdecode(numpy.frombuffer(datum.data, numpy.uint8), cv2.IMREAD_COLOR), resized)
    # Caffe's `!height && !width`: one size alone does not resize, yet forces a re-encode.
    status, err, stored = convert(tmp_path, ["--encoded", "--resize_height=7"], db="one_side")
    assert status == 0, err
    png = dict((k.split("_", 1)[1], d) for k, d in stored)["c.png"]
    assert png.data == imencode(".png", imread(tmp_path, "c.png"))
    assert cv2.imdecode(numpy.frombuffer(png.data, numpy.uint8), cv2.IMREAD_COLOR).shape == (H, W, 3)


# ---------------------------------------------------------------------------------------------
# Raw records, keys, skipped files, shuffle
# ---------------------------------------------------------------------------------------------
def test_raw_records_are_opencv_pixels_in_chw(tmp_path):
    status, err, stored = convert(tmp_path, ["--resize_height=11", "--resize_width=13"])
    assert status == 0, err
    for (_, datum), (name, _, _) in zip(stored, STANDARD):
        expected = cv2.resize(imread(tmp_path, name), (13, 11), interpolation=cv2.INTER_LINEAR)
        assert not datum.encoded and (datum.channels, datum.height, datum.width) == (3, 11, 13)
        assert datum.data == numpy.ascontiguousarray(expected.transpose(2, 0, 1)).tobytes()
    status, err, stored = convert(tmp_path, ["--gray"], db="gray")
    assert status == 0, err
    for (_, datum), (name, _, _) in zip(stored, STANDARD):
        assert (datum.channels, datum.height, datum.width) == (1, H, W)
        assert datum.data == imread(tmp_path, name, gray=True).tobytes()


def test_keys_number_the_lines_and_unreadable_files_are_skipped(tmp_path):
    root = make_files(tmp_path / "images", STANDARD)
    (tmp_path / "images" / "notes.png").write_text("not an image\n")
    names = ["a.jpg", "missing.png", "c.png", "notes.png", "sub dir/none.jpg", "g.png"]
    status, err, stored = convert(tmp_path, ["--encoded"], names=names, root=root)
    assert status == 0, err
    assert [k for k, _ in stored] == ["00000000_a.jpg", "00000002_c.png", "00000005_g.png"]
    assert [d.label for _, d in stored] == [0, 2, 5]
    assert err.count("Could not open or find file") == 3
    assert "Processed 3 files." in err and "A total of 6 images." in err


def test_shuffle_with_seed_is_caffes_shuffle(tmp_path):
    specs = [(f"p{i:02d}.png", i, False) for i in range(17)]
    root = make_files(tmp_path / "images", specs)
    names = [n for n, _, _ in specs]
    status, err, stored = convert(tmp_path, ["--shuffle", "--seed=1701", "--encoded"], names=names,
                                  root=root)
    assert status == 0, err
    assert "Shuffling data" in err
    expected = [(n, i) for i, n in enumerate(names)]
    caffe_shuffle(expected, CaffeRNG(1701))
    assert expected != [(n, i) for i, n in enumerate(names)]
    assert [(k, d.label) for k, d in stored] == [(f"{i:08d}_{n}", lab) for i, (n, lab) in enumerate(expected)]


def test_leveldb_backend(tmp_path):
    pytest.importorskip("plyvel")
    root = make_files(tmp_path / "images", STANDARD)
    list_file = write_list(tmp_path / "list.txt", [n for n, _, _ in STANDARD])
    for backend in ("leveldb", "lmdb"):
        status, _, err = run_tool(convert_imageset, ["--encode_type=png", f"--backend={backend}", root,
                                                     list_file, tmp_path / backend], capsys_holder[0])
        assert status == 0, err
    assert dbio.detect_backend(tmp_path / "leveldb") == "leveldb"
    items = dbio.read_all(tmp_path / "leveldb", "leveldb")
    assert items == dbio.read_all(tmp_path / "lmdb", "lmdb") and len(items) == len(STANDARD)
    assert caffe_pb2.Datum.FromString(items[0][1]).data == imencode(".png", imread(tmp_path, "a.jpg"))
    assert sorted(os.listdir(tmp_path)) == ["images", "leveldb", "list.txt", "lmdb"]


# ---------------------------------------------------------------------------------------------
# --check_size, errors, no partial database
# ---------------------------------------------------------------------------------------------
def test_check_size_of_encoded_records_compares_decoded_sizes(tmp_path):
    status, err, stored = convert(tmp_path, ["--encoded", "--check_size"])
    assert status == 0, err                        # Caffe would stop at the second record
    assert len(stored) == len(STANDARD)
    root = make_files(tmp_path / "images", STANDARD)
    cv2.imwrite(str(tmp_path / "images" / "big.png"), picture(9, size=(H, W + 1)))
    names = ["a.jpg", "c.png", "big.png", "g.png"]
    status, err, _ = convert(tmp_path, ["--encoded", "--check_size"], names=names, root=root, db="bad")
    line = one_error_line(err)
    assert "'big.png'" in line and f"3x{H}x{W + 1}" in line and f"3x{H}x{W}" in line and "'a.jpg'" in line
    assert not (tmp_path / "bad").exists()
    # Without an encoding it is Caffe's check (the data length), with the same kind of line.
    status, err, _ = convert(tmp_path, ["--check_size"], names=names, root=root, db="raw")
    line = one_error_line(err)
    assert "Incorrect data field size" in line and "'big.png'" in line and f"3x{H}x{W + 1}" in line
    assert not (tmp_path / "raw").exists()


def test_failure_after_a_commit_leaves_no_database(tmp_path):
    root = make_files(tmp_path / "images", STANDARD)
    cv2.imwrite(str(tmp_path / "images" / "big.png"), picture(9, size=(H + 2, W)))
    names = ["c.png"] * 1001 + ["big.png"]               # 1,000 records committed, then the error
    before = sorted(os.listdir(tmp_path))
    for backend in ("lmdb", "leveldb"):
        status, err, _ = convert(tmp_path, ["--check_size", f"--backend={backend}"], names=names,
                                 root=root, db="db")
        assert status == 1 and "'big.png'" in one_error_line(err)
        assert "Processed 1000 files." in err
        assert sorted(os.listdir(tmp_path)) == sorted(before + ["db.txt"])   # no db, no leftovers


def test_encoding_opencv_cannot_write_is_one_line_and_no_database(tmp_path):
    status, err, _ = convert(tmp_path, ["--encode_type=xyz"])
    line = one_error_line(err)
    assert "'a.jpg'" in line and "xyz" in line
    assert not (tmp_path / "db").exists() and not any(p.name.startswith(".db") for p in tmp_path.iterdir())


def test_name_without_extension_with_encoded_alone(tmp_path):
    root = make_files(tmp_path / "images", STANDARD + [("noext", 6, False)])
    names = ["a.jpg", "noext"]
    status, err, _ = convert(tmp_path, ["--encoded"], names=names, root=root)
    line = one_error_line(err)
    assert "'noext'" in line and "--encode_type" in line
    assert not (tmp_path / "db").exists()
    # With an encoding it converts (re-encoded: matchExt compares the encoding with the path).
    status, err, stored = convert(tmp_path, ["--encode_type=jpg"], names=names, root=root, db="ok")
    assert status == 0, err
    assert stored[1][1].data == imencode(".jpg", imread(tmp_path, "noext"))


def test_interrupt_leaves_no_database(tmp_path, monkeypatch):
    real = convert_imageset.image_to_datum
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(convert_imageset, "image_to_datum", interrupted)
    status, err, _ = convert(tmp_path, ["--encoded"])
    assert status == 130 and "interrupted" in err and len(calls) == 3
    assert sorted(os.listdir(tmp_path)) == ["db.txt", "images"]


def test_existing_db_name_is_refused_and_kept(tmp_path):
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "mine").write_text("keep")
    status, err, _ = convert(tmp_path, ["--encoded"])
    assert status == 1 and "already exists" in one_error_line(err)
    assert (tmp_path / "db" / "mine").read_text() == "keep"


# ---------------------------------------------------------------------------------------------
# Round trip through the Data layer
# ---------------------------------------------------------------------------------------------
def forward_all(source, count):
    text = (f'name: "d" type: "Data" top: "data" top: "label" '
            f'data_param {{ source: "{source}" batch_size: {count} backend: LMDB prefetch: 0 }}')
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TEST)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.forward([], top)
    data, label = top[0].data.copy(), top[1].data.copy()
    if hasattr(layer, "close"):
        layer.close()
    return data, label


def test_data_layer_reads_the_same_pixels_from_encoded_and_raw_databases(tmp_path):
    specs = [(f"p{i}.png", 10 + i, False) for i in range(5)]
    root = make_files(tmp_path / "images", specs)
    names = [n for n, _, _ in specs]
    assert convert(tmp_path, ["--encoded"], names=names, root=root, db="enc")[0] == 0
    assert convert(tmp_path, [], names=names, root=root, db="raw")[0] == 0
    assert convert(tmp_path, ["--encode_type=png", "--resize_height=8", "--resize_width=6"],
                   names=names, root=root, db="enc_small")[0] == 0
    assert convert(tmp_path, ["--resize_height=8", "--resize_width=6"], names=names, root=root,
                   db="raw_small")[0] == 0
    for encoded, raw, size in (("enc", "raw", (H, W)), ("enc_small", "raw_small", (8, 6))):
        enc_data, enc_label = forward_all(tmp_path / encoded, len(names))
        raw_data, raw_label = forward_all(tmp_path / raw, len(names))
        assert enc_data.shape == (len(names), 3) + size
        numpy.testing.assert_array_equal(enc_data, raw_data)
        numpy.testing.assert_array_equal(enc_label, raw_label)
        numpy.testing.assert_array_equal(enc_label, numpy.arange(len(names)))
        expected = numpy.stack([cv2.resize(imread(tmp_path, n), size[::-1], interpolation=cv2.INTER_LINEAR)
                                if size != (H, W) else imread(tmp_path, n) for n in names])
        numpy.testing.assert_array_equal(enc_data, expected.transpose(0, 3, 1, 2).astype(numpy.float32))
