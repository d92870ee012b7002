"""LevelDB databases of serialized records, read and written the way Caffe's LevelDB backend does.

Caffe: src/caffe/util/db_leveldb.cpp, include/caffe/util/db_leveldb.hpp (LevelDB, LevelDBCursor,
LevelDBTransaction), src/caffe/layers/data_layer.cpp (``Next``).

Through the maintained binding `plyvel <https://plyvel.readthedocs.io>`_. The database is opened
with Caffe's options: ``block_size`` 65536, ``write_buffer_size`` 268435456, ``max_open_files``
100, ``create_if_missing`` unless reading, ``error_if_exists`` for a new database. Reading also
asks LevelDB for checksummed reads and paranoid checks, so a damaged file stops with an error
instead of being skipped in silence (Caffe's defaults would drop the damaged records).

A :class:`LevelDBCursor` behaves as :class:`~caffe_engine.io.lmdb_source.LMDBCursor`: records in
key order (LevelDB's default comparator: bytewise, the same order as LMDB's), and at the end it
wraps to the first record and logs ``Restarting data prefetching from start.``. LevelDB allows
one open handle per database and process (its ``LOCK`` file), so cursors on one database share
the handle (counted, closed with the last user); each cursor has its own iterator, which reads
the database as it was when the cursor was made (LevelDB's implicit snapshot).

LevelDB writes into its folder even to read (the ``LOCK`` file, a new log, the ``MANIFEST``). A
database in a folder this process may not write (a read-only filesystem, another user's files)
is copied into a temporary folder first, read there and the copy removed when the last cursor
closes (or at exit); a WARNING line says so.

:class:`LevelDBWriter` is Caffe's LevelDB transaction: puts collect in a ``WriteBatch`` written
by :meth:`LevelDBWriter.commit` (the tools commit every 1,000 records, as Caffe's do).
"""
import atexit
import logging
import os
import shutil
import tempfile
import threading

from ..errors import CaffeError
from .closing import Closing

logger = logging.getLogger("caffe_engine")

#: Caffe's options (src/caffe/util/db_leveldb.cpp, LevelDB::Open).
BLOCK_SIZE = 65536
WRITE_BUFFER_SIZE = 268435456
MAX_OPEN_FILES = 100


def _plyvel():
    try:
        import plyvel
    except ImportError:  # pragma: no cover - depends on the environment
        raise CaffeError("LevelDB data needs the 'plyvel' package (pip install plyvel)") from None
    return plyvel


def _status(exc):
    """LevelDB's status text of a plyvel error, on one line."""
    text = exc.args[0] if exc.args else str(exc)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " ".join(str(text).split())


def _describe(path, exc, doing="open"):
    plyvel = _plyvel()
    if isinstance(exc, plyvel.CorruptionError):
        return f"LevelDB '{path}' is corrupt: {_status(exc)}"
    return f"cannot {doing} LevelDB '{path}': {_status(exc)}"


def check_leveldb(path):
    """Raise a one-line CaffeError unless ``path`` looks like a LevelDB folder.

    Checked before LevelDB sees the path, because LevelDB creates a missing folder and writes its
    ``LOCK`` and ``LOG`` files into any folder it is asked to open, even one that is no database.

    Raises:
        CaffeError: ``path`` is missing, not a folder, an LMDB, or has no ``CURRENT`` file.
    """
    path = str(path)
    if not os.path.exists(path):
        raise CaffeError(f"cannot open LevelDB '{path}': no such file or directory")
    if not os.path.isdir(path):
        raise CaffeError(f"'{path}' is not a LevelDB (a LevelDB is a folder)")
    if not os.path.isfile(os.path.join(path, "CURRENT")):
        if os.path.isfile(os.path.join(path, "data.mdb")):
            raise CaffeError(f"'{path}' is an LMDB, not a LevelDB (use the LMDB backend)")
        raise CaffeError(f"'{path}' is not a LevelDB (it has no CURRENT file)")


def _open_db(path, create=False):
    """A plyvel DB with Caffe's options; ``create``: Caffe's db::NEW, else db::READ."""
    plyvel = _plyvel()
    options = dict(block_size=BLOCK_SIZE, write_buffer_size=WRITE_BUFFER_SIZE,
                   max_open_files=MAX_OPEN_FILES, create_if_missing=create, error_if_exists=create)
    if not create:
        options["paranoid_checks"] = True
    return plyvel.DB(path, **options)


def _read_only_folder(path, exc):
    if isinstance(exc, _plyvel().CorruptionError):
        return False
    text = _status(exc).lower()
    return (not os.access(path, os.W_OK) or "read-only file system" in text
            or "permission denied" in text)


