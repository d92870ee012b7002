"""Harness for the Caffe layer fixtures in ``../shared/caffe_reference/layers``.

One fixture case is a tiny net (an ``Input`` layer, then the layer or layers under test) run
once forward and once backward by BVLC Caffe; the ``.npz`` stores the prototxt, the inputs, the
parameters, and every top, top diff, bottom diff and parameter diff (see the README there).
:func:`check_case` rebuilds that net from the engine's layers -- directly through
``create_layer``, no Net involved -- replays the same pass and compares every stored array.

Tolerances (the fixture README's): elementwise ``|x - ref| <= atol * s + rtol * |ref|`` with
``rtol = 1e-5``, ``atol = 1e-6``, ``s = max(1, max|ref|)`` over the array. Discrete outputs
(Accuracy, the Pooling mask, ArgMax) must match exactly.

Layers that sum through BLAS (``BLAS_LAYERS``) may also differ by the rounding of a different
summation order. For those the bound gets ``BLAS_ULPS`` float32 epsilons of the *magnitude of
the summed terms*: for ``y = sum_k a_k b_k`` that is ``sum_k |a_k| |b_k|``, for a bias sum
``sum |dy|``. Every such layer is bilinear in (input, parameters) and in (top diff,
parameters / input), so the magnitudes of every output element are obtained by replaying the
same pass with the absolute values of the inputs, parameters and top diffs. As a sanity check on
that replay, a magnitude must never be below the reference value it bounds.

Devices: the replay builds blobs in the current mode (``backend.xp()``), so in GPU mode (the
``gpu_mode`` fixture, or the ``kernel_set`` fixture's ``cuda``) the case runs on CuPy. Values go
in through :func:`put` (``xp.asarray`` of the target's module) and come out through
``backend.to_numpy`` in :func:`compare`; nothing here is NumPy-only.
"""
import json
import re
from functools import lru_cache
from pathlib import Path

import numpy
from google.protobuf import json_format, text_format

from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from caffe_engine.rng import set_random_seed

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LAYER_REF = SHARED / "caffe_reference" / "layers"

RTOL = 1e-5
ATOL = 1e-6
#: Summation-order allowance for BLAS layers, in float32 epsilons of the summed magnitude.
BLAS_ULPS = 4
# LSTM, RNN, BatchNorm and MVN sum through BLAS too but are not bilinear (sigmoid/tanh,
# normalisation), so the absolute-value replay cannot bound them; they meet the plain tolerance.
BLAS_LAYERS = {"Convolution", "Deconvolution", "InnerProduct", "Embed", "Scale", "Bias"}
#: Layer types whose loops are the kernel set's (:mod:`caffe_engine.kernels`; SPP through its
#: Pooling levels): their cases run once per kernel set (the ``kernel_set`` fixture).
KERNEL_LAYERS = {"Convolution", "Deconvolution", "Pooling", "SPP", "Im2col", "LRN", "InnerProduct",
                 "ReLU"}
#: Layer type -> indices of the tops that must match exactly (None: all of them).
EXACT_TOPS = {"Accuracy": None, "ArgMax": None, "Pooling": {1}, "Filter": None}

EPS32 = float(numpy.finfo(numpy.float32).eps)


def put(target, value):
    """``target[...] = value`` for a NumPy or CuPy ``target`` (``value`` a host array, list or
    number; CuPy gets it as ``cupy.asarray``, cast to the target's dtype as NumPy's assignment
    would)."""
    target[...] = backend.get_array_module(target).asarray(value, dtype=target.dtype)


@lru_cache(maxsize=None)
def manifest():
    """The parsed ``manifest.json``."""
    with open(LAYER_REF / "manifest.json") as f:
        return json.load(f)


def cases(layer_types, kind="layer"):
    """Manifest cases of the given layer types and kind, in manifest order."""
    return [c for c in manifest()["cases"] if c["layer_type"] in layer_types and c["kind"] == kind]


def failures(layer_types):
    """Manifest ``failures`` (configurations on which Caffe aborts) of the given layer types."""
    return [f for f in manifest()["failures"] if f["layer_type"] in layer_types]


def load(case):
    """(arrays dict, NetParameter) of one case."""
    with numpy.load(LAYER_REF / case["file"]) as z:
        arrays = {k: z[k] for k in z.files}
    net = text_format.Parse(str(arrays["prototxt"]), caffe_pb2.NetParameter())
    return arrays, net


