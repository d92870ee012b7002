#!/usr/bin/env python3
"""parse_log: a Caffe (or caffe_engine) training log -> ``<log>.train`` and ``<log>.test`` CSV.

Usage: python tools/parse_log.py --help

The tool is caffe_engine/tools/parse_log.py (see its docstring), installed as the `parse_log`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.parse_log import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
