"""The prefetching pipeline with its data threads (caffe_engine/layers/prefetch.py,
caffe_engine/io/workers.py) changes no result: the same batches, bit for bit, as loading on the
caller's thread with one thread, for Data (encoded JPEGs of several sizes), ImageData and
WindowData; an exact resume of a run reading encoded records equals the uninterrupted run; Caffe's
``Data layer prefetch queue empty`` line comes as glog's LOG_EVERY_N(INFO, 1000); ``caffe train``
ends cleanly on SIGINT, SIGTERM and at its end, leaving no prefetch thread behind (threads, not
processes: there is no shared memory to leak)."""
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import numpy
import pytest

from caffe_engine.io import workers
from caffe_engine.io.lmdb_source import write_lmdb
from caffe_engine.layers import prefetch
from caffe_engine.proto import caffe_pb2
from caffe_engine.solvers import SolverAction, get_solver
from tiny_data import batches, setup_layer

cv2 = pytest.importorskip("cv2")


@pytest.fixture
def data_threads():
    """Set the data threads for a test (``data_threads(n)``); the count is restored after."""
    previous = workers.set_threads(1)
    yield workers.set_threads
    workers.set_threads(previous or workers.default_threads())


def jpeg(h, w, seed):
    r = numpy.random.RandomState(seed)
    y, x = numpy.mgrid[0:h, 0:w]
    image = numpy.stack([(x * 3 + y + 50 * k) % 256 for k in range(3)], -1) + r.randint(-9, 9, (h, w, 3))
    ok, buf = cv2.imencode(".jpg", numpy.clip(image, 0, 255).astype(numpy.uint8))
    return buf.tobytes()


def encoded_db(path, count=23, sizes=((32, 32), (36, 40), (33, 47))):
    """An LMDB of ``count`` encoded JPEG Datums of several sizes, labels 0..9."""
    items = []
    for i in range(count):
        h, w = sizes[i % len(sizes)]
        datum = caffe_pb2.Datum(data=jpeg(h, w, i), label=i % 10, encoded=True)
        items.append((b"%08d" % i, datum.SerializeToString()))
    write_lmdb(path, items)
    return str(path)


def assert_same(a, b):
    assert len(a) == len(b)
    for (da, la), (db, lb) in zip(a, b):
        assert da.tobytes() == db.tobytes() and la.tobytes() == lb.tobytes()


TRANSFORM = ("crop_size: 28 mirror: true scale: 0.017 "
             "mean_value: 104 mean_value: 117 mean_value: 123")


def test_threaded_pipeline_equals_the_single_threaded_path_for_50_batches(tmp_path, data_threads):
    source = encoded_db(tmp_path / "db")
    text = ('name: "d" type: "Data" top: "data" top: "label" transform_param {{ {} }} '
            'data_param {{ source: "{}" batch_size: 8 backend: LMDB prefetch: {} }}')
    data_threads(1)
    single, single_top = setup_layer(text.format(TRANSFORM, source, 0))
    want = batches(single, single_top, 50)
    for threads, depth in ((3, 4), (2, 1)):
        data_threads(threads)
        threaded, top = setup_layer(text.format(TRANSFORM, source, depth))
        assert_same(batches(threaded, top, 50), want)
        assert threaded.cursor.offset == single.cursor.offset
        assert numpy.array_equal(threaded.transformer.last_params, single.transformer.last_params)
        threaded.close()
    # The draws were those of records of their own sizes: at least one crop offset lies beyond
    # the smallest record's range.
    assert single.transformer.last_params[:, 2].max() > 32 - 28
    single.close()


