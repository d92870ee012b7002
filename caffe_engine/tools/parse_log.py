"""parse_log: a Caffe (or caffe_engine) training log -> ``<log>.train`` and ``<log>.test`` CSV.

Caffe: tools/extra/parse_log.py and extract_seconds.py.

Usage::

    parse_log [--verbose] [--delimiter ,] LOGFILE OUTPUT_DIR

One row per iteration that logged outputs: ``NumIters``, ``Seconds`` (since the ``Solving``
line), ``LearningRate``, then one column per output (``loss``, ``accuracy`` ...), from the
``Train net output #k: name = v`` and ``Test net output #k: name = v`` lines. Numbers are
written as Python floats, as Caffe's script writes them. Differences from Caffe's script:

* ``LearningRate`` is the rate printed for the row's own iteration (``Iteration N, lr = X``
  comes after iteration N's outputs; Caffe's script gives each row the rate of the iteration
  before). A row whose iteration printed none keeps the last one seen.
* Both glog date formats are read: ``I1129 08:37:31.425`` (the year is the file's, as Caffe's
  script does, plus one at each new year in the log) and ``I20261129 08:37:31.425`` (newer glog
  and caffe_engine's log).
* ``nan`` and ``inf`` values are kept; a last row is written even if it has fewer columns.
* Outputs of a second test net (``Testing net (#1)``) go to the same row, as in Caffe's script:
  same names overwrite.
"""
import collections
import csv
import datetime
import math
import os
import re
import sys

from ._common import Parser, ToolError, run

PROG = "parse_log"

_NUMBER = r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf)"
RE_ITERATION = re.compile(r"Iteration (\d+)")
RE_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = (" + _NUMBER + ")", re.IGNORECASE)
RE_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = (" + _NUMBER + ")", re.IGNORECASE)
RE_LEARNING_RATE = re.compile(r"Iteration (\d+), lr = (" + _NUMBER + ")", re.IGNORECASE)
RE_DISPLAY_LOSS = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = (" + _NUMBER + ")", re.IGNORECASE)
RE_STAMP = re.compile(r"^[IWEF](\d{8}|\d{4}) (\d\d):(\d\d):(\d\d)\.(\d{1,6})")


class LogParse:
    """Everything read from one log.

    Attributes:
        train, test: lists of OrderedDict rows (see the module docstring).
        display_loss: list of (iteration, seconds, loss) from ``Iteration N (...), loss = X``
            (the smoothed loss Caffe displays; what Caffe's plotting script plots).
    """

    def __init__(self):
        self.train = []
        self.test = []
        self.display_loss = []


class _Clock:
    """Seconds since the start, from glog stamps (with or without the year)."""

    def __init__(self, year):
        self.year = year
        self.last_month = None
        self.start = None

    def stamp(self, line):
        m = RE_STAMP.match(line)
        if not m:
            return None
        date, hh, mm, ss, frac = m.groups()
        if len(date) == 8:
            year, month, day = int(date[:4]), int(date[4:6]), int(date[6:])
        else:
            month, day = int(date[:2]), int(date[2:])
            if self.last_month is not None and month < self.last_month:
                self.year += 1                    # the log ran over a new year
            self.last_month = month
            year = self.year
        try:
            return datetime.datetime(year, month, day, int(hh), int(mm), int(ss),
                                     int(frac.ljust(6, "0")))
        except ValueError:
            return None


def _float(text):
    return float(text)


