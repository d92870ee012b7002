#!/usr/bin/env python3
"""Upgrade a binary net (a .caffemodel in the V0/V1 format) to the current format.

Usage: python tools/upgrade_net_proto_binary.py V0_OR_V1_NET_BINARY_IN NET_BINARY_OUT

Caffe: tools/upgrade_net_proto_binary.cpp. Same upgrades as upgrade_net_proto_text (the weights
are carried over layer by layer); the result is written as a binary NetParameter. Errors are one
line on stderr and exit status 1.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from caffe_engine.io.upgrade import run_upgrade_tool  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_upgrade_tool("upgrade_net_proto_binary"))
