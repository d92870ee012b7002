"""Convolution and Deconvolution: Caffe's parameters, geometry and contract.

Caffe: src/caffe/layers/base_conv_layer.cpp, conv_layer.cpp, deconv_layer.cpp. The arithmetic
is the kernel set's (:mod:`caffe_engine.kernels`): the layer plans one convolution geometry in
``reshape`` and calls the plan's ``forward``, ``backward_data``, ``weight_grad`` and
``bias_grad``.
"""
from .. import fillers, kernels
from ..blob import Blob
from ..kernels.geometry import ConvGeometry, conv_output_shape, deconv_output_shape
from .base import Layer, register


def spatial_values(layer, param, name, default, num_axes):
    """Read a repeated per-axis field (kernel_size, stride, pad, dilation) with its _h/_w form.

    Follows Caffe's BaseConvolutionLayer::LayerSetUp: the _h/_w pair is 2-D only and excludes the
    repeated field; the repeated field is given 0 times (default), once, or once per axis.

    Raises:
        CaffeError: naming ``layer``, for each of those rules broken or a required field missing.
    """
    values = list(getattr(param, name))
    hw = {"kernel_size": ("kernel_h", "kernel_w"), "stride": ("stride_h", "stride_w"),
          "pad": ("pad_h", "pad_w")}.get(name)
    if hw and (param.HasField(hw[0]) or param.HasField(hw[1])):
        if num_axes != 2:
            raise layer.error(f"{hw[0]} & {hw[1]} can only be used for 2-D convolution "
                              f"(input has {num_axes} spatial axes)")
        if values:
            raise layer.error(f"either {name} or {hw[0]}/{hw[1]} should be specified; not both")
        return (getattr(param, hw[0]), getattr(param, hw[1]))
    if default is None and not values:
        raise layer.error(f"{name} must be specified")
    if len(values) not in (0, 1, num_axes):
        raise layer.error(f"{name} must be specified once, or once per spatial dimension "
                          f"({name} specified {len(values)} times; {num_axes} spatial dims)")
    if not values:
        return (default,) * num_axes
    return tuple(values) * num_axes if len(values) == 1 else tuple(values)


def read_window(layer, param, num_axes):
    """(kernel, stride, pad, dilation) of a convolution_param, checked as Caffe checks them.

    Raises:
        CaffeError: a field missing or inconsistent, a zero kernel or stride, a negative pad,
            a non-positive dilation.
    """
    kernel = spatial_values(layer, param, "kernel_size", None, num_axes)
    stride = spatial_values(layer, param, "stride", 1, num_axes)
    pad = spatial_values(layer, param, "pad", 0, num_axes)
    dilation = spatial_values(layer, param, "dilation", 1, num_axes)
    if min(kernel) <= 0:
        raise layer.error(f"filter dimensions must be nonzero, got kernel {kernel}")
    if min(stride) <= 0:
        raise layer.error(f"stride dimensions must be nonzero, got stride {stride}")
    if min(pad) < 0 or min(dilation) <= 0:
        raise layer.error(f"pad must be >= 0 and dilation > 0, got pad {pad}, "
                          f"dilation {dilation}")
    return kernel, stride, pad, dilation


