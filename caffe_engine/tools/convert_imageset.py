"""convert_imageset: a list of images and labels -> an LMDB or LevelDB of Caffe ``Datum`` records.

Caffe: tools/convert_imageset.cpp, src/caffe/util/io.cpp (``ReadImageToDatum``, ``matchExt``,
``ReadFileToDatum``, ``CVMatToDatum``).

Usage::

    convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

LISTFILE has one ``relative/path.jpg LABEL`` per line (the label after the last space, so names
may hold spaces). Each line becomes one record under the key ``%08d_<path>`` of its position in
the (shuffled) list. A file that cannot be read is logged (``Could not open or find file``) and
skipped, its number used up, as in Caffe. ``--backend`` ``lmdb`` (default) or ``leveldb``;
records are committed 1,000 at a time, as Caffe's.

Each image is read as Caffe's ``ReadImageToDatum`` does, through OpenCV itself
(:mod:`caffe_engine.io.images`): ``cv::imread`` in colour (BGR) or, with ``--gray``, grey; then
``cv::resize`` (bilinear) to ``--resize_height`` x ``--resize_width`` when both are > 0. Then:

* without an encoding: a raw Datum, ``channels``/``height``/``width`` set and ``data`` the
  (C, H, W) uint8 bytes (Caffe's ``CVMatToDatum``);
* with an encoding (``--encoded``, or ``--encode_type=jpg|png|...``, which implies it with
  Caffe's INFO line ``encode_type specified, assuming encoded=true.``): ``encoded: true`` and no
  sizes; ``data`` is the file's own bytes (``ReadFileToDatum``) when the image needs no change
  (no resize, and the decoded image has 3 channels exactly when colour was asked for) and the
  file's extension matches the encoding (Caffe's ``matchExt``: the text after the path's last
  dot, lower-cased, equals the encoding, or is ``jpeg`` for the encoding ``jpg``, not the other
  way round); otherwise the decoded (and resized) image compressed by ``cv2.imencode("." +
  encoding)`` with OpenCV's default parameters (JPEG quality 95, PNG compression 1), exactly as
  Caffe's ``cv::imencode``. ``--encoded`` without ``--encode_type`` uses each file's extension,
  lower-cased, as its encoding.

  Caffe's colour test looks at the *decoded* image, which ``imread`` always gives 3 channels in
  colour and 1 in grey, so it never fails: a grey ``.png`` converted in colour mode, or a colour
  ``.jpg`` converted with ``--gray``, is stored as the file's own bytes, and its records decode
  (natively, as the Data layer does without ``force_color`` / ``force_gray``) with the file's
  own channels. This is reproduced as is; set ``transform_param { force_color: true }`` (or
  ``force_gray``) in the Data layer, or re-encode with a resize or another ``--encode_type``.

``--shuffle`` shuffles the lines first with Caffe's ``shuffle`` over a mt19937 stream seeded by
``--seed`` (default: from the clock, as Caffe's is).

Differences from Caffe, on purpose:

* ``--check_size``: Caffe compares each record's ``data`` length with the first record's
  ``channels * height * width``. Encoded records have neither sizes nor a ``data`` length that
  tells the image's size, so Caffe stops on the second encoded record whatever the images.
  Here, with an encoding, the check compares the decoded (and resized) images' (C, H, W)
  instead, which is what a user checking an encoded set needs; without one it is Caffe's
  (``data`` length against the first record's C*H*W). Either way a mismatch stops the tool with
  one line naming the file and both sizes.
* ``--encoded`` without ``--encode_type`` and a name whose file name has no extension (no dot
  after the last ``/``, or a final dot): Caffe logs ``Failed to guess the encoding`` and goes on
  with the whole name as the encoding, so ``cv::imencode`` then throws and the tool aborts (or,
  by accident, stores the file's bytes). Here the list is checked before anything is written,
  and the tool stops with one line naming the line and file and asking for ``--encode_type``.
  A guessed or given encoding that OpenCV cannot write stops the tool, naming the file, when
  the first image that needs re-encoding comes (Caffe's uncaught ``cv::Exception``).
* Errors are one line on stderr and exit status 1 (Caffe: a ``CHECK`` failure and a core
  dump), and a failed or interrupted run leaves no DB_NAME behind: the database is written
  into a hidden sibling folder (``.DB_NAME.partial-<pid>``) and renamed to DB_NAME only when
  complete (Caffe leaves the records committed so far). DB_NAME must not exist, as in Caffe.
* Blank lines of LISTFILE are skipped (Caffe reads them as an empty name, a file that cannot be
  read, so a blank line in the middle shifts the following keys' numbers by one there).
"""
import os
import shutil
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
    add_bool(p, "check_size", "check that all the images have the same size (with --encoded: "
             "the decoded images' channels, height and width)")
    add_bool(p, "encoded", "store the encoded image in the datum")
    p.add_argument("--encode_type", default="",
                   help="what type to encode the image as ('png', 'jpg', ...); implies --encoded")
    return p


