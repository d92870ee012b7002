"""Reading and writing Caffe's files: LMDB Datum cursors, binaryproto means.

Modules are imported where they are used (``from caffe_engine.io import lmdb_source``), so importing
this package costs nothing and needs neither ``lmdb`` nor a parsed schema.
"""
