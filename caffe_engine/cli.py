"""The ``caffe`` command: ``caffe train|test|time|device_query`` with Caffe's flags and log.

Caffe: tools/caffe.cpp. Flags are parsed as gflags does: ``--flag=value``, ``--flag value``,
``-flag=value`` and ``-flag value`` all work; booleans also as bare ``--flag`` / ``--noflag``.
Every user error (bad flag, unreadable or malformed file, bad layer parameter) is printed as
one line ``caffe: ...`` on stderr with exit status 1 — never a traceback.
"""
import sys
import time

import numpy

from . import backend
from .errors import CaffeError
from .log import g, logger, setup_logging

USAGE = """caffe: command line brew
usage: caffe <command> <args>

commands:
  train           train or finetune a model
  test            score a model
  device_query    show GPU diagnostic information
  time            benchmark model execution time

Flags:
  --solver (The solver definition protocol buffer text file.) type: string
  --model (The model definition protocol buffer text file.) type: string
  --weights (Optional; the pretrained weights to initialize finetuning,
      separated by ','. Cannot be set simultaneously with snapshot.) type: string
  --snapshot (Optional; the snapshot solver state to resume training.) type: string
  --iterations (The number of iterations to run.) type: int32 default: 50
  --phase (Optional; network phase (TRAIN or TEST). Only used for 'time'.) type: string
  --level (Optional; network level.) type: int32 default: 0
  --stage (Optional; network stages (not to be confused with phase), separated by ',')
      type: string
  --gpu (Optional; run in GPU mode on given device IDs separated by ','. Use '-gpu all'
      to run on all available GPUs.) type: string
  --sigint_effect (Optional; action to take when a SIGINT signal is received:
      snapshot, stop or none.) type: string default: "stop"
  --sighup_effect (Optional; action to take when a SIGHUP signal is received:
      snapshot, stop or none.) type: string default: "snapshot"
"""

FLAGS = {
    "solver": (str, ""),
    "model": (str, ""),
    "weights": (str, ""),
    "snapshot": (str, ""),
    "iterations": (int, 50),
    "phase": (str, ""),
    "level": (int, 0),
    "stage": (str, ""),
    "gpu": (str, ""),
    "sigint_effect": (str, "stop"),
    "sighup_effect": (str, "snapshot"),
}


class UsageError(CaffeError):
    """A command-line mistake: usage text is printed with the message."""


def parse_flags(argv):
    """Parse gflags-style ``argv`` into (positional args, dict of flag values).

    Raises:
        UsageError: unknown flag, missing value, or a value of the wrong type.
    """
    values = {name: default for name, (_, default) in FLAGS.items()}
    positional = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        if arg == "--":
            positional.extend(argv[i:])
            break
        body = arg.lstrip("-")
        name, eq, value = body.partition("=")
        if name not in FLAGS:
            raise UsageError(f"unknown command line flag '{name}'")
        kind, _ = FLAGS[name]
        if not eq:
            if i >= len(argv):
                raise UsageError(f"flag '{name}' is missing its argument")
            value = argv[i]
            i += 1
        try:
            values[name] = kind(value)
        except ValueError:
            raise UsageError(f"illegal value '{value}' specified for {kind.__name__} flag '{name}'") from None
    return positional, values


def _stages(flags):
    return [s for s in flags["stage"].split(",") if s] if flags["stage"] else []


def _select_device(flags, solver_param=None):
    """CPU unless --gpu (or the solver's solver_mode: GPU when CuPy and a GPU are present)."""
    gpus = flags["gpu"]
    from .proto import caffe_pb2
    if not gpus and solver_param is not None and solver_param.solver_mode == caffe_pb2.SolverParameter.GPU:
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() > 0:
                gpus = str(solver_param.device_id)
        except Exception:
            logger.warning("solver_mode is GPU but CuPy/CUDA is not available; using the CPU")
    if not gpus:
        logger.info("Use CPU.")
        backend.set_mode_cpu()
        return
    ids = gpus.split(",")
    if gpus == "all":
        ids = ["0"]
    if len(ids) > 1:
        raise CaffeError("--gpu: several GPUs in one process are not supported; use mpiexec -n P")
    backend.set_device(int(ids[0]))
    backend.set_mode_gpu()
    logger.info("Use GPU with device ID %s", ids[0])


def train(flags):
    """``caffe train``: build the solver, restore or finetune, and solve."""
    from .io import prototxt as pio
    from .solvers import get_solver
    if not flags["solver"]:
        raise UsageError("Need a solver definition to train.")
    if flags["snapshot"] and flags["weights"]:
        raise UsageError("Give a snapshot to resume training or weights to finetune but not both.")
    param = pio.read_solver_param(flags["solver"])
    param.train_state.level = flags["level"]
    param.train_state.stage.extend(_stages(flags))
    _select_device(flags, param)
    solver = get_solver(param)
    if flags["snapshot"]:
        logger.info("Resuming from %s", flags["snapshot"])
    elif flags["weights"]:
        for path in flags["weights"].split(","):
            solver.net.copy_from(path)
            for net in solver.test_nets:
                net.copy_from(path)
    logger.info("Starting Optimization")
    solver.solve(flags["snapshot"] or None)
    logger.info("Optimization Done.")
    return 0


