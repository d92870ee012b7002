"""The lifetime of a database reader: ``with`` closes it, and so does garbage collection.

Used by the LMDB and LevelDB cursors (``caffe_engine.io.db``), whose ``close`` releases a shared
environment or handle and is idempotent.
"""


class Closing:
    """Mixin: ``__enter__`` returns the object, ``__exit__`` and ``__del__`` call ``close()``
    (``__del__`` quietly: at interpreter shutdown the modules it needs may be gone)."""

    def close(self):  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # pragma: no cover - interpreter shutdown
            pass
