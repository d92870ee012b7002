#!/usr/bin/env python3
"""Upgrade a net prototxt written in deprecated syntax to the current format.

Usage: python tools/upgrade_net_proto_text.py V0_OR_V1_NET_PROTOTXT_IN NET_PROTOTXT_OUT

Caffe: tools/upgrade_net_proto_text.cpp. V0 and V1 layers, data transformation fields, net-level
input fields and old BatchNorm param specs are upgraded as Caffe upgrades them on read (see
caffe_engine/io/upgrade.py; the command is caffe_engine/tools/upgrade_proto.py, installed as
`upgrade_net_proto_text`); the result is written as text. A file already in the current format
is written back unchanged, with Caffe's note. Errors are one line on stderr and exit status 1
(also when Caffe would report problems during the upgrade; the output is written anyway).
"""
import sys

import _launch

if __name__ == "__main__":
    sys.exit(_launch.run("caffe_engine.tools.upgrade_proto", "upgrade_net_proto_text"))