class _Handle:
    """One open database (perhaps a temporary copy) and how many cursors use it."""

    def __init__(self, path):
        self.path = path
        self.copy_dir = None
        self.users = 0
        check_leveldb(path)
        plyvel = _plyvel()
        try:
            self.db = _open_db(path)
        except plyvel.Error as exc:
            if not _read_only_folder(path, exc):
                raise CaffeError(_describe(path, exc)) from None
            self.db = self._open_copy(path, exc)

    def _open_copy(self, path, first_exc):
        plyvel = _plyvel()
        self.copy_dir = tempfile.mkdtemp(prefix="caffe_engine_leveldb_")
        copy = os.path.join(self.copy_dir, "db")
        try:
            shutil.copytree(path, copy, ignore=shutil.ignore_patterns("LOCK"))
            for folder, dirs, names in os.walk(copy):   # copies of read-only files stay read-only
                for name in dirs + names:
                    os.chmod(os.path.join(folder, name), 0o700 if name in dirs else 0o600)
            os.chmod(copy, 0o700)
            logger.warning("LevelDB '%s' is in a folder this process cannot write (%s); LevelDB "
                           "writes there even to read, so reading a copy in %s", path,
                           _status(first_exc), copy)
            return _open_db(copy)
        except (OSError, shutil.Error, plyvel.Error) as exc:
            self.remove_copy()
            detail = _status(exc) if isinstance(exc, plyvel.Error) else (
                getattr(exc, "strerror", None) or str(exc).splitlines()[0])
            raise CaffeError(f"cannot open LevelDB '{path}': its folder is read-only "
                             f"({_status(first_exc)}) and copying it to a temporary folder "
                             f"failed: {detail}") from None

    def remove_copy(self):
        copy_dir, self.copy_dir = self.copy_dir, None
        if copy_dir is not None:
            shutil.rmtree(copy_dir, ignore_errors=True)

    def close(self):
        try:
            self.db.close()
        finally:
            self.remove_copy()


# LevelDB's LOCK allows one handle per database and process, but a TRAIN and a TEST net may read
# the same database: handles are shared, counted, closed with the last user. Re-entrant for the
# same reason as lmdb_source's: a cursor collected during an open releases from __del__.
_shared = {}
_shared_lock = threading.RLock()


def _acquire(path):
    key = os.path.realpath(path)
    with _shared_lock:
        handle = _shared.get(key)
        if handle is None:
            handle = _shared[key] = _Handle(path)
        handle.users += 1
        return key, handle


@atexit.register
def _remove_copies():
    """Temporary copies of read-only databases still open at exit are removed too."""
    for handle in list(_shared.values()):
        handle.remove_copy()


def _release(key):
    with _shared_lock:
        handle = _shared.get(key)
        if handle is None:
            return
        handle.users -= 1
        if handle.users <= 0:
            del _shared[key]
            handle.close()


class LevelDBCursor(Closing):
    """A wrapping cursor over a LevelDB's records in key order (Caffe's LevelDBCursor plus
    DataLayer's ``Next``); the same interface as :class:`~caffe_engine.io.lmdb_source.LMDBCursor`.

    Args:
        path: the database folder (the one holding ``CURRENT``), as ``data_param.source``.

    Attributes:
        path: the path as given.
        offset: how many times :meth:`next` has advanced (Caffe's ``offset_``).
        size: the number of records (counted by one pass over the keys on first use: LevelDB
            keeps no count; Caffe's ``LevelDB::Count`` returns -1).

    Raises:
        CaffeError: the path is missing, is not a LevelDB, cannot be opened (in a read-only folder
            only if copying it fails too), is corrupt, or holds no records.
    """

    def __init__(self, path):
        self.path = str(path)
        self._iter = None
        self._size = None
        self._key, self._handle = _acquire(self.path)
        plyvel = _plyvel()
        try:
            # Caffe's NewIterator(ReadOptions()); checksums verified here (see the module doc).
            self._iter = self._handle.db.iterator(verify_checksums=True)
            self._item = next(self._iter, None)
        except plyvel.Error as exc:
            self.close()
            raise CaffeError(_describe(self.path, exc, "read")) from None
        if self._item is None:
            self.close()
            raise CaffeError(f"LevelDB '{self.path}' holds no records")
        self.offset = 0

    @property
    def size(self):
        if self._size is None:
            plyvel = _plyvel()
            try:
                with self._handle.db.iterator(include_value=False) as keys:
                    self._size = sum(1 for _ in keys)
            except plyvel.Error as exc:
                raise CaffeError(_describe(self.path, exc, "read")) from None
        return self._size

    def __len__(self):
        return self.size

    def key(self):
        """The current record's key (bytes)."""
        return self._item[0]

    def value(self):
        """The current record's value (bytes), e.g. a serialized ``Datum``."""
        return self._item[1]

    def _step(self):
        try:
            return next(self._iter, None)
        except _plyvel().Error as exc:
            raise CaffeError(_describe(self.path, exc, "read")) from None

    def next(self):
        """Advance one record; past the last one, log the restart and go back to the first.

        Raises:
            CaffeError: LevelDB reports an error (e.g. a checksum mismatch).
        """
        item = self._step()
        if item is None:
            logger.info("Restarting data prefetching from start.")
            self._iter.seek_to_start()
            item = self._step()
        self._item = item
        self.offset += 1

    def seek_to_first(self):
        """Go back to the first record (``offset`` is kept, as in Caffe)."""
        self._iter.seek_to_start()
        self._item = self._step()

    def seek(self, key):
        """Position on the record ``key`` (bytes); False, and the position unchanged, if the
        database has no such key. ``offset`` is not changed."""
        self._iter.seek(bytes(key))
        item = self._step()
        if item is None or item[0] != bytes(key):
            self._iter.seek(self._item[0])
            self._step()
            return False
        self._item = item
        return True

    def close(self):
        """Close the iterator and release the database (idempotent)."""
        it, self._iter = getattr(self, "_iter", None), None
        if it is not None:
            it.close()
        key, self._key = getattr(self, "_key", None), None
        if key is not None:
            _release(key)


