"""The engine's user-facing error type.

Every mistake a user can make in a prototxt, a solver, a weights file or a command line is raised
as :class:`CaffeError` with a one-line message that names the file, layer or field. The command
line prints that line and exits with status 1; it never shows a traceback for one.
"""


class CaffeError(Exception):
    """A user error with a one-line, self-explanatory message (no traceback is shown for it)."""


class AxisError(CaffeError, IndexError):
    """An axis index out of range for a blob (Caffe's ``CanonicalAxisIndex`` CHECKs); also an
    IndexError, so code that catches that keeps working."""


#: Longest error line printed whole (issue 15): longer ones keep their start and end.
MAX_LINE = 300


def one_line(message, limit=MAX_LINE):
    """``message`` as one printable line: every character that would break the line or act on
    the terminal (newline, tab, escape, NUL ...) written as its Python escape (``\\n``,
    ``\\x1b``), so that a path, flag value, layer name or record key holding one is shown whole
    instead of cut at it; and when longer than ``limit`` characters, its start and end around
    `` ... `` (a repeated path or prototxt line keeps what names it, not 15 KB of it)."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message).strip())
    if len(line) <= limit:
        return line
    keep = limit - 5
    head = keep * 2 // 3
    return f"{line[:head]} ... {line[len(line) - (keep - head):]}"
