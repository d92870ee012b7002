"""The model zoo: every real-world net in ../shared/realworld builds as BVLC Caffe builds it.

For every net, phase and stage set recorded in ``realworld/reference/shapes`` (Caffe master's
build of the file after its automatic upgrades and Split insertion), the engine reads the same
text -- the data-layer-substituted copy in ``reference/substituted`` for training nets, the
original file for deploy nets -- upgrades it, builds it in that phase/stages and must agree
exactly on: layer order, names, types, bottoms, tops and param shapes; every blob's name (in
order) and shape; the net's inputs, outputs and non-zero loss weights; the total and unique
parameter counts; and Caffe's upgrade log lines. Then one forward and one backward pass run on
random inputs (deploy nets at batch <= 2, with ``force_backward`` and random output diffs so
that backward reaches every layer) and everything must stay finite.

The nets Caffe refuses (the manifest's ``negative`` cases: fork-only fields, an unknown bottom)
must fail with a one-line CaffeError carrying the gist of Caffe's message.

Fillers: the structure does not depend on them, and the engine's random stream costs about
0.2 s per million draws (VGG-16 has 138 M parameters), so random fillers are made constant
before building and the weight layers get NumPy random values for the smoke runs; filler
exactness is the fillers' own tests' business.

A case whose net uses a layer type the engine does not register yet is a strict expected failure
naming the types, so it turns into a real test the moment they land. ``KNOWN_ISSUES`` lists
cases failing for a reported engine bug (also strict).
"""
import json
import re
import time
from functools import lru_cache
from pathlib import Path

import numpy
import pytest

from caffe_engine import backend
from caffe_engine.errors import CaffeError
from caffe_engine.io import prototxt as pio
from caffe_engine.io.upgrade import upgrade_net
from caffe_engine.layers import layer_type_list
from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
REALWORLD = SHARED / "realworld"
REF = REALWORLD / "reference"

#: Cases (shapes file stem) whose forward+backward takes well over 10 s on 2 CPU cores
#: (VGG-16 at 224x224; the FCNs, VGG-16 at 256x256 and 500x500 padded by 100).
SLOW_RUN = {
    "natanielruiz__net-archive__vgg_ilsvrc_16__VGG_ILSVRC_16_layers_deploy.prototxt.TEST",
    "shelhamer__fcn.berkeleyvision.org__siftflow-fcn32s__trainval.prototxt.TRAIN",
    "shelhamer__fcn.berkeleyvision.org__siftflow-fcn32s__trainval.prototxt.TEST",
    "shelhamer__fcn.berkeleyvision.org__voc-fcn8s__deploy.prototxt.TEST",
    "shelhamer__fcn.berkeleyvision.org__voc-fcn8s__train.prototxt.TRAIN",
    "shelhamer__fcn.berkeleyvision.org__voc-fcn8s__train.prototxt.TEST",
}

KNOWN_ISSUES = {}


# ------------------------------------------------------------------------------------------------
# The cases
# ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def manifest():
    with open(REF / "manifest.json") as f:
        return json.load(f)


@lru_cache(maxsize=None)
def reference(shapes_file):
    with open(REF / shapes_file) as f:
        return json.load(f)


def zoo_cases():
    """One dict per (net, phase, stages) Caffe built: id, source path, phase, stages, reference."""
    out = []
    for net in manifest()["nets"]:
        for built in net.get("phases_built", []):
            original = net["built_from"] == "original file"
            out.append({
                "id": Path(built["file"]).name[:-len(".json")],
                "file": net["file"],
                "source": REALWORLD / net["file"] if original else REF / net["built_from"],
                # The path Caffe was given (named in its upgrade log lines).
                "caffe_path": net["file"] if original else "reference/" + net["built_from"],
                "deploy": original,
                "phase": caffe_pb2.TRAIN if built["phase"] == "TRAIN" else caffe_pb2.TEST,
                "stages": list(built["stages"]),
                "shapes": built["file"],
            })
    return out


def missing_types(case):
    ref = reference(case["shapes"])
    return sorted({layer["type"] for layer in ref["layers"]} - set(layer_type_list()))


