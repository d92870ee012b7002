"""LMDB databases of serialized records, read the way Caffe's Data layer reads them.

Caffe: src/caffe/util/db_lmdb.cpp (LMDB, LMDBCursor), src/caffe/layers/data_layer.cpp (``Next``).

A :class:`LMDBCursor` walks the records in key order (LMDB's byte order) and, at the end, wraps to the
first record and logs ``Restarting data prefetching from start.`` at INFO on the ``caffe_engine``
logger, exactly when Caffe's ``DataLayer::Next`` does. The environment is opened read-only, without a
lock file and without readahead, so databases on read-only filesystems can be read; it stays open for
the cursor's life (call :meth:`LMDBCursor.close` or let it be collected). Cursors on one database
share its environment (Python's lmdb allows one per process) and each has its own read transaction.

:func:`write_lmdb` writes ``(key, value)`` pairs into a new database (used by the tools that convert
datasets, e.g. ``tools/create_mnist.py``); :class:`LMDBWriter` streams them in transactions of
1,000 (convert_imageset, extract_features, convert_db). :mod:`caffe_engine.io.db` chooses between
this backend and LevelDB's (:mod:`caffe_engine.io.leveldb_source`), which has the same interface.
"""
import logging
import os
import threading

from ..errors import CaffeError
from .closing import Closing

logger = logging.getLogger("caffe_engine")

#: The smallest map size write_lmdb picks (256 MiB: the size recorded in shared/data/mnist_5k's
#: LMDBs, so that tools/create_mnist.py reproduces them byte for byte). LMDB does not allocate it.
MIN_MAP_SIZE = 256 * 1024 * 1024


def _lmdb():
    try:
        import lmdb
    except ImportError:  # pragma: no cover - depends on the environment
        raise CaffeError("reading LMDB data needs the 'lmdb' package (pip install lmdb)") from None
    return lmdb


def _open_env(path, readonly=True, map_size=10 * 1024 * 1024):
    lmdb = _lmdb()
    if readonly and not os.path.exists(path):
        raise CaffeError(f"cannot open LMDB '{path}': no such file or directory")
    # Caffe opens the directory holding data.mdb; a path to a data file is accepted too.
    subdir = not os.path.isfile(path)
    if readonly and subdir and not os.path.exists(os.path.join(path, "data.mdb")) \
            and os.path.isfile(os.path.join(path, "CURRENT")):
        raise CaffeError(f"'{path}' is a LevelDB, not an LMDB (use the LEVELDB backend)")
    try:
        env = lmdb.open(path, readonly=readonly, lock=False, readahead=False, subdir=subdir,
                        map_size=map_size, create=not readonly, max_dbs=0)
    except lmdb.Error as exc:
        raise CaffeError(f"cannot open LMDB '{path}': {exc}") from None
    if readonly:
        _check_length(env, path, os.path.join(path, "data.mdb") if subdir else path)
    return env


def _check_length(env, path, data_file):
    """Refuse a data file shorter than the pages its own header says are in use: LMDB maps the
    file and a read of a page past its end is a SIGBUS that kills the process (a truncated
    copy, a full disk while it was written). The meta page's last page number and page size
    are what mdb_env_open read from the header; nothing past it has been touched yet.

    Raises:
        CaffeError: naming the file, its length and the length the header needs.
    """
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        length = os.path.getsize(data_file)
    except (OSError, KeyError) as exc:
        env.close()
        raise CaffeError(f"cannot open LMDB '{path}': {exc}") from None
    if length < needed:
        env.close()
        raise CaffeError(f"LMDB '{path}' is truncated: {data_file} holds {length} bytes but its "
                         f"header uses {needed}")


# Python's lmdb refuses to open one environment twice in a process, but a TRAIN and a TEST net
# may read the same database: read-only environments are shared, counted, closed with the last
# user. Each cursor still has its own read transaction (lmdb opens environments with MDB_NOTLS).
# Re-entrant: a cursor collected while this thread holds the lock (the garbage collector can run
# inside lmdb.open in _acquire_env) releases its environment from __del__ on the same thread;
# with a plain Lock that __del__ would wait for itself forever.
_shared_envs = {}
_shared_lock = threading.RLock()


def _acquire_env(path):
    key = os.path.realpath(path)
    with _shared_lock:
        entry = _shared_envs.get(key)
        if entry is None:
            entry = _shared_envs[key] = [_open_env(path), 0]
        entry[1] += 1
        return key, entry[0]


def _release_env(key):
    with _shared_lock:
        entry = _shared_envs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            del _shared_envs[key]
            entry[0].close()


