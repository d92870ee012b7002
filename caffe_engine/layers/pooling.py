"""Pooling: Caffe's parameters, output geometry and contract.

Caffe: src/caffe/layers/pooling_layer.cpp. The MAX and AVE loops (Caffe's first-max rule and
argmax, its AVE divisor, its backward order) are the kernel set's
(:mod:`caffe_engine.kernels`), planned in ``reshape``.
"""
from .. import kernels
from ..kernels.geometry import PoolGeometry, pooled_size
from ..proto import caffe_pb2
from .base import Layer, register

_MAX = caffe_pb2.PoolingParameter.MAX
_AVE = caffe_pb2.PoolingParameter.AVE
_STOCHASTIC = caffe_pb2.PoolingParameter.STOCHASTIC


@register("Pooling")
class PoolingLayer(Layer):
    """MAX or AVE pooling over the last two axes, with Caffe's output size and AVE divisor.

    Shapes: bottom (N, C, H, W) -> top (N, C, PH, PW) (see :func:`pooled_size`); with MAX an
    optional second top ``mask`` (N, C, PH, PW) holds each window's argmax as the float index
    ``h * W + w`` (the first maximum in row-major scan order, as Caffe). float32.

    AVE divides each window's sum by its size clipped to ``H + pad`` (padding counts, the ceil
    overhang does not).

    Fields read (pooling_param): pool (MAX), kernel_size or kernel_h + kernel_w (required unless
    global_pooling), stride / stride_h + stride_w (1), pad / pad_h + pad_w (0), global_pooling
    (false: kernel = H x W, needs pad 0 and stride 1), round_mode (CEIL; FLOOR).

    The loops are the kernel set's (:mod:`caffe_engine.kernels`), planned in ``reshape``.

    Raises:
        CaffeError: inconsistent kernel/stride/pad fields, zero kernel, pad >= kernel, a second
            top with AVE, an input that is not 4-D, and STOCHASTIC pooling at forward time (Caffe
            has no CPU implementation either).

    Caffe: src/caffe/layers/pooling_layer.cpp.
    """

    exact_num_bottom = 1
    min_top = 1
    max_top = 2

    def layer_setup(self, bottom, top):
        p = self.param.pooling_param
        self.method = p.pool
        if self.method not in (_MAX, _AVE, _STOCHASTIC):
            raise self.error(f"unknown pooling method {self.method}")
        if len(top) > 1 and self.method != _MAX:
            raise self.error(f"produces at most 1 top blob(s) for pool "
                             f"{caffe_pb2.PoolingParameter.PoolMethod.Name(self.method)}, "
                             f"got {len(top)}")
        has = p.HasField
        self.global_pooling = p.global_pooling
        if self.global_pooling:
            if has("kernel_size") or has("kernel_h") or has("kernel_w"):
                raise self.error("with global_pooling: true filter size cannot be specified")
        else:
            if has("kernel_size") == (has("kernel_h") and has("kernel_w")):
                raise self.error("filter size is kernel_size OR kernel_h and kernel_w; not both"
                                 if has("kernel_size") else
                                 "kernel_size (or both kernel_h and kernel_w) is required")
        if not ((not has("pad") and has("pad_h") and has("pad_w"))
                or (not has("pad_h") and not has("pad_w"))):
            raise self.error("pad is pad OR pad_h and pad_w are required")
        if not ((not has("stride") and has("stride_h") and has("stride_w"))
                or (not has("stride_h") and not has("stride_w"))):
            raise self.error("stride is stride OR stride_h and stride_w are required")
        if self.global_pooling:
            self.kernel = tuple(bottom[0].shape[-2:])
        elif has("kernel_size"):
            self.kernel = (p.kernel_size, p.kernel_size)
        else:
            self.kernel = (p.kernel_h, p.kernel_w)
        if min(self.kernel) <= 0:
            raise self.error(f"filter dimensions cannot be zero, got {self.kernel}")
        self.pad = (p.pad_h, p.pad_w) if has("pad_h") else (p.pad, p.pad)
        self.stride = (p.stride_h, p.stride_w) if has("stride_h") else (p.stride, p.stride)
        if min(self.stride) <= 0:
            raise self.error(f"stride cannot be zero, got {self.stride}")
        if self.global_pooling and (any(self.pad) or self.stride != (1, 1)):
            raise self.error("with global_pooling: true only pad = 0 and stride = 1 are allowed")
        if any(self.pad):
            if self.method not in (_MAX, _AVE):
                raise self.error("padding implemented only for average and max pooling")
            if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
                raise self.error(f"pad {self.pad} must be smaller than kernel {self.kernel}")
        self.ceil_mode = p.round_mode == caffe_pb2.PoolingParameter.CEIL

        self.plan = None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), "
                             f"got shape {shape}")
        n, c, h, w = shape
        if self.global_pooling:
            self.kernel = (h, w)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        out_h = pooled_size(h, kh, sh, ph, self.ceil_mode)
        out_w = pooled_size(w, kw, sw, pw, self.ceil_mode)
        if out_h < 1 or out_w < 1:
            raise self.error(f"kernel {self.kernel} larger than the padded input {(h, w)}")
        self.in_hw, self.out_hw = (h, w), (out_h, out_w)
        for t in top:
            t.reshape((n, c, out_h, out_w))
        if self.method == _STOCHASTIC:
            return
        geometry = PoolGeometry(n, c, (h, w), (out_h, out_w), self.kernel, self.stride,
                                self.pad, self.method)
        kernel_set = kernels.for_array(bottom[0].data)
        if self.plan is None or (geometry, kernel_set) != self._planned_for:
            self.plan = kernel_set.pooling(geometry)
            self._planned_for = (geometry, kernel_set)

    def forward(self, bottom, top):
        if self.method == _STOCHASTIC:
            raise self.error("STOCHASTIC pooling is not implemented in the CPU engine "
                             "(Caffe: 'Not Implemented Yet'); use MAX or AVE")
        self.plan.forward(bottom[0].data, top[0].data, top[1].data if len(top) > 1 else None)

    def saved_bytes(self):
        """MAX pooling's argmax (Caffe's ``max_idx_``), int32 (N, C, PH, PW)."""
        return 0 if self.plan is None else self.plan.saved_bytes

    def keep_saved_in(self, buffer):
        self.plan.keep_saved_in(buffer)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.method == _STOCHASTIC:
            raise self.error("STOCHASTIC pooling is not implemented in the CPU engine")
        self.plan.backward(top[0].diff, bottom[0].diff)