class _ConvolutionBase(Layer):
    """What Convolution and Deconvolution share (Caffe's BaseConvolutionLayer).

    Both are described by the *convolution* they are built on (a
    :class:`~caffe_engine.kernels.geometry.ConvGeometry`): it maps an image side
    (``conv_in_channels``, spatial ``conv_in_spatial``) to a column side (``conv_out_channels``,
    ``conv_out_spatial``) through weights (conv_out_channels, conv_in_channels / group,
    *kernel). Convolution runs it forward (bottom = image side); Deconvolution (``reverse``)
    runs it backward (bottom = column side), exactly as Caffe's DeconvolutionLayer calls
    ``backward_cpu_gemm`` in its forward pass and ``forward_cpu_gemm`` and ``weight_cpu_gemm``
    on the top diff in its backward pass.

    Fields read (convolution_param): num_output (required, > 0), bias_term (true),
    kernel_size / kernel_h + kernel_w (required), stride / stride_h + stride_w (1),
    pad / pad_h + pad_w (0), dilation (1), group (1), axis (1), weight_filler, bias_filler
    (constant 0). ``engine`` and ``force_nd_im2col`` are accepted and ignored.
    """

    min_bottom = 1
    min_top = 1
    equal_num_bottom_top = True
    #: Deconvolution: forward is the convolution's backward-data pass, and vice versa.
    reverse = False

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(p.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after axis {self.channel_axis}, "
                             f"got a bottom of shape {bottom[0].shape}")
        self.kernel, self.stride, self.pad, self.dilation = read_window(self, p,
                                                                        self.num_spatial)
        self.channels = bottom[0].shape[self.channel_axis]
        self.num_output = p.num_output
        self.group = p.group
        if self.num_output <= 0:
            raise self.error("num_output must be specified and > 0")
        if self.group <= 0 or self.channels % self.group:
            raise self.error(f"input channels ({self.channels}) must be a multiple of group "
                             f"({self.group})")
        if self.num_output % self.group:
            raise self.error(f"num_output ({self.num_output}) should be a multiple of group "
                             f"({self.group})")
        if self.reverse:
            self.conv_in_channels, self.conv_out_channels = self.num_output, self.channels
        else:
            self.conv_in_channels, self.conv_out_channels = self.channels, self.num_output
        self.bias_term = p.bias_term
        weight_shape = ((self.conv_out_channels, self.conv_in_channels // self.group)
                        + self.kernel)
        if not self.blobs:
            self.blobs = [Blob(weight_shape)]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.num_output,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)
        self.plan = None

    def reshape(self, bottom, top):
        axis = self.channel_axis
        shape = bottom[0].shape
        if len(shape) != axis + 1 + self.num_spatial:
            raise self.error(f"bottom num_axes may not change (got shape {shape})")
        if shape[axis] != self.channels:
            raise self.error(f"input size incompatible with convolution kernel: "
                             f"{shape[axis]} channels, expected {self.channels}")
        for b in bottom[1:]:
            if b.shape != shape:
                raise self.error(f"all inputs must have the same shape ({b.shape} vs {shape})")
        self.num = bottom[0].count_range(0, axis)
        self.in_spatial = shape[axis + 1:]
        geometry = deconv_output_shape if self.reverse else conv_output_shape
        self.out_spatial = geometry(self.in_spatial, self.kernel, self.stride, self.pad,
                                    self.dilation)
        if min(self.out_spatial) < 1:
            raise self.error(f"output size {self.out_spatial} < 1: input {self.in_spatial}, "
                             f"kernel {self.kernel}, stride {self.stride}, pad {self.pad}, "
                             f"dilation {self.dilation}")
        for t in top:
            t.reshape(shape[:axis] + (self.num_output,) + self.out_spatial)
        image, column = ((self.out_spatial, self.in_spatial) if self.reverse
                         else (self.in_spatial, self.out_spatial))
        conv = ConvGeometry(self.num, self.conv_in_channels, self.conv_out_channels, self.group,
                            image, column, self.kernel, self.stride, self.pad, self.dilation)
        kernel_set = kernels.for_array(bottom[0].data)
        if self.plan is None or (conv, kernel_set) != self._planned_for:
            self.plan = kernel_set.conv(conv)
            self._planned_for = (conv, kernel_set)
        self.image_shape = (self.num, self.conv_in_channels) + image
        self.column_shape = (self.num, self.conv_out_channels) + column

    def _param_flags(self):
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        return ppd[0], self.bias_term and ppd[1]

    def _bias_shape(self):
        return (1, self.num_output) + (1,) * self.num_spatial


