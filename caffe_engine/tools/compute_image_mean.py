"""compute_image_mean: the mean image of an LMDB or LevelDB of Datum records, as a ``.binaryproto``.

Caffe: tools/compute_image_mean.cpp.

Usage::

    compute_image_mean [FLAGS] INPUT_DB [OUTPUT_FILE]

As Caffe: every record (encoded ones decoded with their own channels) is added, in key order,
into a float32 running sum per element; the mean is ``sum / count`` in float32, written as a
BlobProto with the legacy shape ``num=1, channels, height, width``. The per-channel means are
logged (``mean_value channel [c]: ...``). Records must all have the first one's size.
``--backend`` ``lmdb`` (default) or ``leveldb``.
"""
import sys

import numpy

from ._common import Parser, ToolError, progress, run, start_logging

PROG = "compute_image_mean"


def build_parser():
    p = Parser(prog=PROG, description="Compute the mean_image of a set of images given by a "
               "leveldb/lmdb.")
    p.add_argument("input_db", metavar="INPUT_DB", help="LMDB or LevelDB of Datum records")
    p.add_argument("output_file", metavar="OUTPUT_FILE", nargs="?",
                   help="where to write the mean (.binaryproto); omitted: only log it")
    p.add_argument("--backend", default="lmdb",
                   help="the backend {lmdb, leveldb} containing the images (default lmdb)")
    return p


def compute_mean(input_db, log=None, backend="lmdb"):
    """The mean of the Datum records of ``input_db`` (a database of ``backend``).

    Returns:
        float32 array (C, H, W).

    Raises:
        ToolError / CaffeError: unreadable or empty DB, a record of another size.
    """
    from ..errors import CaffeError
    from ..io.arrays import decode_datum
    from ..io.db import open_db
    from ..log import logger
    from ..proto import caffe_pb2
    log = log or logger
    total = None
    with open_db(str(input_db), backend) as cursor:
        n = len(cursor)
        for i in progress(range(n), total=n, desc=PROG, unit="img"):
            if i:
                cursor.next()
            datum = caffe_pb2.Datum()
            datum.ParseFromString(cursor.value())
            if datum.encoded:
                if i == 0:
                    log.info("Decoding Datum")
                try:
                    datum = decode_datum(datum)
                except CaffeError as exc:
                    raise ToolError(f"record {i} (key {cursor.key().decode(errors='replace')}) "
                                    f"of '{input_db}': {exc}") from None
            size = datum.channels * datum.height * datum.width
            if total is None:
                shape = (datum.channels, datum.height, datum.width)
                total = numpy.zeros(max(len(datum.data), len(datum.float_data)), numpy.float32)
                log.info("Starting Iteration")
            if len(datum.data):
                values = numpy.frombuffer(datum.data, numpy.uint8)
            else:
                values = numpy.asarray(datum.float_data, numpy.float32)
            if values.size != size or values.size != total.size:
                raise ToolError(f"Incorrect data field size {values.size} in record {i} "
                                f"(key {cursor.key().decode(errors='replace')}); expected {total.size}")
            total += values.astype(numpy.float32)   # float32 running sum, as Caffe's BlobProto
            if (i + 1) % 10000 == 0:
                log.info("Processed %d files.", i + 1)
    if n % 10000:
        log.info("Processed %d files.", n)
    mean = (total / numpy.float32(n)).astype(numpy.float32)
    return mean.reshape(shape)


def _main(argv):
    args = build_parser().parse_args(argv)
    from ..io.db import backend_name
    backend = backend_name(args.backend)
    start_logging()
    from ..io.blobproto import write_blobproto
    from ..log import g, logger
    mean = compute_mean(args.input_db, backend=backend)
    if args.output_file:
        logger.info("Write to %s", args.output_file)
        write_blobproto(args.output_file, mean[None], legacy=True)
    channels = mean.shape[0]
    logger.info("Number of channels: %d", channels)
    for c in range(channels):
        logger.info("mean_value channel [%d]: %s", c, g(float(mean[c].astype(numpy.float64).mean())))
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