def read_list(path):
    """``[(filename, label)]`` from a list file (label after the last space; blank lines skipped).

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


def _ascii_lower(text):
    """Lower-case ASCII letters only (C's ``::tolower`` in the "C" locale, as Caffe calls it)."""
    return "".join(c.lower() if c.isascii() else c for c in text)


def match_ext(filename, encoding):
    """Caffe's ``matchExt``: does ``filename``'s extension match ``encoding``?

    The extension is what follows the last ``.`` of the whole path (the whole path when it has
    none); both are lower-cased; they match when equal, or when the encoding is ``jpg`` and the
    extension ``jpeg`` (not the other way round: a ``.jpg`` file with the encoding ``jpeg`` is
    re-encoded, as in Caffe).
    """
    dot = filename.rfind(".")
    ext = _ascii_lower(filename[dot + 1:] if dot >= 0 else filename)
    encoding = _ascii_lower(encoding)
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def guess_encoding(name):
    """The encoding ``--encoded`` alone uses for the list entry ``name``: its file name's
    extension, lower-cased (Caffe: what follows the name's last dot); None when the file name
    has none (no dot after the last ``/``, or nothing after the dot).

    Caffe, for a name without a dot, logs ``Failed to guess the encoding`` and uses the whole
    name as the encoding, which then makes ``cv::imencode`` throw (an abort) or, by accident,
    matches the path; a dot only in a folder name gives it a nonsense encoding the same way.
    The caller here turns None into a clear error before writing anything (see the module
    docstring).
    """
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    dot = base.rfind(".")
    if dot < 0 or dot == len(base) - 1:
        return None
    return _ascii_lower(base[dot + 1:])


def encode_image(image, encoding, name=None):
    """Compress a decoded uint8 image (BGR or grey, as OpenCV holds it) with
    ``cv2.imencode("." + encoding, image)`` and OpenCV's default parameters (Caffe's
    ``cv::imencode`` call).

    Raises:
        ToolError: OpenCV has no encoder for ``encoding`` or fails.
    """
    import cv2
    what = f"'{name}' " if name else ""
    try:
        ok, buf = cv2.imencode("." + encoding, image)
    except cv2.error:
        ok, buf = False, None
        if not cv2.haveImageWriter("." + encoding):
            raise ToolError(f"cannot encode {what}as '{encoding}': OpenCV has no encoder for "
                            f"'.{encoding}'; pass --encode_type=png (or jpg, ...)") from None
    if not ok:
        raise ToolError(f"cannot encode {what}as '{encoding}': cv2.imencode failed")
    return buf.tobytes()


def image_to_datum(path, label, height, width, is_color, encoding, name=None):
    """Caffe's ``ReadImageToDatum``: a Datum for one file, or None if it cannot be read.

    Args:
        path: the file.
        label: the Datum's label.
        height, width: resize to this size when both are > 0.
        is_color: decode in colour (BGR, 3 channels), else grey (1 channel).
        encoding: "" for a raw Datum, else the encoding of an encoded one (see the module
            docstring).
        name: the list's name of the file, for error messages.

    Returns:
        (datum, (C, H, W) of the decoded and resized image) or (None, None).

    Raises:
        ToolError: the image must be re-encoded and OpenCV cannot encode it as ``encoding``.
    """
    import numpy
    from ..errors import CaffeError
    from ..io.images import image_to_chw, read_image_resized
    from ..proto import caffe_pb2
    try:        # cv::imread, then cv::resize only when both sizes are > 0
        image = read_image_resized(path, height, width, is_color)
    except CaffeError:
        return None, None
    chw = image_to_chw(image)
    datum = caffe_pb2.Datum(label=label)
    if encoding:
        channels = 1 if image.ndim == 2 else image.shape[2]
        # Caffe's condition, `!height && !width` included: a resize of one side only (the
        # other 0) does not resize, yet re-encodes.
        if (channels == 3) == bool(is_color) and not height and not width and \
                match_ext(path, encoding):
            with open(path, "rb") as f:     # Caffe's ReadFileToDatum: the file's own bytes
                datum.data = f.read()
        else:
            datum.data = encode_image(image, encoding, name or path)
        datum.encoded = True
    else:                                   # Caffe's CVMatToDatum
        datum.channels, datum.height, datum.width = (int(d) for d in chw.shape)
        datum.data = numpy.ascontiguousarray(chw).tobytes()
    return datum, tuple(int(d) for d in chw.shape)


def _size_text(shape):
    return "x".join(str(d) for d in shape)


def _partial_path(db_name):
    """The hidden sibling folder the database is written into before its rename to DB_NAME."""
    path = os.path.abspath(db_name)
    folder, base = os.path.split(path)
    return os.path.join(folder, f".{base}.partial-{os.getpid()}")


def convert(root_folder, list_file, db_name, gray=False, shuffle=False, seed=None,
            resize_height=0, resize_width=0, check_size=False, encoded=False, encode_type="",
            backend="lmdb", log=None):
    """Write the database (see the module docstring); returns the number of records written.

    The records go to a hidden sibling folder renamed to ``db_name`` at the end; on any error
    (or Ctrl-C) that folder is removed, so ``db_name`` is either complete or absent.

    Raises:
        CaffeError / ToolError: an unknown backend, an unreadable list, an existing DB_NAME, a
            name without extension with ``--encoded`` alone, a size mismatch with
            ``check_size``, an encoding OpenCV cannot write.
    """
    from ..log import logger
    from ..io.db import backend_name
    log = log or logger
    backend = backend_name(backend)
    lines = _read_lines(list_file, shuffle, seed, log)
    if encode_type and not encoded:
        log.info("encode_type specified, assuming encoded=true.")
    encoded = encoded or bool(encode_type)
    encodings = _encodings(lines, list_file, encoded, encode_type)
    db_kind = "LMDB" if backend == "lmdb" else "LevelDB"
    if os.path.lexists(db_name):
        raise ToolError(f"cannot create {db_kind} '{db_name}': it already exists")
    partial, writer = _open_partial(db_name, backend)
    try:
        count = _write_records(writer, root_folder, lines, encodings, max(0, resize_height),
                               max(0, resize_width), not gray, check_size, encoded, log)
        writer.close()
        if os.path.lexists(db_name):    # created by someone else meanwhile: keep theirs
            raise ToolError(f"cannot create {db_kind} '{db_name}': it already exists")
        os.rename(partial, db_name)
    except BaseException:
        try:
            writer.close()
        except Exception:               # the error being raised is the one to report
            pass
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if count % 1000:
        log.info("Processed %d files.", count)
    return count


def _read_lines(list_file, shuffle, seed, log):
    """The list's ``[(name, label)]``, shuffled with Caffe's ``shuffle`` over a mt19937 stream
    seeded by ``seed`` (from the clock when None) when ``shuffle``."""
    from ..layers.image_data import caffe_shuffle
    from ..rng import CaffeRNG
    lines = read_list(list_file)
    if shuffle:
        log.info("Shuffling data")
        if seed is None:
            seed = (int(time.time() * 1e6) ^ os.getpid()) & 0xFFFFFFFF
        caffe_shuffle(lines, CaffeRNG(seed))
    log.info("A total of %d images.", len(lines))
    return lines


def _encodings(lines, list_file, encoded, encode_type):
    """Each line's encoding: "" (raw records), ``encode_type``, or with ``encoded`` alone the
    file name's extension (:func:`guess_encoding`).

    Raises:
        ToolError: a name without an extension with ``encoded`` alone. Caffe's run aborts at
            that image (see guess_encoding); here it is an error before anything is written,
            naming the first such entry.
    """
    encodings = [encode_type] * len(lines) if encoded else [""] * len(lines)
    if encoded and not encode_type:
        for line_id, (name, _) in enumerate(lines):
            encodings[line_id] = guess_encoding(name)
            if encodings[line_id] is None:
                raise ToolError(f"cannot guess the encoding of '{name}' (entry {line_id + 1} "
                                f"of {list_file}): its file name has no extension; pass "
                                f"--encode_type=png (or jpg, ...)")
    return encodings


def _open_partial(db_name, backend):
    """``(partial, writer)``: a writer of a new database in :func:`_partial_path`'s folder."""
    from ..io.db import open_writer
    partial = _partial_path(db_name)
    if os.path.lexists(partial):        # left by a killed run with the same pid: not ours to keep
        shutil.rmtree(partial, ignore_errors=True)
    try:
        writer = open_writer(partial, backend)
    except BaseException:               # e.g. LMDB made the folder, then failed to open it
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return partial, writer


def _write_records(writer, root_folder, lines, encodings, resize_height, resize_width,
                   is_color, check_size, encoded, log):
    """Each readable image of ``lines`` put as one record under ``%08d_<name>`` (an unreadable
    one logged and skipped, its number used up); returns the number of records put."""
    count = 0
    first = None
    for line_id, (name, label) in enumerate(progress(lines, total=len(lines), desc=PROG, unit="img")):
        path = os.path.join(root_folder, name)
        datum, shape = image_to_datum(path, label, resize_height, resize_width, is_color,
                                      encodings[line_id], name)
        if datum is None:
            log.error("Could not open or find file %s", path)
            continue
        if check_size:
            first = _check_size(first, name, shape, datum, encoded)
        writer.put(f"{line_id:08d}_{name}".encode(), datum.SerializeToString())
        count += 1
        if count % 1000 == 0:
            log.info("Processed %d files.", count)
    return count


def _check_size(first, name, shape, datum, encoded):
    """``--check_size`` for one record: ``first`` is ``(shape, name)`` of the first record
    (None for the first itself), which is returned. With an encoding the decoded images'
    (C, H, W) are compared, on purpose not Caffe's rule (see the module docstring); without
    one, Caffe's: the ``data`` length against the first's C*H*W.

    Raises:
        ToolError: a mismatch, naming both files and sizes.
    """
    if first is None:
        return shape, name
    size, first_name = first
    if encoded:
        if shape != size:
            raise ToolError(f"Incorrect image size: '{name}' decodes to "
                            f"{_size_text(shape)} (CxHxW), the first image '{first_name}' "
                            f"to {_size_text(size)} (--check_size)")
    elif len(datum.data) != size[0] * size[1] * size[2]:
        raise ToolError(f"Incorrect data field size {len(datum.data)}: '{name}' "
                        f"is {_size_text(shape)} (CxHxW), the first image "
                        f"'{first_name}' {_size_text(size)} (--check_size)")
    return first


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
