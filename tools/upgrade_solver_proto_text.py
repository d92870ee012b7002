#!/usr/bin/env python3
"""Upgrade a solver prototxt that uses the deprecated solver_type enum.

Usage: python tools/upgrade_solver_proto_text.py SOLVER_PROTOTXT_IN SOLVER_PROTOTXT_OUT

Caffe: tools/upgrade_solver_proto_text.cpp. solver_type: NESTEROV becomes type: "Nesterov" and
so on. Errors (both solver_type and type given, unreadable file) are one line on stderr and exit
status 1.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.io.upgrade import run_upgrade_tool  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_upgrade_tool("upgrade_solver_proto_text"))