# ------------------------------------------------------------------------------------------------
# Replaying one case
# ------------------------------------------------------------------------------------------------
class Replay:
    """The case's net built from engine layers: ``blobs`` by name and ``layers`` in order.

    Args:
        case: a manifest case.
        arrays: the npz arrays (or a transformed copy: see ``absolute``).
        net: the case's NetParameter.
    """

    def __init__(self, case, arrays, net):
        self.case, self.arrays, self.net = case, arrays, net
        # Dropout (TRAIN) and DummyData draw from Caffe's stream, seeded just before the build.
        set_random_seed(case["caffe_seed"])
        self.phase = net.state.phase
        self.blobs = {}
        self.layers = []      # (LayerParameter, layer, bottoms, tops)
        sourced = set(case.get("parameter_sourced_inputs", []))
        for lp in net.layer:
            if lp.type == "Parameter" and len(lp.top) == 1 and lp.top[0] in sourced:
                value = arrays["input/" + lp.top[0]]
                blob = Blob(value.shape)
                put(blob.data, value)
                self.blobs[lp.top[0]] = blob
                continue
            layer = create_layer(lp, self.phase)
            bottoms = [self.blobs[b] for b in lp.bottom]
            tops = [self.blobs[t] if t in self.blobs else Blob() for t in lp.top]
            for name, blob in zip(lp.top, tops):
                self.blobs[name] = blob
            layer.setup(bottoms, tops)
            if lp.type == "Input":
                for name, blob in zip(lp.top, tops):
                    value = arrays["input/" + name]
                    assert blob.shape == value.shape, (
                        f"Input top {name!r}: engine shape {blob.shape}, fixture {value.shape}")
                    put(blob.data, value)
            stored = sorted((k for k in arrays if k.startswith(f"param/{lp.name}/")),
                            key=lambda k: int(k.rsplit("/", 1)[1]))
            if stored or layer.blobs:
                assert len(stored) == len(layer.blobs), (
                    f"layer {lp.name!r}: engine has {len(layer.blobs)} param blobs, "
                    f"fixture {len(stored)}")
            for blob, key in zip(layer.blobs, stored):
                assert blob.shape == arrays[key].shape, (
                    f"{key}: engine shape {blob.shape}, fixture {arrays[key].shape}")
                put(blob.data, arrays[key])
            self.layers.append((lp, layer, bottoms, tops))

    def forward(self):
        for _, layer, bottoms, tops in self.layers:
            layer.reshape(bottoms, tops)
            layer.forward(bottoms, tops)

    def backward(self):
        """Set the top diffs per the case's backward mode and run backward over all layers."""
        mode = self.case["backward"]
        if mode == "none":
            return False
        for key, value in self.arrays.items():
            if not key.startswith("top_diff/"):
                continue
            blob = self.blobs[key[len("top_diff/"):]]
            if mode in ("loss", "loss_noforce"):
                # The loss weight Caffe puts there, which the layer's setup wrote.
                compare(f"{key} (loss weight set by setup)", blob.diff, value, exact=True)
            put(blob.diff, value)
        nograd = set(self.case.get("nograd_inputs", []))
        for lp, layer, bottoms, tops in reversed(self.layers):
            if not bottoms:
                continue
            layer.backward(tops, [name not in nograd for name in lp.bottom], bottoms)
        return True


def absolute(arrays):
    """A copy of the fixture arrays with every input, parameter and top diff made absolute."""
    out = dict(arrays)
    for key, value in arrays.items():
        if key.startswith(("input/", "param/", "top_diff/")):
            out[key] = numpy.abs(value)
    return out


def compare(what, actual, expected, exact=False, magnitude=None):
    """Assert ``actual`` matches ``expected`` within the README tolerance (see module docstring).

    Args:
        what: label for the failure message.
        exact: require equality (discrete outputs).
        magnitude: same-shape array of summed-term magnitudes (BLAS layers), or None.
    """
    actual = backend.to_numpy(actual)
    expected = backend.to_numpy(expected)
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}")
    if exact:
        bad = actual != expected
        assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} values differ; first at "
                               f"{numpy.argwhere(bad)[0].tolist()}: {actual[bad][0]} vs "
                               f"{expected[bad][0]}")
        return
    a = actual.astype(numpy.float64)
    e = expected.astype(numpy.float64)
    scale = max(1.0, float(numpy.abs(e).max())) if e.size else 1.0
    allowed = ATOL * scale + RTOL * numpy.abs(e)
    if magnitude is not None:
        mag = numpy.abs(backend.to_numpy(magnitude).astype(numpy.float64))
        assert (mag + allowed >= numpy.abs(e)).all(), f"{what}: BLAS magnitude below |reference|"
        allowed = allowed + BLAS_ULPS * EPS32 * mag
    err = numpy.abs(a - e)
    bad = ~(err <= allowed)
    if bad.any():
        i = tuple(numpy.argwhere(bad)[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} values out of tolerance; worst excess "
            f"{float(numpy.max(numpy.where(bad, err - allowed, 0))):.3g}; first at {list(i)}: "
            f"got {a[i]!r}, expected {e[i]!r}, allowed error {allowed[i]:.3g}")


def _exact_top(replay, blob_name):
    for lp, _, _, _ in replay.layers:
        if blob_name in lp.top and lp.type in EXACT_TOPS:
            indices = EXACT_TOPS[lp.type]
            return indices is None or list(lp.top).index(blob_name) in indices
    return False


