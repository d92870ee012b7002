"""Layer implementations, one module per family, registered by Caffe's type string.

Importing this package registers every layer type; see ``base.register``.
"""
from .base import Layer, create_layer, layer_type_list, register  # noqa: F401
from . import (concat_slice, convolution, data, dummy_data, eltwise, endpoints, hdf5,  # noqa: F401
               im2col, image_data, indexing, inner_product, loss, memory_data, neuron,
               normalization, pooling, python_layer, recurrent, reduction, shape, softmax,
               split, spp)  # registration


def __getattr__(name):
    """pycaffe's ``from caffe import layers as L``: ``L.Convolution(...)`` is a NetSpec layer.

    Only CamelCase names that are not attributes of this package (the layer modules and
    ``Layer`` are) reach here; each returns :data:`caffe_engine.net_spec.layers`'s factory.
    """
    if name[:1].isupper():
        from ..net_spec import layers as _netspec_layers
        return getattr(_netspec_layers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
