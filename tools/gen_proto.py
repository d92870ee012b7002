#!/usr/bin/env python3
"""Generate caffe_engine/proto/caffe_pb2.py from proto/caffe.proto.

Uses the protoc bundled in grpcio-tools (pip install grpcio-tools), so no system protoc is needed.

Usage:
    python tools/gen_proto.py            # (re)write caffe_engine/proto/caffe_pb2.py
    python tools/gen_proto.py --out DIR  # write caffe_pb2.py into DIR instead (used by the drift test)

Exit status 1 with a one-line message when grpcio-tools is missing or protoc fails.
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "proto")
DEFAULT_OUT = os.path.join(ROOT, "caffe_engine", "proto")


def generate(out_dir):
    """Run protoc on proto/caffe.proto, writing caffe_pb2.py into out_dir.

    Raises:
        RuntimeError: grpcio-tools is not installed or protoc reports an error.
    """
    try:
        from grpc_tools import protoc
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("grpcio-tools is not installed (pip install grpcio-tools)") from exc
    os.makedirs(out_dir, exist_ok=True)
    status = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
                          os.path.join(PROTO_DIR, "caffe.proto")])
    if status != 0:
        raise RuntimeError(f"protoc failed on {os.path.join(PROTO_DIR, 'caffe.proto')} (status {status})")
    return os.path.join(out_dir, "caffe_pb2.py")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        path = generate(args.out)
    except RuntimeError as exc:
        print(f"gen_proto: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
