"""Im2col: Caffe's column matrix as a layer. Caffe: src/caffe/layers/im2col_layer.cpp."""
import numpy

from .. import kernels
from ..kernels.geometry import conv_output_shape
from .base import Layer, register
from .convolution import read_window


@register("Im2col")
class Im2colLayer(Layer):
    """Caffe's im2col as a layer: every receptive field of the input becomes a column.

    Shapes: bottom (N, C, *S) (axes before ``axis`` are batch axes), top
    (N, C * prod(kernel), *out) with Convolution's ``out``. Channel ``(c, k...)`` of the top
    (channel-major: ``c * prod(kernel) + k_h * kernel_w + k_w`` in 2-D) at position ``o`` holds
    ``x[c, o * stride - pad + k * dilation]``, 0 in the padding. Backward adds every column back
    onto the input (col2im). float32.

    Fields read (convolution_param): kernel_size / kernel_h + kernel_w (required),
    stride / stride_h + stride_w (1), pad / pad_h + pad_w (0), dilation (1), axis (1).
    ``num_output`` and the rest are ignored.

    Raises:
        CaffeError: missing or inconsistent kernel/stride/pad/dilation fields, non-positive
            kernel/stride, no spatial axis, a changed axis count, an output size < 1.

    Caffe: src/caffe/layers/im2col_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1
    backward_ignores_propagate_down = True

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(p.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after axis {self.channel_axis}, "
                             f"got a bottom of shape {bottom[0].shape}")
        self.kernel, self.stride, self.pad, self.dilation = read_window(self, p,
                                                                        self.num_spatial)

    def reshape(self, bottom, top):
        axis = self.channel_axis
        shape = bottom[0].shape
        if len(shape) != axis + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (got shape {shape})")
        self.num = bottom[0].count_range(0, axis)
        self.channels = shape[axis]
        self.in_spatial = shape[axis + 1:]
        self.out_spatial = conv_output_shape(self.in_spatial, self.kernel, self.stride, self.pad,
                                             self.dilation)
        if min(self.out_spatial) < 1:
            raise self.error(f"kernel extent exceeds the padded input: input {self.in_spatial}, "
                             f"kernel {self.kernel}, pad {self.pad}, dilation {self.dilation}")
        top[0].reshape(shape[:axis] + (self.channels * int(numpy.prod(self.kernel)),)
                       + self.out_spatial)
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape((self.num, self.channels) + self.in_spatial)
        col = self.kernels.im2col(x, self.kernel, self.stride, self.pad, self.dilation,
                                  self.out_spatial)
        top[0].data[...] = col.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        col = top[0].diff.reshape((self.num, self.channels) + self.kernel + self.out_spatial)
        dx = self.kernels.col2im(col, self.in_spatial, self.kernel, self.stride, self.pad,
                                 self.dilation)
        bottom[0].diff[...] = dx.reshape(bottom[0].shape)
