#!/usr/bin/env python3
"""extract_features: run a net over N mini-batches and save some of its blobs, item by item.

Usage: python tools/extract_features.py --help

The tool is caffe_engine/tools/extract_features.py (see its docstring), installed as the `extract_features`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.extract_features"))
