"""Layer implementations, one module per family, registered by Caffe's type string.

Importing this package registers every layer type; see ``base.register``.
"""
from .base import Layer, create_layer, layer_type_list, register  # noqa: F401
from . import common, data, loss, neuron, split, vision  # noqa: F401  (registration side effects)
