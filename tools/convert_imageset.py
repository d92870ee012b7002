#!/usr/bin/env python3
"""convert_imageset: a list of images and labels -> an LMDB or LevelDB of Caffe ``Datum`` records.

Usage: python tools/convert_imageset.py --help

The tool is caffe_engine/tools/convert_imageset.py (see its docstring), installed as the `convert_imageset`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.convert_imageset"))