def iter_items(path):
    """``(key, value)`` bytes pairs of the LevelDB at ``path`` in key order, one at a time.

    Raises:
        CaffeError: as :class:`LevelDBCursor` (an empty database yields nothing).
    """
    plyvel = _plyvel()
    key, handle = _acquire(str(path))
    try:
        with handle.db.iterator(verify_checksums=True) as it:
            yield from it
    except plyvel.Error as exc:
        raise CaffeError(_describe(path, exc, "read")) from None
    finally:
        _release(key)


def read_all(path):
    """All ``(key, value)`` pairs of the LevelDB at ``path`` in key order, as a list."""
    return list(iter_items(path))


class LevelDBWriter:
    """Put records into a new LevelDB (Caffe's ``db::NEW`` and ``LevelDBTransaction``).

    Puts collect in a ``WriteBatch``; :meth:`commit` writes it, and :meth:`put` commits by
    itself every ``commit_every`` records (Caffe's tools commit every 1,000). :meth:`close`
    commits the rest.

    Args:
        path: the folder to create; it must not exist (Caffe: ``error_if_exists``).
        commit_every: records per batch; 0 or None: only on :meth:`commit` / :meth:`close`.

    Attributes:
        path, count (records put so far).

    Raises:
        CaffeError: the path exists or LevelDB fails.
    """

    def __init__(self, path, commit_every=1000):
        plyvel = _plyvel()
        self.path = str(path)
        if os.path.exists(self.path):
            raise CaffeError(f"cannot create LevelDB '{self.path}': it already exists")
        try:
            self.db = _open_db(self.path, create=True)
        except plyvel.Error as exc:
            raise CaffeError(_describe(self.path, exc, "create")) from None
        self.commit_every = commit_every or 0
        self.batch = self.db.write_batch()
        self.pending = 0
        self.count = 0

    def put(self, key, value):
        """Add ``value`` (bytes) under ``key`` (bytes) to the current batch."""
        self.batch.put(bytes(key), bytes(value))
        self.pending += 1
        self.count += 1
        if self.commit_every and self.pending >= self.commit_every:
            self.commit()

    def commit(self):
        """Write the current batch (Caffe's ``LevelDBTransaction::Commit``) and start a new one."""
        if not self.pending:
            return
        try:
            self.batch.write()
        except _plyvel().Error as exc:
            raise CaffeError(_describe(self.path, exc, "write")) from None
        self.batch = self.db.write_batch()
        self.pending = 0

    def close(self):
        """Commit what is pending and close the database (idempotent)."""
        db = getattr(self, "db", None)
        if db is None or db.closed:
            return
        try:
            self.commit()
        finally:
            db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_leveldb(path, items, commit_every=1000):
    """Write ``(key, value)`` byte pairs into a new LevelDB folder ``path``.

    Returns:
        The number of records written.

    Raises:
        CaffeError: ``path`` exists, or LevelDB reports an error.
    """
    with LevelDBWriter(path, commit_every) as writer:
        for key, value in items:
            writer.put(key, value)
    return writer.count
