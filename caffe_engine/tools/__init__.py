"""Caffe's data and log tools, as Python commands.

Each module has ``main(argv=None) -> int`` (the exit status) and is also run by a thin script of
the same name under the repository's ``tools/`` folder:

* :mod:`.convert_imageset` (tools/convert_imageset.cpp): image list -> LMDB/LevelDB of Datum;
* :mod:`.compute_image_mean` (tools/compute_image_mean.cpp): LMDB/LevelDB -> mean ``.binaryproto``;
* :mod:`.extract_features` (tools/extract_features.cpp): net blobs -> LMDB/LevelDB of Datum or ``.npy``;
* :mod:`.convert_db` (not in Caffe): LevelDB <-> LMDB, same keys and values, for migrating;
* :mod:`.parse_log` (tools/extra/parse_log.py): training log -> ``.train`` / ``.test`` CSV;
* :mod:`.plot_training_log` (tools/extra/plot_training_log.py.example): log -> PNG chart;
* :mod:`.draw_net` (python/draw_net.py, python/caffe/draw.py): prototxt -> PNG/SVG/DOT graph.

A mistake on the command line or in the inputs prints one ``<tool>: error: ...`` line and
exits with status 1. Long loops show a tqdm progress bar when tqdm is installed (extra
``tools``) and stderr is a terminal.
"""
