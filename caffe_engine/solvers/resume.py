"""Exact resume (``caffe train --exact_resume``), an addition to Caffe.

Caffe's ``--snapshot`` restores weights, history, ``iter`` and ``current_step`` only: the data
cursors restart at record 0 and the random stream restarts from ``random_seed``, so a resumed
run differs from the uninterrupted one. With ``--exact_resume`` the solver also writes, next to
each ``.solverstate`` (which stays exactly Caffe's), a side file ``<solverstate>.resume``
holding what Caffe forgets:

* the process-wide random stream (mt19937 state) and each data transformer's own stream;
* every other Caffe stream a layer keeps as an attribute (a ``CaffeRNG``);
* each Data layer's cursor (records read so far and the key of the next record), in the
  train net and in every test net;
* the state of any layer that offers ``resume_state()`` / ``restore_resume_state(state)``;
* the smoothed-loss window, so that the printed losses continue as well.

A test interrupted by a stop request is rewound (its net's cursors and streams put back to
where the test began), so that the resumed run repeats that test exactly as the uninterrupted
run ran it.

Resuming with ``--snapshot=<solverstate> --exact_resume`` restores all of it after the usual
restore, so training N iterations straight and N/2 + stop + resume give the same weights, bit
for bit. The side file is JSON (version 1), written atomically. Under ``mpiexec -n P`` rank 0
writes every rank's state into it (``"ranks"``, :func:`gather`) and each rank restores its own;
it must be resumed with the same P.
"""
import base64
import json
import logging

import numpy

from .. import rng as caffe_rng
from ..errors import CaffeError
from ..io import prototxt as pio

logger = logging.getLogger("caffe_engine")

VERSION = 1
SUFFIX = ".resume"

#: Layer types that read data in an order the side file cannot yet capture (no cursor API).
_POSITIONED_TYPES = ("HDF5Data", "ImageData", "WindowData", "MemoryData")


def side_file(state_file):
    """The side file of a ``.solverstate`` (or ``.solverstate.h5``) path."""
    return str(state_file) + SUFFIX


# -- random streams ------------------------------------------------------------------------------
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


# -- layers --------------------------------------------------------------------------------------
def _cursor_state(cursor):
    if hasattr(cursor, "get_position"):
        return {"api": cursor.get_position()}
    return {"offset": int(cursor.offset), "key": base64.b64encode(bytes(cursor.key())).decode("ascii")}


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


# -- the side file -------------------------------------------------------------------------------
def capture(solver):
    """The side file's content for ``solver`` at its current iteration."""
    return {
        "version": VERSION,
        "iter": int(solver.iter),
        "global_rng": rng_state(caffe_rng.get_rng()),
        "train_net": net_state(solver.net),
        "test_nets": [net_state(net) for net in solver.test_nets],
        "loss_window": solver.loss_window_state(),
    }


def gather(solver, comm=None):
    """The side file's content for a data-parallel solver: every rank's :func:`capture`.

    Collective when ``comm`` (a communicator: ``rank``, ``size``, ``allgather_object``) spans
    several ranks (each rank reads its own share of the records and draws from its own
    ``random_seed + rank`` stream, so each needs its own state): returns, on rank 0, rank 0's
    capture with the list of all ranks' captures under ``"ranks"``; None on the other ranks.
    Without a communicator (or with one rank) it is :func:`capture`. The data-parallel solver
    callback calls it (:meth:`caffe_engine.comm.data_parallel.DataParallel.on_snapshot`).
    """
    content = capture(solver)
    if comm is None or comm.size == 1:
        return content
    states = comm.allgather_object(content)
    if comm.rank != 0:
        return None
    return dict(states[0], ranks=states)


def for_rank(content, rank, size, path):
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


def write(path, content):
    """Write the side file atomically."""
    pio.write_atomic(path, json.dumps(content, separators=(",", ":")).encode("utf-8"))


def read(path):
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
    if not isinstance(content, dict) or content.get("version") != VERSION:
        raise CaffeError(f"--exact_resume: '{path}' has an unknown format")
    return content


def apply(solver, content):
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
