"""HDF5 snapshots (``snapshot_format: HDF5``): ``.caffemodel.h5`` and ``.solverstate.h5``.

Caffe: src/caffe/net.cpp (Net::ToHDF5), src/caffe/solvers/sgd_solver.cpp
(SnapshotSolverStateToHDF5, RestoreSolverStateFromHDF5), src/caffe/util/hdf5.cpp.

Layouts, as Caffe writes them:

* model ``<prefix>_iter_N.caffemodel.h5``: a group ``/data`` holding one group per layer
  (also for layers without params), each with float32 datasets ``0``, ``1``, ... of the param
  shapes; a param shared from another layer is written only by its owner. With
  ``snapshot_diff`` a group ``/diff`` mirrors ``/data`` with the gradients (sharers included).
  Written and read by :mod:`caffe_engine.io.hdf5_weights`; this module makes the write atomic.
* solver state ``<prefix>_iter_N.solverstate.h5``: int32 datasets ``/iter`` and
  ``/current_step`` of shape (1,) (Caffe's hdf5_save_int: H5LTmake_dataset_int with rank 1 and
  one element), a scalar null-terminated fixed-length string ``/learned_net`` (hdf5_save_string:
  H5LTmake_dataset_string; the model file name exactly as the solver wrote it, so relative to
  the working directory of that run), and a group ``/history`` with float32 datasets ``0`` ..
  ``len(history) - 1`` of the params' shapes.

  The reader also takes scalar (shape ()) ``iter`` / ``current_step``, which this engine wrote
  before it followed Caffe's layout, and a variable-length ``learned_net`` string.

Files are written to a temporary name in the target folder and renamed, so a reader never sees a
half-written snapshot.
"""

import numpy

from .. import backend
from ..errors import CaffeError
from .hdf5_weights import damaged_hdf5
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


def _load_string(f, name, path):
    """The string in dataset ``name``: Caffe's scalar fixed-length one (hdf5_load_string), or a
    variable-length or one-element string dataset; up to the first NUL, decoded as UTF-8."""
    dset = f[name]
    if dset.dtype.kind not in ("S", "O", "U") or dset.size != 1:
        raise CaffeError(f"{path}: '{name}' should be one string, got a {dset.dtype} dataset "
                         f"of shape {dset.shape}")
    value = numpy.asarray(dset[()]).reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return str(value)


def _load_int(f, name, path):
    """The integer in dataset ``name``: Caffe's shape-(1,) int (hdf5_load_int reads one int) or
    the scalar this engine used to write."""
    dset = f[name]
    if dset.dtype.kind not in ("i", "u") or dset.size != 1:
        raise CaffeError(f"{path}: '{name}' should be one integer, got a {dset.dtype} dataset "
                         f"of shape {dset.shape}")
    return int(numpy.asarray(dset[()]).reshape(-1)[0])


def save_net_hdf5(net, path, write_diff=False):
    """Write ``net``'s params as a ``.caffemodel.h5`` (Caffe's Net::ToHDF5), atomically.

    The layout is :func:`caffe_engine.io.hdf5_weights.save_hdf5_weights`'s (see module doc).

    Raises:
        CaffeError: two layers share a name (naming ``path`` and the layer), or ``path``'s
            folder is not writable.
    """
    from .hdf5_weights import check_unique_layer_names, save_hdf5_weights
    check_unique_layer_names(net, path)
    write_atomic_with(path, lambda tmp: save_hdf5_weights(net, tmp, write_diff))


def save_solver_state_hdf5(path, iteration, learned_net, current_step, history):
    """Write a ``.solverstate.h5`` in Caffe's layout (SGDSolver::SnapshotSolverStateToHDF5).

    Args:
        path: the file to write (atomically).
        iteration, current_step: ints, stored as int32 datasets of shape (1,) (hdf5_save_int).
        learned_net: the model snapshot's file name, stored as Caffe's scalar string.
        history: list of Blobs, stored as float32 ``/history/<i>`` of their shapes.
    """
    def fill(f):
        f.create_dataset("iter", data=numpy.array([iteration], dtype=numpy.int32))
        _save_string(f, "learned_net", learned_net)
        f.create_dataset("current_step", data=numpy.array([current_step], dtype=numpy.int32))
        group = f.create_group("history")
        for i, blob in enumerate(history):
            group.create_dataset(str(i), data=backend.to_numpy(blob.data).astype(numpy.float32))
    def write(tmp):
        with _h5py().File(tmp, "w") as f:
            fill(f)
    write_atomic_with(path, write)


def load_solver_state_hdf5(path):
    """Read a ``.solverstate.h5`` written by Caffe or by this engine (see module doc).

    Caffe: SGDSolver::RestoreSolverStateFromHDF5 (reads ``iter``, ``learned_net`` if present,
    ``current_step``, then ``history/0`` .. ``history/<n-1>`` for the n links of ``/history``).

    Returns:
        dict with ``iter`` (int), ``learned_net`` (str as stored, or None when absent),
        ``current_step`` (int) and ``history`` (list of float32 arrays, in index order).

    Raises:
        CaffeError: unreadable file; missing ``iter`` / ``current_step`` / ``history``; an
            ``iter`` / ``current_step`` that is not one integer, a ``learned_net`` that is not
            one string; a ``history`` group whose members are not ``0`` .. ``n-1`` float
            datasets. The message names the file and the dataset.
    """
    with damaged_hdf5(f"{path}: cannot read HDF5 solver state"):
        return _read_solver_state(path)


def _read_solver_state(path):
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
        if not isinstance(group, h5py.Group):
            raise CaffeError(f"{path}: 'history' should be a group of datasets")
        history = []
        for i in range(len(group)):
            dset = group.get(str(i))
            if not isinstance(dset, h5py.Dataset) or dset.dtype.kind not in ("f", "i", "u"):
                raise CaffeError(f"{path}: 'history' has {len(group)} members but no numeric "
                                 f"dataset 'history/{i}'")
            history.append(numpy.asarray(dset[()], dtype=numpy.float32))
        return {
            "iter": _load_int(f, "iter", path),
            "learned_net": _load_string(f, "learned_net", path) if "learned_net" in f else None,
            "current_step": _load_int(f, "current_step", path),
            "history": history,
        }
