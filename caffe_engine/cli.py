"""The ``caffe`` command: ``caffe train|test|time|device_query`` with Caffe's flags and log.

Caffe: tools/caffe.cpp. Flags are parsed as gflags does (:mod:`.flags`: ``--flag=value``,
``--flag value``, ``-flag=value`` and ``-flag value``; booleans also as bare ``--flag`` /
``--noflag``); the device is chosen in :mod:`.devices`, signals are caught as
:mod:`.signal_handler` says. Every user error (bad flag, unreadable or malformed file, bad layer parameter) is printed as
one line ``caffe: ...`` on stderr with exit status 1 — never a traceback.

``train`` follows Caffe: ``--weights`` (comma-separated) finetunes the train and test nets,
``--snapshot`` resumes (weights, history, iter, lr step; data cursors and the random stream
restart as in a fresh process), SIGINT/SIGHUP act as ``--sigint_effect`` (default stop) and
``--sighup_effect`` (default snapshot) say. ``--exact_resume`` (not in Caffe) also saves and
restores the data cursors and random streams (see ``solvers/snapshot.py``).

Data-parallel training (FireCaffe; not in Caffe's tool, which used ``--gpu 0,1,..`` threads):
``mpiexec -n P caffe train --solver S`` runs one solver per process, each with the
data-parallel solver callback (``comm/data_parallel.py``); ``--comm`` picks the
gradient allreduce (tree, ring, ps, mpi, hier, nccl; default tree), ``--bucket_mb`` the gradient
bucket size (default 25) and ``--debug_sync`` checks after every update that all ranks hold
bitwise identical weights. ``--comm_compress none|fp16|topk|gtopk``, ``--comm_density`` and
``--comm_error_feedback`` compress the gradients (``comm/compress.py``; they override the
solver's engine-only ``comm_param`` block). ``--fc_parallel data|auto|G`` makes every
InnerProduct layer PCL-DNN hybrid parallel over groups of G ranks (``comm/hybrid_train.py``;
it overrides the layers' engine-only ``inner_product_param.parallel``). A failure on one rank
ends every rank (``comm/distributed.py``).
Without a launcher, or with one process, training is exactly the one-process run.
"""
import logging
import sys
import time

import numpy

from . import backend, devices
from .comm import supervisor
from .errors import CaffeError, one_line
from .flags import GLOG_FLAGS, USAGE, UsageError, clip, gflags_number, parse_flags
from .log import g, init_glog, log_to_files, logger
from .signal_handler import InterruptCheck, SignalHandler


def _positive_iterations(flags):
    """``--iterations`` for test and time: at least 1 (Caffe would divide by it).

    Raises:
        UsageError: zero or negative.
    """
    if flags["iterations"] < 1:
        raise UsageError(f"--iterations must be a positive number of iterations, got "
                         f"{flags['iterations']}")
    return flags["iterations"]


def _stages(flags):
    """``--stage`` split at ',' as Caffe's get_stages_from_flags (boost::split: ``""`` -> ``[""]``)."""
    return flags["stage"].split(",")


def _bucket_mb(value):
    """``--bucket_mb``: "auto", or a positive size in MiB written as gflags writes a double.

    Raises:
        UsageError: anything else (one line).
    """
    if value == "auto":
        return value
    try:
        size = gflags_number(float, value)
    except ValueError:
        size = None
    if size is None or not 0 < size < float("inf"):
        raise UsageError(f"--bucket_mb must be a positive size in MiB or auto, got {clip(value)}")
    return size


def _check_compression(flags):
    """``--comm_compress`` / ``--comm_density`` checked before MPI starts.

    Raises:
        CaffeError: an unknown method, a density outside (0, 1], compression with nccl (one
            line, as the ``--comm`` check).
    """
    from .comm import compress, registry
    if flags["comm_compress"] is not None:
        compress.check_method(flags["comm_compress"], "--comm_compress")
    if flags["comm_density"] is not None:
        compress.check_density(flags["comm_density"], "--comm_density")
    if flags["comm_compress"] not in (None, "none") and \
            registry.canonical(flags["comm"].partition(":")[0]) == "nccl":
        raise CaffeError("--comm_compress needs an MPI communicator (tree, ring, ps, mpi, "
                         "hier), not nccl")


