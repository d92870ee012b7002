"""The ``caffe`` command's flags, parsed as Caffe's gflags parses them.

Caffe: tools/caffe.cpp (the DEFINE_* flags and the usage message), gflags' gflags.cc
(``ParseCommandLineFlags``: the flag forms, ``FlagValue::ParseFrom``'s numbers and booleans, and
its messages). ``--flag=value``, ``--flag value``, ``-flag=value`` and ``-flag value`` all work;
booleans also as bare ``--flag`` / ``--noflag``; ``--`` ends the flags. glog's flags, which
Caffe's gflags parse too, are in the table (:data:`GLOG_FLAGS`).

A maintained parser (absl-py's ``absl.flags``, Google's Python heir of gflags) was measured
against this one (issue 28) and not taken: it refuses what gflags takes (``--flag=no``,
``0X7fffffff``), takes what gflags refuses (``1_000``, ``"2 "``, Arabic-Indic digits, ``nan``)
and words every error differently (``Unknown command line flag``, ``Missing value for flag``,
``invalid literal for int()``) from the gflags messages users and the tests know.
"""
import re

from .errors import CaffeError

USAGE = """caffe: command line brew
usage: caffe <command> <args>

commands:
  train           train or finetune a model
  test            score a model
  device_query    show GPU diagnostic information
  time            benchmark model execution time

  Flags:
    -solver (The solver definition protocol buffer text file.) type: string
      default: ""
    -model (The model definition protocol buffer text file.) type: string
      default: ""
    -weights (Optional; the pretrained weights to initialize finetuning,
      separated by ','. Cannot be set simultaneously with snapshot.)
      type: string default: ""
    -snapshot (Optional; the snapshot solver state to resume training.)
      type: string default: ""
    -exact_resume (Not in Caffe: with -snapshot, also restore the data cursors
      and random streams saved in <solverstate>.resume; when training, write
      that file with every snapshot.) type: bool default: false
    -iterations (The number of iterations to run.) type: int32 default: 50
    -phase (Optional; network phase (TRAIN or TEST). Only used for 'time'
      (and 'test', which defaults to TEST).) type: string default: ""
    -level (Optional; network level.) type: int32 default: 0
    -stage (Optional; network stages (not to be confused with phase), separated
      by ','.) type: string default: ""
    -gpu (Optional; run in GPU mode on given device IDs separated by ','.Use
      '-gpu all' to run on all available GPUs. The effective training batch
      size is multiplied by the number of devices.) type: string default: ""
    -sigint_effect (Optional; action to take when a SIGINT signal is received:
      snapshot, stop or none.) type: string default: "stop"
    -sighup_effect (Optional; action to take when a SIGHUP signal is received:
      snapshot, stop or none.) type: string default: "snapshot"
    -comm (Not in Caffe; under mpiexec, the gradient allreduce: tree, ring, ps,
      mpi, hier[:ring|:tree] or nccl.) type: string default: "tree"
    -bucket_mb (Not in Caffe; under mpiexec, the gradient bucket size in MiB, or
      auto: MG-WFBP's buckets from measured backward times and the alpha-beta
      model, CAFFE_COST_MODEL's file or measured at start.) type: string
      default: "25"
    -debug_sync (Not in Caffe; under mpiexec, check after every update that all
      ranks hold identical weights.) type: bool default: false
    -comm_compress (Not in Caffe; under mpiexec, gradient compression: none, fp16,
      topk or gtopk; overrides the solver's comm_param.) type: string
      default: none
    -comm_density (Not in Caffe; topk/gtopk: fraction of each gradient bucket
      sent, in (0, 1].) type: double default: 0.001
    -comm_error_feedback (Not in Caffe; topk/gtopk: keep what is not sent in a
      residual added to the next gradient.) type: bool default: true
    -fc_parallel (Not in Caffe; under mpiexec, PCL-DNN's hybrid parallelism for
      every InnerProduct layer: data, auto (the balance equations) or a group
      size G dividing the rank count; overrides the layers' parallel field.)
      type: string default: ""
"""

