"""The cuda kernel set: CUDA C kernels for CuPy arrays (see :mod:`caffe_engine.kernels`).

Each hot loop is a grid-stride CUDA kernel (:mod:`.source`), compiled by NVRTC the first time
it runs (:mod:`.device`), launched from a plan made in the layer's ``reshape``; matrix products
go to cuBLAS through ``cupy.matmul``. The set is built on a *device*: :class:`.device.CupyDevice`
on a GPU, or :class:`.emulator.EmulatedDevice`, which runs the same sources serially on the CPU
for the tests. Importing this package needs neither CuPy nor a GPU.

Modules: :mod:`.conv` (im2col/col2im and the convolution plan), :mod:`.pooling`, :mod:`.lrn`,
:mod:`.neuron` (ReLU, Dropout), :mod:`.solver` (the fused updates, the norms), :mod:`.transform`
(the Data layer's crop, mirror, mean and scale), :mod:`.softmax` (Softmax, SoftmaxWithLoss).
What a module does not cover (a plan factory returning None) falls back to the reference set's
array code, which runs on CuPy too: N-D convolution and the WITHIN_CHANNEL LRN.
"""
from ..reference import ReferenceKernels
from . import conv, lrn, neuron, pooling, softmax, solver, transform
from .workspace import DeviceWorkspace


def _contiguous(*arrays):
    return all(a.flags.c_contiguous for a in arrays)


class CudaKernels(ReferenceKernels):
    """The kernel interface in CUDA C, on ``device`` (default: a :class:`.device.CupyDevice`).

    Raises:
        ImportError: no ``device`` given and CuPy is not installed.
    """

    name = "cuda"

    def __init__(self, device=None):
        if device is None:
            from .device import CupyDevice
            device = CupyDevice()
        self.device = device
        self.workspace = DeviceWorkspace()

    def conv(self, geometry):
        plan = conv.make_plan(self.device, geometry, self.workspace)
        return plan if plan is not None else super().conv(geometry)

    def im2col(self, x, kernel, stride, pad, dilation, out_shape):
        col = conv.im2col(self.device, x, kernel, stride, pad, dilation, out_shape)
        return col if col is not None else super().im2col(x, kernel, stride, pad, dilation,
                                                          out_shape)

    def col2im(self, col, in_shape, kernel, stride, pad, dilation):
        x = conv.col2im(self.device, col, in_shape, kernel, stride, pad, dilation)
        return x if x is not None else super().col2im(col, in_shape, kernel, stride, pad,
                                                      dilation)

    def pooling(self, geometry):
        plan = pooling.make_plan(self.device, geometry)
        return plan if plan is not None else super().pooling(geometry)

    def lrn(self, geometry):
        plan = lrn.make_plan(self.device, geometry)
        return plan if plan is not None else super().lrn(geometry)

    def relu_forward(self, x, y, negative_slope):
        if not _contiguous(x, y):
            return super().relu_forward(x, y, negative_slope)
        neuron.relu_forward(self.device, x, y, negative_slope)

    def relu_backward(self, x, dy, dx, negative_slope):
        if not _contiguous(x, dy, dx):
            return super().relu_backward(x, dy, dx, negative_slope)
        neuron.relu_backward(self.device, x, dy, dx, negative_slope)

    def softmax_forward(self, x, y, scale):
        if not softmax.softmax_launchable(x, y):
            return super().softmax_forward(x, y, scale)
        softmax.softmax_forward(self.device, x, y)

    def softmax_loss_forward(self, prob, labels, ignore_label, normalizer, loss, key,
                             make_error):
        if not softmax.loss_launchable(prob, labels, loss):
            return super().softmax_loss_forward(prob, labels, ignore_label, normalizer, loss,
                                                key, make_error)
        return softmax.softmax_loss_forward(self.device, prob, labels, ignore_label, normalizer,
                                           loss, key, make_error)

    def softmax_loss_backward(self, prob, cache, top_diff, dx):
        if not isinstance(cache, softmax.LossCache):  # the forward fell back to the reference
            return super().softmax_loss_backward(prob, cache, top_diff, dx)
        softmax.softmax_loss_backward(self.device, prob, cache, top_diff, dx)

    def update(self, rule):
        step = solver.make_step(self.device, rule)
        return step if step is not None else super().update(rule)

    def param_norms(self, data, diff):
        if not _contiguous(data, diff):
            return super().param_norms(data, diff)
        return solver.param_norms(self.device, data, diff)

    def transform(self, batch, out, params, mean, scale):
        transform.transform(self.device, batch, out, params, mean, scale)

    def dropout_forward(self, x, mask, threshold, scale, y):
        if not neuron.dropout_launchable(x, mask, y):
            return super().dropout_forward(x, mask, threshold, scale, y)
        neuron.dropout_forward(self.device, x, mask, threshold, scale, y)

    def dropout_backward(self, dy, mask, threshold, scale, dx):
        if not neuron.dropout_launchable(dy, mask, dx):
            return super().dropout_backward(dy, mask, threshold, scale, dx)
        neuron.dropout_backward(self.device, dy, mask, threshold, scale, dx)
