#!/usr/bin/env python3
"""Upgrade a solver prototxt that uses the deprecated solver_type enum.

Usage: python tools/upgrade_solver_proto_text.py SOLVER_PROTOTXT_IN SOLVER_PROTOTXT_OUT

Caffe: tools/upgrade_solver_proto_text.cpp. solver_type: NESTEROV becomes type: "Nesterov" and
so on. Errors (both solver_type and type given, unreadable file) are one line on stderr and exit
status 1.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.upgrade_proto", "upgrade_solver_proto_text"))
