"""Snapshot and restore of a solver, and exact resume (``--exact_resume``, an addition to Caffe).

Caffe: src/caffe/solver.cpp (CheckSnapshotWritePermissions, Snapshot, SnapshotToBinaryProto,
SnapshotToHDF5, Restore) and src/caffe/solvers/sgd_solver.cpp (the state files). A snapshot
writes, each file atomically (a temporary name renamed into place):

* the weights, ``<snapshot_prefix>_iter_<N>.caffemodel`` (``snapshot_format: BINARYPROTO``) or
  ``.caffemodel.h5`` (HDF5), with the diffs when ``snapshot_diff``;
* the solver state, ``.solverstate`` or ``.solverstate.h5``, written by the update rule
  (``Solver.snapshot_state``: ``iter``, ``current_step``, ``learned_net`` and the history);
* with exact resume, the side file ``<solverstate>.resume`` (below).

A restore reads a solver state back (``.h5`` names as HDF5, anything else as a binary
``SolverState``): ``iter``, the weights of the ``learned_net`` it names, ``current_step`` and
the history (``Solver.restore_state``), then the side file with exact resume.

Exact resume. Caffe's ``--snapshot`` restores weights, history, ``iter`` and ``current_step``
only: the data cursors restart at record 0 and the random stream restarts from
``random_seed``, so a resumed run differs from the uninterrupted one. With ``--exact_resume``
each snapshot also writes, next to the ``.solverstate`` (which stays exactly Caffe's), a side
file holding what Caffe forgets:

* the process-wide random stream (mt19937 state) and each data transformer's own stream;
* every other Caffe stream a layer keeps as an attribute (a ``CaffeRNG``);
* each Data layer's cursor (records read so far and the key of the next record), in the
  train net and in every test net;
* the state of any layer that offers ``resume_state()`` / ``restore_resume_state(state)``;
* the smoothed-loss window, so that the printed losses continue as well.

A test interrupted by a stop request is rewound (its net's cursors and streams put back to
where the test began, :func:`net_state` / :func:`set_net_state`), so that the resumed run
repeats that test exactly as the uninterrupted run ran it. Resuming with
``--snapshot=<solverstate> --exact_resume`` restores all of it after the usual restore, so
training N iterations straight and N/2 + stop + resume give the same weights, bit for bit. The
side file is JSON (version 1). Under ``mpiexec -n P`` rank 0 writes every rank's state into it
(``"ranks"``, :func:`gather_resume`) and each rank restores its own; it must be resumed with
the same P.

The side file is one concept with the snapshot it belongs to (written and read with it, named
after its solver state), hence one module.
"""
import base64
import json
import os

import numpy

from .. import rng as caffe_rng
from ..errors import CaffeError
from ..io import prototxt as pio
from ..log import logger
from ..proto import caffe_pb2

RESUME_VERSION = 1
RESUME_SUFFIX = ".resume"

#: Layer types that read data in an order the side file cannot yet capture (no cursor API).
_POSITIONED_TYPES = ("HDF5Data", "ImageData", "WindowData", "MemoryData")


# -- snapshots -----------------------------------------------------------------------------------
def check_snapshot_prefix(param):
    """Caffe's CheckSnapshotWritePermissions, at construction (SolverParameter ``param``).

    Raises:
        CaffeError: ``snapshot`` set without ``snapshot_prefix``, or the prefix's folder missing
            or not writable (when ``snapshot`` or ``snapshot_after_train`` will write there).
    """
    if not (param.snapshot or param.snapshot_after_train):
        return
    if param.snapshot and not param.snapshot_prefix:
        raise CaffeError("In solver params, snapshot is specified but snapshot_prefix is not")
    folder = os.path.dirname(param.snapshot_prefix) or "."
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise CaffeError(f"Cannot write to snapshot prefix '{param.snapshot_prefix}'. "
                         "Make sure that the directory exists and is writable.")


def remove_stale_temporaries(prefix):
    """Delete temporary snapshot files a killed run left (``.tmp-<prefix>_iter_*``), at the
    start and before each snapshot; logged, one line per file."""
    for path in pio.remove_stale_temporaries(f"{prefix}_iter_"):
        logger.info("Removed a temporary file a previous run left: %s", path)


