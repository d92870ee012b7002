"""Every environment variable the engine reads, declared in one table and read here only.

Each :class:`Variable` names one variable, its default, what it does, and how its text is read
(``parse``); :func:`read` returns that value, :func:`raw` the text. They read the environment
at the moment they are called (nothing is cached at import), so a variable set later in the
process -- ``monkeypatch.setenv`` in the tests -- counts from the next read; the functions of
the modules that use a variable keep their ``environ`` argument (a mapping to read instead of
``os.environ``) for the tests. The README's table lists the same names
(tests/test_environment.py checks both, and that no other module of the package touches
``os.environ``).

Four kinds (:attr:`Variable.kind`):

* ``engine``: the engine's own switches (``CAFFE_*``). Caffe itself reads none.
* ``launcher``: what MPI launchers (MPICH's Hydra, Open MPI, MVAPICH) put in each rank's
  environment; read to learn the rank and size before MPI is initialised.
* ``glog``: glog's settings, read by :mod:`caffe_engine.log`'s emulation of glog as glog reads
  them itself (``GLOG_<flag>``, the ``GOOGLE_*`` defaults, the temporary folders, ``USER``);
  their text is interpreted there, with glog's rules (``EnvToBool``, ``EnvToInt``).
* ``library``: variables that OpenMP, OpenBLAS, MKL, BLIS or Numba read themselves; the engine
  only looks at them, to leave a thread count the user chose alone or to name a forced BLAS
  kernel in its start-up line.

One exception to "read here only": ``caffe/__init__.py`` reads ``CAFFE_ENGINE_NO_ALIAS`` itself,
because it must decide before the engine is imported (declared here all the same).
"""
import os
from dataclasses import dataclass
from typing import Callable, Optional

from .errors import CaffeError


# ------------------------------------------------------------------------------------------------
# How a variable's text is read: parse(name, text or None) -> value
# ------------------------------------------------------------------------------------------------
def _text(name, value):
    """The text; None when unset or empty."""
    return value or None


def _word(name, value):
    """The text without surrounding blanks; None when unset or blank."""
    return (value or "").strip() or None


def _on_unless_zero(name, value):
    """True unless the text is exactly ``0`` (unset: True)."""
    return value != "0"


def _on_unless_off_word(name, value):
    """False for ``0``, ``off``, ``false``, ``no`` (any case, blanks ignored); else True."""
    return (value or "").strip().lower() not in ("0", "off", "false", "no")


def _on_when_set(name, value):
    """True when set to anything but blanks or ``0``."""
    return (value or "").strip() not in ("", "0")


def _is_one(name, value):
    """True when the text is exactly ``1``."""
    return value == "1"


def _positive_int(name, value):
    """A positive int, or None when unset or blank.

    Raises:
        CaffeError: anything but a positive integer (one line naming the variable).
    """
    value = (value or "").strip()
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise CaffeError(f"{name} must be a positive integer, got {value!r}")
    return number


def _int(name, value):
    """An int (Python's ``int()``: ValueError for other text), or None when unset."""
    return None if value is None else int(value)


def _seconds(name, value):
    """A float number of seconds, or None when unset.

    Raises:
        CaffeError: text that is not a number (one line naming the variable).
    """
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise CaffeError(f"{name} must be a number of seconds, got {value!r}") from None


def _staging_mode(name, value):
    """The mode word in lower case, ``auto`` when unset or empty (checked by the communicators'
    staging of device buckets, ``mode_from_env`` in :mod:`caffe_engine.comm`)."""
    return (value or "auto").strip().lower()


# ------------------------------------------------------------------------------------------------
# The table
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variable:
    """One environment variable the engine reads.

    Attributes:
        name: the variable's name.
        kind: ``engine``, ``launcher``, ``glog`` or ``library`` (module docstring).
        default: the behaviour when unset, in words (the README's "Default" column).
        meaning: what it does, and where it is read (the README's last column).
        parse: ``parse(name, text or None) -> value`` for :func:`read`; None: the text itself
            (None when unset).
    """
    name: str
    kind: str
    default: str
    meaning: str
    parse: Optional[Callable] = None


