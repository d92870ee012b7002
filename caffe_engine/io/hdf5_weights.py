"""Weights in Caffe's HDF5 snapshot format (``.caffemodel.h5``), read and written.

Caffe: src/caffe/net.cpp (Net::CopyTrainedLayersFromHDF5, Net::ToHDF5),
src/caffe/util/hdf5.cpp (hdf5_load_nd_dataset). Layout of the file: a group ``/data`` holding one
group per layer (every layer of the saved net, parameterless ones as empty groups), named by the
layer, and in it one float dataset per param blob, named ``0``, ``1`` ... in the layer's blob
order, with the blob's N-D shape. ``Net::ToHDF5(write_diff=true)`` adds a ``/diff`` group of the
same layout.

Loading matches layers by name, as for ``.caffemodel``: source layers absent from the net are
ignored (logged), net layers absent from the file keep their values. Unlike the protobuf path,
shapes must match exactly (no legacy 4-D equivalence), and a missing dataset is allowed only for
a param the net shares from another layer.

With several net layers of one name, the weights go into the *last* of them (Caffe's
CopyTrainedLayersFromHDF5 looks the name up in ``layer_names_index_``, filled in layer order so
the last wins; the ``.caffemodel`` path searches ``layer_names_`` and takes the first), with a
WARNING naming the layer. Caffe cannot write such a net to HDF5 (Net::ToHDF5's second group of
one name fails: "Error saving weights"); neither can we (one-line CaffeError).

Loading is :func:`caffe_engine.io.weights.copy_from`'s (one loader for both formats; a file
:func:`is_hdf5_weights` finds to be HDF5, whatever its name, is read here by
:func:`read_hdf5_weights`, as Caffe's CopyTrainedLayersFrom asks ``H5Fis_hdf5``); this module
only reads and writes the files.
"""
import contextlib
import os

import numpy

from .. import backend
from ..errors import CaffeError


def _open(path, mode):
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a declared dependency
        raise CaffeError(f"{path}: reading HDF5 weights needs h5py (pip install h5py)") from None
    try:
        return h5py.File(path, mode)
    except OSError as exc:
        raise CaffeError(f"{path}: Couldn't open HDF5 weights file: {exc}") from None


def read_hdf5_weights(path):
    """The layers of an HDF5 weights file, in file order (Net.copy_from matches them by name).

    Args:
        path: a ``.caffemodel.h5`` file written by Caffe (``snapshot_format: HDF5``).

    Returns:
        list of (layer name, {param index: float32 array of the dataset's shape}); a layer
        group without datasets gives an empty dict.

    Raises:
        CaffeError: unreadable file, no ``/data`` group, or a dataset that is not float data
            (naming the file, the layer and the param index).
    """
    path = str(path)
    with damaged_hdf5(f"{path}: Error reading weights"):
        return _read_layers(path)


@contextlib.contextmanager
def damaged_hdf5(what):
    """Turn h5py's errors for a damaged file (a bad symbol table, a truncated chunk, ... as
    OSError, RuntimeError, KeyError, ValueError or TypeError) into one CaffeError line starting
    with ``what`` (the file and the action)."""
    try:
        yield
    except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CaffeError(f"{what}: damaged HDF5 file ({first})") from None


def _read_layers(path):
    layers = []
    with _open(path, "r") as f:
        data = f.get("data")
        if data is None or not hasattr(data, "keys"):
            raise CaffeError(f"{path}: Error reading weights: no /data group")
        for name in data.keys():
            group = data[name]
            params = {}
            for key in group.keys():
                dataset = group[key]
                if not key.isdigit() or not hasattr(dataset, "dtype"):
                    raise CaffeError(f"{path}: layer {name}: unexpected entry '{key}' (params are "
                                     f"datasets named 0, 1, ...)")
                if dataset.dtype.kind != "f":
                    raise CaffeError(f"{path}: layer {name} param {key}: expected float or double "
                                     f"data, got {dataset.dtype}")
                params[int(key)] = numpy.asarray(dataset[()], dtype=numpy.float32)
            layers.append((name, params))
    return layers


def save_hdf5_weights(net, path, write_diff=False):
    """Write ``net``'s params in Caffe's HDF5 layout (Net::ToHDF5); every layer gets a group.

    A layer name containing ``/`` becomes nested groups (as HDF5 paths do).

    Raises:
        CaffeError: two layers share a name (one HDF5 group per name; Caffe's H5Gcreate2 fails
            there: "Error saving weights to <file>"), naming the layer.
    """
    path = str(path)
    check_unique_layer_names(net, path)
    with _open(path, "w") as f:
        groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        for i, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
            for g, attr in zip(groups, ("data", "diff")):
                layer_group = g.create_group(name)
                for k, blob in enumerate(layer.blobs):
                    if attr == "data" and param_is_shared_view(net, i, k):
                        continue  # only a param's owner stores its values; diffs always
                    layer_group.create_dataset(str(k), data=backend.to_numpy(getattr(blob, attr))
                                               .astype(numpy.float32))


def check_unique_layer_names(net, path):
    """Raise CaffeError (naming ``path`` and the layer) if two layers of ``net`` share a name,
    which an HDF5 weights file cannot hold (Net::ToHDF5's H5Gcreate2 fails on the second)."""
    seen = set()
    for name in net.layer_names:
        if name in seen:
            raise CaffeError(f"{path}: Error saving weights: the net has several layers named "
                             f"'{name}' and HDF5 holds one group per layer name")
        seen.add(name)


#: The HDF5 format signature, at the start of the superblock (HDF5 File Format
#: Specification, "Format Signature").
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5_weights(path):
    """Whether ``path`` holds HDF5 data: Caffe's CopyTrainedLayersFrom asks ``H5Fis_hdf5``,
    whatever the file's name.

    Like ``H5Fis_hdf5``, looks for :data:`HDF5_SIGNATURE` at offset 0, 512, 1024, 2048, ...
    (a file may begin with a user block of a power-of-two size of at least 512 bytes). A file
    that cannot be opened is judged by its name (ending in ``.h5``), so that the error then
    comes from the reader its name suggests.
    """
    path = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size  # 0 for a device: only offset 0 is read
            offset = 0
            while offset == 0 or offset + len(HDF5_SIGNATURE) <= size:
                f.seek(offset)
                if f.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                    return True
                offset = max(512, 2 * offset)
            return False
    except OSError:
        return path.endswith(".h5")


def param_is_shared_view(net, layer_index, k):
    """Whether param ``k`` of ``net``'s layer ``layer_index`` is a view of another layer's
    param (``param { name: ... }`` sharing): only the owner's values are stored in HDF5."""
    lp = net.layers[layer_index].param
    if k >= len(lp.param) or not lp.param[k].name:
        return False
    owner = getattr(net, "_param_owner", {}).get(lp.param[k].name)
    return owner is not None and owner != (layer_index, k)