def snapshot(solver, resume_content=None):
    """Write ``solver``'s weights and solver state (atomically), in ``snapshot_format``.

    BINARYPROTO: ``<prefix>_iter_<N>.caffemodel`` and ``.solverstate``; HDF5:
    ``.caffemodel.h5`` and ``.solverstate.h5``. With ``solver.exact_resume`` also the solver
    state's ``.resume`` side file: ``resume_content`` (every rank's, from an ``on_snapshot``
    callback: :func:`gather_resume`) or this process's own (:func:`capture_resume`).

    Raises:
        CaffeError: an unknown ``snapshot_format``; a file that cannot be written.
    """
    remove_stale_temporaries(solver.param.snapshot_prefix)
    state_filename = solver.snapshot_state(_write_weights(solver))
    if solver.exact_resume:
        side = side_file(state_filename)
        logger.info("Snapshotting data cursors and random streams to %s", side)
        write_side_file(side, resume_content or capture_resume(solver))


def _write_weights(solver):
    """The train net's ``.caffemodel`` (or ``.caffemodel.h5``); returns its file name."""
    param = solver.param
    if param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
        from ..io.hdf5_snapshot import save_net_hdf5
        model_filename = solver.snapshot_filename(".caffemodel.h5")
        logger.info("Snapshotting to HDF5 file %s", model_filename)
        save_net_hdf5(solver.net, model_filename, param.snapshot_diff)
    elif param.snapshot_format == caffe_pb2.SolverParameter.BINARYPROTO:
        model_filename = solver.snapshot_filename(".caffemodel")
        logger.info("Snapshotting to binary proto file %s", model_filename)
        solver.net.save(model_filename, param.snapshot_diff)
    else:
        raise CaffeError("solver: Unsupported snapshot format.")
    return model_filename


# -- restore -------------------------------------------------------------------------------------
def restore(solver, state_file, exact_resume):
    """Restore iter, lr step, history and (via ``learned_net``) weights from a solver state.

    A name ending in ``.h5`` is read as an HDF5 solver state (Caffe's layout or this engine's
    older one, see :mod:`caffe_engine.io.hdf5_snapshot`), anything else as a binary
    ``.solverstate`` (as Caffe's Solver::Restore). The ``learned_net`` named in the state is
    opened as written, i.e. relative to the working directory, as Caffe's
    RestoreSolverStateFrom* pass it straight to CopyTrainedLayersFrom. With ``exact_resume``
    the ``.resume`` side file is applied too (:func:`apply_resume`). A negative ``iter`` is
    kept, as Caffe does, with one WARNING naming it.

    Raises:
        CaffeError: unreadable or malformed state, a ``learned_net`` file that does not exist
            (one line naming it and the state), weights that do not fit, history of the wrong
            length or shape, a missing or foreign side file.
    """
    state_file = str(state_file)
    if state_file.endswith(".h5"):
        from ..io.hdf5_snapshot import load_solver_state_hdf5
        state = load_solver_state_hdf5(state_file)
        _set_solver_state(solver, state_file, state["iter"], state["learned_net"],
                          state["current_step"], state["history"], log=False)
    else:
        state = pio.read_binary(state_file, caffe_pb2.SolverState(), "solverstate")
        learned_net = state.learned_net if state.HasField("learned_net") else None
        _set_solver_state(solver, state_file, state.iter, learned_net, state.current_step,
                          list(state.history), log=True)
    if exact_resume:
        side = side_file(state_file)
        logger.info("Restoring data cursors and random streams from %s", side)
        content = resume_for_rank(read_side_file(side), solver.rank, solver.solver_count, side)
        apply_resume(solver, content)


def _set_solver_state(solver, state_file, iteration, learned_net, current_step, history, log):
    """Put a read solver state into ``solver``, in Caffe's order (iter, weights, step, history;
    ``log``: the rule logs its ``restoring history`` line, as for binary states)."""
    solver.iter = iteration
    if iteration < 0:
        logger.warning("%s: iter %d is negative; training resumes from it as Caffe does",
                       state_file, iteration)
    if learned_net is not None:
        solver.net.copy_from(_learned_net_path(state_file, learned_net))
    solver.current_step = current_step
    solver.lr_state["current_step"] = current_step
    solver.restore_state(history, log=log)


def _learned_net_path(state_file, learned_net):
    """``learned_net`` from solver state ``state_file``, checked to exist.

    Caffe opens the name as stored (relative to the working directory; no search beside the
    state file). A missing file is one CaffeError line naming both, with a hint when a file of
    that name lies beside the state (the run that wrote it worked from another folder).
    """
    if isinstance(learned_net, bytes):
        # protobuf hands back bytes for a string field that is not UTF-8: a damaged file
        raise CaffeError(f"{state_file}: learned_net is not UTF-8 text ({learned_net[:60]!r}); "
                         "the solver state is damaged")
    if os.path.exists(learned_net):
        return learned_net
    hint = ""
    beside = os.path.join(os.path.dirname(state_file), os.path.basename(learned_net))
    if os.path.exists(beside):
        hint = f"; {beside} exists: run from the folder the snapshot was taken in"
    raise CaffeError(f"{state_file}: learned_net '{learned_net}' does not exist (opened as "
                     f"written, relative to the working directory {os.getcwd()}){hint}")