def _fc_parallel(flags, world_size):
    """``--fc_parallel``: data, auto or a group size G in digits; with ``world_size`` known
    (after MPI starts, before any solver is built), G must divide it (one process included).

    Raises:
        CaffeError: one line naming the flag.
    """
    from .comm import hybrid_train
    if flags["fc_parallel"] is None:
        return
    group = hybrid_train.parse_parallel(flags["fc_parallel"], "--fc_parallel")
    if world_size is not None:
        hybrid_train.check_divides(group, world_size, "--fc_parallel")


def train(flags):
    """``caffe train``: build the solver, restore or finetune, and solve (tools/caffe.cpp).

    Under ``mpiexec -n P`` (P > 1) every process is one data-parallel solver (see the module
    docstring); a failure on any rank aborts them all.

    Raises:
        CaffeError: unknown ``--comm`` (one line), and whatever training raises.
    """
    from .comm import distributed, registry
    try:
        registry.resolve(flags["comm"])   # name, alias or name:option (e.g. hier:tree)
    except CaffeError as exc:
        raise CaffeError(f"--comm: {exc}") from None
    flags["bucket_mb"] = _bucket_mb(flags["bucket_mb"])
    _check_compression(flags)
    _fc_parallel(flags, None)
    ctx = distributed.init(flags["comm"])
    _fc_parallel(flags, ctx.size)
    if ctx.size == 1:
        return _train(flags, None)
    if not ctx.is_root:  # rank 0 alone logs; the others report warnings and errors only
        logger.setLevel(max(logger.level, logging.WARNING))
    with distributed.guard(ctx):
        status = _train(flags, ctx)
        ctx.comm.close()
    return status


def _train(flags, ctx):
    from .io import prototxt as pio
    from .solvers import get_solver
    if not flags["solver"]:
        raise UsageError("Need a solver definition to train.")
    if flags["snapshot"] and flags["weights"]:
        raise UsageError("Give a snapshot to resume training or weights to finetune but not both.")
    handler = SignalHandler(flags["sigint_effect"], flags["sighup_effect"])
    param = pio.read_solver_param(flags["solver"])
    param.train_state.level = flags["level"]
    param.train_state.stage.extend(_stages(flags))
    devices.select_train_device(flags["gpu"], param, ctx)
    if flags["snapshot"]:
        param.ClearField("weights")
    elif flags["weights"]:
        param.ClearField("weights")
        param.weights.append(flags["weights"])
    callbacks = []
    if ctx is not None:     # one solver of several: the data-parallel callback (P2PSync's part)
        from .comm.data_parallel import DataParallel
        callbacks.append(DataParallel(ctx.comm, bucket_mb=flags["bucket_mb"],
                                      debug_sync=flags["debug_sync"],
                                      compress=flags["comm_compress"],
                                      density=flags["comm_density"],
                                      error_feedback=flags["comm_error_feedback"],
                                      fc_parallel=flags["fc_parallel"]))
    with handler:
        solver = get_solver(param, source=flags["solver"], callbacks=callbacks)
        solver.exact_resume = flags["exact_resume"]
        solver.action_request_function = handler.check_for_signals
        if flags["snapshot"]:
            logger.info("Resuming from %s", flags["snapshot"])
            solver.restore(flags["snapshot"])
        logger.info("Starting Optimization")
        solver.solve()
    for callback in callbacks:
        callback.close()
    logger.info("Optimization Done.")
    return 0


def _phase(flags, default):
    from .net import TEST, TRAIN
    name = flags["phase"] or default
    if name not in ("TRAIN", "TEST"):
        raise UsageError(f"--phase must be TRAIN or TEST, got '{name}'")
    return TRAIN if name == "TRAIN" else TEST


