"""Caffe's (glog's) log line format, so that existing log parsers keep working.

A line looks like ``I20261129 08:37:31.425395 29493 solver.py:239] Iteration 0, lr = 0.01``:
severity letter, date, time with microseconds, thread id, source file:line, then the message.
Caffe prints numbers with C++ iostream's default 6 significant digits; :func:`g` does the same.
"""
import logging
import sys
import threading
import time

LOGGER_NAME = "caffe_engine"
logger = logging.getLogger(LOGGER_NAME)

_LEVEL_LETTER = {logging.DEBUG: "I", logging.INFO: "I", logging.WARNING: "W",
                 logging.ERROR: "E", logging.CRITICAL: "F"}


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
    """Send the engine's log to ``stream`` (default stderr, as Caffe with GLOG_logtostderr=1)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(GlogFormatter())
    logger.handlers[:] = [handler]
    logger.setLevel(level)
    logger.propagate = False
    return logger


def g(x):
    """Format a number as C++ ``ostream << x`` does by default (``%g``, 6 significant digits)."""
    return "%g" % x