# -- exact resume: random streams ----------------------------------------------------------------
def rng_state(stream):
    """A JSON-able snapshot of a CaffeRNG (its mt19937 words and position, and plain fields)."""
    if stream is None:
        return None
    if hasattr(stream, "get_state"):
        return {"api": stream.get_state()}
    out = {}
    for name, value in vars(stream).items():
        if hasattr(value, "state") and hasattr(value, "random_raw"):  # the bit generator
            st = value.state
            out[name] = {"bit_generator": st["bit_generator"],
                         "key": numpy.asarray(st["state"]["key"]).astype(numpy.uint32).tolist(),
                         "pos": int(st["state"]["pos"])}
        elif isinstance(value, numpy.ndarray):
            out[name] = {"array": value.ravel().tolist(), "dtype": value.dtype.str,
                         "shape": list(value.shape)}
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = {"plain": value}
        else:
            raise CaffeError(f"exact_resume: cannot save field '{name}' of the random stream "
                             f"({type(value).__name__})")
    return out


def set_rng_state(stream, state):
    """Put a snapshot from :func:`rng_state` back into CaffeRNG ``stream`` (in place)."""
    if "api" in state:
        stream.set_state(state["api"])
        return
    for name, value in state.items():
        if "plain" in value:
            setattr(stream, name, value["plain"])
        elif "array" in value:
            setattr(stream, name, numpy.asarray(value["array"], dtype=numpy.dtype(value["dtype"]))
                    .reshape(value["shape"]))
        else:
            bitgen = getattr(stream, name)
            bitgen.state = {"bit_generator": value["bit_generator"],
                            "state": {"key": numpy.asarray(value["key"], dtype=numpy.uint32),
                                      "pos": value["pos"]}}


def _new_rng_like(state):
    stream = caffe_rng.CaffeRNG(0)
    set_rng_state(stream, state)
    return stream


# -- exact resume: layers ------------------------------------------------------------------------
def _cursor_state(cursor):
    if hasattr(cursor, "get_position"):
        return {"api": cursor.get_position()}
    return {"offset": int(cursor.offset),
            "key": base64.b64encode(bytes(cursor.key())).decode("ascii")}


def _set_cursor_state(cursor, state, where):
    if "api" in state:
        cursor.set_position(state["api"])
        return
    key = base64.b64decode(state["key"])
    if not cursor.seek(key):
        raise CaffeError(f"exact_resume: {where}: record '{key!r}' not found in '{cursor.path}' "
                         "(was the database changed?)")
    cursor.offset = int(state["offset"])


def layer_state(layer, warn=True):
    """What one layer needs to continue exactly (None when nothing)."""
    out = {}
    if hasattr(layer, "resume_state"):
        out["layer"] = layer.resume_state()
    cursor = getattr(layer, "cursor", None)
    if cursor is not None and hasattr(cursor, "offset"):
        out["cursor"] = _cursor_state(cursor)
    transformer = getattr(layer, "transformer", None)
    if transformer is not None and getattr(transformer, "rng", None) is not None:
        out["transformer_rng"] = rng_state(transformer.rng)
    streams = {name: rng_state(value) for name, value in vars(layer).items()
               if isinstance(value, caffe_rng.CaffeRNG)}
    if streams:
        out["rngs"] = streams
    if warn and "layer" not in out and layer.type in _POSITIONED_TYPES:
        logger.warning("exact_resume: layer %s (%s) cannot save its position; it will restart "
                       "from its first record as in Caffe", layer.param.name, layer.type)
    return out or None


def set_layer_state(layer, state, where):
    """Put a :func:`layer_state` snapshot back into ``layer`` (``where`` names it in errors)."""
    if "layer" in state:
        layer.restore_resume_state(state["layer"])
    if "cursor" in state:
        _set_cursor_state(layer.cursor, state["cursor"], where)
    if "transformer_rng" in state:
        layer.transformer.rng = _new_rng_like(state["transformer_rng"])
    for name, st in state.get("rngs", {}).items():
        setattr(layer, name, _new_rng_like(st))


def net_state(net, warn=True):
    """The resumable state of every layer of ``net`` (JSON-able list)."""
    return [{"name": name, "type": layer.type, "state": layer_state(layer, warn)}
            for name, layer in zip(net.layer_names, net.layers)]


