"""Neuron layers: elementwise functions of one bottom, top shaped like it, in place allowed.

ReLU, PReLU, ELU, Sigmoid, TanH, Swish, BNLL, AbsVal, Clip, Exp, Log, Power, Threshold, Dropout.

Caffe: include/caffe/layers/neuron_layer.hpp and one ``*_layer.cpp`` per function.

In place (``top: "x"`` = ``bottom: "x"``) the top and the bottom are the same Blob, so a
layer's backward reads ``bottom[0].data`` knowing it may already hold the forward's output, as
Caffe's do. In place is exact for ReLU, PReLU (which keeps a copy of its input), ELU, Sigmoid,
TanH, Swish, Exp and Dropout. AbsVal refuses it, as Caffe does. BNLL, Clip, Log and Power accept
it, like Caffe, but then compute their gradient from the output, as Caffe does: wrong, so avoid
in-place use of those where a gradient is needed.
"""
import numpy

from .. import fillers, kernels, rng
from ..backend import get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register

f32 = numpy.float32


class NeuronLayer(Layer):
    """Base for elementwise layers: one bottom, one top of the bottom's shape.

    Caffe: src/caffe/layers/neuron_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)


@register("ReLU")
class ReLULayer(NeuronLayer):
    """Rectified linear unit, leaky when ``negative_slope`` is set.

    ``top = max(x, 0) + negative_slope * min(x, 0)``; the gradient is ``top_diff`` where
    ``x > 0`` and ``negative_slope * top_diff`` elsewhere. Shapes: any, top as bottom; float32.
    In place the ``x > 0`` test is made on the stored top data, which has the same sign for any
    ``negative_slope >= 0`` (Caffe does the same).

    Fields read (relu_param): negative_slope (0). ``engine`` is accepted and ignored.

    Caffe: src/caffe/layers/relu_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        self.negative_slope = numpy.float32(self.param.relu_param.negative_slope)

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        self.kernels.relu_forward(bottom[0].data, top[0].data, self.negative_slope)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.kernels.relu_backward(bottom[0].data, top[0].diff, bottom[0].diff,
                                       self.negative_slope)


def _in_place(bottom, top):
    return top[0] is bottom[0]