@register("Convolution")
class ConvolutionLayer(_ConvolutionBase):
    """N-D convolution with groups, padding, stride and dilation.

    Shapes: bottom (N, C, *S) (leading axes before ``axis`` are all batch axes), top
    (N, num_output, *out) with ``out = (S + 2 pad - (dilation (kernel - 1) + 1)) // stride + 1``.
    Several bottoms (all of one shape) give as many tops, sharing the weights. float32 throughout.

    Params: ``blobs[0]`` weights (num_output, C / group, *kernel), ``blobs[1]`` bias
    (num_output,) when ``bias_term``; filled with ``weight_filler`` then ``bias_filler``.

    Fields read (convolution_param): num_output (required, > 0), bias_term (true),
    kernel_size / kernel_h + kernel_w (required), stride / stride_h + stride_w (1),
    pad / pad_h + pad_w (0), dilation (1), group (1), axis (1), weight_filler, bias_filler
    (constant 0). ``engine`` and ``force_nd_im2col`` are accepted and ignored.

    The sums are Caffe's (im2col + GEMM per image); the kernels may add them in another order
    (BLAS's rounding).

    Raises:
        CaffeError: missing or inconsistent kernel/stride/pad/dilation fields, non-positive
            num_output/kernel/stride, channels or num_output not divisible by group, changed
            input channels or axis count, bottoms of different shapes, an output size < 1.

    Caffe: src/caffe/layers/base_conv_layer.cpp, src/caffe/layers/conv_layer.cpp.
    """

    def forward(self, bottom, top):
        w = self.blobs[0].data
        bias = self.blobs[1].data if self.bias_term else None
        for b, t in zip(bottom, top):
            self.plan.forward(b.data.reshape(self.image_shape), w, bias,
                              t.data.reshape(self.column_shape))

    def diff_in_place(self):
        """Where the plan's data gradient takes ``dx`` in ``dy``'s memory (e.g. VGG-16's 3x3
        pad-1 layers on the cpu set): ``backward`` takes the bias and weight gradients from the
        top diff first, the data gradient last."""
        return self.plan.backward_data_in_place

    def backward(self, top, propagate_down, bottom):
        do_w, do_b = self._param_flags()
        w = self.blobs[0].data
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(self.column_shape)
            if do_b:
                self.plan.bias_grad(dy, self.blobs[1].diff)
            if do_w:
                self.plan.weight_grad(b.data.reshape(self.image_shape), dy, self.blobs[0].diff)
            if propagate_down[i]:
                self.plan.backward_data(dy, w, b.diff.reshape(self.image_shape))


@register("Deconvolution")
class DeconvolutionLayer(_ConvolutionBase):
    """Transposed convolution: the adjoint of Convolution with the same parameters.

    Shapes: bottom (N, C, *S), top (N, num_output, *out) with
    ``out = stride (S - 1) + dilation (kernel - 1) + 1 - 2 pad``. Several bottoms (one shape)
    give as many tops, sharing the weights. float32 throughout.

    Forward scatters every input pixel through the kernel (the convolution's backward-data
    pass, then the bias); backward takes the convolution of the top diff for the bottom diff and
    ``dW += x col(dy)^T``, as Caffe's deconv_layer.cpp.

    Params: ``blobs[0]`` weights (C, num_output / group, *kernel) (Caffe's layout: the input
    channels first), ``blobs[1]`` bias (num_output,) when ``bias_term``; filled with
    ``weight_filler`` (e.g. ``bilinear`` for upsampling) then ``bias_filler``.

    Fields read (convolution_param): as Convolution: num_output (required, > 0), bias_term
    (true), kernel_size / kernel_h + kernel_w (required), stride / stride_h + stride_w (1),
    pad / pad_h + pad_w (0), dilation (1), group (1), axis (1), weight_filler, bias_filler
    (constant 0); ``engine`` and ``force_nd_im2col`` are ignored.

    Raises:
        CaffeError: as Convolution (output size < 1 when ``2 pad`` eats the whole output).

    Caffe: src/caffe/layers/base_conv_layer.cpp, src/caffe/layers/deconv_layer.cpp.
    """

    reverse = True

    def forward(self, bottom, top):
        w = self.blobs[0].data
        for b, t in zip(bottom, top):
            y = t.data.reshape(self.image_shape)
            self.plan.backward_data(b.data.reshape(self.column_shape), w, y)
            if self.bias_term:
                y += self.blobs[1].data.reshape(self._bias_shape())

    def backward(self, top, propagate_down, bottom):
        do_w, do_b = self._param_flags()
        w = self.blobs[0].data
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(self.image_shape)
            if do_b:
                self.blobs[1].diff += dy.reshape(self.num, self.num_output, -1).sum(
                    axis=2).sum(axis=0)
            if do_w:
                self.plan.weight_grad(dy, b.data.reshape(self.column_shape),
                                      self.blobs[0].diff)
            if propagate_down[i]:
                self.plan.forward(dy, w, None, b.diff.reshape(self.column_shape))