class LMDBCursor(Closing):
    """A wrapping cursor over an LMDB's records in key order (Caffe's LMDBCursor plus ``Next``).

    Args:
        path: the database directory (the one holding ``data.mdb``), as ``data_param.source``.

    Attributes:
        path: the path as given.
        size: the number of records.
        offset: how many times :meth:`next` has advanced (Caffe's ``offset_``).

    Raises:
        CaffeError: the path is missing, is not an LMDB, cannot be read, or holds no records.
    """

    def __init__(self, path):
        self.path = str(path)
        self._txn = None
        self._env_key, env = _acquire_env(self.path)
        lmdb = _lmdb()
        try:
            self.size = env.stat()["entries"]
            # One read transaction for the cursor's life; buffers=False returns bytes that stay
            # valid after the cursor moves.
            self._txn = env.begin(buffers=False)
            self._cursor = self._txn.cursor()
            has_first = self._cursor.first()
        except lmdb.Error as exc:
            self.close()
            raise CaffeError(f"cannot read LMDB '{self.path}': {exc}") from None
        if not has_first:
            self.close()
            raise CaffeError(f"LMDB '{self.path}' holds no records")
        self.offset = 0

    def __len__(self):
        return self.size

    def key(self):
        """The current record's key (bytes)."""
        return self._cursor.key()

    def value(self):
        """The current record's value (bytes), e.g. a serialized ``Datum``."""
        return self._cursor.value()

    def next(self):
        """Advance one record; past the last one, log the restart and go back to the first."""
        if not self._cursor.next():
            logger.info("Restarting data prefetching from start.")
            self._cursor.first()
        self.offset += 1

    def seek_to_first(self):
        """Go back to the first record (``offset`` is kept, as in Caffe)."""
        self._cursor.first()

    def seek(self, key):
        """Position on the record ``key`` (bytes); False, and the position unchanged, if the
        database has no such key. ``offset`` is not changed."""
        current = self._cursor.key()
        if self._cursor.set_key(bytes(key)):
            return True
        self._cursor.set_key(current)
        return False

    def close(self):
        """End the read transaction and release the environment (idempotent)."""
        txn, self._txn = getattr(self, "_txn", None), None
        if txn is not None:
            txn.abort()
        key, self._env_key = getattr(self, "_env_key", None), None
        if key is not None:
            _release_env(key)


def read_all(path):
    """All ``(key, value)`` pairs of the LMDB at ``path`` in key order, as a list of bytes pairs."""
    key, env = _acquire_env(str(path))
    try:
        with env.begin(buffers=False) as txn:
            return list(txn.cursor())
    finally:
        _release_env(key)


def iter_items(path):
    """``(key, value)`` bytes pairs of the LMDB at ``path`` in key order, one at a time (in one
    read transaction).

    Raises:
        CaffeError: the path is missing, is not an LMDB or cannot be read.
    """
    lmdb = _lmdb()
    key, env = _acquire_env(str(path))
    try:
        with env.begin(buffers=False) as txn:
            yield from txn.cursor()
    except lmdb.Error as exc:
        raise CaffeError(f"cannot read LMDB '{path}': {exc}") from None
    finally:
        _release_env(key)


def write_lmdb(path, items, map_size=None):
    """Write ``(key, value)`` byte pairs into a new LMDB directory ``path`` in one transaction.

    Args:
        path: directory to create; it must not exist yet (Caffe's ``db::NEW`` refuses too).
        items: iterable of ``(key, value)`` bytes pairs; records are stored in key order whatever
            the order given.
        map_size: the LMDB map size in bytes; ``None`` picks 256 MiB or, for bigger data, about
            twice the payload rounded up to a MiB.

    Returns:
        The number of records written.

    Raises:
        CaffeError: ``path`` exists, or LMDB reports an error (e.g. the map is full).
    """
    path = str(path)
    if os.path.exists(path):
        raise CaffeError(f"cannot create LMDB '{path}': it already exists")
    items = list(items)
    if map_size is None:
        payload = sum(len(k) + len(v) + 64 for k, v in items)
        map_size = max(MIN_MAP_SIZE, -(-2 * payload // (1 << 20)) << 20)
    lmdb = _lmdb()
    os.makedirs(path)
    env = _open_env(path, readonly=False, map_size=map_size)
    try:
        with env.begin(write=True) as txn:
            for key, value in items:
                txn.put(key, value)
    except lmdb.Error as exc:
        raise CaffeError(f"cannot write LMDB '{path}': {exc}") from None
    finally:
        env.close()
    return len(items)


class LMDBWriter:
    """Put records into a new LMDB, committing every ``commit_every`` puts (as Caffe's tools:
    tools/convert_imageset.cpp, extract_features.cpp; the transaction of src/caffe/util/db_lmdb.cpp).

    The map grows by doubling when it fills (the pending records are written again).

    Args:
        path: the directory to create; it must not exist (Caffe's ``db::NEW``).
        commit_every: records per write transaction.
        map_size: the first map size in bytes.

    Attributes:
        path, count (records put so far).

    Raises:
        CaffeError: the path exists or LMDB fails.
    """

    def __init__(self, path, commit_every=1000, map_size=1 << 28):
        lmdb = self._lmdb = _lmdb()
        self.path = str(path)
        if os.path.exists(self.path):
            raise CaffeError(f"cannot create LMDB '{self.path}': it already exists")
        os.makedirs(self.path)
        try:
            self.env = lmdb.open(self.path, map_size=map_size, subdir=True, lock=True)
        except lmdb.Error as exc:
            raise CaffeError(f"cannot create LMDB '{self.path}': {exc}") from None
        self.commit_every = commit_every
        self.pending = []
        self.count = 0

    def put(self, key, value):
        """Add ``value`` (bytes) under ``key`` (bytes); commits every ``commit_every`` puts."""
        self.pending.append((key, value))
        self.count += 1
        if len(self.pending) >= self.commit_every:
            self.commit()

    def commit(self):
        """Write the pending records in one transaction (growing the map when it is full)."""
        lmdb = self._lmdb
        while self.pending:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self.pending:
                        txn.put(key, value)
                self.pending = []
            except lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise CaffeError(f"cannot write LMDB '{self.path}': {exc}") from None

    def close(self):
        """Commit what is pending and close the environment (idempotent)."""
        env = getattr(self, "env", None)
        if env is None:
            return
        try:
            self.commit()
        finally:
            self.env = None
            env.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