def test_image_data_and_window_data_threaded_equal_single(tmp_path, data_threads):
    lines, windows = [], []
    for i in range(9):
        h, w = (30 + i % 3, 40)
        path = tmp_path / f"im{i}.jpg"
        path.write_bytes(jpeg(h, w, i))
        lines.append(f"im{i}.jpg {i}")
        windows.append(f"# {i}\nim{i}.jpg\n3 {h} {w}\n2\n{1 + i % 3} 0.9 2 3 20 25\n0 0.1 0 0 10 10\n")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "windows.txt").write_text("".join(windows))
    image = ('name: "i" type: "ImageData" top: "data" top: "label" transform_param {{ {} }} '
             'image_data_param {{ source: "{}/list.txt" root_folder: "{}/" batch_size: 4 '
             'shuffle: true }}').format(TRANSFORM, tmp_path, tmp_path)
    window = ('name: "w" type: "WindowData" top: "data" top: "label" '
              'transform_param { crop_size: 12 mirror: true mean_value: 100 } '
              'window_data_param { source: "%s/windows.txt" root_folder: "%s/" batch_size: 6 '
              'context_pad: 2 }') % (tmp_path, tmp_path)
    for text in (image, window):
        data_threads(1)
        single, top = setup_layer(text)
        single.close()                     # loads on the caller's thread from here on
        want = [single.load_batch() for _ in range(7)]
        data_threads(3)
        threaded, top = setup_layer(text)
        got = batches(threaded, top, 7)
        assert_same(got, [(b.data, b.label) for b in want])
        threaded.close()


