"""upgrade_net_proto_text, upgrade_net_proto_binary, upgrade_solver_proto_text: files written in
Caffe's deprecated syntax rewritten in the current one.

Caffe: tools/upgrade_net_proto_text.cpp, tools/upgrade_net_proto_binary.cpp,
tools/upgrade_solver_proto_text.cpp. The upgrades themselves are :mod:`caffe_engine.io.upgrade`'s
(what every reader applies); this module is only the commands.

Usage::

    upgrade_net_proto_text   V0_OR_V1_NET.prototxt   NET_OUT.prototxt
    upgrade_net_proto_binary V1_NET.caffemodel       NET_OUT.caffemodel
    upgrade_solver_proto_text OLD_SOLVER.prototxt    SOLVER_OUT.prototxt
"""
import argparse
import sys

from ..errors import CaffeError
from ..io import prototxt as pio
from ..io.upgrade import (net_needs_upgrade, solver_needs_type_upgrade, upgrade_net_as_needed,
                          upgrade_solver_as_needed)
from ..log import logger
from ..proto import caffe_pb2
from ._common import start_logging

_TOOLS = {
    # name: (message class, binary?, what, needs-test, upgrade)
    "upgrade_net_proto_text": (caffe_pb2.NetParameter, False, "NetParameter text proto",
                               net_needs_upgrade, upgrade_net_as_needed),
    "upgrade_net_proto_binary": (caffe_pb2.NetParameter, True, "NetParameter binary proto",
                                 net_needs_upgrade, upgrade_net_as_needed),
    "upgrade_solver_proto_text": (caffe_pb2.SolverParameter, False, "SolverParameter text proto",
                                  solver_needs_type_upgrade, upgrade_solver_as_needed),
}
_TOOL_HELP = {
    "upgrade_net_proto_text": "Upgrade a net prototxt written with deprecated syntax (V0 or V1 "
                              "layers, data transformation fields, input fields, BatchNorm "
                              "param specs) to the current format.",
    "upgrade_net_proto_binary": "Upgrade a binary net (e.g. a .caffemodel in the V1 'layers' "
                                "format) to the current format, weights included.",
    "upgrade_solver_proto_text": "Upgrade a solver prototxt using the deprecated 'solver_type' "
                                 "enum to the 'type' string.",
}


def run(tool, argv=None):
    """Body of Caffe's ``tools/upgrade_{net_proto_text,net_proto_binary,solver_proto_text}``.

    Reads ``argv[0]``, upgrades it as Caffe does (saying "File already in latest proto format"
    when nothing needs it), writes ``argv[1]`` atomically. Every error is one line
    ``<tool>: <message>`` on stderr.

    Returns:
        the exit status: 0 on success, 1 on a usage, read or write error or when Caffe
        reported problems while upgrading (the output is still written then, as Caffe does).
    """

    msg_class, binary, what, needs, upgrade = _TOOLS[tool]
    kind = "solver" if msg_class is caffe_pb2.SolverParameter else "net"
    parser = argparse.ArgumentParser(prog=tool, description=_TOOL_HELP[tool])
    parser.add_argument("input", help=f"the {kind} file to upgrade "
                        f"({'binary' if binary else 'text'})")
    parser.add_argument("output", help=f"where to write the upgraded {what}")

    def fail_usage(message):
        sys.stderr.write(f"usage: {tool} INPUT OUTPUT\n{tool}: {message}\n")
        raise SystemExit(1)

    parser.error = fail_usage
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exc:      # --help exits 0, usage errors 1
        return int(exc.code or 0)
    start_logging()
    try:
        param = msg_class()
        if binary:
            pio.read_binary(args.input, param, what)
        else:
            pio.read_text(args.input, param, what)
        ok = True
        if needs(param):
            ok = upgrade(param, args.input)
            if not ok:
                logger.error("Encountered error(s) while upgrading prototxt; see details above.")
        else:
            logger.error(f"File already in latest proto format: {args.input}")
        if binary:
            pio.write_binary(args.output, param)
        else:
            pio.write_text(args.output, param)
        logger.info(f"Wrote upgraded {what} to {args.output}")
    except CaffeError as exc:
        sys.stderr.write(f"{tool}: {exc}\n")
        return 1
    return 0 if ok else 1


def upgrade_net_proto_text(argv=None):
    """The ``upgrade_net_proto_text`` command; returns its exit status."""
    return run("upgrade_net_proto_text", argv)


def upgrade_net_proto_binary(argv=None):
    """The ``upgrade_net_proto_binary`` command; returns its exit status."""
    return run("upgrade_net_proto_binary", argv)


def upgrade_solver_proto_text(argv=None):
    """The ``upgrade_solver_proto_text`` command; returns its exit status."""
    return run("upgrade_solver_proto_text", argv)
