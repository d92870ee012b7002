"""The reference kernel set: readable NumPy/CuPy bodies in Caffe's arithmetic order.

What NumPy arrays fall back to without Numba, what the cuda set falls back to for what it does
not cover (it runs on CuPy arrays too), and the oracle the tests hold the compiled kernels to.
"""
from ...backend import get_array_module
from . import channelwise, conv, lrn, neuron, pooling, softmax, solver, transform


class ReferenceKernels:
    """The kernel interface (see :mod:`caffe_engine.kernels`), in array code."""

    name = "reference"

    def describe(self):
        """The set in one phrase for the start-up line."""
        return f"{self.name} (array code)"

    def channel_sum(self, a, alpha=None):
        """Per-channel sums (C,) of an (outer, C, inner) array (times ``alpha``); see
        :mod:`.channelwise`."""
        return channelwise.channel_sum(a, alpha)

    def batch_norm_stats(self, x, inv):
        """BatchNorm's batch ``(mean, var)``; see :mod:`.channelwise`."""
        return channelwise.batch_norm_stats(x, inv)

    def batch_norm_forward(self, x, mean, std, x_norm, y, scale=None, bias=None, slope=None):
        """BatchNorm's normalisation, with an in-place Scale and ReLU after it when given; see
        :mod:`.channelwise`."""
        channelwise.batch_norm_forward(x, mean, std, x_norm, y, scale, bias, slope)

    def batch_norm_stats_forward(self, x, inv, eps, x_norm, y, std, scale=None, bias=None,
                                 slope=None):
        """BatchNorm's forward with batch statistics: the statistics, ``std`` (written), the
        normalisation (with an in-place Scale and ReLU after it when given); returns ``(mean,
        var)``; see :mod:`.channelwise`."""
        return channelwise.batch_norm_stats_forward(x, inv, eps, x_norm, y, std, scale, bias,
                                                    slope)

    def batch_norm_backward(self, dy, x_norm, std, dx, factor=None, scale=None, y=None,
                            slope=None):
        """The gradient through (ReLU and Scale, when given, then) BatchNorm; returns the
        Scale's ``(bias_sum, scale_sum)``; see :mod:`.channelwise`."""
        return channelwise.batch_norm_backward(dy, x_norm, std, dx, factor, scale, y, slope)

    def scale_shift(self, x, scale, bias, y):
        """Scale's ``y = x * scale (+ bias)``; see :mod:`.channelwise`."""
        channelwise.scale_shift(x, scale, bias, y)

    def scale_grad(self, dy, x, scale, product=None, dx=None):
        """Scale's ``product = dy * x`` and ``dx = dy * scale``; see :mod:`.channelwise`."""
        channelwise.scale_grad(dy, x, scale, product, dx)

    def conv(self, geometry):
        """A plan for one :class:`..geometry.ConvGeometry` (any number of spatial axes)."""
        return conv.ConvPlan(geometry)

    def pooling(self, geometry):
        """A plan for one :class:`..geometry.PoolGeometry` (MAX or AVE)."""
        return pooling.PoolPlan(geometry)

    def lrn(self, geometry):
        """A plan for one :class:`..geometry.LRNGeometry`."""
        return lrn.LRNPlan(geometry)

    @staticmethod
    def matmul(a, b, c, accumulate=False, trans_a=False, trans_b=False):
        """``c (+)= op(a) op(b)`` for 2-D float32 arrays, ``op`` the transpose where asked
        (BLAS through ``xp.matmul``)."""
        xp = get_array_module(c)
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if accumulate:
            c += xp.matmul(a, b)
        else:
            xp.matmul(a, b, out=c)

    @staticmethod
    def relu_forward(x, y, negative_slope):
        """``y`` = ReLU(``x``): see :func:`.neuron.relu_forward`."""
        neuron.relu_forward(x, y, negative_slope)

    @staticmethod
    def relu_backward(x, dy, dx, negative_slope):
        """``dx`` = the gradient of ReLU: see :func:`.neuron.relu_backward`."""
        neuron.relu_backward(x, dy, dx, negative_slope)

    @staticmethod
    def softmax_forward(x, y, scale):
        """``y`` = softmax of ``x`` (outer, C, inner) over axis 1: see
        :func:`.softmax.softmax_forward`."""
        softmax.softmax_forward(x, y, scale)

    @staticmethod
    def softmax_loss_forward(prob, labels, ignore_label, normalizer, loss, key, make_error):
        """SoftmaxWithLoss's loss from the probabilities, the label check, and a cache for the
        backward pass: see :func:`.softmax.softmax_loss_forward`."""
        return softmax.softmax_loss_forward(prob, labels, ignore_label, normalizer, loss, key,
                                            make_error)

    @staticmethod
    def softmax_loss_backward(prob, cache, top_diff, dx):
        """SoftmaxWithLoss's gradient: see :func:`.softmax.softmax_loss_backward`."""
        softmax.softmax_loss_backward(prob, cache, top_diff, dx)

    @staticmethod
    def im2col(x, kernel, stride, pad, dilation, out_shape):
        """Caffe's column matrix of every image of ``x``: see :func:`.conv.im2col`."""
        return conv.im2col(x, kernel, stride, pad, dilation, out_shape)

    @staticmethod
    def col2im(col, in_shape, kernel, stride, pad, dilation):
        """The adjoint of :meth:`im2col`: see :func:`.conv.col2im`."""
        return conv.col2im(col, in_shape, kernel, stride, pad, dilation)

    @staticmethod
    def update(rule):
        """The fused solver step for update rule ``rule`` (a name declared in
        :mod:`..update_rules`): ``step(data, diff, history, local_rate, hyper, decay, l1,
        iter_scale)``, see :func:`.solver.step`.

        Raises:
            ValueError: ``rule`` is not declared, or has no reference kernel.
        """
        solver.kernel(rule)

        def step(data, diff, history, local_rate, hyper, decay, l1, iter_scale):
            solver.step(rule, data, diff, history, local_rate, hyper, decay, l1, iter_scale)
        return step

    @staticmethod
    def param_norms(data, diff):
        """``(||data||, ||diff||)`` of one learnable param, float32 (LARC's norms): see
        :func:`.solver.param_norms`."""
        return solver.param_norms(data, diff)

    @staticmethod
    def transform(batch, out, params, mean, scale):
        """The Data layer's crop, mirror, mean and scale: see :func:`.transform.transform`."""
        transform.transform(batch, out, params, mean, scale)

    @staticmethod
    def dropout_forward(x, mask, threshold, scale, y):
        """``y = x * (mask > threshold) * scale``: see :func:`.neuron.dropout_forward`."""
        neuron.dropout_forward(x, mask, threshold, scale, y)

    @staticmethod
    def dropout_backward(dy, mask, threshold, scale, dx):
        """``dx = dy * (mask > threshold) * scale``: see :func:`.neuron.dropout_backward`."""
        neuron.dropout_backward(dy, mask, threshold, scale, dx)
