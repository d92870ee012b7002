"""Caffe's protobuf schema as Python classes (generated from proto/caffe.proto)."""
from . import caffe_pb2  # noqa: F401