def case_param(case, slow=False):
    marks = []
    missing = missing_types(case)
    if missing:
        marks.append(pytest.mark.xfail(strict=True, reason=f"layer type(s) {', '.join(missing)} "
                                       "not implemented yet"))
    elif case["id"] in KNOWN_ISSUES:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_ISSUES[case["id"]]))
    if slow:
        marks.append(pytest.mark.slow)
    return pytest.param(case, id=case["id"], marks=marks)


# ------------------------------------------------------------------------------------------------
# Building
# ------------------------------------------------------------------------------------------------
def read_upgraded(path, notes=None):
    """The NetParameter at ``path`` after Caffe's upgrades (as ``Net(path)`` reads it)."""
    param = pio.read_text_or_binary(str(path), caffe_pb2.NetParameter(), "net prototxt")
    return upgrade_net(param, str(path), notes)


_RANDOM_FILLERS = ("gaussian", "msra", "xavier", "uniform", "positive_unitball")
_WEIGHT_LAYERS = ("Convolution", "Deconvolution", "InnerProduct")


def cheap_fillers(param):
    """Make every random filler a constant-0 one (in place); returns ``param``.

    The structure does not depend on the values, and the engine's mt19937 stream costs about
    0.2 s per million draws (VGG-16 has 138 M parameters). :func:`randomize_weights` gives
    the weight layers random values afterwards, from NumPy, for the smoke runs. Fillers that
    draw nothing (constant, bilinear) are kept, so Scale (1) and PReLU (0.25) keep theirs.
    """
    def walk(msg):
        for field, value in msg.ListFields():
            if field.message_type is None:
                continue
            for item in (value if field.is_repeated else [value]):
                if isinstance(item, caffe_pb2.FillerParameter):
                    if item.type in _RANDOM_FILLERS:
                        item.Clear()
                        item.type = "constant"
                else:
                    walk(item)
    for layer in param.layer:
        walk(layer)
    return param


def build(case, force_backward=False):
    """The engine's Net for ``case`` (cheap fillers); ``force_backward`` for deploy smoke runs."""
    param = cheap_fillers(read_upgraded(case["source"]))
    if force_backward:
        param.force_backward = True
    return Net(param, case["phase"], stages=case["stages"])


