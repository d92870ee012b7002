"""convert_imageset: a list of images and labels -> an LMDB or LevelDB of Caffe ``Datum`` records.

Caffe: tools/convert_imageset.cpp, src/caffe/util/io.cpp (``ReadImageToDatum``,
``CVMatToDatum``, ``ReadFileToDatum``).

Usage::

    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

LISTFILE has one ``relative/path.jpg LABEL`` per line (the label after the last space). Each
image is decoded as Caffe's OpenCV build does (BGR colour or grey, uint8; see
:mod:`caffe_engine.layers.image_data`), optionally resized (OpenCV's bilinear), and stored as a
Datum (C, H, W bytes, ``label``) under the key ``%08d_<path>`` of its line number. With
``--encoded`` the Datum holds the compressed file instead (the file's own bytes when it needs no
change, else re-encoded as ``--encode_type``), as Caffe's. Images that cannot be read are
logged and skipped. ``--shuffle`` shuffles the lines first with Caffe's ``shuffle`` over a
mt19937 stream seeded by ``--seed`` (default: from the clock, as Caffe's is). ``--backend``
``lmdb`` (default) or ``leveldb``; records are committed 1,000 at a time, as Caffe's.
"""
import io
import os
import sys
import time

from ._common import Parser, ToolError, add_bool, progress, run, start_logging

PROG = "convert_imageset"


def build_parser():
    p = Parser(prog=PROG, description="Convert a set of images to the leveldb/lmdb format used "
               "as input for Caffe.", epilog="Example: convert_imageset --resize_height=32 "
               "--resize_width=32 --shuffle --seed=1 images/ list.txt train_lmdb")
    p.add_argument("root_folder", metavar="ROOTFOLDER/", help="folder the LISTFILE paths are relative to")
    p.add_argument("list_file", metavar="LISTFILE", help="lines 'path label'")
    p.add_argument("db_name", metavar="DB_NAME", help="database folder to create (must not exist)")
    add_bool(p, "gray", "treat images as grayscale ones")
    add_bool(p, "shuffle", "randomly shuffle the order of images and their labels")
    p.add_argument("--seed", type=int, default=None,
                   help="random seed of --shuffle (default: from the clock)")
    p.add_argument("--backend", default="lmdb",
                   help="the backend {lmdb, leveldb} for storing the result (default lmdb)")
    p.add_argument("--resize_width", type=int, default=0, help="width images are resized to")
    p.add_argument("--resize_height", type=int, default=0, help="height images are resized to")
    add_bool(p, "check_size", "check that all the datum have the same size")
    add_bool(p, "encoded", "store the encoded image in the datum")
    p.add_argument("--encode_type", default="",
                   help="what type to encode the image as ('png', 'jpg', ...); implies --encoded")
    return p


def read_list(path):
    """``[(filename, label)]`` from a list file (label after the last space).

    Raises:
        ToolError: unreadable file, or a line without an integer label.
    """
    lines = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                name, _, label = line.rpartition(" ")
                try:
                    lines.append((name, int(label)))
                except ValueError:
                    raise ToolError(f"{path}:{number}: expected 'path label', got {line!r}") from None
    except OSError as exc:
        raise ToolError(f"cannot read list file '{path}': {exc.strerror}") from None
    return lines


_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "tif": "TIFF",
            "tiff": "TIFF", "ppm": "PPM", "pgm": "PPM", "webp": "WEBP"}


def encode_image(image, encoding):
    """Compress a decoded uint8 image (BGR or grey, as OpenCV holds it) as ``encoding``."""
    from PIL import Image
    fmt = _FORMATS.get(encoding.lower())
    if fmt is None:
        raise ToolError(f"unknown --encode_type '{encoding}' (known: {', '.join(sorted(_FORMATS))})")
    pixels = image[:, :, ::-1] if image.ndim == 3 else image  # BGR -> RGB for the file
    buf = io.BytesIO()
    options = {"quality": 95} if fmt == "JPEG" else {}         # OpenCV's default JPEG quality
    Image.fromarray(pixels).save(buf, format=fmt, **options)
    return buf.getvalue()


