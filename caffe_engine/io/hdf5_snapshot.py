"""HDF5 snapshots (``snapshot_format: HDF5``): ``.caffemodel.h5`` and ``.solverstate.h5``.

Caffe: src/caffe/net.cpp (Net::ToHDF5), src/caffe/solvers/sgd_solver.cpp
(SnapshotSolverStateToHDF5, RestoreSolverStateFromHDF5), src/caffe/util/hdf5.cpp.

Layouts, as Caffe writes them:

* model ``<prefix>_iter_N.caffemodel.h5``: a group ``/data`` holding one group per layer
  (also for layers without params), each with float32 datasets ``0``, ``1``, ... of the param
  shapes; a param shared from another layer is written only by its owner. With
  ``snapshot_diff`` a group ``/diff`` mirrors ``/data`` with the gradients (sharers included).
  Written and read by :mod:`caffe_engine.io.hdf5_weights`; this module makes the write atomic.
* solver state ``<prefix>_iter_N.solverstate.h5``: scalar int32 datasets ``/iter`` and
  ``/current_step``, a scalar null-terminated fixed-length string ``/learned_net``, and a group
  ``/history`` with float32 datasets ``0`` .. ``len(history) - 1``.

Files are written to a temporary name in the target folder and renamed, so a reader never sees a
half-written snapshot.
"""

import numpy

from .. import backend
from ..errors import CaffeError
from .prototxt import write_atomic_with


def _h5py():
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a dependency
        raise CaffeError("HDF5 snapshots need the h5py package (pip install h5py)") from None
    return h5py


def _save_string(f, name, value):
    """A scalar dataset of a fixed-length, null-terminated string (H5LTmake_dataset_string)."""
    h5py = _h5py()
    raw = value.encode("utf-8")
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    dset = h5py.h5d.create(f.id, name.encode(), tid, space)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, numpy.array(raw + b"\0", dtype=f"S{len(raw) + 1}"))


def _load_string(f, name):
    value = f[name][()]
    if isinstance(value, numpy.ndarray):
        value = value.item()
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode("utf-8")
    return str(value)


def save_net_hdf5(net, path, write_diff=False):
    """Write ``net``'s params as a ``.caffemodel.h5`` (Caffe's Net::ToHDF5), atomically.

    The layout is :func:`caffe_engine.io.hdf5_weights.save_hdf5_weights`'s (see module doc).
    """
    from .hdf5_weights import save_hdf5_weights
    write_atomic_with(path, lambda tmp: save_hdf5_weights(net, tmp, write_diff))


def save_solver_state_hdf5(path, iteration, learned_net, current_step, history):
    """Write a ``.solverstate.h5`` (see module doc); ``history`` is a list of Blobs."""
    def fill(f):
        f.create_dataset("iter", data=numpy.int32(iteration))
        _save_string(f, "learned_net", learned_net)
        f.create_dataset("current_step", data=numpy.int32(current_step))
        group = f.create_group("history")
        for i, blob in enumerate(history):
            group.create_dataset(str(i), data=backend.to_numpy(blob.data).astype(numpy.float32))
    def write(tmp):
        with _h5py().File(tmp, "w") as f:
            fill(f)
    write_atomic_with(path, write)


def load_solver_state_hdf5(path):
    """Read a ``.solverstate.h5``.

    Returns:
        dict with ``iter`` (int), ``learned_net`` (str or None when absent), ``current_step``
        (int) and ``history`` (list of float32 arrays, in index order).

    Raises:
        CaffeError: unreadable file or missing ``iter`` / ``current_step`` / ``history``.
    """
    h5py = _h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise CaffeError(f"{path}: cannot read HDF5 solver state: {exc}") from None
    with f:
        for key in ("iter", "current_step", "history"):
            if key not in f:
                raise CaffeError(f"{path}: no '{key}' in the HDF5 solver state")
        group = f["history"]
        return {
            "iter": int(f["iter"][()]),
            "learned_net": _load_string(f, "learned_net") if "learned_net" in f else None,
            "current_step": int(f["current_step"][()]),
            "history": [numpy.asarray(group[str(i)][()], dtype=numpy.float32) for i in range(len(group))],
        }
