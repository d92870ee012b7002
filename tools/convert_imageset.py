#!/usr/bin/env python3
"""convert_imageset: a list of images and labels -> an LMDB of Caffe ``Datum`` records.

Usage: python tools/convert_imageset.py --help

The tool is caffe_engine/tools/convert_imageset.py (see its docstring), installed as the `convert_imageset`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.convert_imageset import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