_V = Variable
VARIABLES = (
    # -- the engine's own ---------------------------------------------------------------------
    _V("CAFFE_ENGINE_KERNELS", "engine", "cpu (reference without Numba)",
       "kernel set for NumPy arrays: reference, cpu or cuda-emulated (caffe_engine/kernels)",
       _word),
    _V("CAFFE_ENGINE_GPU_KERNELS", "engine", "cuda",
       "kernel set for CuPy arrays: cuda or reference (caffe_engine/kernels)", _word),
    _V("CAFFE_ENGINE_EXACT_RNG", "engine", "off",
       "1: GPU runs draw Dropout's masks from the host mt19937 stream, bit-identical to a CPU "
       "run (caffe_engine/rng.py)", _on_when_set),
    _V("CAFFE_ENGINE_SHARE_DIFFS", "engine", "1",
       "0: every blob keeps its own diff after step(), as Caffe (caffe_engine/diff_sharing.py)",
       _on_unless_zero),
    _V("CAFFE_ENGINE_MMAP_THRESHOLD", "engine", "4194304 (4 MiB)",
       "bytes from which glibc's malloc maps each allocation on its own and unmaps it when "
       "freed, held from the first net on; 0: glibc's sliding default (caffe_engine/memory.py)",
       _int),
    _V("CAFFE_ENGINE_DATA_THREADS", "engine", "the cores this process may use",
       "threads decoding and transforming a batch's records (caffe_engine/io/workers.py)",
       _positive_int),
    _V("CAFFE_ENGINE_NO_ALIAS", "engine", "off",
       "1: `import caffe` loads the next caffe package on sys.path, not this one "
       "(caffe/__init__.py)", _on_when_set),
    _V("CAFFE_BLAS_THREADS", "engine", "unset",
       "set: data-parallel ranks sharing a host keep their BLAS and kernel threads "
       "(caffe_engine/comm/distributed.py)", _text),
    _V("CAFFE_NODE", "engine", "the launcher's host",
       "this rank's node name for the hier communicator, on every rank or none "
       "(caffe_engine/comm/hier.py)", _text),
    _V("CAFFE_HIER_LANES", "engine", "the node's size",
       "leaders per node of the hier communicator, the same on every rank "
       "(caffe_engine/comm/hier.py)", _positive_int),
    _V("CAFFE_COMM_STAGING", "engine", "auto",
       "emulate: stage NumPy gradient buckets through an emulated device (auto: CuPy buckets "
       "only; the communicators' staging, caffe_engine/comm)", _staging_mode),
    _V("CAFFE_GRAD_OVERLAP", "engine", "on",
       "0, off, false or no: reduce the gradient buckets after backward instead of during it "
       "(caffe_engine/comm/buckets.py)", _on_unless_off_word),
    _V("CAFFE_NCCL_DEVICE", "engine", "the local rank",
       "CUDA device of this rank for the nccl communicator (caffe_engine/comm/nccl.py)", _text),
    _V("CAFFE_COMM_TIMEOUT", "engine", "50",
       "seconds a communicator wait may take before the job is aborted; 0 disables "
       "(caffe_engine/comm/communicator.py)", _seconds),
    _V("CAFFE_COST_MODEL", "engine", "built-in",
       "an AlphaBetaModel JSON file for the auto bucket plan and --fc_parallel auto's link "
       "(caffe_engine/comm/data_parallel.py, comm/hybrid_train.py)", _text),
    _V("CAFFE_PEER_WATCH", "engine", "1",
       "0: rank 0 does not watch the other ranks' sockets (caffe_engine/comm/peer_watch.py)",
       _on_unless_zero),
    _V("CAFFE_SUPERVISE", "engine", "1",
       "0: an mpiexec rank does not fork a supervised child (caffe_engine/comm/supervisor.py)",
       _on_unless_zero),
    _V("CAFFE_SUPERVISED", "engine", "unset",
       "1 in the supervised child, set by its parent; not for users "
       "(caffe_engine/comm/supervisor.py)", _is_one),
    # -- set by MPI launchers -----------------------------------------------------------------
    _V("PMI_RANK", "launcher", "unset", "this rank (MPICH's Hydra)", _int),
    _V("PMIX_RANK", "launcher", "unset", "this rank (PMIx)", _int),
    _V("OMPI_COMM_WORLD_RANK", "launcher", "unset", "this rank (Open MPI)", _int),
    _V("MV2_COMM_WORLD_RANK", "launcher", "unset", "this rank (MVAPICH)", _int),
    _V("PMI_SIZE", "launcher", "unset", "the number of ranks (MPICH's Hydra)", _int),
    _V("OMPI_COMM_WORLD_SIZE", "launcher", "unset", "the number of ranks (Open MPI)", _int),
    _V("MV2_COMM_WORLD_SIZE", "launcher", "unset", "the number of ranks (MVAPICH)", _int),
    # -- glog's, read by caffe_engine/log.py as glog reads them -------------------------------
    _V("GLOG_logtostderr", "glog", "GOOGLE_LOGTOSTDERR, else off",
       "log to stderr only, no log files"),
    _V("GLOG_alsologtostderr", "glog", "GOOGLE_ALSOLOGTOSTDERR, else off (on for commands)",
       "log to stderr as well as to the files"),
    _V("GLOG_stderrthreshold", "glog", "2", "severity from which lines go to stderr too"),
    _V("GLOG_minloglevel", "glog", "0", "severity below which lines are dropped"),
    _V("GLOG_log_dir", "glog", "GOOGLE_LOG_DIR, else TEST_TMPDIR",
       "folder of the log files"),
    _V("GLOG_v", "glog", "0", "VLOG verbosity"),
    _V("GOOGLE_LOGTOSTDERR", "glog", "off", "the default of GLOG_logtostderr"),
    _V("GOOGLE_ALSOLOGTOSTDERR", "glog", "off", "the default of GLOG_alsologtostderr"),
    _V("GOOGLE_LOG_DIR", "glog", "unset", "the default of GLOG_log_dir"),
    _V("TEST_TMPDIR", "glog", "unset",
       "the default of GLOG_log_dir after GOOGLE_LOG_DIR; the first log folder tried"),
    _V("TMPDIR", "glog", "unset", "log folder tried after TEST_TMPDIR"),
    _V("TMP", "glog", "unset", "log folder tried after TMPDIR (then /tmp, then .)"),
    _V("USER", "glog", "the effective user's name", "the user in the log files' names"),
    # -- the libraries' own; the engine only looks --------------------------------------------
    _V("OMP_NUM_THREADS", "library", "unset",
       "caps the compiled kernels' threads; set: data-parallel ranks keep their thread counts"),
    _V("NUMBA_NUM_THREADS", "library", "unset",
       "caps the compiled kernels' threads when OMP_NUM_THREADS is not set"),
    _V("OPENBLAS_NUM_THREADS", "library", "unset",
       "set: data-parallel ranks keep their thread counts"),
    _V("MKL_NUM_THREADS", "library", "unset",
       "set: data-parallel ranks keep their thread counts"),
    _V("BLIS_NUM_THREADS", "library", "unset",
       "set: data-parallel ranks keep their thread counts"),
    _V("NUMBA_CACHE_DIR", "library", "unset (beside the sources)",
       "where Numba caches the compiled kernels; set, the engine leaves that cache alone "
       "(unset, it drops the kernel set's cache when any of its sources changed: "
       "caffe_engine/kernels/cpu/stale_cache.py)"),
    _V("OPENBLAS_CORETYPE", "library", "unset",
       "OpenBLAS's forced kernel, named in the start-up line when below the CPU's AVX-512"),
)

