"""The geometry a layer hands to its kernels: frozen, hashable descriptions of one call shape.

Kernels are planned from these in the layer's ``reshape`` (and planned again only when the
geometry changes), so the layers hold Caffe's parameters and the kernels hold the loops.
"""
from dataclasses import dataclass


def conv_output_shape(in_shape, kernel, stride, pad, dilation):
    """Caffe's convolution output size per spatial axis: ``(S + 2p - (d(k-1)+1)) // s + 1``.

    Caffe: src/caffe/layers/conv_layer.cpp, ``compute_output_shape``.
    """
    return tuple((s + 2 * p - (d * (k - 1) + 1)) // st + 1
                 for s, k, st, p, d in zip(in_shape, kernel, stride, pad, dilation))


def deconv_output_shape(in_shape, kernel, stride, pad, dilation):
    """Caffe's deconvolution output size per spatial axis: ``s (S - 1) + d (k - 1) + 1 - 2p``.

    Caffe: src/caffe/layers/deconv_layer.cpp, ``compute_output_shape``.
    """
    return tuple(st * (s - 1) + d * (k - 1) + 1 - 2 * p
                 for s, k, st, p, d in zip(in_shape, kernel, stride, pad, dilation))


def pooled_size(size, kernel, stride, pad, ceil_mode=True):
    """Caffe's pooling output size along one axis.

    ``ceil((size + 2 pad - kernel) / stride) + 1`` (``floor`` when not ``ceil_mode``); with
    ``pad > 0`` the last window is dropped when it would start at or beyond ``size + pad``.
    Caffe: src/caffe/layers/pooling_layer.cpp, ``Reshape``.
    """
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@dataclass(frozen=True)
class ConvGeometry:
    """One convolution, described from its image side to its column side.

    ``num`` images of ``channels`` x ``in_spatial`` map to ``num_output`` x ``out_spatial``
    through weights (num_output, channels / group, *kernel). Convolution runs it forward
    (bottom = image side); Deconvolution runs it backward (bottom = column side), as Caffe's
    BaseConvolutionLayer does. All fields are ints or tuples of ints, one per spatial axis.
    """

    num: int
    channels: int
    num_output: int
    group: int
    in_spatial: tuple
    out_spatial: tuple
    kernel: tuple
    stride: tuple
    pad: tuple
    dilation: tuple

    @property
    def kernel_dim(self):
        """Rows of one group's column matrix: ``channels / group * prod(kernel)``."""
        k = self.channels // self.group
        for d in self.kernel:
            k *= d
        return k


@dataclass(frozen=True)
class PoolGeometry:
    """MAX or AVE pooling of (num, channels, height, width) into (num, channels, *out_hw).

    ``method`` is caffe_pb2.PoolingParameter's MAX (0) or AVE (1); ``kernel``, ``stride``,
    ``pad`` and ``out_hw`` are (h, w) pairs (see :func:`pooled_size`).
    """

    num: int
    channels: int
    in_hw: tuple
    out_hw: tuple
    kernel: tuple
    stride: tuple
    pad: tuple
    method: int


@dataclass(frozen=True)
class LRNGeometry:
    """Local response normalisation of ``shape`` (num, channels, height, width): ACROSS_CHANNELS
    (``within`` false) or WITHIN_CHANNEL, with Caffe's ``local_size``, alpha, beta and k (float32
    values as Python floats)."""

    shape: tuple
    size: int
    alpha: float
    beta: float
    k: float
    within: bool = False