def set_net_state(net, saved, which):
    """Put a :func:`net_state` snapshot back (``which`` names the net in errors)."""
    if len(saved) != len(net.layers):
        raise CaffeError(f"exact_resume: the {which} has {len(net.layers)} layers, the side file "
                         f"{len(saved)}; was the net changed?")
    for entry, name, layer in zip(saved, net.layer_names, net.layers):
        if entry["name"] != name or entry["type"] != layer.type:
            raise CaffeError(f"exact_resume: the {which} has layer {name} ({layer.type}) where "
                             f"the side file has {entry['name']} ({entry['type']})")
        if entry["state"]:
            set_layer_state(layer, entry["state"], f"{which} layer {name}")


# -- exact resume: the side file -----------------------------------------------------------------
def side_file(state_file):
    """The side file of a ``.solverstate`` (or ``.solverstate.h5``) path."""
    return str(state_file) + RESUME_SUFFIX


def capture_resume(solver):
    """The side file's content for ``solver`` at its current iteration."""
    return {
        "version": RESUME_VERSION,
        "iter": int(solver.iter),
        "global_rng": rng_state(caffe_rng.get_rng()),
        "train_net": net_state(solver.net),
        "test_nets": [net_state(net) for net in solver.test_nets],
        "loss_window": solver.loss_window_state(),
    }


def gather_resume(solver, comm=None):
    """The side file's content for a data-parallel solver: every rank's :func:`capture_resume`.

    Collective when ``comm`` (a communicator: ``rank``, ``size``, ``allgather_object``) spans
    several ranks (each rank reads its own share of the records and draws from its own
    ``random_seed + rank`` stream, so each needs its own state): returns, on rank 0, rank 0's
    capture with the list of all ranks' captures under ``"ranks"``; None on the other ranks.
    Without a communicator (or with one rank) it is :func:`capture_resume`. The data-parallel
    solver callback calls it through the solver (``Solver.resume_content``, from
    :meth:`caffe_engine.comm.data_parallel.DataParallel.on_snapshot`).
    """
    content = capture_resume(solver)
    if comm is None or comm.size == 1:
        return content
    states = comm.allgather_object(content)
    if comm.rank != 0:
        return None
    return dict(states[0], ranks=states)


def resume_for_rank(content, rank, size, path):
    """The part of a side file's ``content`` that rank ``rank`` of ``size`` restores.

    Raises:
        CaffeError: the file was written by a different number of processes.
    """
    ranks = content.get("ranks")
    written = len(ranks) if ranks is not None else 1
    if written != size:
        raise CaffeError(f"--exact_resume: '{path}' was written by {written} process(es), this "
                         f"run has {size}; resume with the same number of processes")
    return ranks[rank] if ranks is not None else content


def write_side_file(path, content):
    """Write the side file atomically."""
    pio.write_atomic(path, json.dumps(content, separators=(",", ":")).encode("utf-8"))


def read_side_file(path):
    """Read a side file.

    Raises:
        CaffeError: missing, unreadable or of another version.
    """
    try:
        with open(path, "rb") as f:
            content = json.loads(f.read().decode("utf-8"))
    except OSError as exc:
        raise CaffeError(f"--exact_resume: cannot read '{path}' ({exc.strerror or exc}); it is "
                         "written only by runs trained with --exact_resume") from None
    except ValueError as exc:
        raise CaffeError(f"--exact_resume: '{path}' is not a resume file: {exc}") from None
    if not isinstance(content, dict) or content.get("version") != RESUME_VERSION:
        raise CaffeError(f"--exact_resume: '{path}' has an unknown format")
    return content


def apply_resume(solver, content):
    """Restore streams, cursors and loss window from ``content`` into ``solver``.

    Raises:
        CaffeError: the side file does not belong to this solver state or net.
    """
    if content["iter"] != solver.iter:
        raise CaffeError(f"--exact_resume: the side file is for iteration {content['iter']}, "
                         f"the solver state for {solver.iter}")
    if len(content["test_nets"]) != len(solver.test_nets):
        raise CaffeError(f"--exact_resume: the side file has {len(content['test_nets'])} test "
                         f"nets, the solver {len(solver.test_nets)}")
    set_net_state(solver.net, content["train_net"], "train net")
    for i, (saved, net) in enumerate(zip(content["test_nets"], solver.test_nets)):
        set_net_state(net, saved, f"test net #{i}")
    set_rng_state(caffe_rng.get_rng(), content["global_rng"])
    solver.set_loss_window_state(content.get("loss_window"))
