#!/usr/bin/env python3
"""repro_check: does the engine reproduce a real Caffe training run (same seed, same numbers)?

Usage: python tools/repro_check.py SOLVER.prototxt --log CAFFE.log [--until N] [--tol T]

The tool is caffe_engine/tools/repro_check.py (see its docstring), installed as the
`caffe_repro_check` command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.repro_check"))