FLAGS = {
    "solver": (str, ""),
    "model": (str, ""),
    "weights": (str, ""),
    "snapshot": (str, ""),
    "exact_resume": (bool, False),
    "iterations": (int, 50),
    "phase": (str, ""),
    "level": (int, 0),
    "stage": (str, ""),
    "gpu": (str, ""),
    "sigint_effect": (str, "stop"),
    "sighup_effect": (str, "snapshot"),
    "comm": (str, "tree"),
    "bucket_mb": (str, "25"),
    "debug_sync": (bool, False),
    # Gradient compression (None: not given; the solver's comm_param block or its defaults).
    "comm_compress": (str, None),
    "comm_density": (float, None),
    "comm_error_feedback": (bool, None),
    # PCL-DNN's hybrid InnerProduct (None: not given; each layer's inner_product_param.parallel).
    "fc_parallel": (str, None),
    # glog's flags, which Caffe's gflags parse too (None: not given; GLOG_<flag> and the
    # defaults of caffe_engine.log.init_glog apply).
    "log_dir": (str, None),
    "logtostderr": (bool, None),
    "alsologtostderr": (bool, None),
    "stderrthreshold": (int, None),
    "minloglevel": (int, None),
    "v": (int, None),
}

#: The FLAGS entries that are glog's (passed to :func:`caffe_engine.log.init_glog`).
GLOG_FLAGS = ("log_dir", "logtostderr", "alsologtostderr", "stderrthreshold", "minloglevel", "v")

_BOOL_VALUES = {"true": True, "t": True, "yes": True, "y": True, "1": True,
                "false": False, "f": False, "no": False, "n": False, "0": False}


#: gflags' int32 range (tools/caffe.cpp DEFINE_int32: strto32 refuses values outside it).
INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
_GFLAGS_TYPE = {int: "int32", float: "double", str: "string", bool: "bool"}
#: The numbers gflags takes (gflags.cc FlagValue::ParseFrom: strtoll, in base 16 after a leading
#: "0x", and strtod, the whole value consumed). Python's int() and float() also take "1_000",
#: trailing blanks and non-ASCII digits, which gflags refuses (and int() refuses "0x10").
_INT32_TEXT = re.compile(r"0[xX][0-9a-fA-F]+|[ \t\n\v\f\r]*[+-]?[0-9]+")
_DOUBLE_TEXT = re.compile(r"[ \t\n\v\f\r]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?"
                          r"|inf|infinity|nan)", re.IGNORECASE)


def gflags_number(kind, value):
    """``value`` as gflags parses an int32 (``kind`` int) or a double flag (``kind`` float).

    Raises:
        ValueError: not such a number (or NaN, which no flag of the engine takes).
    """
    if kind is int and _INT32_TEXT.fullmatch(value):
        parsed = int(value, 16) if value[:2] in ("0x", "0X") else int(value)
        if INT32_MIN <= parsed <= INT32_MAX:
            return parsed
    elif kind is float and _DOUBLE_TEXT.fullmatch(value):
        parsed = float(value)
        if parsed == parsed:
            return parsed
    raise ValueError(value)


class UsageError(CaffeError):
    """A command-line mistake: usage text is printed with the message."""


def parse_flags(argv):
    """Parse gflags-style ``argv`` into (positional args, dict of flag values).

    ``--flag=value``, ``--flag value``, ``-flag=value`` and ``-flag value``; booleans also as
    bare ``--flag`` and ``--noflag``.

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
        if name not in FLAGS and name.startswith("no") and FLAGS.get(name[2:], (None,))[0] is bool \
                and not eq:
            values[name[2:]] = False
            continue
        if name not in FLAGS:
            raise UsageError(f"unknown command line flag '{name}'")
        kind, _ = FLAGS[name]
        if kind is bool:
            if not eq:
                values[name] = True
                continue
            if value.lower() not in _BOOL_VALUES:
                raise UsageError(f"illegal value '{value}' specified for bool flag '{name}'")
            values[name] = _BOOL_VALUES[value.lower()]
            continue
        if not eq:
            if i >= len(argv):
                raise UsageError(f"flag '{name}' is missing its argument")
            value = argv[i]
            i += 1
        try:
            parsed = value if kind is str else gflags_number(kind, value)
        except ValueError:
            raise UsageError(f"illegal value '{clip(value)}' specified for "
                             f"{_GFLAGS_TYPE[kind]} flag '{name}'") from None
        values[name] = parsed
    return positional, values


def clip(text, limit=60):
    """``text`` cut in the middle to about ``limit`` characters (a flag value in a message)."""
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 2:]}"
