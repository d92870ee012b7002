"""The process state is one object (``caffe_engine.process.state``, Caffe's ``Caffe::Get()``),
set through pycaffe's functions and put back by ``process.reset()``, which conftest calls around
every test."""
import numpy
import pytest

import caffe
from caffe_engine import backend, kernels, process, rng

state = process.state


def test_pycaffe_functions_set_the_one_state():
    caffe.set_solver_count(3)
    caffe.set_solver_rank(2)
    caffe.set_multiprocess(True)
    caffe.set_device(1)              # recorded; CPU mode touches no device
    assert (state.solver_count, state.solver_rank, state.multiprocess, state.device) == \
        (3, 2, True, 1)
    assert (caffe.solver_count(), caffe.solver_rank(), backend.multiprocess()) == (3, 2, True)
    caffe.set_random_seed(5)
    assert rng.get_rng() is state.rng and state.rng.seed == 5
    previous = kernels.use("reference")
    assert previous is None and state.kernel_choice == "reference"
    rng.set_exact_rng(True)
    assert state.exact_rng is True


def test_reset_puts_back_a_fresh_process():
    caffe.set_solver_count(4)
    caffe.set_solver_rank(1)
    caffe.set_multiprocess(True)
    caffe.set_device(2)
    caffe.set_random_seed(7)
    seeded = rng.get_rng()
    kernels.use("reference")
    rng.set_exact_rng(True)
    state.warned_no_gpu = True
    with backend.count_host_reads():
        backend.host_scalar(numpy.float32(1))
        backend.check_flag("key", numpy.array(True), numpy.array(3), ValueError)
    assert backend.host_reads() == 1 and backend.pending_checks() == 1

    process.reset()

    assert state.xp is numpy and backend.xp() is numpy and state.device == 0
    assert (backend.solver_count(), backend.solver_rank(), backend.multiprocess()) == (1, 0, False)
    assert state.kernel_choice is None and state.exact_rng is None and not state.warned_no_gpu
    assert rng.get_rng() is not seeded and state.device_streams == {}
    assert backend.host_reads() == 0 and state.emulated_reads == 0
    assert backend.pending_checks() == 0


def test_reset_keeps_the_numpy_kernel_sets_and_drops_the_cuda_one():
    reference = kernels.get("reference")
    stand_in = object()
    state.kernel_sets["cuda"] = stand_in        # a set made over some CuPy module
    process.reset()
    assert kernels.get("reference") is reference
    assert "cuda" not in state.kernel_sets


@pytest.mark.parametrize("module, private", [(backend, "_state"), (backend, "_reads"),
                                             (backend, "_deferred"), (kernels, "_state"),
                                             (kernels, "_sets"), (rng, "_global")])
def test_no_module_keeps_process_values_of_its_own(module, private):
    assert not hasattr(module, private)


def test_each_test_starts_fresh_a():
    """With its twin below: whichever runs second sees none of the first's settings."""
    assert backend.solver_count() == 1 and state.kernel_choice is None
    caffe.set_solver_count(2)
    kernels.use("reference")


def test_each_test_starts_fresh_b():
    test_each_test_starts_fresh_a()


def test_threads_asking_at_once_get_one_kernel_set(monkeypatch):
    """A Data layer's prefetch thread asks for the cpu set while the main thread sets up the
    next layers: both must get the same set (two made at once sent the layers planned on the
    first one re-planning at the first forward, with their scratch memory made again)."""
    import threading
    import time
    from caffe_engine.kernels import reference

    made = []

    class SlowToMake(reference.ReferenceKernels):
        def __init__(self):
            time.sleep(0.05)         # wide enough for every thread to get in
            super().__init__()
            made.append(self)

    monkeypatch.setattr(reference, "ReferenceKernels", SlowToMake)
    monkeypatch.delitem(state.kernel_sets, "reference", raising=False)
    start = threading.Barrier(4)
    got = []

    def ask():
        start.wait()
        got.append(kernels.get("reference"))

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len(got) == 4 and all(s is made[0] for s in got)