def test(flags):
    """``caffe test``: forward ``--iterations`` batches, log every output and their means.

    As tools/caffe.cpp's test(): per batch ``Batch i, <output> = v`` for every element of every
    output blob, then ``Loss: <mean loss>`` and ``<output> = <mean>`` (with the
    ``(* weight = weighted loss)`` suffix for loss outputs). The net is built in TEST phase
    (``--phase`` may choose TRAIN, an addition) with ``--level`` and ``--stage``. SIGINT stops
    it before the next batch (:class:`InterruptCheck`).
    """
    with InterruptCheck() as interrupt:
        return _test(flags, interrupt)


def _test(flags, interrupt):
    from .net import Net
    if not flags["model"]:
        raise UsageError("Need a model definition to score.")
    if not flags["weights"]:
        raise UsageError("Need model weights to score.")
    _positive_iterations(flags)
    devices.select_device(flags["gpu"])
    net = Net(flags["model"], _phase(flags, "TEST"), level=flags["level"], stages=_stages(flags))
    net.copy_from(flags["weights"])
    iterations = flags["iterations"]
    logger.info("Running for %d iterations.", iterations)
    f32 = numpy.float32
    scores, score_output = [], []
    loss = f32(0)
    for i in range(iterations):
        interrupt.check()
        loss += net.forward_loss()
        idx = 0
        for j, name in enumerate(net.outputs):
            for v in backend.to_numpy(net.blobs[name].data).ravel():
                if i == 0:
                    scores.append(f32(v))
                    score_output.append(j)
                else:
                    scores[idx] += f32(v)
                idx += 1
                logger.info("Batch %d, %s = %s", i, name, g(v))
    loss = f32(loss / f32(iterations)) if iterations else f32("nan")
    logger.info("Loss: %s", g(loss))
    for score, j in zip(scores, score_output):
        name = net.outputs[j]
        weight = f32(net.blob_loss_weights[net.blob_names.index(name)])
        mean = f32(score / f32(iterations))
        suffix = f" (* {g(weight)} = {g(f32(weight * mean))} loss)" if weight else ""
        logger.info("%s = %s%s", name, g(mean), suffix)
    return 0


def time_(flags):
    """``caffe time``: average forward and backward time per layer over ``--iterations``.

    As tools/caffe.cpp's time(): one untimed forward and backward, then per iteration every
    layer's forward in order and backward in reverse order, each timed; the log gives each
    iteration's time, the per-layer averages, the forward/backward averages and the total.

    The timed backward calls every layer's ``backward`` directly, with the net's
    ``bottom_need_backward``, whether or not the net marked the layer as needing backward: so on
    a deploy net (no loss, nothing "needs backward") Convolution, InnerProduct, Scale, ... still
    compute their parameter gradients (``param_propagate_down``, from ``lr_mult``), as
    tools/caffe.cpp's ``layers[i]->Backward(top_vecs[i], bottom_need_backward[i],
    bottom_vecs[i])`` does; the untimed first pass is ``Net::Backward``, which skips them.
    Layers whose Caffe backward ignores ``propagate_down`` (their class says so:
    ``backward_ignores_propagate_down``; Softmax, BatchNorm, LRN across channels, MVN, Im2col)
    compute their bottom gradient here as in Caffe (see ``_time_propagate_down``).
    Times are wall-clock milliseconds (the device synchronised after each layer on the GPU).
    SIGINT stops it before the next iteration (:class:`InterruptCheck`).

    Raises:
        UsageError: no ``--model`` or a bad ``--phase``.
        CaffeError: the net cannot be built (one line).
    """
    with InterruptCheck() as interrupt:
        return _time(flags, interrupt)


