"""draw_net: a net prototxt drawn as a graph (PNG, SVG, PDF ... or DOT text).

Caffe: python/draw_net.py, python/caffe/draw.py.

Usage::

    draw_net [--rankdir LR] [--phase ALL] [--display_lrm] NET.prototxt OUTPUT.{png,svg,pdf,dot,...}

As Caffe's: layers are boxes (``name (Type)``; convolution and pooling add kernel size, stride
and pad; coloured by type: convolution red, pooling orange, inner product purple, others blue,
in-place layers green), blobs are grey octagons, edges run bottom -> layer -> top, and a layer's
out-edges carry its output count (``num_output``, ``Batch N`` for Data). ``--phase TRAIN|TEST``
draws the layers that phase keeps (by ``include``/``exclude`` phase rules), ``ALL`` every layer.

The graph is built with pydot; ``.dot``, ``.gv`` and ``.raw`` outputs are the DOT text and need
nothing else, other formats are rendered by Graphviz's ``dot`` program, which must be installed
(``apt-get install graphviz``).
"""
import sys

from ..draw import draw_net_to_file, get_edge_label, get_layer_label, get_pydot_graph  # noqa: F401
from ._common import Parser, run

PROG = "draw_net"


def build_parser():
    p = Parser(prog=PROG, description="Draw a graph of the net architecture.")
    p.add_argument("input_net_proto_file", help="input network prototxt file")
    p.add_argument("output_image_file", help="output file: .png, .svg, .pdf, .jpg ... (Graphviz) "
                   "or .dot/.gv/.raw (DOT text)")
    p.add_argument("--rankdir", default="LR", choices=["LR", "TB", "BT", "RL"],
                   help="graph direction: LR (left-right, default), TB (top-bottom), BT, RL")
    p.add_argument("--phase", default="ALL", choices=["TRAIN", "TEST", "ALL"],
                   help="which phase's layers to draw: TRAIN, TEST, or ALL (default: every layer)")
    p.add_argument("--display_lrm", action="store_true",
                   help="show the lr_mult of learning layers")
    return p


def _main(argv):
    args = build_parser().parse_args(argv)
    from ..io import prototxt as pio
    from ..proto import caffe_pb2
    net = pio.read_text(args.input_net_proto_file, caffe_pb2.NetParameter(), "net prototxt")
    phase = {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST, "ALL": None}[args.phase]
    print(f"Drawing net to {args.output_image_file}")
    draw_net_to_file(net, args.output_image_file, args.rankdir, phase, args.display_lrm)
    return 0


def main(argv=None):
    return run(PROG, _main, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
