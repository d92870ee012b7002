"""A net's params copied in from and written out to weight files, matched by layer name.

Caffe: src/caffe/net.cpp (Net::CopyTrainedLayersFrom, CopyTrainedLayersFromBinaryProto,
CopyTrainedLayersFromHDF5, ShareTrainedLayersWith, ToProto, ToHDF5). Two formats:

- ``.caffemodel``: a binary NetParameter whose layers carry their param blobs (read with
  :func:`caffe_engine.io.prototxt.read_binary`, upgraded as Caffe upgrades it);
- ``.caffemodel.h5``: Caffe's HDF5 layout (:mod:`caffe_engine.io.hdf5_weights`).

Which one a file holds is read from its content, as Caffe's CopyTrainedLayersFrom asks
``H5Fis_hdf5`` (:func:`caffe_engine.io.hdf5_weights.is_hdf5_weights`), so any file name works.

``net`` here is a built :class:`caffe_engine.net.Net`; these functions read its
``layer_names``, ``layers`` (each with ``blobs`` and ``param``) and ``name``.
"""
import numpy

from .. import backend
from ..errors import CaffeError
from ..log import logger
from ..proto import caffe_pb2
from . import prototxt as pio
from .blobproto import blob_to_proto, proto_shape, proto_to_array
from .hdf5_weights import is_hdf5_weights, param_is_shared_view, read_hdf5_weights
from .upgrade import upgrade_net


def copy_from(net, source):
    """Copy params by layer name from a ``.caffemodel``, a ``.caffemodel.h5`` or a
    NetParameter (Caffe's CopyTrainedLayersFrom, which picks HDF5 by the file's content).

    Layers absent from the source keep their values; source layers absent here are ignored
    (logged). With several layers of one name here, Caffe's two readers differ and so does
    this one: a ``.caffemodel`` source layer goes into the *first* of them (Caffe searches
    ``layer_names_``), an HDF5 one into the *last* (Caffe looks it up in
    ``layer_names_index_``, filled in layer order); the others keep their initial values,
    and a WARNING line names the layer. A ``.caffemodel``'s legacy 4-D shapes equal the
    target padded with leading 1s (Blob::ShapeEquals); an HDF5 file's must match exactly,
    and may leave out a param this net shares from another layer.

    Args:
        net: the net whose params are overwritten (float32 arrays, in place).
        source: a path (str or path-like) or a caffe_pb2.NetParameter.

    Returns:
        list of the layer names copied, in source order.

    Raises:
        CaffeError: unreadable file, wrong number of blobs, a missing HDF5 dataset, or a
            shape mismatch naming the layer, the param and both shapes.
    """
    if isinstance(source, caffe_pb2.NetParameter):
        return _copy_proto(net, source, "<NetParameter>")
    where = str(source)
    if is_hdf5_weights(where):
        return load_hdf5(net, where)
    param = pio.read_binary(where, caffe_pb2.NetParameter(), "caffemodel")
    upgrade_net(param, where)
    return _copy_proto(net, param, where)


def load_hdf5(net, path):
    """Copy params by layer name from the HDF5 weights file ``path``, whatever its name
    (Caffe's CopyTrainedLayersFromHDF5, pycaffe's ``load_hdf5``; see :func:`copy_from`).

    Returns:
        list of the layer names copied, in file order.

    Raises:
        CaffeError: the file is missing or not HDF5 ("Couldn't open HDF5 weights file"), or
            its params do not fit (see :func:`copy_from`).
    """
    where = str(path)
    index = {name: i for i, name in enumerate(net.layer_names)}        # last wins
    return _copy_records(net, read_hdf5_weights(where), index, where, hdf5=True)


def _copy_proto(net, param, where):
    """Caffe's CopyTrainedLayersFrom(NetParameter): each source layer into the first layer of
    its name here."""
    records = [(layer.name, dict(enumerate(layer.blobs))) for layer in param.layer]
    return _copy_records(net, records, first_layer_index(net), where, hdf5=False)


def _copy_records(net, records, index, where, hdf5):
    """Copy ``records`` (layer name, {param index: BlobProto or array}) into the layers
    ``index`` names; return the names copied."""
    if not records:
        logger.warning("%s holds no layers: no weights copied (Caffe goes on as well)", where)
    copied, warned = [], set()
    for name, blobs in records:
        i = index.get(name)
        if i is None:
            logger.info("Ignoring source layer %s", name)
            continue
        if name not in warned:
            warned.add(name)
            warn_duplicate_layer_name(net, name, i, where)
        _copy_layer(net, i, name, blobs, where, hdf5)
        copied.append(name)
    return copied