def _time(flags, interrupt):
    from .net import Net
    if not flags["model"]:
        raise UsageError("Need a model definition to time.")
    _positive_iterations(flags)
    phase = _phase(flags, "TRAIN")
    devices.select_device(flags["gpu"])
    net = Net(flags["model"], phase, level=flags["level"], stages=_stages(flags))
    logger.info("Performing Forward")
    initial_loss = net.forward_loss()
    logger.info("Initial loss: %s", g(initial_loss))
    logger.info("Performing Backward")
    net.backward_from_to()
    layers, top_vecs, bottom_vecs = net.layers, net.top_vecs, net.bottom_vecs
    bottom_need_backward = [_time_propagate_down(layer, need)
                            for layer, need in zip(layers, net.bottom_need_backward)]
    n_layers = len(layers)
    fwd, bwd = numpy.zeros(n_layers), numpy.zeros(n_layers)
    forward_time = backward_time = 0.0
    iters = flags["iterations"]
    logger.info("*** Benchmark begins ***")
    logger.info("Testing for %d iterations.", iters)
    chains, backward_chains = _timed_chains(net, bottom_need_backward)
    if chains:
        logger.info("%d BatchNorm+Scale+ReLU chains run as one pass each, as in training: "
                    "forward time on the BatchNorm's line, backward on the chain's last layer",
                    len(chains))
    sync = devices.device_sync()
    total_start = time.perf_counter()
    for it in range(iters):
        interrupt.check()
        t_iter = time.perf_counter()
        i = 0
        while i < n_layers:
            last = chains[i].last if i in chains else i
            t = time.perf_counter()
            net.forward_from_to(i, last)
            sync()
            fwd[i] += time.perf_counter() - t
            i = last + 1
        forward_time += time.perf_counter() - t_iter
        t_back = time.perf_counter()
        i = n_layers - 1
        while i >= 0:
            t = time.perf_counter()
            if i in backward_chains:
                backward_chains[i].backward()
            else:
                layers[i].backward(top_vecs[i], bottom_need_backward[i], bottom_vecs[i])
            sync()
            bwd[i] += time.perf_counter() - t
            i = backward_chains[i].first - 1 if i in backward_chains else i - 1
        backward_time += time.perf_counter() - t_back
        logger.info("Iteration: %d forward-backward time: %s ms.", it + 1,
                    g((time.perf_counter() - t_iter) * 1e3))
    total = time.perf_counter() - total_start
    n = iters if iters else float("nan")
    logger.info("Average time per layer: ")
    for i, name in enumerate(net.layer_names):
        logger.info("%10s\tforward: %s ms.", name, g(fwd[i] * 1e3 / n))
        logger.info("%10s\tbackward: %s ms.", name, g(bwd[i] * 1e3 / n))
    logger.info("Average Forward pass: %s ms.", g(forward_time * 1e3 / n))
    logger.info("Average Backward pass: %s ms.", g(backward_time * 1e3 / n))
    logger.info("Average Forward-Backward: %s ms.", g(total * 1e3 / n))
    logger.info("Total Time: %s ms.", g(total * 1e3))
    logger.info("*** Benchmark ends ***")
    return 0


def _time_propagate_down(layer, need):
    """``propagate_down`` for ``layer`` in ``caffe time``'s backward: the net's
    ``bottom_need_backward`` (``need``), or all true where Caffe's layer ignores it
    (``layer.backward_ignores_propagate_down``: src/caffe/layers/{batch_norm,im2col,mvn,
    softmax}_layer.cpp, and lrn_layer.cpp across channels). The engine's layers skip that work
    when ``propagate_down`` is false, so ``caffe time`` asks them for it to time what Caffe does."""
    return [True] * len(need) if layer.backward_ignores_propagate_down else list(need)


def _timed_chains(net, bottom_need_backward):
    """The net's BatchNorm+Scale+ReLU chains (:mod:`caffe_engine.layers.batch_norm_chain`) that
    ``caffe time`` runs as one, as training does: by first layer for the forward, by last layer
    for the backward where the timed backward propagates down through all of it."""
    chains = dict(net._chains_by_first)
    backward = {c.last: c for c in chains.values()
                if all(bottom_need_backward[i][0] for i in range(c.first, c.last + 1))}
    return chains, backward


