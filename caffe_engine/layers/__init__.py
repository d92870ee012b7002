"""Layer implementations, one module per family, registered by Caffe's type string.

Importing this package registers every layer type; see ``base.register``.
"""
from .base import Layer, create_layer, layer_type_list, register  # noqa: F401
from . import (common, data, dummy_data, hdf5, image_data, loss, memory_data,  # noqa: F401
               neuron, normalization, python_layer, recurrent, split, vision)  # registration
