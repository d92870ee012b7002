"""Caffe's (glog's) log: the line format, and glog's log files and ``GLOG_*`` settings.

A line looks like ``I20261129 08:37:31.425395 29493 solver.py:239] Iteration 0, lr = 0.01``:
severity letter, date, time with microseconds, thread id, source file:line, then the message
(glog >= 0.6, whose ``log_year_in_prefix`` puts the year in; the reference Caffe logs have it).
Caffe prints numbers with C++ iostream's default 6 significant digits; :func:`g` does the same.

:func:`init_glog` is ``google::InitGoogleLogging(argv[0])`` for the ``caffe`` command and the
tools: as glog (src/logging.cc), every message of severity S goes to the log file of S and of
every lower severity (the INFO file has everything), each file created when its first message
arrives, named ``<program>.<host>.<user>.log.<SEVERITY>.<yyyymmdd>-<hhmmss>.<pid>`` in
``GLOG_log_dir`` (default: the first existing one of ``$TEST_TMPDIR``, ``$TMPDIR``, ``$TMP``,
``/tmp``, then ``.``), with the symlink ``<program>.<SEVERITY>`` beside it pointing to the latest
file. The settings glog reads from the environment as ``GLOG_<flag>`` are honoured:
``logtostderr`` (stderr only, no files), ``alsologtostderr`` (stderr too; ``caffe`` and the tools
set it, as Caffe's mains do), ``stderrthreshold`` (severities copied to stderr anyway; glog 0.7
reads it from the environment), ``minloglevel`` (severities below it are dropped everywhere),
``log_dir`` and ``v`` (VLOG verbosity: :func:`vlog_is_on`). Not implemented: glog's file
rotation at ``max_log_size`` (1800 MB), ``log_link``, the buffering of INFO lines (every line
is flushed) and the FATAL abort. The variables are read through :mod:`caffe_engine.environment`
(declared there as glog's); their text is interpreted here, by glog's rules.
"""
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

from . import environment

LOGGER_NAME = "caffe_engine"
logger = logging.getLogger(LOGGER_NAME)

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
                 logging.ERROR: "E", logging.CRITICAL: "F"}

#: glog's severities, by number (glog/log_severity.h).
SEVERITY_NAMES = ("INFO", "WARNING", "ERROR", "FATAL")
_SEVERITY_LEVEL = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)


class GlogFormatter(logging.Formatter):
    """Format records as glog does (see module docstring)."""

    def format(self, record):
        t = time.localtime(record.created)
        micros = int((record.created - int(record.created)) * 1e6)
        prefix = "%s%s %s.%06d %5d %s:%d] " % (
            _LEVEL_LETTER.get(record.levelno, "I"), time.strftime("%Y%m%d", t),
            time.strftime("%H:%M:%S", t), micros, threading.get_native_id() % 100000,
            record.filename, record.lineno)
        return prefix + record.getMessage()


