"""Reading and writing Caffe's protobuf files: prototxt text, binary protos, atomically.

Caffe: src/caffe/util/io.cpp (ReadProtoFromTextFile, ReadProtoFromBinaryFile, WriteProtoTo*),
src/caffe/util/upgrade_proto.cpp (ReadNetParamsFromTextFileOrDie, ReadSolverParamsFromTextFileOrDie).

Every failure is a :class:`CaffeError` whose one-line message names the file (and, for text,
the line and column), so the command line can print it and exit 1.
"""
import os
import tempfile

from google.protobuf import message as _message
from google.protobuf import text_format

from ..errors import CaffeError
from ..proto import caffe_pb2
from .upgrade import upgrade_net, upgrade_solver


def _read_bytes(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CaffeError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None


#: Characters C++ protobuf's tokenizer accepts after a backslash in a string literal
#: (google/protobuf/io/tokenizer.cc ConsumeString): simple escapes, octal, hex, unicode.
_ESCAPES = set("abfnrtv\\?'\"01234567xuU")
_CONTROL_OK = set("\t\n\r\v\f")


def _check_tokens(text, where):
    """What C++ protobuf's tokenizer refuses and Python's ``text_format`` lets through: an
    invalid escape in a string literal, a control character outside comments and strings, and a
    NUL anywhere (Caffe reads prototxt with the C++ parser).

    Raises:
        CaffeError: ``where:line:column: reason`` with the C++ parser's reason.
    """
    line, col, i, n = 1, 1, 0, len(text)

    def fail(reason):
        raise CaffeError(f"{where}:{line}:{col}: {reason}")

    while i < n:
        c = text[i]
        if c == "\x00":
            fail("Invalid control characters encountered in text.")
        if c == "#":                                   # a comment runs to the end of the line
            j = text.find("\n", i)
            j = n if j < 0 else j
            if "\x00" in text[i:j]:
                col += text.index("\x00", i) - i
                fail("Invalid control characters encountered in text.")
            col += j - i
            i = j
            continue
        if c in "\"'":
            quote, i, col = c, i + 1, col + 1
            while i < n and text[i] != quote:
                if text[i] == "\n":
                    fail("String literals cannot cross line boundaries.")
                if text[i] == "\x00":
                    fail("Invalid control characters encountered in text.")
                if text[i] == "\\":
                    if i + 1 >= n or text[i + 1] not in _ESCAPES:
                        fail("Invalid escape sequence in string literal.")
                    i, col = i + 1, col + 1
                i, col = i + 1, col + 1
            i, col = i + 1, col + 1
            continue
        if c == "\n":
            line, col = line + 1, 1
        else:
            if ord(c) < 32 and c not in _CONTROL_OK:
                fail("Invalid control characters encountered in text.")
            col += 1
        i += 1


def parse_text(text, msg, path="<string>"):
    """Parse prototxt ``text`` into protobuf message ``msg`` and return it, as strictly as
    Caffe's C++ ``TextFormat::Parse``: a non-repeated field given twice, a bad escape or a
    control character is an error (Python's ``text_format.Merge`` would take the last value or
    the raw character).

    Raises:
        CaffeError: ``path:line:column: reason`` on a syntax or schema error.
    """
    _check_tokens(text, path)
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        reason = str(exc)
        # The library prefixes "line:col : "; keep only the reason.
        if line is not None and reason.startswith(f"{line}:"):
            reason = reason.split(" : ", 1)[-1]
        where = f"{path}:{line}:{col}" if line is not None else path
        raise CaffeError(f"{where}: {reason}") from None
    return msg


def read_text(path, msg, what="prototxt"):
    """Parse the text-format file at ``path`` into ``msg`` (a fresh message instance)."""
    data = _read_bytes(path, what)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise CaffeError(f"{path}: not a text {what} (is it a binary file?)") from None
    return parse_text(text, msg, path)


def read_binary(path, msg, what="binary proto"):
    """Parse the binary protobuf file at ``path`` into ``msg``."""
    data = _read_bytes(path, what)
    try:
        msg.ParseFromString(data)
    except _message.DecodeError as exc:
        raise CaffeError(f"{path}: not a valid {what}: {exc}") from None
    return msg


def read_text_or_binary(path, msg, what="proto"):
    """Parse ``path`` as text first, then as binary (Caffe's ReadProtoFromTextFileOrDie fallback)."""
    data = _read_bytes(path, what)
    try:
        return parse_text(data.decode("utf-8"), msg, path)
    except (UnicodeDecodeError, CaffeError) as text_error:
        msg.Clear()
        try:
            msg.ParseFromString(data)
            return msg
        except _message.DecodeError:
            if isinstance(text_error, CaffeError):
                raise text_error from None
            raise CaffeError(f"{path}: neither a text nor a binary {what}") from None


#: Temporary files of the atomic writer are ``.tmp-<target name>.<random><suffix>`` beside the
#: target, so that a killed writer's leftovers can be found by the target's name.
TEMP_PREFIX = ".tmp-"


def write_atomic_with(path, write, suffix=""):
    """Have ``write(tmp_path)`` create the file at a temporary name beside ``path``, then rename
    it onto ``path``: readers never see a half-written file, and a failure leaves none behind
    (a SIGKILL may leave the temporary file; :func:`remove_stale_temporaries` clears those).

    Raises:
        CaffeError: the folder is missing or not writable, or writing fails (a full disk, an
            I/O error): one line naming ``path`` and the cause; ``path`` keeps its old content.
    """
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{os.path.basename(path)}.",
                                   suffix=suffix, dir=folder)
    except OSError as exc:
        raise CaffeError(f"{path}: cannot write: {exc.strerror or exc}") from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError):
            raise CaffeError(f"{path}: cannot write: {exc.strerror or exc}; the previous file, "
                             f"if any, is unchanged") from None
        raise


def remove_stale_temporaries(prefix):
    """Delete the atomic writer's leftovers for files whose names start with ``prefix``'s base
    name, in ``prefix``'s folder (e.g. a snapshot prefix ``snapshots/lenet``: the
    ``.tmp-lenet_iter_*`` files a killed run left). Returns the paths removed; unreadable
    folders and files that vanish meanwhile are skipped."""
    folder = os.path.dirname(os.path.abspath(prefix)) if prefix else os.getcwd()
    start = TEMP_PREFIX + os.path.basename(prefix)
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        if name.startswith(start):
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(os.path.join(folder, name))
            except OSError:
                pass
    return removed


def write_atomic(path, data):
    """Write ``data`` (bytes) to ``path`` atomically (see :func:`write_atomic_with`), synced to disk."""
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    write_atomic_with(path, write)


def write_binary(path, msg):
    """Serialize ``msg`` to ``path`` atomically (Caffe's WriteProtoToBinaryFile)."""
    write_atomic(path, msg.SerializeToString())


def write_text(path, msg):
    """Write ``msg`` as prototxt to ``path`` atomically."""
    write_atomic(path, text_format.MessageToString(msg).encode("utf-8"))


def read_net_param(path):
    """Read a net prototxt (text, or binary as Caffe accepts) and upgrade legacy fields.

    Returns:
        caffe_pb2.NetParameter.
    """
    param = read_text_or_binary(path, caffe_pb2.NetParameter(), "net prototxt")
    return upgrade_net(param, path)


def read_solver_param(path):
    """Read a solver prototxt and upgrade legacy fields (solver_type -> type).

    Returns:
        caffe_pb2.SolverParameter.
    """
    param = read_text(path, caffe_pb2.SolverParameter(), "solver prototxt")
    return upgrade_solver(param, path)
