"""GradientSync's overlap switch (``overlap=`` / ``CAFFE_GRAD_OVERLAP=0``) on a real Net with a
fake communicator of two ranks that records when each bucket's allreduce is launched.

Oracles: the layer whose backward had just finished when a bucket was launched (read from the
net's own after-backward hook order), the buckets' fixed launch order, and the diffs, which the
fake "mean" of identical ranks must leave bit for bit as backward made them.
"""
import numpy
import pytest
from google.protobuf import text_format

from caffe_engine import rng
from caffe_engine.comm import buckets as buckets_module
from caffe_engine.comm.buckets import GradientSync, overlap_from_env
from caffe_engine.net import TRAIN, Net
from caffe_engine.proto import caffe_pb2
from tiny_nets import IP_NET


class FakeComm:
    """Two ranks holding identical data: the mean changes nothing. Records each launch with the
    last layer whose backward had finished (``self.layer``, set by a hook registered first)."""
    name, rank, size = "fake", 0, 2

    def __init__(self):
        self.layer = None
        self.launches = []

    def allreduce_async_(self, buf, op="mean"):
        self.launches.append((self.layer, buf.size))

        class Handle:
            def wait(self):
                return None
        return Handle()


def build():
    rng.set_random_seed(7)
    net = Net(text_format.Parse(IP_NET, caffe_pb2.NetParameter()), TRAIN)
    r = numpy.random.default_rng(3)
    net.blobs["data"].data[...] = r.standard_normal((4, 6)).astype(numpy.float32)
    net.blobs["label"].data[...] = r.standard_normal((4, 3)).astype(numpy.float32)
    return net


def one_iteration(net, sync, comm):
    def where(i):
        comm.layer = i
    net.after_backward(where)
    net.after_backward(sync.on_layer_backward_done)
    net.clear_param_diffs()
    sync.begin()
    net.forward_backward()
    before = [b.diff.copy() for b in net.learnable_params]
    comm.layer = "finish"
    sync.finish()
    for b, want in zip(net.learnable_params, before):
        numpy.testing.assert_array_equal(b.diff, want)
    return comm.launches


def test_overlap_launches_during_backward(monkeypatch):
    monkeypatch.delenv("CAFFE_GRAD_OVERLAP", raising=False)
    net, comm = build(), FakeComm()
    sync = GradientSync(net, comm, bucket_mb=0)          # one bucket per param
    assert sync.overlap
    launches = one_iteration(net, sync, comm)
    # ip2 (layer 3): weight and bias right after its backward; ip1 (layer 1) after its own.
    assert launches == [(3, 15), (3, 3), (1, 30), (1, 5)]


@pytest.mark.parametrize("value", ["0", "off", "False", " no "])
def test_env_zero_reduces_everything_after_backward(monkeypatch, value):
    monkeypatch.setenv("CAFFE_GRAD_OVERLAP", value)
    net, comm = build(), FakeComm()
    sync = GradientSync(net, comm, bucket_mb=0)
    assert not sync.overlap
    launches = one_iteration(net, sync, comm)
    assert launches == [("finish", 15), ("finish", 3), ("finish", 30), ("finish", 5)]
    # Read once, in the constructor: changing the variable later changes nothing.
    monkeypatch.setenv("CAFFE_GRAD_OVERLAP", "1")
    comm.launches.clear()
    assert one_iteration(net, sync, comm) == launches


def test_argument_overrides_env_and_plans_keep_the_switch(monkeypatch):
    monkeypatch.setenv("CAFFE_GRAD_OVERLAP", "0")
    net, comm = build(), FakeComm()
    sync = GradientSync(net, comm, bucket_mb=0, overlap=True)
    sync.set_plan([[0, 1, 2, 3]])                       # as --bucket_mb auto does
    assert sync.overlap
    assert one_iteration(net, sync, comm) == [(1, 53)]
    monkeypatch.delenv("CAFFE_GRAD_OVERLAP")
    net, comm = build(), FakeComm()
    sync = GradientSync(net, comm, bucket_mb=25, overlap=False)
    assert one_iteration(net, sync, comm) == [("finish", 53)]


def test_overlap_from_env_words():
    assert overlap_from_env({}) is True
    assert overlap_from_env({"CAFFE_GRAD_OVERLAP": ""}) is True
    assert overlap_from_env({"CAFFE_GRAD_OVERLAP": "1"}) is True
    assert overlap_from_env({"CAFFE_GRAD_OVERLAP": "on"}) is True
    for word in ("0", "OFF", "false", "No"):
        assert overlap_from_env({"CAFFE_GRAD_OVERLAP": word}) is False
    assert buckets_module.OVERLAP_VAR == "CAFFE_GRAD_OVERLAP"
