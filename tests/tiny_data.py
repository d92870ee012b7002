"""A small LMDB of random uint8 Datums and a Data layer reading it, for the tests of the data
path (the prefetch thread, the device staging, the data threads, encoded records):
``make_source``, ``setup_layer``, ``data_layer``, ``batches``."""
import numpy
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.blob import Blob
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2


def make_source(tmp_path, count=11, shape=(3, 6, 7)):
    """An LMDB at ``tmp_path/db`` of ``count`` random uint8 Datums of ``shape`` (C, H, W),
    labels 0..count-1; returns its path."""
    r = numpy.random.RandomState(0)
    items = []
    for i in range(count):
        datum = caffe_pb2.Datum(channels=shape[0], height=shape[1], width=shape[2],
                                data=r.randint(0, 256, shape).astype(numpy.uint8).tobytes(),
                                label=i)
        items.append((b"%08d" % i, datum.SerializeToString()))
    write_lmdb(tmp_path / "db", items)
    return str(tmp_path / "db")


def setup_layer(text, phase=caffe_pb2.TRAIN, seed=77):
    """The layer of LayerParameter ``text`` with two tops (data, label), set up in ``phase``
    after seeding ``seed``; returns ``(layer, [data, label])``."""
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), phase)
    top = [Blob(), Blob()]
    rng.set_random_seed(seed)
    layer.setup([], top)
    return layer, top


def data_layer(source, prefetch, transform="mirror: true crop_size: 4 scale: 0.5", batch=4,
               phase=caffe_pb2.TRAIN, seed=77):
    """A Data layer on the LMDB ``source`` with ``transform`` (transform_param's text), set up
    as :func:`setup_layer`; returns ``(layer, [data, label])``."""
    text = (f'name: "d" type: "Data" top: "data" top: "label" transform_param {{ {transform} }} '
            f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB '
            f'prefetch: {prefetch} }}')
    return setup_layer(text, phase, seed)


def batches(layer, top, count):
    """``count`` forwards of ``layer``: a list of (data, label) copies."""
    out = []
    for _ in range(count):
        layer.forward([], top)
        out.append((top[0].data.copy(), top[1].data.copy()))
    return out
