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

``Net.copy_from`` should send paths ending in ``.h5`` here, as Caffe's CopyTrainedLayersFrom does.
"""
import numpy

from .. import backend
from ..errors import CaffeError
from ..log import logger


def _open(path, mode):
    try:
        import h5py
    except ImportError:  # pragma: no cover - h5py is a declared dependency
        raise CaffeError(f"{path}: reading HDF5 weights needs h5py (pip install h5py)") from None
    try:
        return h5py.File(path, mode)
    except OSError as exc:
        raise CaffeError(f"{path}: Couldn't open HDF5 weights file: {exc}") from None


def _shared_from_elsewhere(net, layer_index, k):
    """Whether param ``k`` of layer ``layer_index`` is a view of another layer's param."""
    lp = net.layers[layer_index].param
    if k >= len(lp.param) or not lp.param[k].name:
        return False
    owner = getattr(net, "_param_owner", {}).get(lp.param[k].name)
    return owner is not None and owner != (layer_index, k)


def load_hdf5_weights(net, path):
    """Copy params from the HDF5 weights file ``path`` into ``net`` by layer name.

    Args:
        net: a built :class:`caffe_engine.net.Net`.
        path: a ``.caffemodel.h5`` file written by Caffe (``snapshot_format: HDF5``).

    Returns:
        list of the layer names whose params were copied.

    Raises:
        CaffeError: unreadable file, no ``/data`` group, more datasets than the layer has
            params, a missing dataset for an unshared param, a non-float dataset, or a shape
            mismatch (naming the layer, the param index and both shapes).
    """
    path = str(path)
    copied = []
    with _open(path, "r") as f:
        data = f.get("data")
        if data is None or not hasattr(data, "keys"):
            raise CaffeError(f"{path}: Error reading weights: no /data group")
        index = {name: i for i, name in enumerate(net.layer_names)}
        for name in data.keys():
            i = index.get(name)
            if i is None:
                logger.info("Ignoring source layer %s", name)
                continue
            group = data[name]
            target = net.layers[i].blobs
            if len(group.keys()) > len(target):
                raise CaffeError(f"{path}: Incompatible number of blobs for layer {name} "
                                 f"(source {len(group.keys())}, target {len(target)})")
            logger.info("Copying source layer %s", name)
            for k, blob in enumerate(target):
                key = str(k)
                if key not in group:
                    if _shared_from_elsewhere(net, i, k):
                        continue
                    raise CaffeError(f"{path}: Incompatible number of blobs for layer {name} "
                                     f"(param {k} missing)")
                dataset = group[key]
                if dataset.dtype.kind != "f":
                    raise CaffeError(f"{path}: layer {name} param {k}: expected float or double "
                                     f"data, got {dataset.dtype}")
                shape = tuple(int(d) for d in dataset.shape)
                if shape != tuple(blob.shape):
                    raise CaffeError(
                        f"{path}: Cannot copy param {k} weights from layer '{name}'; shape "
                        f"mismatch. Source param shape is {_shape_str(shape)}; target param "
                        f"shape is {_shape_str(blob.shape)}")
                values = numpy.asarray(dataset[()], dtype=numpy.float32)
                xp = backend.get_array_module(blob.data)
                blob.data[...] = xp.asarray(values)
            copied.append(name)
    return copied


def save_hdf5_weights(net, path, write_diff=False):
    """Write ``net``'s params in Caffe's HDF5 layout (Net::ToHDF5); every layer gets a group.

    A layer name containing ``/`` becomes nested groups (as HDF5 paths do).
    """
    path = str(path)
    with _open(path, "w") as f:
        groups = [f.create_group("data")] + ([f.create_group("diff")] if write_diff else [])
        for i, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
            for g, attr in zip(groups, ("data", "diff")):
                layer_group = g.create_group(name)
                for k, blob in enumerate(layer.blobs):
                    if attr == "data" and _shared_from_elsewhere(net, i, k):
                        continue  # only a param's owner stores its values; diffs always
                    layer_group.create_dataset(str(k), data=backend.to_numpy(getattr(blob, attr))
                                               .astype(numpy.float32))


def is_hdf5_weights(path):
    """Whether Caffe would read ``path`` as HDF5 weights (its name ends with ``.h5``)."""
    return str(path).endswith(".h5")


def _shape_str(shape):
    count = int(numpy.prod(shape)) if len(shape) else 1
    return " ".join(str(d) for d in shape) + f" ({count})"
