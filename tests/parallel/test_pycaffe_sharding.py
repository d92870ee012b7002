"""A pycaffe training loop under ``mpiexec -n P``: after ``caffe.set_solver_count(P)`` and
``caffe.set_solver_rank(rank)`` each rank's ``caffe.Net(..., caffe.TRAIN)`` reads its own share
of the records, r, r + P, r + 2P, ... (Caffe's ``DataLayer::Skip``), disjoint across ranks and
together every record; a TEST net reads them all on every rank."""
import numpy
import pytest

import caffe
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.proto import caffe_pb2


@pytest.fixture
def indexed_lmdb(tmp_path):
    """An LMDB whose record i has label i (each rank writes its own copy: same records)."""
    items = [(b"%08d" % i, caffe_pb2.Datum(channels=1, height=2, width=2, data=bytes(4),
                                           label=i).SerializeToString()) for i in range(32)]
    write_lmdb(tmp_path / "db", items)
    return str(tmp_path / "db")


def net_file(tmp_path, source, phase):
    path = tmp_path / f"{phase}.prototxt"
    path.write_text(f'''layer {{ name: "d" type: "Data" top: "data" top: "label"
        data_param {{ source: "{source}" batch_size: 4 backend: LMDB }} }}''')
    return str(path)


def test_each_rank_reads_its_own_records(world, tmp_path, indexed_lmdb):
    size = 1 if world is None else world.Get_size()
    rank = 0 if world is None else world.Get_rank()
    caffe.set_solver_count(size)
    caffe.set_solver_rank(rank)
    try:
        train = caffe.Net(net_file(tmp_path, indexed_lmdb, "train"), caffe.TRAIN)
        test = caffe.Net(net_file(tmp_path, indexed_lmdb, "test"), caffe.TEST)
        read, every = [], []
        for _ in range(2):                                   # the loop: forward, read labels
            train.forward()
            read += train.blobs["label"].data.astype(int).tolist()
            test.forward()
            every += test.blobs["label"].data.astype(int).tolist()
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
    assert read == [rank + size * k for k in range(8)]
    assert every == list(range(8))
    if world is not None and size > 1:
        shares = world.allgather(read)
        assert sorted(numpy.concatenate(shares).tolist()) == list(range(8 * size))
