"""Finite-difference gradient checks: Caffe's GradientChecker, the one harness of every test.

Caffe: include/caffe/test/test_gradient_check_util.hpp. For every element of every checked
bottom and parameter blob, the central difference ``(f(x + h) - f(x - h)) / 2h`` with step
``h = stepsize`` is compared with the analytic gradient from ``backward``; they must agree within
``threshold * max(|analytic|, |estimate|, 1)`` (Caffe's scale rule). Caffe's defaults of its
layer tests are ``stepsize = 1e-2``, ``threshold = 1e-3``; a layer's own test in Caffe may use
others (src/caffe/test/test_*_layer.cpp), and the tests here pass the same ones.

Kinks, as Caffe's checker: an element whose value ``x`` has ``|x|`` within ``kink_range`` of
``kink`` is not checked (a negative ``kink_range``, the default, checks every element).

The layer runs in float32 as always; the objective is ``sum_i top_i * r_i`` with fixed random
weights ``r`` (the top diffs), summed in float64 so that unperturbed outputs cancel exactly --
over every top, or over top ``top_id`` alone (Caffe's ``top_id``: a MAX pooling mask or an
exposed recurrent state is not part of the function). Parameter diffs start at zero, as the
checker requires.

Devices: blobs are made in the current mode, so in GPU mode (the ``gpu_mode`` fixture, the
``kernel_set`` fixture's ``cuda``) the layer runs on CuPy; values go in through :func:`put` and
come out through ``backend.to_numpy`` / ``backend.host_scalar``, and the objective and the
comparison are computed on the host in float64 either way. :func:`gpu_twins` gives a test
module a GPU-mode twin of each of its gradient checks.
"""
import functools
import inspect

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import backend
from caffe_engine.blob import Blob
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2

STEPSIZE = 1e-2
THRESHOLD = 1e-3


def put(target, value):
    """``target[...] = value`` for a NumPy or CuPy ``target`` (``value`` a host array, list or
    number, cast to the target's dtype as NumPy's assignment casts)."""
    target[...] = backend.get_array_module(target).asarray(value, dtype=target.dtype)


def blobs_of(values):
    """One float32 Blob per array (in the current mode), holding its values (data only)."""
    blobs = []
    for value in values:
        blob = Blob(value.shape)
        put(blob.data, value)
        blobs.append(blob)
    return blobs


def make_layer(text, bottom_values, seed=0):
    """Create and set up a layer (TRAIN) from prototxt text; params get random values."""
    lp = text_format.Parse(text, caffe_pb2.LayerParameter())
    layer = create_layer(lp, caffe_pb2.TRAIN)
    bottoms = blobs_of(bottom_values)
    tops = [Blob() for _ in lp.top]
    layer.setup(bottoms, tops)
    rng = numpy.random.RandomState(seed)
    for blob in layer.blobs:
        put(blob.data, rng.standard_normal(blob.shape))
    return layer, bottoms, tops


def gaussian(shape, seed=2):
    """Standard normal float32 values."""
    return numpy.random.RandomState(seed).standard_normal(shape).astype(numpy.float32)


def distinct(shape, seed=3, spacing=0.05):
    """Values pairwise at least ``spacing`` apart (no ties survive a +-stepsize nudge)."""
    n = int(numpy.prod(shape))
    values = numpy.random.RandomState(seed).permutation(n) * spacing - n * spacing / 2
    return values.reshape(shape).astype(numpy.float32)


