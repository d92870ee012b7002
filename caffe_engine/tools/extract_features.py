"""extract_features: run a net over N mini-batches and save some of its blobs, item by item.

Caffe: tools/extract_features.cpp.

Usage (Caffe's)::

    extract_features PRETRAINED_NET_PARAM FEATURE_EXTRACTION_PROTO \\
        BLOB_NAME1[,NAME2,...] SAVE_DATASET_NAME1[,NAME2,...] NUM_MINI_BATCHES DB_TYPE \\
        [CPU/GPU] [DEVICE_ID=0]

The net is built in TEST phase from FEATURE_EXTRACTION_PROTO (which reads its own data, e.g.
a Data layer) with the weights of PRETRAINED_NET_PARAM (``.caffemodel`` or ``.h5``). Each
forward pass adds one record per item of each named blob:

* DB_TYPE ``lmdb`` or ``leveldb``: a Datum with ``float_data`` = the item's values and
  ``channels``, ``height``, ``width`` = the blob's legacy C, H, W, under the key ``%010d`` of the
  item index (committed 1,000 records at a time, as Caffe's);
* DB_TYPE ``npy``: a float32 ``.npy`` file of shape (NUM_MINI_BATCHES * N, ...) per blob.
"""
import sys

import numpy

from ..errors import CaffeError
from ._common import Parser, ToolError, progress, run, start_logging

PROG = "extract_features"


def build_parser():
    p = Parser(prog=PROG, description="Extract features of named blobs of a pretrained net over "
               "mini-batches of its own input, into LMDBs/LevelDBs of Datum or .npy files.")
    p.add_argument("pretrained_net_param", help=".caffemodel (or .caffemodel.h5) weights")
    p.add_argument("feature_extraction_proto", help="net prototxt (built in TEST phase)")
    p.add_argument("blob_names", help="comma-separated blob names, e.g. fc7,fc8")
    p.add_argument("dataset_names", help="comma-separated output database folders or .npy files")
    p.add_argument("num_mini_batches", type=int, help="number of forward passes")
    p.add_argument("db_type", help="lmdb, leveldb or npy")
    p.add_argument("mode", nargs="?", default="CPU", choices=["CPU", "GPU"], help="CPU (default) or GPU")
    p.add_argument("device_id", nargs="?", type=int, default=0, help="GPU device id (default 0)")
    return p


def extract(weights, proto, blob_names, dataset_names, num_mini_batches, db_type, log=None):
    """Write the features (see the module docstring); returns {blob: number of items}.

    Raises:
        ToolError / CaffeError: mismatched name lists, an unknown blob, a bad DB type or
            batch count, and whatever building the net or reading the weights raises.
    """
    from ..log import logger
    from ..net import TEST, Net
    log = log or logger
    if len(blob_names) != len(dataset_names):
        raise ToolError(f"the number of blob names ({len(blob_names)}) and dataset names "
                        f"({len(dataset_names)}) must be equal")
    if num_mini_batches < 0:
        raise ToolError(f"num_mini_batches must be non-negative, got {num_mini_batches}")
    if db_type not in ("lmdb", "leveldb", "npy"):
        raise ToolError(f"unknown or unsupported DB_TYPE '{db_type}' (lmdb, leveldb or npy)")
    net = Net(proto, TEST, weights=weights)
    for name in blob_names:
        if name not in net.blobs:
            raise ToolError(f"Unknown feature blob name {name} in the network {proto}")
    from ..io.db import open_writer
    writers = None
    if db_type != "npy":
        writers = []
        try:
            for path in dataset_names:
                writers.append(open_writer(path, db_type))
        except CaffeError:
            for writer in writers:
                writer.close()
            raise
    collected = {name: [] for name in blob_names}
    counts = {name: 0 for name in blob_names}
    from ..backend import to_numpy
    from ..proto import caffe_pb2
    log.info("Extracting Features")
    try:
        for _ in progress(range(num_mini_batches), total=num_mini_batches, desc=PROG, unit="batch"):
            net.forward()
            for k, name in enumerate(blob_names):
                blob = net.blobs[name]
                values = to_numpy(blob.data).astype(numpy.float32)
                items = values.reshape(blob.shape[0] if blob.shape else 1, -1)
                if writers is None:
                    collected[name].append(values.copy())
                    counts[name] += len(items)
                    continue
                for item in items:
                    datum = caffe_pb2.Datum(channels=blob.channels, height=blob.height, width=blob.width)
                    datum.float_data.extend(item.tolist())
                    writers[k].put(f"{counts[name]:010d}".encode(), datum.SerializeToString())
                    counts[name] += 1
                    if counts[name] % 1000 == 0:
                        log.info("Extracted features of %d query images for feature blob %s",
                                 counts[name], name)
    finally:
        for writer in writers or []:
            writer.close()
    if writers is None:
        for name, path in zip(blob_names, dataset_names):
            shape = (0,) + tuple(net.blobs[name].shape[1:])
            array = numpy.concatenate(collected[name]) if collected[name] else numpy.zeros(shape, numpy.float32)
            numpy.save(path, array)
    for name in blob_names:
        log.info("Extracted features of %d query images for feature blob %s", counts[name], name)
    log.info("Successfully extracted the features!")
    return counts


def _main(argv):
    args = build_parser().parse_args(argv)
    start_logging()
    from .. import backend
    if args.mode == "GPU":
        backend.set_device(args.device_id)
        backend.set_mode_gpu()
    extract(args.pretrained_net_param, args.feature_extraction_proto, args.blob_names.split(","),
            args.dataset_names.split(","), args.num_mini_batches, args.db_type)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
