#!/usr/bin/env python3
"""extract_features: run a net over N mini-batches and save some of its blobs, item by item.

Usage: python tools/extract_features.py --help

The tool is caffe_engine/tools/extract_features.py (see its docstring), installed as the `extract_features`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.extract_features import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