def check_case(case):
    """Replay one fixture case and assert every stored top, bottom diff and param diff."""
    arrays, net = load(case)
    replay = Replay(case, arrays, net)
    replay.forward()
    ran_backward = replay.backward()

    mags = None
    if any(lp.type in BLAS_LAYERS for lp, _, _, _ in replay.layers):
        mags = Replay(case, absolute(arrays), net)
        mags.forward()
        mags.backward()

    def magnitude(kind, name):
        if mags is None:
            return None
        if kind == "top":
            return mags.blobs[name].data
        if kind == "bottom_diff":
            return mags.blobs[name].diff
        layer_name, index = name.rsplit("/", 1)
        layer = next(layer for lp, layer, _, _ in mags.layers if lp.name == layer_name)
        return layer.blobs[int(index)].diff

    checked = 0
    for key, ref in arrays.items():
        kind, _, name = key.partition("/")
        if kind == "top":
            compare(f"{case['id']} {key}", replay.blobs[name].data, ref,
                    exact=_exact_top(replay, name), magnitude=magnitude(kind, name))
        elif kind == "bottom_diff" and ran_backward:
            compare(f"{case['id']} {key}", replay.blobs[name].diff, ref,
                    magnitude=magnitude(kind, name))
        elif kind == "param_diff" and ran_backward:
            layer_name, index = name.rsplit("/", 1)
            layer = next(layer for lp, layer, _, _ in replay.layers if lp.name == layer_name)
            compare(f"{case['id']} {key}", layer.blobs[int(index)].diff, ref,
                    magnitude=magnitude(kind, name))
        else:
            continue
        checked += 1
    assert checked, f"{case['id']}: nothing compared"
    backend.raise_deferred()    # checks a device run deferred (labels, indices): none may fail
    return checked


# ------------------------------------------------------------------------------------------------
# Failure configurations (no npz): build the net from the manifest entry
# ------------------------------------------------------------------------------------------------
#: Input shapes used to exercise each failing layer type: blob name -> shape.
FAILURE_INPUTS = {
    "Pooling": {"data": (2, 3, 7, 7)},
    "SoftmaxWithLoss": {"data": (3, 5), "label": (3,)},
}
#: Tops of each failing layer type, longest form; the count used is the one Caffe reported.
FAILURE_TOPS = {"Pooling": ["out"], "SoftmaxWithLoss": ["loss", "prob"]}


def failure_layer(failure):
    """(LayerParameter, input shapes) reproducing a manifest ``failures`` entry.

    The number of tops is read from Caffe's recorded check (``top.size() == ... (T vs. W)``)
    when the reason shows one, so the net is the one Caffe refused.
    """
    lp = caffe_pb2.LayerParameter()
    json_format.ParseDict(failure["config"], lp)
    layer_type = failure["layer_type"]
    lp.name, lp.type = "layer", layer_type
    inputs = FAILURE_INPUTS[layer_type]
    lp.bottom.extend(inputs)
    tops = FAILURE_TOPS[layer_type]
    m = re.search(r"top\.size\(\) == \w+ \((\d+) vs\. (\d+)\)", failure.get("reason", ""))
    lp.top.extend(tops[:int(m.group(1))] if m else tops[:1])
    return lp, inputs


def run_failure(failure):
    """Build, set up, forward and backward the failing configuration (expected to raise)."""
    lp, inputs = failure_layer(failure)
    phase = caffe_pb2.Phase.Value(failure.get("phase", "TEST"))
    rng = numpy.random.RandomState(0)
    bottoms = []
    for name, shape in inputs.items():
        blob = Blob(shape)
        put(blob.data, rng.randint(0, 3, shape) if name == "label"
            else rng.standard_normal(shape))
        bottoms.append(blob)
    tops = [Blob() for _ in lp.top]
    layer = create_layer(lp, phase)
    layer.setup(bottoms, tops)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    layer.backward(tops, [True] + [False] * (len(bottoms) - 1), bottoms)


def check_every_case():
    """Replay every ``kind: layer`` case whose layer types the engine registers and every
    Caffe failure, in the current mode, collecting the problems instead of stopping at the
    first; a device mode's deferred checks are raised after each case. Returns
    ``(cases run, problems)``, one line per problem. Dropout's TRAIN cases hold Caffe's host
    mt19937 masks: on a device, run this in the exact RNG mode (``rng.set_exact_rng``)."""
    from caffe_engine.errors import CaffeError
    from caffe_engine.layers import layer_type_list
    known = set(layer_type_list())
    problems, ran = [], 0
    for case in manifest()["cases"]:
        if case["kind"] != "layer" or {lp.type for lp in load(case)[1].layer} - known:
            continue
        try:
            check_case(case)
            backend.raise_deferred()
            ran += 1
        except Exception as exc:  # noqa: BLE001 - collected, reported together
            backend.discard_deferred()
            problems.append(f"{case['id']}: {type(exc).__name__}: {str(exc)[:300]}")
    for failure in failures({f["layer_type"] for f in manifest()["failures"]}):
        try:
            run_failure(failure)
            backend.raise_deferred()
            problems.append(f"failure {failure['id']}: did not raise")
        except CaffeError:
            pass
        except Exception as exc:  # noqa: BLE001
            problems.append(f"failure {failure['id']}: {type(exc).__name__}: {str(exc)[:300]}")
        finally:
            backend.discard_deferred()
    return ran, problems
