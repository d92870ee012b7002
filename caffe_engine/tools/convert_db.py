"""convert_db: copy a database from one of Caffe's backends to the other (LevelDB <-> LMDB).

Not a Caffe tool: for moving datasets between ``backend: LEVELDB`` (Caffe's default, and that of
many older nets) and ``backend: LMDB``. Caffe's own writers are used as they are in
tools/convert_imageset.cpp (src/caffe/util/db_lmdb.cpp, db_leveldb.cpp: transactions of 1,000
records); the readers are the Data layer's (:mod:`caffe_engine.io.db`).

Usage::

    convert_db SRC DST [--from leveldb|lmdb] [--to lmdb|leveldb]

``--from`` defaults to what SRC is (``data.mdb``: LMDB, ``CURRENT``: LevelDB) and ``--to`` to the
other backend. Every record is copied with the same key and the same value bytes, in key order
(both backends sort keys bytewise, so a Data layer reads the copy in the same order and trains to
the same numbers). DST must not exist; the copy is written into a temporary folder beside it
and renamed to DST only when complete, so an error or Ctrl-C leaves no half-written DST.
"""
import os
import shutil
import sys
import tempfile

from ..errors import CaffeError
from ._common import Parser, ToolError, progress, run, start_logging

PROG = "convert_db"


def build_parser():
    p = Parser(prog=PROG, description="Copy a Caffe database between the leveldb and lmdb "
               "backends (same keys, same values, same order).",
               epilog="Example: convert_db mnist_train_leveldb mnist_train_lmdb --from leveldb "
               "--to lmdb")
    p.add_argument("src", metavar="SRC", help="the database folder to read")
    p.add_argument("dst", metavar="DST", help="the database folder to create (must not exist)")
    p.add_argument("--from", dest="src_backend", choices=("leveldb", "lmdb"), default=None,
                   help="the backend of SRC (default: detected from its files)")
    p.add_argument("--to", dest="dst_backend", choices=("leveldb", "lmdb"), default=None,
                   help="the backend of DST (default: the other one)")
    return p


def convert(src, dst, src_backend=None, dst_backend=None, log=None):
    """Copy every record of the database ``src`` into a new database ``dst``.

    Args:
        src: the database folder to read.
        dst: the folder to create; it must not exist, its parent must.
        src_backend: ``"lmdb"`` / ``"leveldb"`` (or a DataParameter.DB value); None: detected.
        dst_backend: likewise; None: the other backend than ``src_backend``.
        log: a logger (default: the engine's).

    Returns:
        the number of records copied.

    Raises:
        CaffeError / ToolError (one line naming the path): ``src`` missing, not a database of
            ``src_backend``, unreadable or corrupt; ``dst`` existing or not creatable; a backend
            error while writing. ``dst`` is then left absent.
    """
    from ..io.db import backend_name, detect_backend, iter_items, open_writer
    from ..log import logger
    log = log or logger
    src, dst = str(src), str(dst)
    src_backend = backend_name(src_backend) if src_backend is not None else detect_backend(src)
    if dst_backend is None:
        dst_backend = "lmdb" if src_backend == "leveldb" else "leveldb"
    dst_backend = backend_name(dst_backend)
    if not os.path.exists(src):
        raise ToolError(f"cannot open {src_backend} '{src}': no such file or directory")
    if os.path.lexists(dst):
        raise ToolError(f"cannot create {dst_backend} '{dst}': it already exists")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ToolError(f"cannot create {dst_backend} '{dst}': folder '{parent}' does not exist")
    try:
        holder = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(dst))}.",
                                  suffix=".convert_db", dir=parent)
    except OSError as exc:
        raise ToolError(f"cannot create {dst_backend} '{dst}': {exc.strerror}") from None
    partial = os.path.join(holder, "db")
    writer = items = None
    try:
        items = iter_items(src, src_backend)
        first = next(items, None)               # opens SRC: its errors come before any output
        log.info("Converting %s %s to %s %s", src_backend, src, dst_backend, dst)
        writer = open_writer(partial, dst_backend)
        if first is not None:
            writer.put(*first)
        for key, value in progress(items, desc=PROG, unit="rec"):
            writer.put(key, value)
            if writer.count % 10000 == 0:
                log.info("Processed %d records.", writer.count)
        writer.close()
        if os.path.lexists(dst):
            raise ToolError(f"cannot create {dst_backend} '{dst}': it appeared while converting")
        try:
            os.rename(partial, dst)
        except OSError as exc:
            raise ToolError(f"cannot create {dst_backend} '{dst}': {exc.strerror}") from None
    except BaseException as exc:
        if writer is not None:
            try:
                writer.close()
            except Exception:
                pass
        if isinstance(exc, CaffeError) and partial in str(exc):
            # Name the destination the user gave, not the temporary folder (removed below).
            raise ToolError(str(exc).replace(partial, dst)) from None
        raise
    finally:
        if items is not None:
            items.close()
        shutil.rmtree(holder, ignore_errors=True)
    log.info("Wrote %d records to %s %s", writer.count, dst_backend, dst)
    return writer.count


def _main(argv):
    args = build_parser().parse_args(argv)
    start_logging()
    convert(args.src, args.dst, args.src_backend, args.dst_backend)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
