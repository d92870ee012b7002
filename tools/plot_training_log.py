#!/usr/bin/env python3
"""plot_training_log: training curves of one or more Caffe logs as a PNG.

Usage: python tools/plot_training_log.py --help

The tool is caffe_engine/tools/plot_training_log.py (see its docstring), installed as the `plot_training_log`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.plot_training_log import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