def _copy_layer(net, i, name, blobs, where, hdf5):
    """Copy one source layer's params into layer ``i``.

    Raises:
        CaffeError: a blob count or shape that does not fit (naming ``where`` and the layer).
    """
    target = net.layers[i].blobs
    if len(blobs) > len(target) or (not hdf5 and len(blobs) != len(target)):
        raise CaffeError(f"{where}: Incompatible number of blobs for layer {name} "
                         f"(source {len(blobs)}, target {len(target)})")
    logger.debug("Copying source layer %s #blobs=%d", name, len(blobs))
    for k, blob in enumerate(target):
        if k not in blobs:
            if param_is_shared_view(net, i, k):
                continue
            raise CaffeError(f"{where}: Incompatible number of blobs for layer {name} "
                             f"(param {k} missing)")
        src = blobs[k]
        if hdf5:
            shape, values = tuple(src.shape), src
        else:
            shape, values = proto_shape(src, blob.shape), None
        if shape != tuple(blob.shape):
            raise CaffeError(f"{where}: Cannot copy param {k} weights from layer '{name}'; "
                             f"shape mismatch. Source param shape is {shape_str(shape)}; "
                             f"target param shape is {shape_str(blob.shape)}")
        if values is None:
            values = proto_to_array(src, what=f"{where}: layer {name} param {k}")
        blob.data[...] = backend.get_array_module(blob.data).asarray(values.reshape(blob.shape))


def to_proto(net, write_diff=False):
    """The net as a NetParameter with every layer's param blobs (Caffe's Net::ToProto)."""
    param = caffe_pb2.NetParameter(name=net.name)
    for layer in net.layers:
        lp = param.layer.add()
        lp.CopyFrom(layer.param)
        lp.ClearField("blobs")
        for blob in layer.blobs:
            blob_to_proto(blob, lp.blobs.add(), write_diff)
    return param


def save(net, path, write_diff=False):
    """Write the weights as a binary ``.caffemodel`` (atomically).

    Raises:
        CaffeError: the folder is missing or not writable.
    """
    pio.write_binary(str(path), to_proto(net, write_diff))


def save_hdf5(net, path, write_diff=False):
    """Write the weights in Caffe's HDF5 layout (Net::ToHDF5), atomically, whatever the name.

    Raises:
        CaffeError: two layers share a name, or the folder is not writable.
    """
    from .hdf5_snapshot import save_net_hdf5
    save_net_hdf5(net, str(path), write_diff)


def share_trained_layers_with(net, other):
    """Make ``net``'s params view ``other``'s, by layer name (Caffe's ShareTrainedLayersWith).

    As Caffe, each of ``other``'s layers is shared into the first layer of ``net`` with its
    name, in order (so with repeated names the first layer views ``other``'s last one, and a
    later layer of the same name keeps its own values).

    Raises:
        CaffeError: a layer of one name with a different number of params or param shapes.
    """
    first = first_layer_index(net)
    for name, layer in zip(other.layer_names, other.layers):
        src_blobs = layer.blobs
        if not src_blobs:
            continue
        i = first.get(name)
        if i is None:
            continue
        target = net.layers[i].blobs
        if len(target) != len(src_blobs):
            raise CaffeError(f"Incompatible number of blobs for layer {name}")
        for t, s in zip(target, src_blobs):
            if t.shape != s.shape:
                raise CaffeError(f"Cannot share param weights from layer '{name}'; shape mismatch. "
                                 f"Source param shape is {shape_str(s.shape)}; "
                                 f"target param shape is {shape_str(t.shape)}")
            t.data = s.data


def first_layer_index(net):
    """dict layer name -> index of the first layer of that name (the target Caffe's
    CopyTrainedLayersFrom and ShareTrainedLayersWith find by searching ``layer_names_``)."""
    first = {}
    for i, name in enumerate(net.layer_names):
        first.setdefault(name, i)
    return first


def warn_duplicate_layer_name(net, name, target, where):
    """Log one WARNING when several layers of ``net`` are named ``name`` and weights from
    ``where`` go into layer ``target`` only; the others keep their values."""
    same = [i for i, n in enumerate(net.layer_names) if n == name]
    if len(same) > 1:
        others = ", ".join(str(i) for i in same if i != target)
        logger.warning("Net %s has %d layers named '%s' (layers %s): weights from %s go into "
                       "layer %d only; layer(s) %s keep their initial values", net.name,
                       len(same), name, ", ".join(map(str, same)), where, target, others)


def shape_str(shape):
    """Caffe's Blob::shape_string: ``"64 3 5 5 (4800)"``."""
    count = int(numpy.prod(shape)) if len(shape) else 1
    return " ".join(str(d) for d in shape) + f" ({count})"
