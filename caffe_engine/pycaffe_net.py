"""pycaffe's ``Net`` surface: what ``import caffe`` scripts call on a net beyond Caffe's net.cpp.

Caffe: python/caffe/pycaffe.py (``_Net_forward``, ``_Net_backward``, ``_Net_forward_all``,
``_Net_forward_backward_all``, ``_Net_batch``, the ``blob_loss_weights`` / ``layer_dict`` /
``top_names`` / ``bottom_names`` properties) and python/caffe/_caffe.cpp (``_forward``,
``_backward``, ``_blob_names``, ``share_with``, ``save_hdf5``, ``load_hdf5``,
``_set_input_arrays``). :class:`PycaffeNet` is mixed into :class:`caffe_engine.net.Net`; it
reads the attributes :func:`caffe_engine.graph.build` sets and runs the net through
``forward_from_to`` / ``backward_from_to``. Blob data are float32 arrays of the current array
module; what it collects over batches is NumPy.
"""
import collections
import itertools

import numpy

from . import backend
from .errors import CaffeError
from .io import weights


class PycaffeNet:
    """pycaffe's methods and properties of ``caffe.Net`` (a mixin of
    :class:`caffe_engine.net.Net`, which provides the graph and the passes)."""

    def forward(self, blobs=None, start=None, end=None, **kwargs):
        """Forward pass, as pycaffe's ``Net.forward``.

        Args:
            blobs: names of blobs whose data to return besides the outputs.
            start, end: layer names to start at / stop after (inclusive); default the first and
                the last layer.
            **kwargs: input blob name -> array copied into that blob first. When given, the
                names must be exactly the net's :attr:`inputs` and each array's first axis the
                blob's batch size (pycaffe's checks).

        Returns:
            dict blob name -> the blob's data array (the live array, not a copy), for the
            net's outputs (or, with ``end``, that layer's tops) and ``blobs``.

        Raises:
            CaffeError: unknown layer or blob name, inputs that do not match, wrong batch size.
        """
        blobs = list(blobs or [])
        start_ind = 0 if start is None else self._layer_index_of(start)
        if end is None:
            end_ind = len(self.layers) - 1
            outputs = set(self.outputs + blobs)
        else:
            end_ind = self._layer_index_of(end)
            outputs = set(self.top_names_of(end) + blobs)
        self._check_blob_names(outputs)
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise CaffeError(f"Input blob arguments {sorted(kwargs)} do not match "
                                 f"net inputs {self.inputs}.")
            for name, value in kwargs.items():
                self._fill(name, value, "data", "Input")
        self._warn_empty_inputs()
        self._forward(start_ind, end_ind)
        return {name: self.blobs[name].data for name in outputs}

    def backward(self, diffs=None, start=None, end=None, **kwargs):
        """Backward pass, as pycaffe's ``Net.backward``.

        Args:
            diffs: names of blobs whose diff to return besides the inputs'.
            start, end: layer names to start at / stop after (inclusive), going down; default
                the last and the first layer.
            **kwargs: output blob name -> array copied into that blob's diff first. When
                given, the names must be exactly the net's :attr:`outputs`.

        Returns:
            dict blob name -> the blob's diff array, for the net's inputs (or, with ``end``,
            that layer's bottoms) and ``diffs``.

        Raises:
            CaffeError: unknown layer or blob name, diffs that do not match, wrong batch size.
        """
        diffs = list(diffs or [])
        start_ind = len(self.layers) - 1 if start is None else self._layer_index_of(start)
        if end is None:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        else:
            end_ind = self._layer_index_of(end)
            outputs = set(self.bottom_names_of(end) + diffs)
        self._check_blob_names(outputs)
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise CaffeError(f"Top diff arguments {sorted(kwargs)} do not match "
                                 f"net outputs {self.outputs}.")
            for name, value in kwargs.items():
                self._fill(name, value, "diff", "Diff")
        self._backward(start_ind, end_ind)
        return {name: self.blobs[name].diff for name in outputs}

    def _layer_index_of(self, name):
        if name not in self._layer_index:
            raise CaffeError(f"unknown layer '{name}'")
        return self._layer_index[name]

    def _check_blob_names(self, names):
        unknown = sorted(n for n in names if n not in self.blobs)
        if unknown:
            raise CaffeError(f"unknown blob(s) {', '.join(unknown)} (net '{self.name}')")

    def _fill(self, name, value, field, what):
        blob = self.blobs[name]
        value = numpy.asarray(value) if not hasattr(value, "shape") else value
        if value.ndim == 0 or not blob.shape or value.shape[0] != blob.shape[0]:
            raise CaffeError(f"{what} '{name}' is not batch sized: got shape {tuple(value.shape)}, "
                             f"blob shape {blob.shape}")
        target = getattr(blob, field)
        target[...] = backend.get_array_module(target).asarray(value)

    def _forward(self, start, end):
        """pycaffe's ``Net._forward(start_ind, end_ind)``: run layers by index; return the loss."""
        return float(self.forward_from_to(start, end))

    def _backward(self, start, end):
        """pycaffe's ``Net._backward(start_ind, end_ind)``: backward from ``start`` down to ``end``."""
        self.backward_from_to(start, end)

    # -- in batches ------------------------------------------------------------------------------
    def forward_all(self, blobs=None, **kwargs):
        """Forward any number of items in batches of the net's batch size (pycaffe's).

        Args:
            blobs: extra blob names to collect, as in :meth:`forward`.
            **kwargs: input blob name -> array of any length N (all the same N). The last
                batch is padded with zeros; the padding's outputs are dropped.

        Returns:
            dict blob name -> NumPy array of N items (copies).

        Raises:
            CaffeError: no inputs given, or inputs of different lengths.
        """
        if not kwargs:
            raise CaffeError("forward_all needs the input arrays as keyword arguments "
                             f"(net inputs: {self.inputs})")
        all_outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        for batch in self._batch(kwargs):
            outs = self.forward(blobs=blobs, **batch)
            for name, data in outs.items():
                all_outs[name].extend(backend.to_numpy(data).copy())
        return _unpad(all_outs, _first_length(kwargs))

    def forward_backward_all(self, blobs=None, diffs=None, **kwargs):
        """Forward and backward in batches (pycaffe's ``forward_backward_all``).

        Args:
            blobs, diffs: extra blob names whose data / diffs to collect.
            **kwargs: input blob name -> array (fed forward) and output blob name -> array
                (fed as top diffs backward); nets with data layers may give neither.

        Returns:
            (all_blobs, all_diffs): dicts blob name -> NumPy array of N items.

        Raises:
            CaffeError: arrays of different lengths, or as :meth:`forward` / :meth:`backward`.
        """
        all_outs = {name: [] for name in set(self.outputs + list(blobs or []))}
        all_diffs = {name: [] for name in set(self.inputs + list(diffs or []))}
        forward_batches = self._batch({k: kwargs[k] for k in self.inputs if k in kwargs})
        backward_batches = self._batch({k: kwargs[k] for k in self.outputs if k in kwargs})
        for fb, bb in itertools.zip_longest(forward_batches, backward_batches, fillvalue={}):
            for name, data in self.forward(blobs=blobs, **fb).items():
                all_outs[name].extend(backend.to_numpy(data).copy())
            for name, diff in self.backward(diffs=diffs, **bb).items():
                all_diffs[name].extend(backend.to_numpy(diff).copy())
        n = _first_length(kwargs) if kwargs else None
        return _unpad(all_outs, n), _unpad(all_diffs, n)

    def _batch(self, arrays):
        """Yield dicts of batch-sized slices of ``arrays``; the last one zero-padded (pycaffe's)."""
        if not arrays:
            return
        num = _first_length(arrays)
        batch_size = next(iter(self.blobs.values())).shape[0]
        for i in range(0, num - num % batch_size, batch_size):
            yield {name: arrays[name][i:i + batch_size] for name in arrays}
        remainder = num % batch_size
        if remainder:
            padded = {}
            for name, values in arrays.items():
                values = numpy.asarray(values)
                padding = numpy.zeros((batch_size - remainder,) + values.shape[1:], values.dtype)
                padded[name] = numpy.concatenate([values[-remainder:], padding])
            yield padded

    # -- weights and inputs ----------------------------------------------------------------------
    def share_with(self, other):
        """pycaffe's ``net.share_with(other)``: view ``other``'s params by layer name
        (:func:`caffe_engine.io.weights.share_trained_layers_with`)."""
        weights.share_trained_layers_with(self, other)

    def save_hdf5(self, path, write_diff=False):
        """Write the weights in Caffe's HDF5 layout to ``path``, whatever its name (pycaffe's
        ``save_hdf5``; :func:`caffe_engine.io.weights.save_hdf5`)."""
        weights.save_hdf5(self, path, write_diff)

    def load_hdf5(self, path):
        """Copy weights by layer name from the HDF5 file ``path``, whatever its name (pycaffe's
        ``load_hdf5``; :func:`caffe_engine.io.weights.load_hdf5`). Returns the layer names
        copied.

        Raises:
            CaffeError: the file is missing or not HDF5, or its params do not fit.
        """
        return weights.load_hdf5(self, path)

    def set_input_arrays(self, data, labels):
        """Feed a MemoryData first layer (pycaffe's ``Net.set_input_arrays``).

        Raises:
            CaffeError: the first layer is not MemoryData.
        """
        if not self.layers or self.layers[0].type != "MemoryData":
            raise CaffeError("set_input_arrays may only be called if the first layer is a MemoryDataLayer")
        self.layers[0].set_input_arrays(data, labels)

    # -- names and indices -----------------------------------------------------------------------
    @property
    def blob_loss_weights(self):
        """OrderedDict blob name -> loss weight (pycaffe's ``net.blob_loss_weights``)."""
        return _LossWeights(zip(self.blob_names, self._blob_loss_weights))

    @property
    def layer_dict(self):
        """OrderedDict layer name -> layer (pycaffe's ``net.layer_dict``)."""
        return collections.OrderedDict(zip(self.layer_names, self.layers))

    @property
    def top_names(self):
        """OrderedDict layer name -> list of its top blob names (pycaffe's)."""
        return collections.OrderedDict(
            (name, [self.blob_names[b] for b in ids]) for name, ids in zip(self.layer_names, self.top_ids))

    @property
    def bottom_names(self):
        """OrderedDict layer name -> list of its bottom blob names (pycaffe's)."""
        return collections.OrderedDict(
            (name, [self.blob_names[b] for b in ids]) for name, ids in zip(self.layer_names, self.bottom_ids))

    @property
    def _layer_names(self):
        return list(self.layer_names)

    @property
    def _blob_names(self):
        return list(self.blob_names)

    @property
    def _blobs(self):
        return list(self._blob_list)

    @property
    def _inputs(self):
        return [self._blob_index[n] for n in self.inputs]

    @property
    def _outputs(self):
        return [self._blob_index[n] for n in self.outputs]

    def _top_ids(self, i):
        return list(self.top_ids[i])

    def _bottom_ids(self, i):
        return list(self.bottom_ids[i])

    def top_names_of(self, layer_name):
        """The top blob names of the layer named ``layer_name``.

        Raises:
            CaffeError: no such layer.
        """
        return [self.blob_names[b] for b in self.top_ids[self._layer_index_of(layer_name)]]

    def bottom_names_of(self, layer_name):
        """The bottom blob names of the layer named ``layer_name``.

        Raises:
            CaffeError: no such layer.
        """
        return [self.blob_names[b] for b in self.bottom_ids[self._layer_index_of(layer_name)]]


class _LossWeights(collections.OrderedDict):
    """pycaffe's ``blob_loss_weights`` dict (name -> weight); an int key still reads the weight
    of the blob with that index, for callers written against the earlier list."""

    def __missing__(self, key):
        if isinstance(key, (int, numpy.integer)) and not isinstance(key, bool):
            return list(self.values())[key]
        raise KeyError(key)


def _first_length(arrays):
    lengths = {name: len(values) for name, values in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise CaffeError(f"input arrays differ in length: {lengths}")
    return next(iter(lengths.values()))


def _unpad(collected, n):
    out = {name: numpy.asarray(values) for name, values in collected.items()}
    if n is not None:
        out = {name: values[:n] for name, values in out.items()}
    return out
