"""The Data layer's prefetch thread against loading on the caller's thread: the same batches,
the same random draws, the same log lines, and a clean stop."""
import gc
import logging
import subprocess
import sys
import threading
import time
import weakref

import numpy
import pytest

from caffe_engine.layers import prefetch as data_module
from tiny_data import batches, data_layer, make_source

F32 = numpy.float32


# -- the prefetch thread ------------------------------------------------------------------------
def threads_named(name):
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_prefetched_batches_are_the_synchronous_ones(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    want = batches(sync, stop, 9)          # wraps around the 11 records twice
    for depth in (1, 4):
        layer, top = data_layer(source, depth)
        got = batches(layer, top, 9)
        assert layer._prefetcher is not None and layer._prefetcher.thread.is_alive()
        for (a, la), (b, lb) in zip(got, want):
            assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
        layer.close()


def test_reading_state_rewinds_to_the_next_batch(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    want = batches(sync, stop, 3)
    sync_params = sync.transformer.last_params.copy()
    more = batches(sync, stop, 4)
    layer, top = data_layer(source, 4)
    got = batches(layer, top, 3)
    time.sleep(0.05)                        # let the thread run ahead
    # The cursor and the transformer are where the synchronous layer left them...
    assert layer.cursor.offset == sync.cursor.offset - 4 * 4
    assert numpy.array_equal(layer.transformer.last_params, sync_params)
    assert layer._prefetcher is None
    # ...and the batches that follow are the same ones.
    got += batches(layer, top, 4)
    for (a, la), (b, lb) in zip(got, want + more):
        assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
    assert numpy.array_equal(layer.load_batch().data, sync.load_batch().data)
    layer.close()


def test_solver_rank_set_after_prefetching_started(tmp_path):
    source = make_source(tmp_path)
    sync, stop = data_layer(source, 0)
    layer, top = data_layer(source, 4)
    batches(sync, stop, 1)
    batches(layer, top, 1)
    for l in (sync, layer):
        l.solver_count, l.solver_rank = 2, 1
    for (a, la), (b, lb) in zip(batches(layer, top, 3), batches(sync, stop, 3)):
        assert numpy.array_equal(a, b) and numpy.array_equal(la, lb)
    layer.close()


def test_thread_log_records_come_with_their_batch(tmp_path, caplog):
    source = make_source(tmp_path, count=6)
    caplog.set_level(logging.INFO, logger="caffe_engine")   # before setup starts the thread
    layer, top = data_layer(source, 4)
    layer.forward([], top)                  # records 0-3
    time.sleep(0.1)                         # the thread reads past the end meanwhile
    restarts = lambda: [r for r in caplog.records
                        if r.getMessage() == "Restarting data prefetching from start."]
    assert restarts() == []
    layer.forward([], top)                  # records 4, 5, 0, 1: the restart is logged now
    assert len(restarts()) == 1
    layer.close()


def test_thread_stops_on_close_and_when_the_layer_is_collected(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 2)
    layer.forward([], top)
    thread = layer._prefetcher.thread
    layer.close()
    assert not thread.is_alive()
    layer, top = data_layer(source, 2)
    layer.forward([], top)
    thread = layer._prefetcher.thread
    alive = weakref.ref(layer)
    del layer, top
    for _ in range(100):   # the layer is in a reference cycle: collected by the gc, once the
        gc.collect()       # thread is not holding it in the middle of a load
        if alive() is None:
            break
        time.sleep(0.01)
    assert alive() is None
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_an_error_in_the_thread_is_raised_by_forward(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 3, transform="crop_size: 4")
    calls = []
    real = layer._load_batch

    def failing():
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("bad record")
        return real()

    layer.cursor                            # the thread started at setup: stop it, rewind
    layer._load_batch = failing
    layer.forward([], top)
    with pytest.raises(ValueError, match="bad record"):
        layer.forward([], top)
    assert layer._prefetcher is None
    layer.forward([], top)                  # a new thread takes over at the failed batch
    layer.close()


def test_no_hang_at_interpreter_exit(tmp_path):
    source = make_source(tmp_path)
    code = f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
from caffe_engine.blob import Blob
from caffe_engine.layers import create_layer
from caffe_engine.proto import caffe_pb2
from google.protobuf import text_format
text = ('name: "d" type: "Data" top: "data" top: "label" '
        'data_param {{ source: "{source}" batch_size: 2 backend: LMDB prefetch: 2 }}')
layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
top = [Blob(), Blob()]
layer.setup([], top)
layer.forward([], top)
print("forwarded", flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "forwarded" in r.stdout


def test_prefetch_zero_starts_no_thread(tmp_path):
    source = make_source(tmp_path)
    layer, top = data_layer(source, 0)
    before = len(threads_named("prefetch:d"))
    layer.forward([], top)
    assert layer._prefetcher is None and len(threads_named("prefetch:d")) == before
    assert data_module.BatchPrefetcher is not None
    layer.close()
