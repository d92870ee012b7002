"""convert_imageset, compute_image_mean and extract_features with ``leveldb`` (Caffe's tools
take ``--backend=leveldb`` / DB_TYPE ``leveldb``).

Oracle: the same tool with ``lmdb``: the LevelDB must hold the same keys and values, the mean
and the features must be the same bytes.
"""
import numpy
import pytest
from PIL import Image

from caffe_engine.io import db as dbio
from caffe_engine.io.blobproto import read_blobproto
from caffe_engine.tools import compute_image_mean, convert_imageset, extract_features

from paths import SHARED

pytest.importorskip("plyvel", reason="the LevelDB backend needs plyvel")

LENET = SHARED / "realworld" / "HorizonRobotics-Platform__ModelZoo" / "Lenet"


@pytest.fixture(autouse=True)
def keep_logging():
    """The tools set up glog-style logging for the process; undo it after each test."""
    from caffe_engine.log import logger
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved


def run_tool(module, argv, capsys):
    try:
        status = module.main([str(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    return status, capsys.readouterr().err


def test_convert_imageset_and_compute_image_mean_with_leveldb(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    rs = numpy.random.RandomState(3)
    lines = []
    for i in range(6):
        name = f"p{i}.png"
        Image.fromarray(rs.randint(0, 256, (9, 7, 3)).astype(numpy.uint8)).save(tmp_path / "images" / name)
        lines.append(f"{name} {i % 2}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    root = str(tmp_path / "images") + "/"
    for backend in ("lmdb", "leveldb"):
        status, err = run_tool(convert_imageset, [f"--backend={backend}", "--shuffle", "--seed=2", root,
                                                  tmp_path / "list.txt", tmp_path / backend], capsys)
        assert status == 0, err
        status, err = run_tool(compute_image_mean, [f"--backend={backend}", tmp_path / backend,
                                                    tmp_path / f"{backend}.binaryproto"], capsys)
        assert status == 0, err
    assert dbio.detect_backend(tmp_path / "leveldb") == "leveldb"
    assert dbio.read_all(tmp_path / "leveldb", "leveldb") == dbio.read_all(tmp_path / "lmdb", "lmdb")
    assert len(dbio.read_all(tmp_path / "leveldb", "leveldb")) == 6
    assert (tmp_path / "leveldb.binaryproto").read_bytes() == (tmp_path / "lmdb.binaryproto").read_bytes()
    assert read_blobproto(tmp_path / "leveldb.binaryproto").shape == (1, 3, 9, 7)
    # Bad input: one line naming the path.
    status, err = run_tool(compute_image_mean, ["--backend=leveldb", tmp_path / "lmdb"], capsys)
    assert status == 1 and err.count("\n") == 1 and "is an LMDB, not a LevelDB" in err
    status, err = run_tool(compute_image_mean, ["--backend=leveldb", tmp_path / "nothing"], capsys)
    assert status == 1 and err.count("\n") == 1 and str(tmp_path / "nothing") in err
    status, err = run_tool(convert_imageset, ["--backend=leveldb", root, tmp_path / "list.txt",
                                              tmp_path / "leveldb"], capsys)
    assert status == 1 and "already exists" in err.splitlines()[-1]


def test_extract_features_into_leveldb(tmp_path, capsys):
    deploy = (LENET / "lenet_train_test.prototxt").read_text()
    data_layer = ('layer { name: "mnist" type: "Data" top: "data" top: "label" '
                  'transform_param { scale: 0.00390625 } '
                  f'data_param {{ source: "{SHARED / "data/mnist_5k/mnist_test_lmdb"}" batch_size: 5 '
                  'backend: LMDB } }\n')
    (tmp_path / "features.prototxt").write_text('name: "LeNet"\n' + data_layer
                                                + deploy[deploy.index("\nlayer {"):])
    weights = LENET / "lenet_iter_100000.caffemodel"
    for db_type in ("lmdb", "leveldb"):
        status, err = run_tool(extract_features, [weights, tmp_path / "features.prototxt", "ip2",
                                                  tmp_path / f"ip2_{db_type}", 2, db_type], capsys)
        assert status == 0, err
    stored = dbio.read_all(tmp_path / "ip2_leveldb", "leveldb")
    assert [k for k, _ in stored] == [b"%010d" % i for i in range(10)]
    assert stored == dbio.read_all(tmp_path / "ip2_lmdb", "lmdb")