BY_NAME = {v.name: v for v in VARIABLES}


def variable(name):
    """The declared :class:`Variable` called ``name``.

    Raises:
        KeyError: ``name`` is not declared in :data:`VARIABLES` (a variable read without being
            declared here is a bug: add it to the table and to the README).
    """
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"environment variable {name} is not declared in "
                       "caffe_engine/environment.py") from None


# ------------------------------------------------------------------------------------------------
# Reading
# ------------------------------------------------------------------------------------------------
def raw(name, environ=None):
    """The text of the declared variable ``name`` in ``environ`` (default: this process's
    environment, read now), or None when unset.

    Raises:
        KeyError: ``name`` is not declared (:func:`variable`).
    """
    variable(name)
    return (os.environ if environ is None else environ).get(name)


def read(name, environ=None):
    """The declared variable ``name`` read as its :attr:`Variable.parse` says (the text itself
    where it says nothing), from ``environ`` (default: this process's environment, read now).

    Raises:
        KeyError: ``name`` is not declared; what its ``parse`` raises for bad text (a one-line
            CaffeError naming the variable).
    """
    parse = variable(name).parse
    text = raw(name, environ)
    return text if parse is None else parse(name, text)


def export(name, value):
    """Set the declared variable ``name`` to the text ``value`` in this process's environment
    (inherited by the processes it starts)."""
    variable(name)
    os.environ[name] = value


def copy():
    """A copy of this process's whole environment (a dict), to change and hand to a child
    process."""
    return dict(os.environ)


__all__ = ["Variable", "VARIABLES", "BY_NAME", "variable", "raw", "read", "export", "copy"]