def parse_lines(lines, year=None):
    """Parse an iterable of log lines (see :func:`parse_log`); ``year`` for 4-digit dates."""
    clock = _Clock(year if year is not None else datetime.date.today().year)
    out = LogParse()
    iteration = -1
    learning_rate = float("nan")
    start = None
    first_stamp = None
    rows = {"train": None, "test": None}
    lists = {"train": out.train, "test": out.test}

    def seconds_of(stamp):
        base = start or first_stamp
        return (stamp - base).total_seconds() if stamp and base else float("nan")

    for line in lines:
        stamp = clock.stamp(line)
        if stamp is not None and first_stamp is None:
            first_stamp = stamp
        if start is None and "Solving" in line and stamp is not None:
            start = stamp
        m = RE_ITERATION.search(line)
        if m:
            iteration = float(m.group(1))
        if iteration == -1:
            continue                            # nothing counts before the first iteration
        seconds = seconds_of(stamp)
        m = RE_LEARNING_RATE.search(line)
        if m:
            learning_rate = _float(m.group(2))
            lr_iter = float(m.group(1))
            for kind in ("train", "test"):
                for row in (rows[kind], lists[kind][-1] if lists[kind] else None):
                    if row is not None and row["NumIters"] == lr_iter:
                        row["LearningRate"] = learning_rate
        m = RE_DISPLAY_LOSS.search(line)
        if m:
            out.display_loss.append((float(m.group(1)), seconds, _float(m.group(2))))
        for kind, regex in (("train", RE_TRAIN_OUTPUT), ("test", RE_TEST_OUTPUT)):
            m = regex.search(line)
            if not m:
                continue
            row = rows[kind]
            if row is None or row["NumIters"] != iteration:
                if row is not None:
                    lists[kind].append(row)
                row = rows[kind] = collections.OrderedDict(
                    [("NumIters", iteration), ("Seconds", seconds), ("LearningRate", learning_rate)])
            row[m.group(2)] = _float(m.group(3))
    for kind in ("train", "test"):
        if rows[kind] is not None:
            lists[kind].append(rows[kind])
        _fix_initial_nan_learning_rate(lists[kind])
    return out


def _fix_initial_nan_learning_rate(rows):
    """Rows before the first printed rate take the first rate printed (Caffe's script copies
    the second row's into the first)."""
    known = [r["LearningRate"] for r in rows if not math.isnan(r["LearningRate"])]
    if not known:
        return
    for row in rows:
        if not math.isnan(row["LearningRate"]):
            break
        row["LearningRate"] = known[0]


def log_year(path):
    """The year a log without years in its dates belongs to: the file's modification year."""
    try:
        return datetime.datetime.fromtimestamp(os.path.getmtime(path)).year
    except OSError:
        return datetime.date.today().year


def parse_log_full(path):
    """:class:`LogParse` of the log file ``path``.

    Raises:
        ToolError: the file cannot be read.
    """
    try:
        with open(path, errors="replace") as f:
            return parse_lines(f, log_year(path))
    except OSError as exc:
        raise ToolError(f"cannot read log '{path}': {exc.strerror}") from None


def parse_log(path):
    """(train_rows, test_rows) of a log, as Caffe's ``parse_log.parse_log``."""
    parsed = parse_log_full(path)
    return parsed.train, parsed.test


def write_csv(path, rows, delimiter=",", verbose=False):
    """Write ``rows`` (OrderedDicts) as CSV with a header; nothing for no rows (Caffe's)."""
    if not rows:
        print(f"Not writing {path}; no lines to write")
        return False
    fieldnames = list(collections.OrderedDict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames, delimiter=delimiter, restval="",
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    if verbose:
        print(f"Wrote {path}")
    return True


def save_csv_files(logfile_path, output_dir, train_rows, test_rows, delimiter=",", verbose=False):
    """``<output_dir>/<log name>.train`` and ``.test`` (Caffe's names)."""
    base = os.path.basename(logfile_path)
    write_csv(os.path.join(output_dir, base + ".train"), train_rows, delimiter, verbose)
    write_csv(os.path.join(output_dir, base + ".test"), test_rows, delimiter, verbose)


def build_parser():
    p = Parser(prog=PROG, description="Parse a Caffe training log into two CSV files holding "
               "the training and the testing outputs.")
    p.add_argument("logfile_path", help="path to the log file")
    p.add_argument("output_dir", help="directory in which to place the output CSV files")
    p.add_argument("--verbose", action="store_true", help="print the names of the files written")
    p.add_argument("--delimiter", default=",", help="column delimiter in the output files (default ',')")
    return p


def _main(argv):
    args = build_parser().parse_args(argv)
    if len(args.delimiter) != 1:
        raise ToolError(f"--delimiter must be one character, got {args.delimiter!r}")
    if not os.path.isdir(args.output_dir):
        raise ToolError(f"output directory '{args.output_dir}' does not exist")
    train, test = parse_log(args.logfile_path)
    if not train and not test:
        raise ToolError(f"'{args.logfile_path}' holds no 'Train net output' or 'Test net output' lines")
    save_csv_files(args.logfile_path, args.output_dir, train, test, args.delimiter, args.verbose)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