def randomize_weights(net, rs):
    """Xavier-like uniform values for every Convolution/Deconvolution/InnerProduct weight.

    BatchNorm statistics become mean 0, variance 1 (with zero statistics, as a deploy file
    without weights has, every BatchNorm multiplies by 1/sqrt(eps) ~ 316 and a deep net
    overflows).
    """
    for layer in net.layers:
        if layer.param.type == "BatchNorm" and len(layer.blobs) == 3:
            for blob, value in zip(layer.blobs, (0.0, 1.0, 1.0)):
                blob.data[...] = value
        if layer.param.type in _WEIGHT_LAYERS and layer.blobs:
            blob = layer.blobs[0]
            scale = (3.0 / (blob.count // blob.shape[0])) ** 0.5
            values = rs.uniform(-scale, scale, blob.shape).astype(numpy.float32)
            blob.data[...] = backend.get_array_module(blob.data).asarray(values)


def _blob_list(net):
    blobs = getattr(net, "_blob_list", None)
    return list(blobs) if blobs is not None else list(net.blobs.values())


def _loss_weight_list(net):
    """Loss weight per blob index (pycaffe exposes a name-keyed dict, the net a list)."""
    weights = getattr(net, "_blob_loss_weights", None)
    if weights is None:
        weights = net.blob_loss_weights
    return list(weights.values()) if hasattr(weights, "values") else list(weights)


def describe(net):
    """The net in the reference JSON's terms."""
    names = list(net.blob_names)
    layers = []
    for i, layer in enumerate(net.layers):
        entry = {"name": net.layer_names[i], "type": layer.param.type,
                 "bottoms": [names[b] for b in net.bottom_ids[i]],
                 "tops": [names[b] for b in net.top_ids[i]]}
        if layer.blobs:
            entry["params"] = [list(b.shape) for b in layer.blobs]
        layers.append(entry)
    blobs = [{"name": n, "shape": list(b.shape)} for n, b in zip(names, _blob_list(net))]
    return {
        "layers": layers, "blobs": blobs,
        "inputs": list(net.inputs), "outputs": list(net.outputs),
        "loss_weights": {names[i]: float(w) for i, w in enumerate(_loss_weight_list(net)) if w},
        "param_count_total": int(sum(b.count for layer in net.layers for b in layer.blobs)),
        "param_count_unique": int(sum(b.count for b in net.learnable_params)),
    }


def differences(mine, ref, limit=8):
    """Human-readable differences between ``describe(net)`` and a reference JSON."""
    out = []
    ref_layers = [{k: v for k, v in layer.items() if k in ("name", "type", "bottoms", "tops",
                                                            "params")} for layer in ref["layers"]]
    for layer in ref_layers:
        layer.setdefault("params", None)
    mine_layers = [dict(layer, params=layer.get("params")) for layer in mine["layers"]]
    if len(mine_layers) != len(ref_layers):
        out.append(f"{len(mine_layers)} layers, Caffe has {len(ref_layers)}")
    for i, (a, b) in enumerate(zip(mine_layers, ref_layers)):
        if a != b:
            out.append(f"layer {i}: engine {a} != Caffe {b}")
    ref_blobs = [(b["name"], b["shape"]) for b in ref["blobs"]]
    mine_blobs = [(b["name"], b["shape"]) for b in mine["blobs"]]
    if len(mine_blobs) != len(ref_blobs):
        out.append(f"{len(mine_blobs)} blobs, Caffe has {len(ref_blobs)}")
    for i, (a, b) in enumerate(zip(mine_blobs, ref_blobs)):
        if a != b:
            out.append(f"blob {i}: engine {a[0]} {a[1]} != Caffe {b[0]} {b[1]}")
    for key in ("inputs", "outputs", "param_count_total", "param_count_unique"):
        if key in ref and mine[key] != ref[key]:
            out.append(f"{key}: engine {mine[key]} != Caffe {ref[key]}")
    ref_lw = {k: float(numpy.float32(v)) for k, v in ref["loss_weights"].items()}
    mine_lw = {k: float(numpy.float32(v)) for k, v in mine["loss_weights"].items()}
    if mine_lw != ref_lw:
        out.append(f"loss_weights: engine {mine_lw} != Caffe {ref_lw}")
    if len(out) > limit:
        out = out[:limit] + [f"... and {len(out) - limit} more"]
    return out


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
def label_classes(ref):
    """Input blob -> number of classes, for inputs feeding a SoftmaxWithLoss/Accuracy label."""
    source = {}
    for layer in ref["layers"]:
        if layer["type"] == "Split":
            for t in layer["tops"]:
                source[t] = layer["bottoms"][0]
    shapes = {b["name"]: b["shape"] for b in ref["blobs"]}
    classes = {}
    for layer in ref["layers"]:
        if layer["type"] in ("SoftmaxWithLoss", "Accuracy") and len(layer["bottoms"]) > 1:
            label = layer["bottoms"][1]
            while label in source:
                label = source[label]
            n = shapes[layer["bottoms"][0]][1]
            classes[label] = min(n, classes.get(label, n))
    return classes


def fill_inputs(net, ref, rs, max_batch=2):
    """Random inputs (labels as valid class indices); batch cut to ``max_batch`` for deploy nets."""
    classes = label_classes(ref)
    for name in net.inputs:
        blob = net.blobs[name]
        if blob.shape and blob.shape[0] > max_batch:
            blob.reshape((max_batch,) + tuple(blob.shape[1:]))
        xp = backend.get_array_module(blob.data)
        if name in classes:
            values = rs.randint(0, classes[name], blob.shape).astype(numpy.float32)
        else:
            values = rs.standard_normal(blob.shape).astype(numpy.float32)
        blob.data[...] = xp.asarray(values)


def forward_backward(net, ref, seed=0, seed_output_diffs=False):
    """One forward and one backward pass on random inputs; returns (loss, seconds).

    ``seed_output_diffs``: give the outputs random diffs before backward (deploy nets, built
    with force_backward, have no loss to start from).
    """
    rs = numpy.random.RandomState(seed)
    randomize_weights(net, rs)
    fill_inputs(net, ref, rs)
    start = time.perf_counter()
    loss = net.forward_loss()
    if seed_output_diffs:
        for name in net.outputs:
            blob = net.blobs[name]
            xp = backend.get_array_module(blob.data)
            blob.diff[...] = xp.asarray(rs.standard_normal(blob.shape).astype(numpy.float32))
    net.backward_from_to()
    return float(loss), time.perf_counter() - start


def non_finite(net):
    """Names of blobs (data or diff) and params holding NaN or inf."""
    bad = []
    for name, blob in zip(net.blob_names, _blob_list(net)):
        for what in ("data", "diff"):
            arr = backend.to_numpy(getattr(blob, what))
            if not numpy.isfinite(arr).all():
                bad.append(f"{name}.{what}")
    for lname, blobs in net.params.items():
        for k, blob in enumerate(blobs):
            if not numpy.isfinite(backend.to_numpy(blob.diff)).all():
                bad.append(f"{lname}[{k}].diff")
    return bad


# ------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------
CASES = zoo_cases()
NEGATIVE = manifest()["negative"]


def _notes_key(notes):
    # Caffe names the file as it was given; compare the lines with the path cut off.
    return [re.sub(r"^(Attempting to upgrade .*?: ).*$", r"\1<file>", n) for n in notes]


def test_every_net_file_is_covered():
    files = {n["file"] for n in manifest()["nets"]}
    built = {c["file"] for c in CASES}
    refused = {n.get("net_file") for n in NEGATIVE}
    assert files - built <= refused, f"nets neither built nor refused: {files - built - refused}"
    assert len(CASES) == sum(len(n.get("phases_built", [])) for n in manifest()["nets"])


@pytest.mark.parametrize("case", [pytest.param(c, id=c["id"]) for c in CASES])
def test_upgrade_log_matches_caffe(case):
    notes = []
    param = read_upgraded(case["source"], notes)
    ref = reference(case["shapes"])
    assert _notes_key(notes) == _notes_key(ref.get("caffe_notes", []))
    assert not len(param.layers) and not len(param.input)


@pytest.mark.parametrize("case", [case_param(c) for c in CASES])
def test_net_builds_like_caffe(case):
    net = build(case)
    problems = differences(describe(net), reference(case["shapes"]))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", [case_param(c, slow=c["id"] in SLOW_RUN) for c in CASES])
def test_net_forward_backward_runs(case):
    ref = reference(case["shapes"])
    net = build(case, force_backward=case["deploy"])
    loss, _ = forward_backward(net, ref, seed_output_diffs=case["deploy"])
    assert numpy.isfinite(loss)
    assert (loss != 0) == bool(ref["loss_weights"])
    bad = non_finite(net)
    assert not bad, f"non-finite values in {bad[:10]}"
    if ref["loss_weights"] or case["deploy"]:
        # Backward went through: every weight layer learning in this net got a weight gradient.
        for i, layer in enumerate(net.layers):
            if (layer.param.type in ("Convolution", "Deconvolution", "InnerProduct")
                    and net.layer_need_backward[i] and layer.param_propagate_down[0]):
                diff = backend.to_numpy(layer.blobs[0].diff)
                assert numpy.abs(diff).max() > 0, f"no gradient reached {net.layer_names[i]}"


PARSE_FAILURES = [n for n in NEGATIVE if n["what"] == "parse"]
INIT_FAILURES = [n for n in NEGATIVE if n["what"].startswith("init ")]


@pytest.mark.parametrize("case", PARSE_FAILURES, ids=[n["net_file"] for n in PARSE_FAILURES])
def test_fork_only_fields_refused_like_caffe(case):
    # Caffe: "<line>:<col>: Message type "caffe.X" has no field named "y"." then a fatal check.
    caffe_says = case["caffe_error"]["protobuf_error"]
    line, field = re.search(r': (\d+):\d+: .*has no field named "(\w+)"', caffe_says).groups()
    with pytest.raises(CaffeError) as info:
        Net(str(REALWORLD / case["net_file"]), caffe_pb2.TEST)
    message = str(info.value)
    assert "\n" not in message
    assert f'no field named "{field}"' in message
    assert f":{line}:" in message


@pytest.mark.parametrize("case", INIT_FAILURES, ids=[n["what"] for n in INIT_FAILURES])
def test_unknown_bottom_refused_like_caffe(case):
    phase = caffe_pb2.TRAIN if case["what"] == "init TRAIN" else caffe_pb2.TEST
    with pytest.raises(CaffeError) as info:
        Net(str(REF / case["built_from"]), phase)
    message = str(info.value)
    assert "\n" not in message
    assert case["caffe_error"]["message"] in message