@register("AbsVal")
class AbsValLayer(NeuronLayer):
    """Absolute value: ``top = |x|``; gradient ``sign(x) * top_diff`` (0 at x = 0).

    Shapes: any, top as bottom; float32. Not in place: the gradient needs the sign of ``x``.

    Raises:
        CaffeError: in-place use (Caffe refuses it too).

    Caffe: src/caffe/layers/absval_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        if _in_place(bottom, top):
            raise self.error("AbsVal Layer does not allow in-place computation")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        xp.abs(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        xp.sign(bottom[0].data, out=bottom[0].diff)
        bottom[0].diff *= top[0].diff


@register("BNLL")
class BNLLLayer(NeuronLayer):
    """Binomial normal log likelihood, a softplus: ``top = log(1 + exp(x))``.

    Evaluated as ``x + log1p(exp(-x))`` for ``x > 0`` and ``log1p(exp(x))`` otherwise, so it
    never overflows. Gradient ``top_diff * e / (e + 1)`` with ``e = exp(min(x, 50))`` (Caffe's
    ``kBNLL_THRESHOLD``). Shapes: any, top as bottom; float32. In place the gradient is computed
    from the overwritten data, as in Caffe (which does not forbid it): do not use in place
    when a gradient is needed.

    Caffe: src/caffe/layers/bnll_layer.cpp.
    """

    THRESHOLD = f32(50.0)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data
        # max(x, 0) + log1p(exp(-|x|)) is both of Caffe's branches at once (0 + v == v).
        soft = xp.log1p(xp.exp(-xp.abs(x)))
        xp.add(xp.maximum(x, f32(0)), soft, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        e = xp.exp(xp.minimum(bottom[0].data, self.THRESHOLD))
        xp.multiply(top[0].diff, e / (e + f32(1)), out=bottom[0].diff)


@register("Clip")
class ClipLayer(NeuronLayer):
    """Clamp to ``[min, max]``: ``top = max(min, min(x, max))``.

    The gradient passes where ``min <= x <= max`` (both ends included) and is 0 elsewhere.
    Shapes: any, top as bottom; float32. In place the test is made on the clipped data (so every
    gradient passes), as in Caffe.

    Fields read (clip_param): min, max (both required).

    Raises:
        CaffeError: min or max missing.

    Caffe: src/caffe/layers/clip_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        p = self.param.clip_param
        if not (p.HasField("min") and p.HasField("max")):
            raise self.error("clip_param needs both 'min' and 'max'")
        self.lo, self.hi = f32(p.min), f32(p.max)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        xp.minimum(bottom[0].data, self.hi, out=top[0].data)
        xp.maximum(top[0].data, self.lo, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        x = bottom[0].data
        xp.multiply(top[0].diff, (x >= self.lo) & (x <= self.hi), out=bottom[0].diff)


@register("ELU")
class ELULayer(NeuronLayer):
    """Exponential linear unit: ``top = x`` for ``x > 0``, ``alpha * (exp(x) - 1)`` otherwise.

    Gradient: ``top_diff`` for ``x > 0``, ``top_diff * (top + alpha)`` otherwise. In place is
    safe for ``alpha >= 0`` (the sign test on the output agrees with the input's).
    Shapes: any, top as bottom; float32.

    Fields read (elu_param): alpha (1).

    Caffe: src/caffe/layers/elu_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        self.alpha = f32(self.param.elu_param.alpha)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data
        neg = self.alpha * (xp.exp(xp.minimum(x, f32(0))) - f32(1))
        xp.add(xp.maximum(x, f32(0)), neg, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        x, y, dy = bottom[0].data, top[0].data, top[0].diff
        xp.copyto(bottom[0].diff, xp.where(x > 0, dy, dy * (y + self.alpha)))


@register("Exp")
class ExpLayer(NeuronLayer):
    """``top = base ** (shift + scale * x)``, computed as ``outer * exp(inner * x)``.

    ``inner = ln(base) * scale`` and ``outer = base ** shift`` (``base = -1`` means e, with
    ``ln(base) = 1`` exactly). Gradient ``top_diff * top * inner``. In place is safe (the gradient
    needs only the output). Shapes: any, top as bottom; float32.

    Fields read (exp_param): base (-1 = e), scale (1), shift (0).

    Raises:
        CaffeError: base neither -1 nor > 0.

    Caffe: src/caffe/layers/exp_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        p = self.param.exp_param
        base, scale, shift = f32(p.base), f32(p.scale), f32(p.shift)
        if base != -1 and not base > 0:
            raise self.error(f"exp_param.base must be strictly positive (or -1 for e), got {base}")
        log_base = f32(1) if base == -1 else f32(numpy.log(base))
        if not numpy.isfinite(log_base):
            raise self.error(f"log(base) = log({base}) is not finite")
        self.inner_scale = f32(log_base * scale)
        if shift == 0:
            self.outer_scale = f32(1)
        elif base == -1:
            self.outer_scale = f32(numpy.exp(shift))
        else:
            self.outer_scale = f32(numpy.power(base, shift))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        if self.inner_scale == 1:
            xp.exp(bottom[0].data, out=y)
        else:
            xp.multiply(bottom[0].data, self.inner_scale, out=y)
            xp.exp(y, out=y)
        if self.outer_scale != 1:
            y *= self.outer_scale

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = bottom[0].diff
        xp.multiply(top[0].data, top[0].diff, out=dx)
        if self.inner_scale != 1:
            dx *= self.inner_scale


@register("Log")
class LogLayer(NeuronLayer):
    """``top = log_base(shift + scale * x)`` (natural log for ``base = -1``).

    Gradient ``top_diff * (scale / ln(base)) / (shift + scale * x)``. Shapes: any, top as
    bottom; float32. In place the gradient is computed from the overwritten data, as in Caffe:
    do not use in place when a gradient is needed.

    Fields read (log_param): base (-1 = e), scale (1), shift (0).

    Raises:
        CaffeError: base neither -1 nor > 0, or ``1 / ln(base)`` not finite (base 1).

    Caffe: src/caffe/layers/log_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        p = self.param.log_param
        base = f32(p.base)
        if base != -1 and not base > 0:
            raise self.error(f"log_param.base must be strictly positive (or -1 for e), got {base}")
        log_base = f32(1) if base == -1 else f32(numpy.log(base))
        with numpy.errstate(divide="ignore"):
            self.base_scale = f32(1) / log_base
        if not (numpy.isfinite(log_base) and numpy.isfinite(self.base_scale)):
            raise self.error(f"1 / log(base) is not finite for base {base}")
        self.input_scale, self.input_shift = f32(p.scale), f32(p.shift)
        self.backward_num_scale = f32(self.input_scale / log_base)

    def _shifted(self, x, out):
        xp = get_array_module(x)
        if self.input_scale != 1:
            xp.multiply(x, self.input_scale, out=out)
        else:
            xp.copyto(out, x)
        if self.input_shift != 0:
            out += self.input_shift
        return out

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        if self.input_scale == 1 and self.input_shift == 0:
            xp.log(bottom[0].data, out=y)
        else:
            xp.log(self._shifted(bottom[0].data, y), out=y)
        if self.base_scale != 1:
            y *= self.base_scale

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = bottom[0].diff
        dy = top[0].diff
        if dy is dx:  # in place: the top diff is needed after dx is written
            dy = dy.copy()
        self._shifted(bottom[0].data, dx)
        xp.reciprocal(dx, out=dx)
        if self.backward_num_scale != 1:
            dx *= self.backward_num_scale
        dx *= dy


@register("Power")
class PowerLayer(NeuronLayer):
    """``top = (shift + scale * x) ** power``.

    When ``power * scale == 0`` the output is the constant ``1`` (power 0) or ``shift ** power``
    and the gradient is 0. Otherwise the gradient follows Caffe's special cases: power 1 gives
    ``power * scale``; power 2 gives ``2 * scale * (shift + scale * x)``; shift 0 gives
    ``power * top / x``; anything else ``power * scale * top / (shift + scale * x)``; each times
    ``top_diff``. Shapes: any, top as bottom; float32. In place the gradient is computed from the
    overwritten data, as in Caffe: do not use in place when a gradient is needed.

    Fields read (power_param): power (1), scale (1), shift (0).

    Caffe: src/caffe/layers/power_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        p = self.param.power_param
        self.power, self.scale, self.shift = f32(p.power), f32(p.scale), f32(p.shift)
        self.diff_scale = f32(self.power * self.scale)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        if self.diff_scale == 0:
            y[...] = f32(1) if self.power == 0 else f32(numpy.power(self.shift, self.power))
            return
        if self.scale != 1:
            xp.multiply(bottom[0].data, self.scale, out=y)
        else:
            xp.copyto(y, bottom[0].data)
        if self.shift != 0:
            y += self.shift
        if self.power != 1:
            xp.power(y, self.power, out=y)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx, dy, x = bottom[0].diff, top[0].diff, bottom[0].data
        if self.diff_scale == 0 or self.power == 1:
            xp.multiply(dy, self.diff_scale, out=dx)
            return
        if self.power == 2:
            # d/dx (shift + scale x)^2 = diff_scale * scale * x + diff_scale * shift
            g = x * f32(self.diff_scale * self.scale)
            if self.shift != 0:
                g += f32(self.diff_scale * self.shift)
        elif self.shift == 0:
            g = top[0].data / x
            g *= self.power
        else:
            g = x * self.scale if self.scale != 1 else x.copy()
            if self.shift != 0:
                g += self.shift
            xp.divide(top[0].data, g, out=g)
            if self.diff_scale != 1:
                g *= self.diff_scale
        xp.multiply(dy, g, out=dx)


@register("PReLU")
class PReLULayer(NeuronLayer):
    """Parametric ReLU: ``top = max(x, 0) + a_c * min(x, 0)`` with a learned slope per channel.

    Shapes: bottom (N, C, ...) with at least 2 axes; top as bottom; float32.
    Params: ``blobs[0]`` slopes, shape (C,), or a scalar blob () with ``channel_shared``; filled
    with ``filler`` (default constant 0.25).
    Gradients: ``a_c`` gets ``sum top_diff * x`` over the ``x <= 0`` elements of channel c,
    accumulated element by element in memory order as Caffe's CPU loop does; the bottom gets
    ``top_diff`` where ``x > 0`` and ``a_c * top_diff`` elsewhere. In place, the bottom is
    copied before the forward overwrites it (Caffe's ``bottom_memory_``).

    Fields read (prelu_param): filler (constant 0.25), channel_shared (false).

    Raises:
        CaffeError: bottom with fewer than 2 axes; a slope blob of the wrong size.

    Caffe: src/caffe/layers/prelu_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        p = self.param.prelu_param
        if bottom[0].num_axes < 2:
            raise self.error("number of axes of bottom blob of PReLU must be >= 2, "
                             f"got shape {bottom[0].shape}")
        self.channel_shared = p.channel_shared
        channels = bottom[0].shape[1]
        if not self.blobs:
            self.blobs = [Blob(() if self.channel_shared else (channels,))]
            if p.HasField("filler"):
                filler = p.filler
            else:
                filler = caffe_pb2.FillerParameter(type="constant", value=0.25)
            fillers.fill(self.blobs[0], filler)
        expected = 1 if self.channel_shared else channels
        if self.blobs[0].count != expected:
            raise self.error(f"slope blob has {self.blobs[0].count} values, expected {expected}")
        self.param_propagate_down = [True]
        self.bottom_memory = None

    def reshape(self, bottom, top):
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom must have at least 2 axes, got shape {bottom[0].shape}")
        top[0].reshape(bottom[0].shape)
        shape = bottom[0].shape
        # (N, C, dim) view; channel_shared reads as one channel.
        self.view = (shape[0], shape[1], bottom[0].count_range(2))
        if _in_place(bottom, top):
            mem = self.bottom_memory
            xp = get_array_module(bottom[0].data)
            if mem is None or mem.shape != shape or get_array_module(mem) is not xp:
                self.bottom_memory = xp.empty(shape, f32)

    def _slope(self):
        a = self.blobs[0].data
        return a.reshape(1, 1, 1) if self.channel_shared else a.reshape(1, -1, 1)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        if _in_place(bottom, top):
            xp.copyto(self.bottom_memory, bottom[0].data)
        x = bottom[0].data.reshape(self.view)
        neg = self._slope() * xp.minimum(x, f32(0))
        xp.add(xp.maximum(x, f32(0)), neg, out=top[0].data.reshape(self.view))

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        src = self.bottom_memory if _in_place(bottom, top) else bottom[0].data
        x = src.reshape(self.view)
        dy = top[0].diff.reshape(self.view)
        # The slope gradient first: in place, bottom diff and top diff are one array.
        if self.param_propagate_down[0]:
            terms = dy * x * (x <= 0)
            n, c, dim = self.view
            if self.channel_shared:
                rows = terms.reshape(1, -1)
            else:
                rows = terms.transpose(1, 0, 2).reshape(c, n * dim)
            diff = self.blobs[0].diff.reshape(-1)
            diff[...] = _serial_row_sums(xp, diff, rows)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.view)
            xp.copyto(dx, xp.where(x > 0, dy, dy * self._slope()))


def _serial_row_sums(xp, init, rows):
    """``init[k] + rows[k, 0] + rows[k, 1] + ...`` added one term at a time in float32.

    That is the order of Caffe's CPU accumulation loops, so the rounding is theirs. On NumPy a
    cumulative sum adds strictly left to right; on CuPy (whose scan does not) a plain sum is used,
    which is what the GPU reductions of Caffe do too.
    """
    if xp is numpy:
        full = numpy.concatenate([init.reshape(-1, 1), rows], axis=1)
        return numpy.add.accumulate(full, axis=1, dtype=f32)[:, -1]
    return init + rows.sum(axis=1, dtype=f32)


@register("Sigmoid")
class SigmoidLayer(NeuronLayer):
    """Logistic function ``top = 1 / (1 + exp(-x))``, evaluated as ``0.5 * tanh(0.5 x) + 0.5``.

    Gradient ``top_diff * top * (1 - top)``; in place is safe (only the output is needed).
    Shapes: any, top as bottom; float32. ``engine`` is accepted and ignored.

    Caffe: src/caffe/layers/sigmoid_layer.cpp.
    """

    def forward(self, bottom, top):
        _sigmoid(bottom[0].data, top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        y = top[0].data
        xp.multiply(top[0].diff * y, f32(1) - y, out=bottom[0].diff)


def _sigmoid(x, out):
    """``out = 0.5 * tanh(0.5 * x) + 0.5`` in float32 (Caffe's form of the logistic)."""
    xp = get_array_module(x)
    xp.multiply(x, f32(0.5), out=out)
    xp.tanh(out, out=out)
    out *= f32(0.5)
    out += f32(0.5)
    return out


@register("Swish")
class SwishLayer(NeuronLayer):
    """Swish: ``top = x * sigmoid(beta * x)``.

    Gradient ``top_diff * (beta * top + s * (1 - beta * top))`` with ``s = sigmoid(beta x)``
    kept from the forward, so in place is safe. Shapes: any, top as bottom; float32.

    Fields read (swish_param): beta (1).

    Caffe: src/caffe/layers/swish_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        self.beta = f32(self.param.swish_param.beta)
        self.sig = None

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape)
        xp = get_array_module(bottom[0].data)
        if self.sig is None or self.sig.shape != bottom[0].shape or \
                get_array_module(self.sig) is not xp:
            self.sig = xp.empty(bottom[0].shape, f32)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        xp.multiply(bottom[0].data, self.beta, out=self.sig)
        _sigmoid(self.sig, self.sig)
        xp.multiply(bottom[0].data, self.sig, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        by = top[0].data * self.beta
        g = self.sig * (f32(1) - by)
        g += by
        xp.multiply(top[0].diff, g, out=bottom[0].diff)


@register("TanH")
class TanHLayer(NeuronLayer):
    """Hyperbolic tangent; gradient ``top_diff * (1 - top ** 2)``; in place is safe.

    Shapes: any, top as bottom; float32. ``engine`` is accepted and ignored.

    Caffe: src/caffe/layers/tanh_layer.cpp.
    """

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        xp.tanh(bottom[0].data, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        y = top[0].data
        xp.multiply(top[0].diff, f32(1) - y * y, out=bottom[0].diff)


@register("Threshold")
class ThresholdLayer(NeuronLayer):
    """Step function: ``top = 1`` where ``x > threshold``, else 0. No gradient.

    Shapes: any, top as bottom; float32.

    Fields read (threshold_param): threshold (0).

    Raises:
        CaffeError: backward asked to propagate to the bottom (Caffe: NOT_IMPLEMENTED).

    Caffe: src/caffe/layers/threshold_layer.cpp.
    """

    def layer_setup(self, bottom, top):
        self.threshold = f32(self.param.threshold_param.threshold)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data > self.threshold

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Threshold has no backward (Caffe: not implemented); "
                             "do not propagate gradients through it")


@register("Dropout")
class DropoutLayer(NeuronLayer):
    """Dropout: in TRAIN, ``top = x * (mask > threshold) * scale`` with a fresh mask each forward.

    The mask keeps each element with probability ``1 - dropout_ratio``. Where it comes from is
    the random streams' choice (:func:`caffe_engine.rng.dropout_mask`); the layer is the same
    on both devices:

    * on the CPU (NumPy blobs), always, and on the GPU in the exact mode
      (``CAFFE_ENGINE_EXACT_RNG=1``, :func:`caffe_engine.rng.exact_rng`): Caffe's CPU rule,
      ``bernoulli<double>(1 - ratio)`` from the global mt19937 stream, one draw per element in
      memory order at every TRAIN forward; ``mask`` is uint8 0/1, ``threshold`` 0 (on the GPU
      the mask is copied to the device each forward). Bit-identical to CPU Caffe.
    * on the GPU otherwise: Caffe's GPU rule (dropout_layer.cu), ``count`` uint32 words drawn
      on the device from the device stream (seeded with the solver's ``random_seed``, so runs
      repeat; :func:`caffe_engine.rng.device_stream`), kept where above ``threshold =
      uint(UINT_MAX * ratio)``. These masks differ from the host stream's (FireCaffe reports
      the same: dropout is where its streams differ), and the host stream is not advanced by
      dropout; see docs/reproducibility.md.

    ``mask`` (the bottom's shape) and ``threshold`` are kept for backward. ``scale`` is
    ``1 / (1 - ratio)`` computed in double and stored as float32. In TEST the layer is the
    identity, forward and backward. In place is safe. Shapes: any, top as bottom; float32.

    Fields read (dropout_param): dropout_ratio (0.5).

    Raises:
        CaffeError: dropout_ratio outside [0, 1).

    Caffe: src/caffe/layers/dropout_layer.cpp, dropout_layer.cu.
    """

    def layer_setup(self, bottom, top):
        ratio = f32(self.param.dropout_param.dropout_ratio)
        if not 0 <= ratio < 1:
            raise self.error(f"dropout_ratio must be in [0, 1), got {ratio}")
        self.ratio = ratio
        self.scale = f32(1.0 / (1.0 - float(ratio)))
        self.mask = None
        self.threshold = 0

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        if self.phase != caffe_pb2.TRAIN:
            if top[0] is not bottom[0]:
                xp.copyto(top[0].data, bottom[0].data)
            return
        mask, self.threshold = rng.dropout_mask(bottom[0].count, self.ratio, bottom[0].data)
        self.mask = mask.reshape(bottom[0].shape)
        self.kernels.dropout_forward(bottom[0].data, self.mask, self.threshold, self.scale,
                                     top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        if self.phase != caffe_pb2.TRAIN:
            if top[0] is not bottom[0]:
                xp.copyto(bottom[0].diff, top[0].diff)
            return
        self.kernels.dropout_backward(top[0].diff, self.mask, self.threshold, self.scale,
                                      bottom[0].diff)