def setup_logging(stream=None, level=logging.INFO):
    """Send the engine's log to ``stream`` only (default stderr), in glog's line format.

    No log files and no ``GLOG_*`` settings: this is for library use (pycaffe's ``init_log``)
    and tests; commands use :func:`init_glog`.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(GlogFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return logger


def g(x):
    """Format a number as C++ ``ostream << x`` does by default (``%g``, 6 significant digits)."""
    return "%g" % x


# ------------------------------------------------------------------------------------------------
# glog's settings
# ------------------------------------------------------------------------------------------------
def env_bool(value, default):
    """glog's ``EnvToBool`` (base/commandlineflags.h): unset -> ``default``; otherwise true when
    the value starts with one of ``tTyY1`` or is empty (glog tests its first byte, and the empty
    string's is the terminating NUL, which is in the set)."""
    if value is None:
        return default
    return value == "" or value[0] in "tTyY1"


def env_int(value, default):
    """glog's ``EnvToInt``: unset -> ``default``; otherwise ``strtol(value, NULL, 10)``: the
    leading integer after optional blanks and sign, 0 when there is none (no error, as glog)."""
    if value is None:
        return default
    text = value.lstrip(" \t\n\r\f\v")
    end = 1 if text[:1] in ("+", "-") else 0
    while end < len(text) and text[end] in "0123456789":
        end += 1
    digits = text[:end]
    return int(digits) if digits not in ("", "+", "-") else 0


@dataclass
class GlogFlags:
    """The glog flags the engine honours, with glog's defaults (src/logging.cc, vlog_is_on.cc).

    Attributes:
        logtostderr: everything to stderr, no log files.
        alsologtostderr: everything to stderr as well as to the files.
        stderrthreshold: severity (0 INFO .. 3 FATAL) from which messages go to stderr too.
        minloglevel: severity below which messages are dropped (stderr and files).
        log_dir: the folder of the log files; "" for glog's default list.
        v: VLOG verbosity (:func:`vlog_is_on`).
    """
    logtostderr: bool = False
    alsologtostderr: bool = False
    stderrthreshold: int = 2
    minloglevel: int = 0
    log_dir: str = ""
    v: int = 0

    @classmethod
    def from_env(cls, environ=None):
        """The flags as glog initialises them from the environment: ``GLOG_<flag>``, with the
        defaults ``GOOGLE_LOGTOSTDERR``, ``GOOGLE_ALSOLOGTOSTDERR`` and ``GOOGLE_LOG_DIR`` /
        ``TEST_TMPDIR`` (``GLOG_DEFINE_*`` and ``DefaultLogDir`` in glog's logging.cc)."""
        def env(name):
            return environment.raw(name, environ)

        log_dir_default = ""
        for name in ("GOOGLE_LOG_DIR", "TEST_TMPDIR"):
            if env(name):
                log_dir_default = env(name)
                break
        log_dir = env("GLOG_log_dir")
        return cls(
            logtostderr=env_bool(env("GLOG_logtostderr"),
                                 env_bool(env("GOOGLE_LOGTOSTDERR"), False)),
            alsologtostderr=env_bool(env("GLOG_alsologtostderr"),
                                     env_bool(env("GOOGLE_ALSOLOGTOSTDERR"), False)),
            stderrthreshold=env_int(env("GLOG_stderrthreshold"), 2),
            minloglevel=env_int(env("GLOG_minloglevel"), 0),
            log_dir=log_dir_default if log_dir is None else log_dir,
            v=env_int(env("GLOG_v"), 0),
        )


#: The flags of the last :func:`init_glog` (None before it: :func:`vlog_is_on` reads the
#: environment then).
FLAGS = None


def vlog_is_on(level):
    """glog's ``VLOG_IS_ON(level)``: whether ``level`` <= the verbosity ``v`` (``GLOG_v``).

    The engine has no VLOG messages of its own (Caffe's are debug-build ``DLOG`` lines, which
    stay off here too); this is for code that wants them.
    """
    flags = FLAGS if FLAGS is not None else GlogFlags.from_env()
    return level <= flags.v


def vlog(level, msg, *args):
    """``VLOG(level) << msg``: an INFO line when :func:`vlog_is_on` ``(level)``."""
    if vlog_is_on(level):
        logger.info(msg, *args, stacklevel=2)


def severity_of(levelno):
    """glog's severity number (0 INFO .. 3 FATAL) of a Python logging level."""
    if levelno >= logging.CRITICAL:
        return 3
    if levelno >= logging.ERROR:
        return 2
    if levelno >= logging.WARNING:
        return 1
    return 0


def program_name(argv0=None):
    """glog's ``ProgramInvocationShortName``: the base name of ``argv[0]`` (``.py`` dropped, so
    ``tools/convert_imageset.py`` logs as ``convert_imageset`` like the console script)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0) or "UNKNOWN"
    return name[:-3] if name.endswith(".py") and len(name) > 3 else name


def host_name():
    """glog's ``GetHostName``: ``uname``'s node name, ``(unknown)`` when empty."""
    try:
        return os.uname().nodename or "(unknown)"
    except (AttributeError, OSError):
        return "(unknown)"


def user_name(environ=None):
    """glog's ``MyUserName``: ``$USER``, else the effective uid's name (``uid<N>`` without one);
    ``invalid-user`` when that is empty."""
    user = environment.raw("USER", environ)
    if user is None:
        try:
            import pwd
            user = pwd.getpwuid(os.geteuid()).pw_name
        except (ImportError, KeyError, AttributeError):
            user = "uid%d" % os.geteuid() if hasattr(os, "geteuid") else ""
    return user or "invalid-user"


def logging_directories(flags, environ=None):
    """Where log files are tried, in order (glog's ``GetLoggingDirectories``): ``log_dir`` alone
    when set; otherwise ``$TEST_TMPDIR``, ``$TMPDIR``, ``$TMP``, ``/tmp`` up to the first that is
    an existing folder, then ``./``."""
    if flags.log_dir:
        return [flags.log_dir]
    dirs = []
    tried = [environment.raw(name, environ) for name in ("TEST_TMPDIR", "TMPDIR", "TMP")]
    for d in tried + ["/tmp"]:
        if not d:
            continue
        dirs.append(d)
        if os.path.isdir(d):
            break
    dirs.append("./")
    return dirs


def _pretty_duration(secs):
    """glog's ``PrettyDuration``: ``h:mm:ss``."""
    secs = max(int(secs), 0)
    return "%d:%02d:%02d" % (secs // 3600, secs // 60 % 60, secs % 60)


class GlogHandler(logging.Handler):
    """glog's ``LogMessage::SendToLog``: files per severity and stderr, as the flags say.

    Log files are opened (``O_EXCL``, mode 0664 less the umask) when the first message of their
    severity arrives, begin with glog's header and get every line flushed. A file that cannot be
    created is reported once on stderr (``Could not create logging file: ...``) and that
    severity's lines are then not written to a file; the program goes on, as with glog.
    """

    def __init__(self, program, flags, stream=None, environ=None):
        super().__init__()
        self.program = program
        self.flags = flags
        self.stream = stream or sys.stderr
        self.setFormatter(GlogFormatter())
        self._environ = environment.copy() if environ is None else dict(environ)
        self._files = [None] * len(SEVERITY_NAMES)
        self._failed = [False] * len(SEVERITY_NAMES)
        self._reported = False
        #: The path of each severity's log file once created (None before).
        self.paths = [None] * len(SEVERITY_NAMES)

    def emit(self, record):
        try:
            severity = severity_of(record.levelno)
            if severity < self.flags.minloglevel:
                return
            line = self.format(record) + "\n"
            files_only = getattr(record, "glog_files_only", False)
            if self.flags.logtostderr:
                if not files_only:
                    self._to_stderr(line)
                return
            for s in range(severity, -1, -1):
                self._to_file(s, record.created, line)
            if not files_only and (severity >= self.flags.stderrthreshold
                                   or self.flags.alsologtostderr):
                self._to_stderr(line)
        except Exception:  # as logging.StreamHandler: report, never raise into the caller
            self.handleError(record)

    def _to_stderr(self, line):
        self.stream.write(line)
        self.stream.flush()

    def _to_file(self, severity, created, line):
        f = self._files[severity]
        if f is None:
            if self._failed[severity]:
                return
            f = self._files[severity] = self._create(severity, created)
            if f is None:
                self._failed[severity] = True
                return
        f.write(line)
        f.flush()

    def _create(self, severity, created):
        """Create ``severity``'s log file (glog's ``LogFileObject::Write``/``CreateLogfile``)."""
        start = time.time()
        t = time.localtime(created)
        time_pid = time.strftime("%Y%m%d-%H%M%S", t) + ".%d" % os.getpid()
        base = "%s.%s.%s.log.%s." % (self.program, host_name(), user_name(self._environ),
                                     SEVERITY_NAMES[severity])
        error = path = None
        for d in logging_directories(self.flags, self._environ):
            path = os.path.join(d, base + time_pid)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0),
                             0o664)
            except OSError as exc:
                error = exc
                continue
            f = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")
            break
        else:
            if not self._reported:
                self._reported = True
                reason = error.strerror if error is not None and error.strerror else str(error)
                self._to_stderr(f"Could not create logging file: {reason}: {path}\n")
            return None
        self.paths[severity] = path
        # The symlink <program>.<SEVERITY>, relative, beside the file; failures are ignored.
        link = os.path.join(os.path.dirname(path), "%s.%s" % (self.program, SEVERITY_NAMES[severity]))
        try:
            os.unlink(link)
        except OSError:
            pass
        try:
            os.symlink(os.path.basename(path), link)
        except OSError:
            pass
        f.write("Log file created at: %s\n" % time.strftime("%Y/%m/%d %H:%M:%S", t)
                + "Running on machine: %s\n" % host_name()
                + "Running duration (h:mm:ss): %s\n" % _pretty_duration(time.time() - start)
                + "Log line format: [IWEF]yyyymmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        return f

    def close(self):
        self.acquire()
        try:
            for i, f in enumerate(self._files):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
                    self._files[i] = None
        finally:
            self.release()
        super().close()


def init_glog(program=None, alsologtostderr=None, overrides=None, stream=None, environ=None):
    """Start the engine's log as ``google::InitGoogleLogging(argv[0])`` does (module docstring).

    Args:
        program: the name in the log files' names and symlinks (default: :func:`program_name`).
        alsologtostderr: set ``alsologtostderr`` after reading the environment, as Caffe's
            mains do with ``FLAGS_alsologtostderr = 1`` (tools/caffe.cpp); None leaves it.
        overrides: ``{flag: value}`` from the command line (gflags parses them after the mains
            set ``alsologtostderr``, so they win over both); None values are skipped.
        stream: where stderr lines go (default ``sys.stderr``, read now).
        environ: the environment to read (default: this process's, read now).

    Returns:
        the engine's logger.

    Raises:
        ValueError: an override names a flag the engine does not know.
    """
    flags = GlogFlags.from_env(environ)
    if alsologtostderr is not None:
        flags.alsologtostderr = bool(alsologtostderr)
    for name, value in (overrides or {}).items():
        if not hasattr(flags, name):
            raise ValueError(f"unknown glog flag '{name}'")
        if value is not None:
            setattr(flags, name, type(getattr(flags, name))(value))
    global FLAGS
    FLAGS = flags
    handler = GlogHandler(program or program_name(), flags, stream=stream, environ=environ)
    logger.handlers[:] = [handler]
    logger.setLevel(min_level(flags.minloglevel))
    logger.propagate = False
    return logger


def min_level(minloglevel):
    """The Python logging level below which records are dropped for glog's ``minloglevel``."""
    if minloglevel <= 0:
        return logging.INFO
    if minloglevel >= len(_SEVERITY_LEVEL):
        return logging.CRITICAL + 1
    return _SEVERITY_LEVEL[minloglevel]


def log_to_files(levelno, msg, *args):
    """Write one record to the glog log files only (not stderr): for a command's final error,
    which the command prints on stderr itself. A no-op without :func:`init_glog`'s handler."""
    handlers = [h for h in logger.handlers if isinstance(h, GlogHandler)]
    if not handlers or not logger.isEnabledFor(levelno):
        return
    caller = sys._getframe(1)
    record = logger.makeRecord(logger.name, levelno, caller.f_code.co_filename, caller.f_lineno,
                               msg, args, None, caller.f_code.co_name,
                               extra={"glog_files_only": True})
    for h in handlers:
        h.handle(record)
