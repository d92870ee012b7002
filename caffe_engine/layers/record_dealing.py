"""Several solvers reading one database: each layer that can skip records keeps its share.

Caffe: src/caffe/layers/data_layer.cpp and hdf5_data_layer.cpp (``Skip``, reading the
process-wide ``Caffe::solver_count`` / ``solver_rank``). Here those are attributes of the
layers that skip (Data, HDF5Data), set by :func:`deal_records`: the solver calls it for its
train net whenever its ``solver_count`` exceeds 1 (from pycaffe's ``set_solver_count`` or a
data-parallel callback), and the data-parallel glue exports it as
:func:`caffe_engine.comm.distributed.deal_records`. It lives beside the layers, not in
``comm/``, because the solver, which never imports the communicators, calls it.
"""


def deal_records(net, rank, count):
    """Make every layer of ``net`` that can skip records (``solver_count`` / ``solver_rank``
    attributes: Data, HDF5Data) keep only record i with i % count == rank.

    The layers keep reading everything in the TEST phase. ``net`` needs only ``layer_names``
    and ``layers``.

    Returns:
        list of str: the names of the layers configured, in layer order.
    """
    names = []
    for name, layer in zip(net.layer_names, net.layers):
        if hasattr(layer, "solver_count") and hasattr(layer, "solver_rank"):
            layer.solver_count = int(count)
            layer.solver_rank = int(rank)
            names.append(name)
    return names
