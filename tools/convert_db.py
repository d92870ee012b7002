#!/usr/bin/env python3
"""convert_db: copy a Caffe database between the LevelDB and LMDB backends (same keys, values, order).

Usage: python tools/convert_db.py SRC DST [--from leveldb|lmdb] [--to lmdb|leveldb]

The tool is caffe_engine/tools/convert_db.py (see its docstring), installed as the `convert_db`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.convert_db"))
