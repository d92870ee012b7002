"""GradientSync on a real Net: the averaged diffs, identical on every rank, with and without the
per-layer hook (overlap), and the distributed helpers (broadcast, --debug_sync, config check,
record dealing)."""
import hashlib
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.comm import distributed
from caffe_engine.comm.buckets import GradientSync
from caffe_engine.errors import CaffeError
from caffe_engine.net import TRAIN, Net
from caffe_engine.proto import caffe_pb2
from tiny_nets import SYNC_NET

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
MNIST_TRAIN = SHARED / "data" / "mnist_5k" / "mnist_train_lmdb"


def build_net(seed):
    rng.set_random_seed(seed)
    return Net(text_format.Parse(SYNC_NET, caffe_pb2.NetParameter()), TRAIN)


def feed(net, rank):
    r = numpy.random.default_rng(500 + rank)
    net.blobs["data"].data[...] = r.standard_normal((4, 6)).astype(numpy.float32)
    net.blobs["label"].data[...] = r.standard_normal((4, 3)).astype(numpy.float32)


def backward_with_hook(net, callback):
    """Net.backward_from_to with Caffe's after-backward callback (the hook asked of net.py)."""
    for i in range(len(net.layers) - 1, -1, -1):
        if net.layer_need_backward[i]:
            net.layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i],
                                   net.bottom_vecs[i])
        callback(i)


def diffs(net):
    return [b.diff.copy() for b in net.learnable_params]


def digest(arrays):
    h = hashlib.sha1()
    for a in arrays:
        h.update(numpy.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def setup_rank(comm):
    net = build_net(1701)
    distributed.broadcast_params(net, comm)
    net.clear_param_diffs()
    feed(net, comm.rank)
    net.forward_loss()
    return net


@pytest.mark.parametrize("name", ["tree", "ring"])
@pytest.mark.parametrize("bucket_mb", [0, 25])
def test_finish_averages_diffs(make, name, bucket_mb):
    comm = make(name)
    net = setup_rank(comm)
    net.backward_from_to()
    local = diffs(net)
    sync = GradientSync(net, comm, bucket_mb=bucket_mb)
    sync.finish()
    everyone = comm.allgather_object(local)
    synced = comm.allgather_object(digest(diffs(net)))
    assert len(set(synced)) == 1
    for k, blob in enumerate(net.learnable_params):
        want = sum(r[k].astype(numpy.float64) for r in everyone) / comm.size
        numpy.testing.assert_allclose(blob.diff, want, rtol=1e-5, atol=1e-6)


def test_overlap_hook_launches_early_and_gives_same_bits(make):
    comm = make("tree")
    # Path 1: no hook.
    net = setup_rank(comm)
    net.backward_from_to()
    plain = GradientSync(net, comm, bucket_mb=0)
    plain.finish()
    reference = digest(diffs(net))
    # Path 2: the per-layer hook, one bucket per param (overlap on whatever CAFFE_GRAD_OVERLAP).
    net = setup_rank(comm)
    sync = GradientSync(net, comm, bucket_mb=0, overlap=True)
    seen = []

    def hook(i):
        sync.on_layer_backward_done(i)
        seen.append((i, sync.launched))

    sync.begin()
    backward_with_hook(net, hook)
    sync.finish()
    ready = [b.ready_layer for b in sync.buckets]
    assert ready == sorted(ready, reverse=True)
    if comm.size > 1:
        after = dict(seen)
        # ip3 (layer 4) has weight and bias: both buckets launch right after its backward.
        assert after[4] == 2
        assert after[0] == len(sync.buckets)
    assert digest(diffs(net)) == reference
    assert len(set(comm.allgather_object(reference))) == 1


def test_buckets_follow_reverse_layer_order_and_shared_params(make):
    comm = make("tree")
    net = build_net(3)
    sync = GradientSync(net, comm, bucket_mb=0)
    names = {id(b): n for n, bl in net.params.items() for b in bl}
    order = [[names.get(id(net.learnable_params[k]), "?") for k in b.params] for b in sync.buckets]
    # w_shared is owned by ip1 (layer 1) and used again by ip_shared (layer 3): ready at 1.
    assert order == [["ip3"], ["ip3"], ["ip1"], ["ip1"]]
    assert [b.ready_layer for b in sync.buckets] == [4, 4, 1, 1]
    one = GradientSync(net, comm, bucket_mb=25)
    assert len(one.buckets) == 1
    assert one.buckets[0].count == sum(b.count for b in net.learnable_params)


def test_broadcast_and_debug_sync(make):
    comm = make("tree")
    net = build_net(1000 + comm.rank)          # rank-dependent fillers, as Caffe seeds them
    distributed.broadcast_params(net, comm)
    distributed.check_params_in_sync(net, comm, iteration=0)
    net.learnable_params[0].data[0, 0] += numpy.float32(comm.rank == comm.size - 1)
    if comm.size > 1:
        with pytest.raises(CaffeError, match=r"--debug_sync: weights differ.*ip1\[0\].*rank "):
            distributed.check_params_in_sync(net, comm, iteration=7)
    else:
        distributed.check_params_in_sync(net, comm, iteration=7)


def test_mismatched_prototxt_is_one_line_error_on_every_rank(make):
    comm = make("ring")
    param = text_format.Parse(SYNC_NET, caffe_pb2.NetParameter())
    distributed.check_same_config(comm, net=param)
    if comm.rank == comm.size - 1:
        param.layer[1].inner_product_param.num_output = 7
    if comm.size > 1:
        with pytest.raises(CaffeError, match="net parameters differ between ranks") as info:
            distributed.check_same_config(comm, net=param)
        assert "\n" not in str(info.value)
    else:
        distributed.check_same_config(comm, net=param)


@pytest.mark.skipif(not MNIST_TRAIN.exists(), reason="shared MNIST LMDB missing")
def test_records_are_dealt_round_robin(make):
    comm = make("tree")
    text = f"""
    layer {{ name: "mnist" type: "Data" top: "data" top: "label"
            data_param {{ source: "{MNIST_TRAIN}" batch_size: 3 backend: LMDB }} }}
    """
    net = Net(text_format.Parse(text, caffe_pb2.NetParameter()), TRAIN)
    assert distributed.deal_records(net, comm.rank, comm.size) == ["mnist"]
    net.forward_loss()
    mine = net.blobs["data"].data.copy()
    everyone = comm.allgather_object(mine)
    # The same net read by one process: records 0 .. 3P-1; rank r got records r, r+P, r+2P.
    whole = Net(text_format.Parse(text.replace("batch_size: 3", f"batch_size: {3 * comm.size}"),
                                  caffe_pb2.NetParameter()), TRAIN)
    whole.forward_loss()
    allrecs = whole.blobs["data"].data
    for r, got in enumerate(everyone):
        rows = list(distributed.record_indices(3 * comm.size, r, comm.size))
        numpy.testing.assert_array_equal(got, allrecs[rows])
