#!/usr/bin/env python3
"""plot_training_log: training curves of one or more Caffe logs as a PNG.

Usage: python tools/plot_training_log.py --help

The tool is caffe_engine/tools/plot_training_log.py (see its docstring), installed as the `plot_training_log`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.plot_training_log"))
