"""Nets written in Python: pycaffe's NetSpec, ``layers`` (L) and ``params`` (P).

Caffe: python/caffe/net_spec.py. A layer call such as ``L.Convolution(bottom, kernel_size=5,
num_output=20)`` records a layer and returns its top(s); ``to_proto`` turns the graph into the
NetParameter Caffe's NetSpec builds, so the same script gives the same prototxt:

* keyword arguments go into the layer's own ``<type>_param`` message when it has such a field
  (``num_output`` -> ``convolution_param.num_output``), else onto the LayerParameter itself
  (``name``, ``loss_weight``, ``include`` ...); keywords ending in ``param`` always go onto the
  LayerParameter (``param=[dict(lr_mult=1)]``, ``transform_param=dict(scale=...)``);
* values: a dict fills a sub-message, a list of dicts adds repeated messages, a list (or a single
  value) of scalars fills a repeated field;
* ``ntop=k`` gives k tops (a tuple; ``ntop=0`` returns the layer itself), ``in_place=True``
  makes the tops the bottoms;
* names: a top assigned to a NetSpec attribute takes that name; other tops are named
  ``<Type><k>`` by a per-type counter in the order ``to_proto`` reaches them; a layer takes the
  name of its first top (``<Type><k>`` for a layer without tops).

``caffe_engine.layers.<Type>`` (via the package's ``__getattr__``) and ``caffe_engine.params``
are the same objects as :data:`layers` and :data:`params` here.
"""
import collections

from .proto import caffe_pb2


def param_name_dict():
    """Map a layer type to its ``<name>_param`` field: ``'Convolution'`` -> ``'convolution'``.

    Built, as Caffe does, from LayerParameter's ``*_param`` fields and their message types
    (``ConvolutionParameter``), so it covers every type with a parameter message.
    """
    out = {}
    for field in caffe_pb2.LayerParameter.DESCRIPTOR.fields:
        if field.name.endswith("_param") and field.message_type is not None:
            type_name = field.message_type.name
            if type_name.endswith("Parameter"):
                out[type_name[:-len("Parameter")]] = field.name[:-len("_param")]
    return out


_param_names = param_name_dict()


def to_proto(*tops):
    """A NetParameter with every layer needed to compute ``tops`` (intermediate tops auto-named)."""
    layers = collections.OrderedDict()
    autonames = collections.Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


def assign_proto(proto, name, val):
    """Assign a Python value to field ``name`` of the message ``proto`` (recursively).

    Dicts fill sub-messages, lists of dicts add repeated sub-messages, lists (or tuples) of
    scalars extend repeated fields, a scalar given for a repeated field becomes a one-element
    list, other scalars are set.

    Raises:
        AttributeError: ``name`` is not a field of ``proto``.
        TypeError / ValueError: a value of the wrong type for the field.
    """
    field = getattr(proto, name)
    is_repeated_field = hasattr(field, "extend")
    if isinstance(val, tuple):
        val = list(val)
    if is_repeated_field and not isinstance(val, list):
        val = [val]
    if isinstance(val, list):
        if val and isinstance(val[0], dict):
            for item in val:
                proto_item = field.add()
                for k, v in item.items():
                    assign_proto(proto_item, k, v)
        else:
            field.extend(val)
    elif isinstance(val, dict):
        for k, v in val.items():
            assign_proto(field, k, v)
    else:
        setattr(proto, name, val)


class Top:
    """One output blob of a layer (the ``n``-th top of Function ``fn``)."""

    def __init__(self, fn, n):
        self.fn = fn
        self.n = n

    def to_proto(self):
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _to_proto(self, layers, names, autonames):
        return self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer: its type, its input Tops and its parameters (keyword arguments).

    Raises:
        TypeError: an input is not a Top, with pycaffe's message (``Silence input 0 is not a
            Top (type is <class 'tuple'>)``).
    """

    def __init__(self, type_name, inputs, params):
        self.type_name = type_name
        for index, inp in enumerate(inputs):
            if not isinstance(inp, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is {type(inp)})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names, autonames):
        if self not in names and self.ntop > 0:
            names[self] = self._get_top_name(self.tops[0], names, autonames)
        elif self not in names:
            autonames[self.type_name] += 1
            names[self] = self.type_name + str(autonames[self.type_name])
        return names[self]

    def _get_top_name(self, top, names, autonames):
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = top.fn.type_name + str(autonames[top.fn.type_name])
        return names[top]

    def _to_proto(self, layers, names, autonames):
        if self in layers:
            return
        bottom_names = []
        for inp in self.inputs:
            inp._to_proto(layers, names, autonames)
            bottom_names.append(layers[inp.fn].top[inp.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottom_names)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for k, v in self.params.items():
            if k.endswith("param"):   # param, transform_param, loss_param ...: on the layer
                assign_proto(layer, k, v)
                continue
            try:
                assign_proto(getattr(layer, _param_names[self.type_name] + "_param"), k, v)
            except (AttributeError, KeyError):
                assign_proto(layer, k, v)
        layers[self] = layer


class NetSpec:
    """Tops assigned as attributes (``n.conv1 = L.Convolution(...)``) under their names;
    :meth:`to_proto` gives the NetParameter of every layer needed for them, in assignment order."""

    def __init__(self):
        super().__setattr__("tops", collections.OrderedDict())

    def __setattr__(self, name, value):
        self.tops[name] = value

    def __getattr__(self, name):
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top named {name!r}") from None

    def __setitem__(self, key, value):
        self.__setattr__(key, value)

    def __getitem__(self, item):
        return self.tops[item]

    def __delitem__(self, name):
        del self.tops[name]

    def keys(self):
        return list(self.tops.keys())

    def vals(self):
        return list(self.tops.values())

    def to_proto(self):
        names = {v: k for k, v in self.tops.items()}
        autonames = collections.Counter()
        layers = collections.OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """Pseudo-module: ``layers.Convolution(bottom, kernel_size=3)`` makes a Convolution layer.

    Returns its Top (``ntop=1``, the default), a tuple of Tops, or the layer (``ntop=0``).
    """

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args, **kwargs):
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        layer_fn.__name__ = name
        return layer_fn


class Parameters:
    """Pseudo-module of enum values: ``params.Pooling.MAX`` is ``PoolingParameter.MAX``."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        message = getattr(caffe_pb2, name + "Parameter")

        class Param:
            def __getattr__(self, param_name):
                return getattr(message, param_name)
        return Param()


layers = Layers()
params = Parameters()