def test_exact_resume_of_a_run_on_encoded_records(tmp_path, data_threads, caplog):
    """N iterations straight (one data thread) equal N/2 + stop + resume (three threads), bit
    for bit: the cursors, the transformer's stream and the prefetched batches are rewound."""
    source = encoded_db(tmp_path / "db", count=40)
    net = f"""name: "enc"
layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: TRAIN }}
  transform_param {{ {TRANSFORM} }}
  data_param {{ source: "{source}" batch_size: 6 backend: LMDB }} }}
layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: TEST }}
  transform_param {{ crop_size: 28 scale: 0.017 mean_value: 110 }}
  data_param {{ source: "{source}" batch_size: 5 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""
    solver = ('net: "net.prototxt"\nbase_lr: 0.01\nmomentum: 0.9\nlr_policy: "fixed"\n'
              'test_iter: 2\ntest_interval: 4\ndisplay: 1\nmax_iter: 10\n'
              'snapshot_prefix: "enc"\nrandom_seed: 3\nsolver_mode: CPU\n')
    here = os.getcwd()
    try:
        for run in ("straight", "split"):
            (tmp_path / run).mkdir()
            (tmp_path / run / "net.prototxt").write_text(net)
            (tmp_path / run / "solver.prototxt").write_text(solver)
        os.chdir(tmp_path / "straight")
        data_threads(1)
        get_solver("solver.prototxt").solve()
        os.chdir(tmp_path / "split")
        data_threads(3)
        first = get_solver("solver.prototxt")
        first.exact_resume = True
        first.action_request_function = (
            lambda: SolverAction.STOP if first.iter == 5 else SolverAction.NONE)
        first.solve()
        assert first.iter == 5
        second = get_solver("solver.prototxt")
        second.exact_resume = True
        second.restore("enc_iter_5.solverstate")
        second.solve()
    finally:
        os.chdir(here)
    assert (tmp_path / "split/enc_iter_10.caffemodel").read_bytes() == \
        (tmp_path / "straight/enc_iter_10.caffemodel").read_bytes()


def test_an_empty_queue_is_logged_every_thousand_waits(tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="caffe_engine")
    monkeypatch.setitem(prefetch._waits, "count", 0)
    for _ in range(2001):
        prefetch._count_wait()
    said = [r for r in caplog.records if r.getMessage() == prefetch.QUEUE_EMPTY]
    assert len(said) == 3                               # waits 1, 1001 and 2001
    # A loader slower than the net: forward finds the queue empty and says so.
    source = encoded_db(tmp_path / "db", count=4, sizes=((32, 32),))
    lay, top = setup_layer('name: "d" type: "Data" top: "data" top: "label" '
                     f'data_param {{ source: "{source}" batch_size: 2 backend: LMDB }}')
    lay.cursor                                          # stops the thread setup started
    real = lay._load_batch
    lay._load_batch = lambda: (time.sleep(0.2), real())[1]
    monkeypatch.setitem(prefetch._waits, "count", 0)
    caplog.clear()
    lay.forward([], top)
    assert [r.getMessage() for r in caplog.records].count(prefetch.QUEUE_EMPTY) == 1
    assert lay.wait_seconds >= 0.15
    lay.close()


def test_data_threads_count_is_checked(monkeypatch):
    monkeypatch.setenv("CAFFE_ENGINE_DATA_THREADS", "3")
    assert workers.default_threads() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv("CAFFE_ENGINE_DATA_THREADS", bad)
        with pytest.raises(Exception, match="CAFFE_ENGINE_DATA_THREADS"):
            workers.default_threads()


def test_workers_raise_the_first_failing_record_and_run_every_record():
    pool = workers.Workers(3)
    seen = set()

    def job(i):
        seen.add(i)
        if i in (5, 9):
            raise ValueError(f"record {i}")
        return i * i
    assert pool.run(lambda i: i * i, 10) == [i * i for i in range(10)]
    with pytest.raises(ValueError, match="record 5"):
        pool.run(job, 12)
    assert seen == set(range(12))                   # every record runs, the lowest error wins
    assert threading.current_thread().name not in {t.name for t in threading.enumerate()
                                                   if t.name.startswith("caffe-data")}
    pool.close()


# -- ``caffe train`` ends cleanly ------------------------------------------------------------------
def train_folder(folder, max_iter):
    source = encoded_db(folder / "db", count=30)
    (folder / "net.prototxt").write_text(f"""name: "enc"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ {TRANSFORM} }}
  data_param {{ source: "{source}" batch_size: 4 backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 10 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
""")
    (folder / "solver.prototxt").write_text(
        f'net: "net.prototxt"\nbase_lr: 0.001\nlr_policy: "fixed"\ndisplay: 1\n'
        f'max_iter: {max_iter}\nsnapshot_prefix: "enc"\nrandom_seed: 1\nsolver_mode: CPU\n')


# A sitecustomize that reports, at exit, the threads still alive besides the main one.
THREAD_REPORT = """import atexit, threading, sys
def _report():
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    sys.stderr.write("threads at exit: %r\\n" % alive)
atexit.register(_report)
"""


@pytest.mark.parametrize("how", ["end", "SIGINT", "SIGTERM"])
def test_caffe_train_ends_cleanly(tmp_path, how):
    train_folder(tmp_path, 4 if how == "end" else 100000)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(THREAD_REPORT)
    env = dict(os.environ, GLOG_logtostderr="1", CAFFE_ENGINE_DATA_THREADS="3",
               PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "caffe_engine", "train", "--solver",
                             "solver.prototxt"], cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True)
    try:
        if how != "end":
            for line in proc.stderr:
                if "Iteration 3" in line:
                    break
            proc.send_signal(getattr(signal, how))
        log = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in log, log[-3000:]
    if how == "SIGTERM":
        assert proc.returncode == -signal.SIGTERM      # Caffe's default: the signal ends it
    else:
        assert proc.returncode == 0, log[-3000:]
        assert "Optimization Done." in log
        # Only the ThreadPoolExecutor's idle threads may still be alive at exit (the standard
        # library joins them); no prefetch thread.
        report = [line for line in log.splitlines() if line.startswith("threads at exit:")]
        assert report and "prefetch:" not in report[-1], report


def test_pycaffe_train_net_reads_its_share_after_set_solver_count(tmp_path):
    """Caffe's DataLayer::Skip for any TRAIN net, not only a solver's: with solver_count 2,
    rank 1 reads records 1, 3, 5, 7; a TEST net reads every record."""
    import caffe
    items = [(b"%08d" % i, caffe_pb2.Datum(channels=1, height=1, width=1, data=b"\0",
                                           label=i).SerializeToString()) for i in range(12)]
    write_lmdb(tmp_path / "db", items)
    net = tmp_path / "net.prototxt"
    net.write_text(f'layer {{ name: "d" type: "Data" top: "data" top: "label" data_param '
                   f'{{ source: "{tmp_path}/db" batch_size: 4 backend: LMDB }} }}')
    caffe.set_solver_count(2)
    caffe.set_solver_rank(1)
    try:
        train = caffe.Net(str(net), caffe.TRAIN)
        test = caffe.Net(str(net), caffe.TEST)
    finally:
        caffe.set_solver_count(1)
        caffe.set_solver_rank(0)
    train.forward()
    test.forward()
    assert train.blobs["label"].data.tolist() == [1, 3, 5, 7]
    assert test.blobs["label"].data.tolist() == [0, 1, 2, 3]
    train.forward()
    assert train.blobs["label"].data.tolist() == [9, 11, 1, 3]            # wraps around
