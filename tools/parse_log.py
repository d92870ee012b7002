#!/usr/bin/env python3
"""parse_log: a Caffe (or caffe_engine) training log -> ``<log>.train`` and ``<log>.test`` CSV.

Usage: python tools/parse_log.py --help

The tool is caffe_engine/tools/parse_log.py (see its docstring), installed as the `parse_log`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.parse_log"))
