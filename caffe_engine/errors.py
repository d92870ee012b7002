"""The engine's user-facing error type.

Every mistake a user can make in a prototxt, a solver, a weights file or a command line is raised
as :class:`CaffeError` with a one-line message that names the file, layer or field. The command
line prints that line and exits with status 1; it never shows a traceback for one.
"""


class CaffeError(Exception):
    """A user error with a one-line, self-explanatory message (no traceback is shown for it)."""
