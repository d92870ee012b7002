"""Caffe's two database backends behind one interface: LMDB and LevelDB.

Caffe: src/caffe/util/db.cpp (``GetDB``), include/caffe/util/db.hpp (DB, Cursor, Transaction).

Backends are named as Caffe names them: ``DataParameter.DB`` values (``LEVELDB`` 0, ``LMDB`` 1)
or the tools' strings ``"leveldb"`` / ``"lmdb"`` (any case). :func:`backend_name` turns either
into the string.

* :func:`open_db` returns a wrapping cursor, :class:`~caffe_engine.io.lmdb_source.LMDBCursor` or
  :class:`~caffe_engine.io.leveldb_source.LevelDBCursor`. Both have ``key()``, ``value()``
  (bytes), ``next()`` (past the last record: back to the first, with Caffe's
  ``Restarting data prefetching from start.``), ``seek_to_first()``, ``seek(key) -> bool``,
  ``offset``, ``size`` / ``len()``, ``path`` and ``close()`` (also as a context manager). Keys
  come in bytewise order in both.
* :func:`open_writer` returns a writer of a new database: ``put(key, value)``, ``commit()``,
  ``close()``, ``count``, committing every 1,000 records by itself as Caffe's tools do.
* :func:`iter_items` yields a database's ``(key, value)`` pairs in key order.
"""
import os

from ..errors import CaffeError

#: The backend names, in DataParameter.DB's order (LEVELDB = 0, LMDB = 1).
BACKENDS = ("leveldb", "lmdb")


def backend_name(backend):
    """``"lmdb"`` or ``"leveldb"`` for a DataParameter.DB value or a backend string.

    Raises:
        CaffeError: an unknown backend (Caffe: ``LOG(FATAL) << "Unknown database backend"``).
    """
    if isinstance(backend, str):
        name = backend.strip().lower()
        if name in BACKENDS:
            return name
    elif isinstance(backend, int) and 0 <= backend < len(BACKENDS):
        return BACKENDS[backend]
    raise CaffeError(f"unknown database backend {backend!r} (lmdb or leveldb)")


def detect_backend(path):
    """The backend of the database at ``path`` from its files: ``"lmdb"`` (``data.mdb``, or a
    plain file: an LMDB opened without subdir) or ``"leveldb"`` (``CURRENT``).

    Raises:
        CaffeError: ``path`` is missing or is neither.
    """
    path = str(path)
    if not os.path.exists(path):
        raise CaffeError(f"cannot open database '{path}': no such file or directory")
    if os.path.isfile(path) or os.path.isfile(os.path.join(path, "data.mdb")):
        return "lmdb"
    if os.path.isfile(os.path.join(path, "CURRENT")):
        return "leveldb"
    raise CaffeError(f"'{path}' is neither an LMDB (no data.mdb) nor a LevelDB (no CURRENT file)")


def _module(backend):
    """The backend's module: lmdb_source or leveldb_source (imported on first use)."""
    if backend_name(backend) == "lmdb":
        from . import lmdb_source
        return lmdb_source
    from . import leveldb_source
    return leveldb_source


def open_db(path, backend):
    """A wrapping cursor on the first record of the database at ``path`` (Caffe's
    ``GetDB(backend)->Open(path, READ)->NewCursor()``, plus DataLayer's wrap-around).

    Args:
        path: the database folder (``data_param.source``).
        backend: ``DataParameter.DB`` value or ``"lmdb"`` / ``"leveldb"``.

    Returns:
        an ``LMDBCursor`` or ``LevelDBCursor`` (see the module docstring).

    Raises:
        CaffeError: an unknown backend; the path is missing, not a database of that backend,
            unreadable, corrupt or empty.
    """
    module = _module(backend)
    cursor_type = getattr(module, "LMDBCursor", None) or module.LevelDBCursor
    return cursor_type(str(path))


def open_writer(path, backend, commit_every=1000):
    """A writer of a new database at ``path`` (Caffe's ``Open(path, NEW)`` and its
    transactions), committing every ``commit_every`` records.

    Raises:
        CaffeError: an unknown backend, ``path`` exists, or the backend fails.
    """
    module = _module(backend)
    writer_type = getattr(module, "LMDBWriter", None) or module.LevelDBWriter
    return writer_type(str(path), commit_every=commit_every)


def iter_items(path, backend):
    """``(key, value)`` bytes pairs of the database at ``path`` in key order, one at a time.

    Raises:
        CaffeError: an unknown backend; the path is missing, not such a database, or unreadable.
    """
    return _module(backend).iter_items(str(path))


def read_all(path, backend):
    """All ``(key, value)`` pairs of the database at ``path`` in key order, as a list."""
    return list(iter_items(path, backend))
