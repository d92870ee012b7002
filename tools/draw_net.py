#!/usr/bin/env python3
"""draw_net: a net prototxt drawn as a graph (PNG, SVG, PDF ... or DOT text).

Usage: python tools/draw_net.py --help

The tool is caffe_engine/tools/draw_net.py (see its docstring), installed as the `draw_net`
command.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.draw_net"))