def check_gradient(layer, bottoms, tops, check_bottoms, stepsize=STEPSIZE, threshold=THRESHOLD,
                   kink=0.0, kink_range=-1.0, top_id=None, params=True, seed=1):
    """Assert analytic == numeric gradients for ``check_bottoms`` and (``params``) every param
    blob of ``layer``; returns the number of elements checked (at least one).

    Args:
        layer, bottoms, tops: a set-up layer and its blobs (the layer runs its own reshape and
            forward here, so it plans on the kernel set in use now).
        check_bottoms: indices of the bottoms to check (the others get ``propagate_down``
            False).
        stepsize, threshold: Caffe's checker's (see the module docstring).
        kink, kink_range: skip elements with ``| |x| - kink | <= kink_range`` (Caffe's kink).
        top_id: only this top enters the objective (None: every top).
        params: also check every param blob (False where Caffe computes no param gradient).
        seed: of the random top weights.
    """
    f32 = numpy.float32
    rng = numpy.random.RandomState(seed)
    layer.reshape(bottoms, tops)
    layer.forward(bottoms, tops)
    objective_tops = range(len(tops)) if top_id is None else [top_id]
    weights = {i: rng.standard_normal(tops[i].shape).astype(f32) for i in objective_tops}

    def objective():
        layer.reshape(bottoms, tops)
        layer.forward(bottoms, tops)
        return sum(float(numpy.sum(backend.to_numpy(tops[i].data).astype(numpy.float64) * w))
                   for i, w in weights.items())

    for i, t in enumerate(tops):
        put(t.diff, weights.get(i, 0))
    for blob in layer.blobs:
        blob.diff[...] = 0
    layer.backward(tops, [i in check_bottoms for i in range(len(bottoms))], bottoms)
    checked = [(f"bottom {i}", bottoms[i], backend.to_numpy(bottoms[i].diff).copy())
               for i in check_bottoms]
    if params:
        checked += [(f"param {k}", b, backend.to_numpy(b.diff).copy())
                    for k, b in enumerate(layer.blobs)]

    count = 0
    for what, blob, analytic in checked:
        flat = blob.data.reshape(-1)
        for j in range(flat.size):
            value = backend.host_scalar(flat[j])      # a numpy.float32 on either device
            if kink - kink_range <= abs(float(value)) <= kink + kink_range:
                continue
            flat[j] = value + f32(stepsize)
            plus = objective()
            flat[j] = value - f32(stepsize)
            minus = objective()
            flat[j] = value
            estimate = (plus - minus) / (2 * stepsize)
            computed = float(analytic.reshape(-1)[j])
            scale = max(abs(computed), abs(estimate), 1.0)
            assert abs(computed - estimate) <= threshold * scale, (
                f"{what}[{numpy.unravel_index(j, blob.shape)}]: analytic {computed}, "
                f"numeric {estimate}")
            count += 1
    assert count > 0
    backend.raise_deferred()    # checks a device run deferred (labels, indices): none may fail
    return count


def gpu_twins(namespace):
    """GPU-mode twins of a test module's gradient checks: ``{name + "_gpu": twin}`` for every
    ``test_*`` function of ``namespace`` (a module's ``globals()``) that runs
    :func:`check_gradient` (directly or through a module-level helper) and does not take the
    ``kernel_set`` fixture (whose ``cuda`` parameter runs in GPU mode already). A twin has the
    test's parameters and marks plus the ``gpu_mode`` fixture (skipped with the reason where
    CuPy or a device is missing), and runs the test's body unchanged. The CPU tests, their ids
    and what they run stay as they are. Use at the end of the module:
    ``globals().update(gpu_twins(globals()))``.
    """
    helpers = {name for name, obj in namespace.items() if inspect.isfunction(obj)
               and obj.__module__ == namespace["__name__"]}

    def runs_check(fn, seen=()):
        names = set(fn.__code__.co_names)
        for const in fn.__code__.co_consts:      # nested functions and lambdas
            if inspect.iscode(const):
                names |= set(const.co_names)
        if "check_gradient" in names:
            return True
        return any(runs_check(namespace[n], seen + (n,)) for n in names & helpers
                   if n not in seen and not n.startswith("test_"))

    twins = {}
    for name, fn in list(namespace.items()):
        if not (name.startswith("test_") and inspect.isfunction(fn)):
            continue
        signature = inspect.signature(fn)
        if "kernel_set" in signature.parameters or not runs_check(fn):
            continue
        twins[name + "_gpu"] = _twin(fn, name + "_gpu", signature)
    return twins


def _twin(fn, name, signature):
    @functools.wraps(fn)
    def twin(*args, gpu_mode, **kwargs):
        return fn(*args, **kwargs)
    del twin.__wrapped__        # pytest reads the parameters from __signature__
    twin.__name__ = twin.__qualname__ = name
    twin.__dict__["pytestmark"] = list(getattr(fn, "pytestmark", []))
    twin.__signature__ = signature.replace(parameters=list(signature.parameters.values()) + [
        inspect.Parameter("gpu_mode", inspect.Parameter.KEYWORD_ONLY)])
    return pytest.mark.gpu(twin)
