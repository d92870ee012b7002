"""The layer contract and the registry of layer types.

Caffe: include/caffe/layer.hpp, src/caffe/layer_factory.cpp.

A layer's life, exactly Caffe's split of duties:

* ``layer_setup(bottom, top)`` once: read the layer's parameters, create ``self.blobs``
  (learnable parameters, as :class:`~caffe_engine.blob.Blob`), fill them.
* ``reshape(bottom, top)`` whenever input shapes may have changed (before every forward):
  shape the tops and any internal buffers; no math.
* ``forward(bottom, top)``: compute ``top[i].data`` from ``bottom[j].data``.
* ``backward(top, propagate_down, bottom)``: write ``bottom[j].diff`` (overwrite) for each j with
  ``propagate_down[j]``, and *accumulate* into ``self.blobs[k].diff`` (Caffe's param-gradient
  accumulation, which ``iter_size`` relies on).

Arity is class data (``exact_num_bottom`` ...), checked once by :meth:`Layer.setup`.
"""
from ..errors import CaffeError

_REGISTRY = {}


def register(type_name):
    """Class decorator registering a layer class under Caffe's type string, e.g. ``"Pooling"``."""
    def wrap(cls):
        if type_name in _REGISTRY:
            raise RuntimeError(f"layer type {type_name!r} registered twice")
        cls.type = type_name
        _REGISTRY[type_name] = cls
        return cls
    return wrap


def layer_type_list():
    """Sorted list of the registered layer type strings (pycaffe's ``layer_type_list``)."""
    return sorted(_REGISTRY)


def create_layer(param, phase):
    """Instantiate the layer class registered for ``param.type``.

    Args:
        param: caffe_pb2.LayerParameter.
        phase: caffe_pb2.TRAIN or caffe_pb2.TEST.

    Raises:
        CaffeError: unknown type; the message names the layer and lists the known types.
    """
    cls = _REGISTRY.get(param.type)
    if cls is None:
        raise CaffeError(f"layer '{param.name}': unknown layer type '{param.type}' "
                         f"(known types: {', '.join(layer_type_list())})")
    return cls(param, phase)


class Layer:
    """Base class: holds the LayerParameter, the phase, the param blobs and the loss weights.

    Attributes:
        param: the caffe_pb2.LayerParameter this layer was built from.
        phase: caffe_pb2.TRAIN or caffe_pb2.TEST.
        blobs: list of learnable parameter Blobs (weights before bias, as Caffe orders them).
        loss_weights: one float per top; non-zero marks a loss output.
    """

    type = None
    exact_num_bottom = None
    min_bottom = None
    max_bottom = None
    exact_num_top = None
    min_top = None
    max_top = None
    equal_num_bottom_top = False
    #: Loss layers default to loss_weight 1 on their first top (Caffe's LossLayer).
    is_loss = False
    #: Whether Caffe's Backward of this layer computes the bottom gradient whatever
    #: ``propagate_down`` says (``caffe time`` then asks for it, to time what Caffe runs).
    backward_ignores_propagate_down = False

    @property
    def auto_top_blobs(self):
        """Whether the net adds anonymous tops up to the required count (Caffe's AutoTopBlobs:
        true for loss layers)."""
        return self.is_loss
    #: Whether force_backward may propagate to bottom ``i`` (Caffe's AllowForceBackward).
    def allow_force_backward(self, bottom_index):
        return True

    def __init__(self, param, phase):
        self.param = param
        self.phase = phase
        self.name = param.name
        self.blobs = []
        self.loss_weights = []
        # A layer keeps its own copy of the param blobs stored in the prototxt/caffemodel.

    # -- the contract ------------------------------------------------------------------------
    def layer_setup(self, bottom, top):
        """Read parameters and create ``self.blobs``. Default: nothing to set up."""

    def reshape(self, bottom, top):
        raise NotImplementedError

    def forward(self, bottom, top):
        raise NotImplementedError

    def backward(self, top, propagate_down, bottom):
        """Default for layers without gradients: nothing to propagate."""

    def saved_bytes(self):
        """Bytes of state that ``forward`` writes for ``backward`` to read and that the net
        may place in memory of its choosing (:meth:`keep_saved_in`); 0: none. The solver's
        train net puts it in the gradient memory it shares (:mod:`caffe_engine.diff_sharing`);
        pycaffe sees no blob of it, as in Caffe (e.g. pooling's ``max_idx_``)."""
        return 0

    def keep_saved_in(self, buffer):
        """From the next ``forward`` on, keep the :meth:`saved_bytes` state in ``buffer`` (a
        flat array of at least that many bytes, on the blobs' device)."""

    def diff_in_place(self):
        """Whether ``backward``, with one bottom and one top of one shape, may be given the
        bottom's diff in the memory of the top's: it reads each part of the top diff before it
        writes that part of the bottom diff, and never the top diff after. The solver's train
        net then gives both one buffer where nothing else reads the top diff later
        (:mod:`caffe_engine.diff_sharing`, which checks the counts and shapes). False unless a
        layer says so."""
        return False

    # -- driven by the net -------------------------------------------------------------------
    def setup(self, bottom, top):
        """Check arity, run ``layer_setup`` and ``reshape``, then set loss weights (Caffe's SetUp)."""
        self._check_counts(bottom, top)
        self.layer_setup(bottom, top)
        self.reshape(bottom, top)
        self._set_loss_weights(top)

    def error(self, message):
        """A CaffeError naming this layer."""
        return CaffeError(f"layer '{self.name}' ({self.type}): {message}")

    def _check_counts(self, bottom, top):
        nb, nt = len(bottom), len(top)
        checks = [
            (self.exact_num_bottom is not None and nb != self.exact_num_bottom,
             f"takes {self.exact_num_bottom} bottom blob(s), got {nb}"),
            (self.min_bottom is not None and nb < self.min_bottom,
             f"takes at least {self.min_bottom} bottom blob(s), got {nb}"),
            (self.max_bottom is not None and nb > self.max_bottom,
             f"takes at most {self.max_bottom} bottom blob(s), got {nb}"),
            (self.exact_num_top is not None and nt != self.exact_num_top,
             f"produces {self.exact_num_top} top blob(s), got {nt}"),
            (self.min_top is not None and nt < self.min_top,
             f"produces at least {self.min_top} top blob(s), got {nt}"),
            (self.max_top is not None and nt > self.max_top,
             f"produces at most {self.max_top} top blob(s), got {nt}"),
            (self.equal_num_bottom_top and nb != nt,
             f"needs as many tops as bottoms, got {nb} bottom(s) and {nt} top(s)"),
        ]
        for failed, message in checks:
            if failed:
                raise self.error(message)

    def _set_loss_weights(self, top):
        if not len(self.param.loss_weight) and self.is_loss:
            # Caffe's LossLayer writes the default into its LayerParameter, so it is saved too.
            self.param.loss_weight.append(1.0)
        weights = list(self.param.loss_weight)
        if weights and len(weights) != len(top):
            raise self.error("loss_weight must be unspecified or specified once per top blob "
                             f"({len(weights)} given for {len(top)} tops)")
        self.loss_weights = [float(w) for w in weights] or [0.0] * len(top)
        for blob, w in zip(top, self.loss_weights):
            if w:
                blob.diff[...] = w

    def loss(self, top_index):
        """The loss weight of top ``top_index`` (0 when it is not a loss)."""
        return self.loss_weights[top_index] if top_index < len(self.loss_weights) else 0.0
