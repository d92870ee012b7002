#!/usr/bin/env python3
"""draw_net: a net prototxt drawn as a graph (PNG, SVG, PDF ... or DOT text).

Usage: python tools/draw_net.py --help

The tool is caffe_engine/tools/draw_net.py (see its docstring), installed as the `draw_net`
command.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.tools.draw_net import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
