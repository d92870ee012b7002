#!/usr/bin/env python3
"""compute_image_mean: the mean image of an LMDB or LevelDB of Datum records, as a ``.binaryproto``.

Usage: python tools/compute_image_mean.py --help

The tool is caffe_engine/tools/compute_image_mean.py (see its docstring), installed as the `compute_image_mean`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.compute_image_mean"))
