"""The solver's train net shares intermediate gradients and pooling's argmax in one arena
(caffe_engine/diff_sharing.py): the same bits as every blob with its own diff, in less memory."""
import numpy
import pytest

from caffe_engine import diff_sharing
from caffe_engine.net import Net
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import get_solver
from caffe_engine.io.prototxt import parse_text

POOL_NET = """
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 2 dim: 9 dim: 9 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
        convolution_param { num_output: 5 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool2" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _solver(monkeypatch, share, net_text=POOL_NET, seed=3):
    """A momentum SGD solver of ``net_text`` (a NetParameter's text), diff sharing on or off;
    also :mod:`test_lrn_diff_sharing`'s."""
    monkeypatch.setenv("CAFFE_ENGINE_SHARE_DIFFS", "1" if share else "0")
    param = caffe_pb2.SolverParameter(base_lr=0.05, momentum=0.9, lr_policy="fixed",
                                      max_iter=100, display=0, random_seed=seed,
                                      snapshot_after_train=False)
    param.net_param.CopyFrom(parse_text(net_text, caffe_pb2.NetParameter()))
    return get_solver(param)


def _feed(net, batch, seed, chw=(2, 9, 9)):
    """Random data (batch, *chw) and labels 0..2 from ``seed``, reshaping the net to ``batch``."""
    rng = numpy.random.default_rng(seed)
    if net.blobs["data"].shape[0] != batch:
        net.blobs["data"].reshape(batch, *chw)
        net.blobs["label"].reshape(batch)
        net.reshape()
    net.blobs["data"].data[...] = rng.standard_normal((batch, *chw), dtype=numpy.float32)
    net.blobs["label"].data[...] = rng.integers(0, 3, batch)


def _params(net):
    return [p.data.copy() for p in net.learnable_params]


def test_shared_training_has_the_same_bits(monkeypatch):
    runs = []
    for share in (False, True):
        solver = _solver(monkeypatch, share)
        for it, batch in enumerate((4, 4, 6, 6, 4)):   # reshapes in between
            _feed(solver.net, batch, it)
            solver.step(1)
        runs.append(_params(solver.net))
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


def test_argmax_lives_in_the_gradient_arena(monkeypatch):
    solver = _solver(monkeypatch, True)
    _feed(solver.net, 4, 0)
    solver.step(1)
    net = solver.net
    arena = net.blobs["conv1"].diff
    while arena.base is not None:
        arena = arena.base
    pools = [layer for layer in net.layers if layer.type == "Pooling"]
    assert pools and all(layer.saved_bytes() > 0 for layer in pools)
    for layer in pools:
        assert numpy.shares_memory(layer.plan.argmax, arena)
    # the arena is smaller than the gradients and argmaxes it holds, side by side
    own = sum(b.count for name, b in net.blobs.items() if name not in ("loss",)) * 4
    own += sum(layer.saved_bytes() for layer in pools)
    assert arena.nbytes < own


def _gradients_match_unshared(monkeypatch, second_pass):
    """Forward and backward at batch 4, then ``second_pass(net, share)``: the param diffs with
    diff sharing have the bits they have without it."""
    grads = []
    for share in (False, True):
        net = _solver(monkeypatch, share).net
        _feed(net, 4, 0)
        net.forward()
        net.backward()
        second_pass(net, share)
        grads.append([p.diff.copy() for p in net.learnable_params])
    for a, b in zip(*grads):
        assert a.tobytes() == b.tobytes()


def test_a_reshape_between_forward_and_backward_keeps_the_argmax(monkeypatch):
    """Backward after a forward whose pooling planned anew (a batch change) reads the argmax
    that forward wrote: bits as without sharing."""
    def second_pass(net, share):
        _feed(net, 6, 1)           # the plan's signature changes; forward from layer 0
        net.forward()
        net.backward()
    _gradients_match_unshared(monkeypatch, second_pass)


def test_test_nets_and_plain_nets_keep_their_own_diffs():
    net = Net(parse_text(POOL_NET, caffe_pb2.NetParameter()), caffe_pb2.TRAIN)
    net.forward()
    net.backward()
    bases = set()
    for name in ("conv1", "pool1", "conv2", "pool2", "ip"):
        arr = net.blobs[name].diff
        while arr.base is not None:
            arr = arr.base
        bases.add(id(arr))
    assert len(bases) == 5


@pytest.mark.parametrize("seed", range(20))
def test_placement_never_overlaps_items_live_together(seed):
    rng = numpy.random.default_rng(seed)
    items = []
    for _ in range(int(rng.integers(1, 40))):
        first = int(rng.integers(0, 50))
        items.append({"first": first, "last": first + int(rng.integers(0, 20)),
                      "size": int(rng.integers(1, 1000))})
    total, offsets = diff_sharing._place(items)
    assert len(offsets) == len(items)
    peak = max(sum(g["size"] for g in items if g["first"] <= s <= g["last"])
               for s in range(0, 80))
    assert peak <= total <= sum(-(-g["size"] // diff_sharing.ALIGN) * diff_sharing.ALIGN
                                for g in items)
    for i, (a, oa) in enumerate(offsets):
        assert oa % diff_sharing.ALIGN == 0 and oa + a["size"] <= total
        for b, ob in offsets[i + 1:]:
            together = not (a["last"] < b["first"] or b["last"] < a["first"])
            if together:
                assert oa + a["size"] <= ob or ob + b["size"] <= oa


def test_planning_a_planned_net_again_keeps_live_gradients_apart(monkeypatch):
    """A second plan sees every shared diff in one arena: it must still tell the blobs apart
    (by address), or blobs live together would land on one place."""
    def second_pass(net, share):
        if share:
            diff_sharing.plan(net, saved=True)     # again, over the arena of the first plan
        net.forward()
        net.backward()
    _gradients_match_unshared(monkeypatch, second_pass)


SAME_SHAPE_NET = """
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 dim: 9 dim: 9 } shape { dim: 4 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "conv3" type: "Convolution" bottom: "conv2" top: "conv3"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1
                            weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "pool" type: "Pooling" bottom: "conv3" top: "pool"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("kernel_set", ["reference", "cpu"])
def test_same_shape_convolutions_take_their_gradient_in_place(monkeypatch, kernel_set):
    """conv2 and conv3 (3x3, pad 1: input and output of one shape) write their bottom's
    gradient over their top's: the three gradients conv1..conv3 are one buffer, and training
    has the bits of every blob with its own diff."""
    if kernel_set == "cpu":
        pytest.importorskip("numba", reason="the cpu kernel set needs Numba")
    from caffe_engine import kernels
    kernels.use(kernel_set)
    runs = []
    for share in (False, True):
        solver = _solver(monkeypatch, share, SAME_SHAPE_NET)
        for it, batch in enumerate((4, 4, 6, 4)):
            _feed(solver.net, batch, it, chw=(3, 9, 9))
            solver.step(1)
        runs.append(_params(solver.net))
        blobs = solver.net.blobs
        pairs = [numpy.shares_memory(blobs[a].diff, blobs[b].diff)
                 for a, b in (("conv1", "conv2"), ("conv2", "conv3"))]
        assert pairs == [share, share]
    for a, b in zip(*runs):
        assert a.tobytes() == b.tobytes()


def test_a_layer_no_longer_in_place_gets_its_own_gradient_again(monkeypatch):
    """Planned with conv2/conv3 in place, then planned again with a convolution that no longer
    says so (e.g. another kernel set): the pairs the first plan put in one buffer are apart
    again (the plan tells blobs apart by the net's own sharing, not by address), and the
    gradients keep the unshared bits."""
    from caffe_engine.layers.convolution import ConvolutionLayer
    grads = []
    for share in (False, True):
        net = _solver(monkeypatch, share, SAME_SHAPE_NET).net
        _feed(net, 4, 0, chw=(3, 9, 9))
        net.forward()
        net.backward()
        if share:
            assert numpy.shares_memory(net.blobs["conv1"].diff, net.blobs["conv2"].diff)
            with monkeypatch.context() as patch:
                patch.setattr(ConvolutionLayer, "diff_in_place", lambda self: False)
                diff_sharing.plan(net, saved=True)
                assert not numpy.shares_memory(net.blobs["conv1"].diff,
                                               net.blobs["conv2"].diff)
                net.forward()
                net.backward()
        else:
            net.forward()
            net.backward()
        grads.append([p.diff.copy() for p in net.learnable_params])
    for a, b in zip(*grads):
        assert a.tobytes() == b.tobytes()
