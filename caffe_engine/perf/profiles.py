"""Per-layer profiles of a net for the DAG (:mod:`.dag`): backward shares and gradient sizes.

Two sources:

* FLOP shares of the layers read from the shapes real BVLC Caffe built for the net
  (``shared/realworld/reference/shapes``; a convolution's forward costs 2 x weights x output
  pixels multiply-adds per image, an inner product 2 x weights; backward twice that, once for
  the weight gradient and once for the bottom gradient, except the bottom gradient of the first
  layer, which Caffe skips), scaled to a per-image compute time taken from a paper
  (:func:`shapes_profile`). Param-less layers (ReLU, pooling, LRN) cost nothing in the FLOP view
  (FireCaffe section 8: over 90 % of the FLOPs are in convolutions);
* measured per layer by ``caffe time`` (:func:`caffe_time_profile`): the time of param-less
  layers is added to the next layer with params, as
  :func:`caffe_engine.comm.bucket_plan.backward_profile` does.
"""
import json
import os

import numpy

from ..comm.bucket_plan import backward_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: BVLC Caffe's shape reports of real nets (beside the checkout).
SHAPES = os.path.join(os.path.dirname(ROOT), "shared", "realworld", "reference", "shapes")
#: ILSVRC-2012's training set: per-image compute is days / (epochs * images).
IMAGENET_TRAIN_IMAGES = 1281167


class Profile:
    """A net's layers with params in backward order: names, backward shares (summing to the
    backward share of the compute), gradient elements; plus the forward share.

    ``seconds(per_image_s, batch)`` gives (forward_s, [backward_s per layer]) for a per-image
    training compute time (forward + backward) and a per-GPU batch.
    """

    def __init__(self, names, bwd_weights, fwd_weight, elements, source=""):
        total = float(sum(bwd_weights)) + float(fwd_weight)
        self.names = list(names)
        self.bwd_share = [w / total for w in bwd_weights]
        self.fwd_share = float(fwd_weight) / total
        self.elements = [int(e) for e in elements]
        self.source = source

    def seconds(self, per_image_s, batch):
        """(forward seconds, [backward seconds per layer]) of one iteration of ``batch``."""
        t = per_image_s * batch
        return t * self.fwd_share, [t * s for s in self.bwd_share]

    def nbytes(self, bytes_per_element=4):
        """Gradient bytes per layer, in backward order."""
        return [e * bytes_per_element for e in self.elements]

    @property
    def params(self):
        """Learnable elements in all."""
        return sum(self.elements)


def _classes(shape, layer_type, classes):
    if classes and layer_type == "InnerProduct" and shape and shape[0] == classes[0]:
        return [classes[1]] + list(shape[1:])
    if classes and layer_type == "InnerProduct" and len(shape) == 1 and shape[0] == classes[0]:
        return [classes[1]]
    return list(shape)


def _layer_flops(layer, shapes, blobs, batch):
    """Forward FLOPs per image of one layer with params (see :func:`shapes_profile`)."""
    weights = int(numpy.prod(shapes[0]))
    if layer["type"] in ("Convolution", "Deconvolution"):
        top = blobs[layer["tops"][0]]
        return 2.0 * weights * int(numpy.prod(top[2:]))
    if layer["type"] == "InnerProduct":
        return 2.0 * weights
    top = blobs[layer["tops"][0]]                 # Scale, PReLU ...: elementwise, per output
    return 2.0 * int(numpy.prod(top)) / batch


def shapes_profile(path, classes=None):
    """:class:`Profile` from a BVLC Caffe shape report (``shared/realworld/reference/shapes``).

    Per image: a Convolution's forward is 2 * prod(weight shape) * output pixels FLOPs, an
    InnerProduct's 2 * prod(weight shape); backward twice the forward (weight and bottom
    gradients), the bottom gradient skipped where the bottom is the net's input. Learnable
    elements: every param blob except BatchNorm's statistics. ``classes=(old, new)`` re-sizes the
    InnerProduct classifiers with ``old`` outputs to ``new`` (Places205's 205 -> ImageNet's 1000).
    """
    with open(path) as f:
        d = json.load(f)
    blobs = {b["name"]: b["shape"] for b in d["blobs"]}
    inputs = set(d.get("inputs") or [])
    for layer in d["layers"]:
        if layer["type"] in ("Input", "Data"):
            inputs.update(layer["tops"])
    batch = blobs[d["layers"][0]["tops"][0]][0] if d["layers"][0]["tops"] else 1
    names, fwd, bwd, elems = [], [], [], []
    for layer in d["layers"]:
        params = layer.get("params") or []
        if not params or layer["type"] == "BatchNorm":
            continue
        shapes = [_classes(s, layer["type"], classes) for s in params]
        flops = _layer_flops(layer, shapes, blobs, batch)
        first = all(b in inputs for b in layer["bottoms"])
        names.append(layer["name"])
        fwd.append(flops)
        bwd.append(flops * (1 if first else 2))
        elems.append(sum(int(numpy.prod(s)) for s in shapes))
    rev = slice(None, None, -1)
    return Profile(names[rev], bwd[rev], sum(fwd), elems[rev],
                   source=os.path.basename(path))


def caffe_time_profile(layer_ms, param_counts):
    """:class:`Profile` from measured per-layer times (``caffe time``).

    Args:
        layer_ms: [(layer name, forward ms, backward ms)] in layer order.
        param_counts: {layer name: learnable elements} (layers with params only).

    The backward of param-less layers is added to the next layer with params in backward order
    (:func:`caffe_engine.comm.bucket_plan.backward_profile`).
    """
    names = [n for n, _, _ in layer_ms]
    ready, counts = [], []
    for i, name in enumerate(names):
        if param_counts.get(name):
            ready.append(i)
            counts.append(param_counts[name])
    layer_seconds = {i: b / 1e3 for i, (_, _, b) in enumerate(layer_ms)}
    _, grad_layers, backward_s, nbytes = backward_profile(ready, counts, layer_seconds,
                                                          len(names))
    fwd = sum(f for _, f, _ in layer_ms) / 1e3
    return Profile([names[i] for i in grad_layers], backward_s, fwd,
                   [n // 4 for n in nbytes], source="caffe time")