def _phase(flags, default):
    from .net import TEST, TRAIN
    name = flags["phase"] or default
    if name not in ("TRAIN", "TEST"):
        raise UsageError(f"--phase must be TRAIN or TEST, got '{name}'")
    return TRAIN if name == "TRAIN" else TEST


def test(flags):
    """``caffe test``: run the model forward ``--iterations`` times and print mean outputs."""
    from .net import Net
    if not flags["model"]:
        raise UsageError("Need a model definition to score.")
    if not flags["weights"]:
        raise UsageError("Need model weights to score.")
    _select_device(flags)
    net = Net(flags["model"], _phase(flags, "TEST"), level=flags["level"], stages=_stages(flags))
    net.copy_from(flags["weights"])
    logger.info("Running for %d iterations.", flags["iterations"])
    sums, loss = {}, numpy.float32(0)
    for i in range(flags["iterations"]):
        loss += net.forward_loss()
        index = 0
        for name in net.outputs:
            for k, v in enumerate(numpy.asarray(net.blobs[name].data).ravel()):
                sums[(name, k)] = sums.get((name, k), numpy.float32(0)) + v
                logger.info("Batch %d, %s = %s", i, name, g(v))
                index += 1
    loss /= numpy.float32(max(flags["iterations"], 1))
    logger.info("Loss: %s", g(loss))
    for index, ((name, k), total) in enumerate(sums.items()):
        mean = total / numpy.float32(flags["iterations"])
        weight = net.blob_loss_weights[net.blob_names.index(name)]
        suffix = f" (* {g(weight)} = {g(weight * mean)} loss)" if weight else ""
        logger.info("%s = %s%s", name, g(mean), suffix)
    return 0


def time_(flags):
    """``caffe time``: average forward and backward time per layer over ``--iterations``."""
    from .net import Net
    if not flags["model"]:
        raise UsageError("Need a model definition to time.")
    _select_device(flags)
    net = Net(flags["model"], _phase(flags, "TRAIN"), level=flags["level"], stages=_stages(flags))
    logger.info("Performing Forward")
    net.forward_loss()
    logger.info("Performing Backward")
    net.backward_from_to()
    n_layers = len(net.layers)
    fwd, bwd = numpy.zeros(n_layers), numpy.zeros(n_layers)
    iters = flags["iterations"]
    logger.info("*** Benchmark begins ***")
    logger.info("Testing for %d iterations.", iters)
    total_start = time.perf_counter()
    for it in range(iters):
        t_iter = time.perf_counter()
        for i in range(n_layers):
            t = time.perf_counter()
            net.forward_from_to(i, i)
            fwd[i] += time.perf_counter() - t
        for i in range(n_layers - 1, -1, -1):
            t = time.perf_counter()
            net.backward_from_to(i, i)
            bwd[i] += time.perf_counter() - t
        logger.info("Iteration: %d forward-backward time: %s ms.", it + 1,
                    g((time.perf_counter() - t_iter) * 1e3))
    n = max(iters, 1)
    for i, name in enumerate(net.layer_names):
        logger.info("%10s\tforward: %s ms.", name, g(fwd[i] * 1e3 / n))
        logger.info("%10s\tbackward: %s ms.", name, g(bwd[i] * 1e3 / n))
    logger.info("Average Forward pass: %s ms.", g(fwd.sum() * 1e3 / n))
    logger.info("Average Backward pass: %s ms.", g(bwd.sum() * 1e3 / n))
    logger.info("Average Forward-Backward: %s ms.", g((time.perf_counter() - total_start) * 1e3 / n))
    logger.info("Total Time: %s ms.", g((time.perf_counter() - total_start) * 1e3))
    logger.info("*** Benchmark ends ***")
    return 0


def device_query(flags):
    """``caffe device_query``: describe the CUDA device(s) CuPy sees, or say there are none."""
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise CaffeError(f"device_query: no CUDA device available (CuPy: {exc})") from None
    ids = [int(x) for x in flags["gpu"].split(",")] if flags["gpu"] and flags["gpu"] != "all" else range(count)
    for i in ids:
        props = cupy.cuda.runtime.getDeviceProperties(i)
        logger.info("Querying GPUs %d", i)
        logger.info("Device id:                     %d", i)
        logger.info("Name:                          %s", props["name"].decode())
        logger.info("Major revision number:         %d", props["major"])
        logger.info("Minor revision number:         %d", props["minor"])
        logger.info("Total global memory:           %d", props["totalGlobalMem"])
        logger.info("Number of multiprocessors:     %d", props["multiProcessorCount"])
    return 0


COMMANDS = {"train": train, "test": test, "time": time_, "device_query": device_query}


def main(argv=None):
    """Entry point of the ``caffe`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    setup_logging()
    try:
        positional, flags = parse_flags(argv)
        if len(positional) != 1 or positional[0] not in COMMANDS:
            what = f"unknown action: {positional[0]}" if positional else "no action given"
            raise UsageError(what)
        return COMMANDS[positional[0]](flags)
    except UsageError as exc:
        sys.stderr.write(USAGE)
        sys.stderr.write(f"caffe: {exc}\n")
        return 1
    except CaffeError as exc:
        sys.stderr.write(f"caffe: {exc}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write("caffe: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