def image_to_datum(path, label, height, width, is_color, encoding):
    """Caffe's ``ReadImageToDatum``: a Datum for one file, or None if it cannot be read.

    Returns:
        (datum, (C, H, W) of the decoded image) or (None, None).
    """
    import numpy
    from ..errors import CaffeError
    from ..io.images import read_image_resized
    from ..proto import caffe_pb2
    try:
        image = read_image_resized(path, height, width, is_color)
    except CaffeError:
        return None, None
    chw = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
    datum = caffe_pb2.Datum(label=label)
    if encoding:
        ext = os.path.splitext(path)[1][1:].lower()
        same_ext = ext == encoding.lower() or {ext, encoding.lower()} <= {"jpg", "jpeg"}
        if (image.ndim == 3) == is_color and not height and not width and same_ext:
            with open(path, "rb") as f:     # Caffe's ReadFileToDatum: the file's own bytes
                datum.data = f.read()
        else:
            datum.data = encode_image(image, encoding)
        datum.encoded = True
    else:
        datum.channels, datum.height, datum.width = (int(d) for d in chw.shape)
        datum.data = numpy.ascontiguousarray(chw).tobytes()
    return datum, tuple(chw.shape)


def convert(root_folder, list_file, db_name, gray=False, shuffle=False, seed=None,
            resize_height=0, resize_width=0, check_size=False, encoded=False, encode_type="",
            backend="lmdb", log=None):
    """Write the database (see the module docstring); returns the number of records written.

    Raises:
        CaffeError / ToolError: an unknown backend, an unreadable list, an existing DB_NAME, a size
            mismatch with ``check_size``, an unknown encoding.
    """
    from ..log import logger
    from ..layers.image_data import caffe_shuffle
    from ..rng import CaffeRNG
    from ..io.db import backend_name, open_writer
    log = log or logger
    backend = backend_name(backend)
    lines = read_list(list_file)
    if shuffle:
        log.info("Shuffling data")
        if seed is None:
            seed = (int(time.time() * 1e6) ^ os.getpid()) & 0xFFFFFFFF
        caffe_shuffle(lines, CaffeRNG(seed))
    log.info("A total of %d images.", len(lines))
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
    encoded = encoded or bool(encode_type)
    resize_height, resize_width = max(0, resize_height), max(0, resize_width)
    writer = open_writer(db_name, backend)
    size = None
    count = 0
    try:
        for line_id, (name, label) in enumerate(progress(lines, total=len(lines), desc=PROG, unit="img")):
            enc = encode_type
            if encoded and not enc:
                enc = os.path.splitext(name)[1][1:].lower()
                if not enc:
                    log.warning("Failed to guess the encoding of '%s'", name)
                    enc = "png"
            path = os.path.join(root_folder, name)
            datum, shape = image_to_datum(path, label, resize_height, resize_width, not gray, enc)
            if datum is None:
                log.error("Could not open or find file %s", path)
                continue
            if check_size:
                if size is None:
                    size = shape
                elif shape != size:
                    raise ToolError(f"Incorrect data field size: '{name}' is {'x'.join(map(str, shape))}, "
                                    f"the first image {'x'.join(map(str, size))} (--check_size)")
            writer.put(f"{line_id:08d}_{name}".encode(), datum.SerializeToString())
            count += 1
            if count % 1000 == 0:
                log.info("Processed %d files.", count)
    finally:
        writer.close()
    if count % 1000:
        log.info("Processed %d files.", count)
    return count


def _main(argv):
    args = build_parser().parse_args(argv)
    start_logging()
    convert(args.root_folder, args.list_file, args.db_name, gray=args.gray, shuffle=args.shuffle,
            seed=args.seed, resize_height=args.resize_height, resize_width=args.resize_width,
            check_size=args.check_size, encoded=args.encoded, encode_type=args.encode_type,
            backend=args.backend)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
