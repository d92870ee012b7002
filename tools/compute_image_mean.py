#!/usr/bin/env python3
"""compute_image_mean: the mean image of an LMDB of Datum records, as a ``.binaryproto``.

Usage: python tools/compute_image_mean.py --help

The tool is caffe_engine/tools/compute_image_mean.py (see its docstring), installed as the `compute_image_mean`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.compute_image_mean import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
