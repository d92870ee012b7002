"""What the tools share: the error-to-exit-status wrapper, gflags-style booleans and progress
bars (the streaming database writers are in caffe_engine.io: ``db.open_writer``)."""
import argparse
import sys

from ..errors import CaffeError, one_line
from ..log import init_glog


class ToolError(CaffeError):
    """A one-line error of a tool (printed as ``<tool>: error: <message>``, exit status 1)."""


def run(prog, body, argv):
    """Run ``body(argv)``; turn expected failures into one line on stderr and status 1.

    Returns:
        the exit status: what ``body`` returned (None -> 0), 1 on an error, 130 on Ctrl-C.
    """
    try:
        status = body(argv)
    except (CaffeError, OSError) as exc:
        message = one_line(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename and exc.strerror:
            message = one_line(f"{exc.filename}: {exc.strerror}")
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    return int(status or 0)


def parse_bool(text):
    """gflags boolean values: true/false, 1/0, yes/no, t/f, y/n."""
    value = str(text).strip().lower()
    if value in ("1", "true", "t", "yes", "y"):
        return True
    if value in ("0", "false", "f", "no", "n"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def add_bool(parser, name, help_text):
    """A gflags-style boolean: ``--name``, ``--noname``, ``--name=true|false``."""
    parser.add_argument(f"--{name}", dest=name, action="store_true", default=False, help=help_text)
    parser.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)
    parser.bool_flags.add(name)


class Parser(argparse.ArgumentParser):
    """argparse with gflags booleans and usage errors as one line, status 1 (argparse's is 2)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.bool_flags = set()

    def parse_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        for i, arg in enumerate(args):
            if arg == "--":
                break
            if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
                if f"-{arg.partition('=')[0]}" in self._option_string_actions or \
                        arg[1:].partition("=")[0] in self.bool_flags:
                    arg = args[i] = "-" + arg          # gflags also takes -name / -name=value
            name, eq, value = arg.lstrip("-").partition("=")
            if arg.startswith("-") and eq and name in self.bool_flags:
                try:
                    args[i] = f"--{name}" if parse_bool(value) else f"--no{name}"
                except ValueError as exc:
                    self.error(f"argument --{name}: {exc}")
        return super().parse_args(args, namespace)

    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(1)


def start_logging():
    """Start the log as Caffe's tools do (``InitGoogleLogging(argv[0])``, ``FLAGS_alsologtostderr
    = 1``): glog-format lines on stderr, and glog's log files named after the program (the base
    name of ``argv[0]``, e.g. ``convert_imageset``), ``GLOG_*`` honoured (caffe_engine.log)."""
    init_glog(alsologtostderr=True)


def progress(iterable, total=None, desc=None, unit="it"):
    """Wrap ``iterable`` in a tqdm bar (on stderr, shown only on a terminal); plain without tqdm."""
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    disable = not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=False)