def device_query(flags):
    """``caffe device_query``: the properties of the ``--gpu`` devices (all when unset).

    Raises:
        CaffeError: no CuPy or no CUDA device (one line).
    """
    logger.info("Querying GPUs %s", flags["gpu"] or "all")
    ids = devices.gpu_ids(flags["gpu"] or "all", "device_query")
    import cupy
    for i in ids:
        p = cupy.cuda.runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
        rows = [
            ("Device id", i), ("Major revision number", p["major"]),
            ("Minor revision number", p["minor"]), ("Name", name),
            ("Total global memory", p["totalGlobalMem"]),
            ("Total shared memory per block", p["sharedMemPerBlock"]),
            ("Total registers per block", p["regsPerBlock"]), ("Warp size", p["warpSize"]),
            # CuPy's dict has memPitch only on ROCm; clockRate left CUDA 13's cudaDeviceProp
            ("Maximum memory pitch", p.get("memPitch", "unknown")),
            ("Maximum threads per block", p["maxThreadsPerBlock"]),
            ("Maximum dimension of block", ", ".join(str(x) for x in p["maxThreadsDim"])),
            ("Maximum dimension of grid", ", ".join(str(x) for x in p["maxGridSize"])),
            ("Clock rate", p.get("clockRate", "unknown")),
            ("Total constant memory", p["totalConstMem"]),
            ("Texture alignment", p["textureAlignment"]),
            ("Concurrent copy and execution", "Yes" if p.get("deviceOverlap") else "No"),
            ("Number of multiprocessors", p["multiProcessorCount"]),
            ("Kernel execution timeout", "Yes" if p.get("kernelExecTimeoutEnabled") else "No"),
        ]
        for label, value in rows:
            logger.info("%-31s%s", label + ":", value)
    return 0


COMMANDS = {"train": train, "test": test, "time": time_, "device_query": device_query}


def _speaks():
    """Whether this process prints a command-line error: under ``mpiexec -n P`` only rank 0 does.

    The errors that reach :func:`main` come from the flags and the set-up before the ranks are
    joined (failures after that end the job through ``distributed.guard``), so every rank has
    the same one; P copies of it would only bury it.
    """
    from .comm.launcher import launcher_rank_size
    return launcher_rank_size()[0] == 0


def main(argv=None):
    """Entry point of the ``caffe`` console script; returns the exit status.

    As tools/caffe.cpp's main: ``alsologtostderr`` is set, the flags are parsed, then the log
    starts (``GlobalInit``: ``InitGoogleLogging``) under the program name ``caffe``, with log
    files as glog writes them and the ``GLOG_*`` environment honoured (see
    :mod:`caffe_engine.log`); glog's flags (``--log_dir``, ``--logtostderr``,
    ``--alsologtostderr``, ``--stderrthreshold``, ``--minloglevel``, ``--v``) override it. A
    command's error is also written to the log files as an ``E`` line.
    """
    # Under mpiexec, as the program itself (not called from Python with MPI perhaps running):
    # a parent that names this rank if a signal kills it.
    if argv is None and supervisor.wanted():
        supervisor.run()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        positional, flags = parse_flags(argv)
        init_glog("caffe", alsologtostderr=True,
                  overrides={name: flags[name] for name in GLOG_FLAGS})
        if len(positional) != 1 or positional[0] not in COMMANDS:
            what = f"unknown action: {positional[0]}" if positional else "no action given"
            raise UsageError(what)
        return COMMANDS[positional[0]](flags)
    except UsageError as exc:
        if _speaks():
            sys.stderr.write(USAGE)
            sys.stderr.write(f"caffe: {one_line(exc)}\n")
        return 1
    except CaffeError as exc:
        log_to_files(logging.ERROR, "%s", exc)
        if _speaks():
            sys.stderr.write(f"caffe: {one_line(exc)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("caffe: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
