"""Nets drawn as graphs with pydot and Graphviz (pycaffe's ``caffe.draw``).

Caffe: python/caffe/draw.py. As Caffe's: layers are boxes (``name (Type)``; convolution and
pooling add kernel size, stride and pad; coloured by type: convolution red, pooling orange,
inner product purple, others blue, in-place layers green), blobs are grey octagons, edges run
bottom -> layer -> top, and a layer's out-edges carry its output count (``num_output``,
``Batch N`` for Data). A phase draws the layers that phase keeps (by ``include``/``exclude``
phase rules), None every layer.

``.dot``, ``.gv`` and ``.raw`` outputs are the DOT text and need only pydot; other formats are
rendered by Graphviz's ``dot`` program, which must be installed (``apt-get install graphviz``).
"""
import contextlib
import io
import os
import shutil

from .errors import CaffeError

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
TYPE_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
               "InnerProduct": "#CC33FF"}
LEARNING_LAYERS = ("Convolution", "Deconvolution", "InnerProduct")
TEXT_FORMATS = ("dot", "gv", "raw")


def _pydot():
    try:
        import pydot
    except ImportError:
        raise CaffeError("drawing a net needs pydot (pip install 'caffe_engine[tools]')") from None
    return pydot


def _first(values, default):
    return values[0] if len(values) else default


def get_layer_label(layer, rankdir, display_lrm=False):
    """The text in a layer's box (LayerParameter ``layer``), quoted for DOT (pycaffe's)."""
    from .proto import caffe_pb2
    separator = " " if rankdir in ("TB", "BT") else "\\n"
    parts = [layer.name]
    if layer.type == "Pooling":
        pool = caffe_pb2.PoolingParameter.PoolMethod.Name(layer.pooling_param.pool)
        parts.append(f"({layer.type} {pool})")
    else:
        parts.append(f"({layer.type})")
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        if layer.type == "Pooling":
            p = layer.pooling_param
            kernel = p.kernel_size or p.kernel_h
            stride, pad = p.stride or p.stride_h or 1, p.pad or p.pad_h
        else:
            p = layer.convolution_param
            kernel = _first(p.kernel_size, p.kernel_h or 1)
            stride = _first(p.stride, p.stride_h or 1)
            pad = _first(p.pad, p.pad_h)
        parts.append(separator.join([f"kernel size: {kernel}", f"stride: {stride}", f"pad: {pad}"]))
    if display_lrm and layer.type in LEARNING_LAYERS:
        mults = [f"{s.lr_mult:g}" for s in layer.param] or ["1"]
        parts.append("lr mult: " + ", ".join(mults))
    return '"%s"' % separator.join(parts)


def get_edge_label(layer):
    """Label of a layer's out-edges (pycaffe's): its output count, or ``Batch N`` for Data."""
    if layer.type == "Data":
        return f'"Batch {layer.data_param.batch_size}"'
    if layer.type in ("Convolution", "Deconvolution"):
        return f'"{layer.convolution_param.num_output}"'
    if layer.type == "InnerProduct":
        return f'"{layer.inner_product_param.num_output}"'
    return '""'


def _kept(layer, phase):
    """Whether ``phase`` (None: all) keeps ``layer`` by its phase rules."""
    if phase is None:
        return True
    if len(layer.include) and len(layer.exclude):
        raise CaffeError(f"layer '{layer.name}' specifies both include and exclude rules")
    if len(layer.include):
        return any(not r.HasField("phase") or r.phase == phase for r in layer.include)
    return not any(r.HasField("phase") and r.phase == phase for r in layer.exclude)


def get_pydot_graph(net, rankdir, label_edges=True, phase=None, display_lrm=False):
    """A pydot graph of the NetParameter ``net`` (see the module docstring)."""
    pydot = _pydot()
    graph = pydot.Dot(net.name or "Net", graph_type="digraph", rankdir=rankdir)
    nodes, edges = {}, []
    layers = list(net.layer)
    if not layers and len(net.layers):
        raise CaffeError("V1 'layers' nets are not drawn: upgrade the prototxt first "
                        "(tools/upgrade_net_proto_text.py)")
    for layer in layers:
        if not _kept(layer, phase):
            continue
        node_name = f"{layer.name}_{layer.type}"
        label = get_layer_label(layer, rankdir, display_lrm)
        if len(layer.bottom) == 1 and len(layer.top) == 1 and layer.bottom[0] == layer.top[0]:
            nodes[node_name] = pydot.Node(node_name, label=label, **NEURON_LAYER_STYLE)
        else:
            style = dict(LAYER_STYLE_DEFAULT, fillcolor=TYPE_COLORS.get(layer.type, "#6495ED"))
            nodes[node_name] = pydot.Node(node_name, label=label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom + "_blob", label=f'"{bottom}"', **BLOB_STYLE)
            edges.append((bottom + "_blob", node_name, '""'))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top + "_blob", label=f'"{top}"', **BLOB_STYLE)
            edges.append((node_name, top + "_blob", get_edge_label(layer) if label_edges else '""'))
    for node in nodes.values():
        graph.add_node(node)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def draw_net(net, rankdir, ext="png", phase=None, display_lrm=False):
    """The drawing of NetParameter ``net`` as bytes in format ``ext`` (pycaffe's ``draw_net``).

    Args:
        net: a ``caffe_pb2.NetParameter`` (layers of the V1 ``layers`` field are refused).
        rankdir: Graphviz's direction, "LR", "TB", "BT" or "RL".
        ext: "dot", "gv" or "raw" give the DOT text (needs only pydot); any other format
            ("png", "svg", "pdf", ...) is rendered by Graphviz's ``dot`` program.
        phase: ``caffe_pb2.TRAIN`` / ``TEST`` draws the layers that phase keeps; None all.
        display_lrm: show the lr_mult of learning layers.

    Raises:
        CaffeError: pydot missing, Graphviz's ``dot`` missing for an image format, an unknown
            format, Graphviz failing, or a layer with both include and exclude rules.
    """
    graph = get_pydot_graph(net, rankdir, phase=phase, display_lrm=display_lrm)
    ext = ext.lower()
    if ext in TEXT_FORMATS:
        return graph.to_string().encode()
    if shutil.which("dot") is None:
        raise CaffeError("Graphviz's 'dot' program is not installed (apt-get install graphviz); "
                         "write a .dot file instead to get the graph as text")
    if ext not in getattr(graph, "formats", [ext]):
        raise CaffeError(f"unknown output format '.{ext}' (known: {', '.join(TEXT_FORMATS)}, "
                         f"{', '.join(f for f in graph.formats if f not in TEXT_FORMATS)})")
    try:
        with contextlib.redirect_stdout(io.StringIO()):   # pydot prints Graphviz's stderr
            return graph.create(format=ext, prog="dot")
    except Exception as exc:   # pydot raises plain exceptions for Graphviz's failures
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise CaffeError(f"Graphviz could not write format '{ext}': "
                         f"{lines[-1] if lines else type(exc).__name__}") from None


def draw_net_to_file(net, filename, rankdir="LR", phase=None, display_lrm=False):
    """Write the drawing of NetParameter ``net`` to ``filename``, in the format its extension
    names (pycaffe's ``draw_net_to_file``); nothing is written when drawing fails.

    Raises:
        CaffeError: no extension, or as :func:`draw_net`.
    """
    ext = os.path.splitext(str(filename))[1][1:].lower()
    if not ext:
        raise CaffeError(f"the output file '{filename}' needs an extension naming its format "
                         f"(.png, .svg, .dot ...)")
    data = draw_net(net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as f:
        f.write(data)
