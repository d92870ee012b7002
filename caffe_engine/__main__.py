"""``python -m caffe_engine`` runs the ``caffe`` command."""
import sys

from .cli import main

sys.exit(main())
