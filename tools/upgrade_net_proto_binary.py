#!/usr/bin/env python3
"""Upgrade a binary net (a .caffemodel in the V0/V1 format) to the current format.

Usage: python tools/upgrade_net_proto_binary.py V0_OR_V1_NET_BINARY_IN NET_BINARY_OUT

Caffe: tools/upgrade_net_proto_binary.cpp. Same upgrades as upgrade_net_proto_text (the weights
are carried over layer by layer); the result is written as a binary NetParameter. Errors are one
line on stderr and exit status 1.
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.upgrade_proto", "upgrade_net_proto_binary"))
