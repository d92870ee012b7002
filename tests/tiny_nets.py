"""Small nets the comm and parallel tests share (prototxt text), so that each is written once.

IP_NET: Input (4x6 data, 4x3 label), two InnerProducts around a ReLU, EuclideanLoss: two
gradient layers for bucket and hook tests. SYNC_NET: the same shape with a param shared by two
layers ("w_shared") and lr_mult 2, for gradient averaging. MLP_NET (``%(source)s``,
``%(batch)d``) reads a 1x4x4 LMDB (tests/parallel/conftest.py's ``tiny_lmdb``); MLP_SOLVER
(``%(iter_size)d``) trains it. SOFTMAX_NET: Input (4x3, 4 labels), one InnerProduct (bias lr_mult
2, decay_mult 0), SoftmaxWithLoss, fed SOFTMAX_DATA / SOFTMAX_LABEL (the solver tests).
"""
import numpy

IP_NET = """
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 6 } shape { dim: 4 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip2" type: "InnerProduct" bottom: "h" top: "out"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "label" top: "loss" }
"""

SYNC_NET = """
name: "sync_net"
layer { name: "input" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 6 } shape { dim: 4 dim: 3 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "h"
        param { name: "w_shared" } param { lr_mult: 2 }
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "ip_shared" type: "InnerProduct" bottom: "h" top: "h2" param { name: "w_shared" }
        inner_product_param { num_output: 6 bias_term: false
                              weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "ip3" type: "InnerProduct" bottom: "h2" top: "out"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "constant" value: -0.2 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "label" top: "loss" }
"""

MLP_NET = """
name: "tiny_mlp"
layer { name: "data" type: "Data" top: "data" top: "label"
        include { phase: TRAIN }
        transform_param { scale: 0.00390625 }
        data_param { source: "%(source)s" batch_size: %(batch)d backend: LMDB } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 10 weight_filler { type: "xavier" }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""

MLP_SOLVER = """
base_lr: 0.1 momentum: 0.9 weight_decay: 0.001 lr_policy: "fixed"
max_iter: 1000 display: 0 average_loss: 1 random_seed: 1701
snapshot_after_train: false iter_size: %(iter_size)d
"""

SOFTMAX_NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        param { lr_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
        inner_product_param { num_output: 3 weight_filler { type: "uniform" min: -1 max: 1 }
                              bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""
SOFTMAX_DATA = numpy.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0], [-0.7, 2.0, 1.5], [2.5, -0.2, 0.0]], numpy.float32)
SOFTMAX_LABEL = numpy.array([0, 2, 1, 2], numpy.float32)
