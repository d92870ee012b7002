"""No host round trips in a training iteration (the GPU path, run on NumPy).

``backend.count_host_reads()`` counts every host read (``backend.to_numpy`` /
``backend.host_scalar``) inside it, NumPy arrays included, and makes the engine take its device
branches (deferred label checks, the clipping scale applied unread), so these CPU tests run the
code a GPU runs and bound its reads:

* LeNet (the ``lenet_sgd`` training fixture's net and solver) with SGD, gradient clipping or
  LARC: every iteration that displays nothing reads nothing; a display iteration reads the
  smoothed loss, the logged output, the deferred checks and (clipping) the norm: at most 4.
* the values are the CPU path's, bit for bit: the same weights after the same iterations, the
  same display lines (the clipping line, logged every clipping iteration on the CPU, only in
  display iterations on the device).
* on a GPU (``gpu_mode``, skipped without one) the same counts with the blobs on CuPy;
* a bad label is raised at the next display (or the end of ``step``), naming the layer, with
  Caffe's message; the CPU path still raises in the forward pass.
"""
import logging
import re

import numpy
import pytest

from caffe_engine import backend
from caffe_engine.errors import CaffeError
from tiny_train import lenet_solver

def reads_per_iteration(solver, iters):
    """Counted host reads of each of ``iters`` iterations (inside ``count_host_reads``), from
    one ``on_start`` to the next; the last iteration's end is the step's end, before its
    closing read of the deferred checks."""
    marks = []
    with backend.count_host_reads() as reads:
        solver.add_callback(lambda: marks.append(reads.count), lambda: None)
        solver._step(iters)
        marks.append(reads.count)
        solver.step(0)            # the step's end: the deferred checks are read
        closing = reads.count - marks[-1]
    return [b - a for a, b in zip(marks, marks[1:])], closing


@pytest.mark.parametrize("fields", [{}, {"clip_gradients": 0.5}, {"larc": True}],
                         ids=["sgd", "clip", "larc"])
def test_lenet_iteration_reads_nothing_unless_it_displays(fields):
    check_reads(fields)


@pytest.mark.gpu
@pytest.mark.parametrize("fields", [{}, {"clip_gradients": 0.5}, {"larc": True}],
                         ids=["sgd", "clip", "larc"])
def test_lenet_iteration_reads_nothing_unless_it_displays_on_the_gpu(fields, gpu_mode):
    """The same on CuPy: the blobs are device arrays, so the counted reads are real ones."""
    check_reads(fields)
    solver = lenet_solver(display=4, **fields)
    assert type(solver.net.learnable_params[0].data).__module__.startswith("cupy")


def check_reads(fields):
    solver = lenet_solver(display=4, **fields)
    per_iter, closing = reads_per_iteration(solver, 10)
    displays = {0, 4, 8}
    assert [per_iter[i] for i in range(10) if i not in displays] == [0] * 7, per_iter
    # smoothed loss, the one output (loss), the deferred label check; clipping: its norm
    expected = 3 + ("clip_gradients" in fields)
    assert [per_iter[i] for i in sorted(displays)] == [expected] * 3, per_iter
    assert closing == 1            # the label check of the iterations since the last display
    assert backend.pending_checks() == 0


def _train(emulate, iters, caplog, **fields):
    caplog.clear()
    solver = lenet_solver(display=3, **fields)
    with caplog.at_level(logging.INFO, logger="caffe_engine"):
        if emulate:
            with backend.count_host_reads():
                solver.step(iters)
        else:
            solver.step(iters)
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith(("Iteration", "    Train", "Gradient clipping"))]
    weights = [b.data.copy() for b in solver.net.learnable_params]
    return lines, weights


@pytest.mark.parametrize("fields", [{"clip_gradients": 0.01, "average_loss": 3},
                                    {"larc": True, "larc_policy": "clip"}],
                         ids=["clip", "larc"])
def test_device_path_values_are_the_cpu_paths(fields, caplog):
    cpu_lines, cpu_weights = _train(False, 7, caplog, **fields)
    dev_lines, dev_weights = _train(True, 7, caplog, **fields)
    for a, b in zip(cpu_weights, dev_weights):
        numpy.testing.assert_array_equal(a, b)
    strip = [re.sub(r"\(\S+ iter/s, \S+ iters\)", "", line) for line in cpu_lines]
    dev = [re.sub(r"\(\S+ iter/s, \S+ iters\)", "", line) for line in dev_lines]
    if "clip_gradients" in fields:
        # The device logs the clipping line only in display iterations (0, 3, 6), where it
        # follows the lr line; the CPU logs it in every iteration that clips.
        assert sum(line.startswith("Gradient clipping") for line in strip) == 7
        strip = [line for i, line in enumerate(strip)
                 if not (line.startswith("Gradient clipping") and ", lr = " not in strip[i - 1])]
        assert sum(line.startswith("Gradient clipping") for line in dev) == 3
    assert dev == strip
    assert any(", loss = " in line for line in dev)


def _bad_label_solver():
    solver = lenet_solver(display=4)
    data_layer = solver.net.layers[0]
    original = data_layer.forward

    def forward(bottom, top):
        original(bottom, top)
        if solver.iter == 2:
            top[1].data[5] = 10          # LeNet has 10 classes: label 10 is out of range
    data_layer.forward = forward
    return solver


def test_bad_label_raised_at_once_on_the_cpu():
    solver = _bad_label_solver()
    with pytest.raises(CaffeError, match=r"loss.*label value 10 outside \[0, 10\)"):
        solver.step(4)
    assert solver.iter == 2


def test_bad_label_deferred_on_the_device_to_the_next_display():
    solver = _bad_label_solver()
    with backend.count_host_reads():
        with pytest.raises(CaffeError, match=r"loss.*label value 10 outside \[0, 10\)"):
            solver.step(8)
    # iteration 2's label was read back at the display of iteration 4, before its update
    assert solver.iter == 4
    assert backend.pending_checks() == 0
    # and at the end of a step that displays nothing after it
    solver = _bad_label_solver()
    solver.param.display = 0
    with backend.count_host_reads():
        with pytest.raises(CaffeError, match="label value 10"):
            solver.step(3)
    assert solver.iter == 3


def test_deferred_checks_keep_the_first_failure():
    backend.discard_deferred()
    xp = numpy
    backend.defer_check("k", xp.bool_(False), xp.int32(1), lambda v: ValueError(f"v={v}"))
    backend.defer_check("k", xp.bool_(True), xp.int32(7), lambda v: ValueError(f"v={v}"))
    backend.defer_check("k", xp.bool_(True), xp.int32(9), lambda v: ValueError(f"v={v}"))
    with backend.count_host_reads() as reads:
        with pytest.raises(ValueError, match="v=7"):
            backend.raise_deferred()
    assert reads.count == 2          # the flags together, then the failing payload
    assert backend.pending_checks() == 0
    backend.raise_deferred()         # nothing left


def test_host_scalar_and_counting():
    with backend.count_host_reads() as reads:
        value = backend.host_scalar(numpy.float32(2.5))
        backend.to_numpy(numpy.zeros(3))
    assert type(value) is numpy.float32 and value == 2.5
    assert reads.count == 2
    before = backend.host_reads()
    backend.host_scalar(numpy.ones((1, 1), numpy.float32))    # NumPy outside: not counted
    assert backend.host_reads() == before
    assert not backend.on_device(numpy.zeros(1))
    with pytest.raises(ValueError, match="one value"):
        backend.host_scalar(numpy.zeros(2))
