"""Recurrent layers: RNN, LSTM and the single-step LSTMUnit.

Caffe: src/caffe/layers/recurrent_layer.cpp, rnn_layer.cpp, lstm_layer.cpp, lstm_unit_layer.cpp.

Caffe builds RNN and LSTM as an *unrolled net* (InnerProduct, Scale, Eltwise, TanH, LSTMUnit,
Slice, Concat and Split layers, one group per timestep, the weights shared between them) and
runs it inside the layer. Here the same arithmetic is written out directly:

* the input transform of all timesteps is one GEMM over (T * N) rows, as Caffe's
  ``x_transform`` layer does;
* the recurrence is a Python loop over the T timesteps, one (N, H) x (H, G) GEMM each;
* backward through time runs the loop in reverse and then takes every weight gradient in one
  GEMM over all timesteps (Caffe accumulates one GEMM per timestep into the shared diff; the
  sums are the same up to summation order).

The element-wise parts keep Caffe's float32 operation order (its LSTMUnit evaluates ``sigmoid``
and ``tanh`` in double and rounds to float), so results agree with Caffe to float32 rounding
except where BLAS sums in another order.

Parameter blobs are exactly Caffe's: the blobs its unrolled net *owns*, in the order their
layers appear, each created and filled (weight filler, then bias filler) where Caffe's would be.
Caffe also fills the weights of every later timestep's copy before sharing them away, which
draws from the random stream; those draws are made (and dropped) too, so the stream stays
in step with Caffe for the layers that follow.

Without ``expose_hidden`` the last hidden (and cell) state of one forward pass is the initial
state of the next, as in Caffe (``cont = 0`` at a sequence start cuts it off); it starts at
zero. With ``expose_hidden`` the initial states are bottoms and the final states extra tops.
"""
import numpy

from .. import fillers
from ..backend import get_array_module
from ..blob import Blob
from .base import Layer, register

f32 = numpy.float32


# ------------------------------------------------------------------------------------------------
# The LSTM unit: one timestep of the cell, Caffe's numerics
# ------------------------------------------------------------------------------------------------
def _sigmoid(xp, x):
    """Caffe's LSTMUnit ``sigmoid``: ``1 / (1 + exp(-x))`` in double, rounded to float32."""
    with numpy.errstate(over="ignore"):
        return (1.0 / (1.0 + xp.exp(-x.astype(numpy.float64)))).astype(f32)


def _tanh(xp, x):
    """Caffe's LSTMUnit ``tanh``: ``2 sigmoid(2x) - 1`` in double, rounded to float32."""
    with numpy.errstate(over="ignore"):
        return (2.0 / (1.0 + xp.exp(-2.0 * x.astype(numpy.float64))) - 1.0).astype(f32)


def unit_forward(xp, c_prev, gates, cont, acts, c, tanh_c, h):
    """One LSTM step for N streams (Caffe's LSTMUnitLayer::Forward_cpu).

    Args:
        c_prev: (N, H) previous cell state.
        gates: (N, 4H) gate pre-activations, in Caffe's order i, f, o, g.
        cont: (N,) sequence continuation indicators; the forget gate is ``cont * sigmoid``
            (exactly 0 where ``cont == 0``).
        acts: (N, 4H) output: the activations i, f (cont applied), o, g, kept for backward.
            May be ``gates`` itself.
        c, tanh_c, h: (N, H) outputs: ``c = f c_prev + i g``, ``tanh(c)``, ``h = o tanh(c)``.
    """
    hd = c.shape[-1]
    ga = gates.reshape(gates.shape[0], 4, hd)
    i = _sigmoid(xp, ga[:, 0])
    sf = _sigmoid(xp, ga[:, 1])
    o = _sigmoid(xp, ga[:, 2])
    g = _tanh(xp, ga[:, 3])
    cont = cont.reshape(-1, 1)
    f = xp.where(cont == 0, f32(0), cont * sf)
    a = acts.reshape(acts.shape[0], 4, hd)
    a[:, 0], a[:, 1], a[:, 2], a[:, 3] = i, f, o, g
    xp.add(f * c_prev, i * g, out=c)
    tanh_c[...] = _tanh(xp, c)
    xp.multiply(o, tanh_c, out=h)


def unit_backward(xp, c_prev, acts, tanh_c, dc, dh, dgates, dc_prev=None):
    """Backward of :func:`unit_forward` (Caffe's LSTMUnitLayer::Backward_cpu, same float order).

    Args:
        c_prev, acts, tanh_c: as saved by the forward step.
        dc, dh: (N, H) diffs of the step's c and h outputs.
        dgates: (N, 4H) output: diff of the gate pre-activations.
        dc_prev: (N, H) output: diff of ``c_prev`` (skipped when None).
    """
    hd = tanh_c.shape[-1]
    a = acts.reshape(acts.shape[0], 4, hd)
    i, f, o, g = a[:, 0], a[:, 1], a[:, 2], a[:, 3]
    one = f32(1)
    c_term = dc + dh * o * (one - tanh_c * tanh_c)
    if dc_prev is not None:
        xp.multiply(c_term, f, out=dc_prev)
    d = dgates.reshape(dgates.shape[0], 4, hd)
    d[:, 0] = c_term * g * i * (one - i)
    d[:, 1] = c_term * c_prev * f * (one - f)
    d[:, 2] = dh * tanh_c * o * (one - o)
    d[:, 3] = c_term * i * (one - g * g)


@register("LSTMUnit")
class LSTMUnitLayer(Layer):
    """One LSTM timestep, the unit Caffe's LSTM layer is unrolled from.

    Shapes: bottoms ``c_prev`` (1, N, H), ``gates`` (1, N, 4H) (pre-activations in the order
    input, forget, output, candidate), ``cont`` (1, N); tops ``c`` (1, N, H) and ``h`` (1, N, H)
    with ``i, f, o = sigmoid(.)``, ``g = tanh(.)``, ``f`` multiplied by ``cont`` (0 where
    ``cont == 0``), ``c = f c_prev + i g``, ``h = o tanh(c)``. float32; sigmoid and tanh are
    evaluated in double as Caffe does. No parameters, no fields read.

    Raises:
        CaffeError: bottoms of the wrong rank or shape; backward asked to propagate to ``cont``
            (Caffe: "Cannot backpropagate to sequence indicators").

    Caffe: src/caffe/layers/lstm_unit_layer.cpp.
    """

    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        c_prev, gates, cont = bottom
        n = c_prev.shape[1] if c_prev.num_axes == 3 else None
        for i, b in enumerate(bottom):
            axes = 2 if i == 2 else 3
            if b.num_axes != axes or b.shape[0] != 1 or b.shape[1] != n:
                raise self.error(f"bottoms must be c_prev (1, N, H), gates (1, N, 4H) and "
                                 f"cont (1, N); got {c_prev.shape}, {gates.shape}, "
                                 f"{cont.shape}")
        self.hidden = c_prev.shape[2]
        if gates.shape[2] != 4 * self.hidden:
            raise self.error(f"gates must have 4 * {self.hidden} = {4 * self.hidden} "
                             f"channels, got {gates.shape[2]}")
        for t in top:
            t.reshape(c_prev.shape)
        xp = get_array_module(c_prev.data)
        if getattr(self, "acts", None) is None or self.acts.shape != (n, 4 * self.hidden):
            self.acts = xp.empty((n, 4 * self.hidden), f32)
            self.tanh_c = xp.empty((n, self.hidden), f32)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        n, hd = self.acts.shape[0], self.hidden
        unit_forward(xp, bottom[0].data.reshape(n, hd), bottom[1].data.reshape(n, 4 * hd),
                     bottom[2].data.reshape(n), self.acts, top[0].data.reshape(n, hd),
                     self.tanh_c, top[1].data.reshape(n, hd))

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise self.error("cannot backpropagate to sequence indicators (bottom 2, cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        xp = get_array_module(top[0].diff)
        n, hd = self.acts.shape[0], self.hidden
        dgates = bottom[1].diff.reshape(n, 4 * hd)
        if not propagate_down[1]:
            dgates = xp.empty_like(dgates)
        unit_backward(xp, bottom[0].data.reshape(n, hd), self.acts, self.tanh_c,
                      top[0].diff.reshape(n, hd), top[1].diff.reshape(n, hd), dgates,
                      bottom[0].diff.reshape(n, hd) if propagate_down[0] else None)


# ------------------------------------------------------------------------------------------------
# RNN and LSTM
# ------------------------------------------------------------------------------------------------
class _RecurrentBase(Layer):
    """What RNN and LSTM share (Caffe's RecurrentLayer).

    Bottoms: ``x`` (T, N, ...), ``cont`` (T, N), optionally ``x_static`` (N, ...), then with
    ``expose_hidden`` the initial states (1, N, H) (RNN: h_0; LSTM: h_0, c_0). Tops: the
    output (T, N, H), then with ``expose_hidden`` the final states (1, N, H) (RNN: h_T; LSTM:
    h_T, c_T).

    Fields read (recurrent_param): num_output (H, required > 0), weight_filler, bias_filler
    (both constant 0 by default), expose_hidden (false), debug_info (accepted, no effect).

    Subclasses give ``state_names`` and implement ``_param_specs``, ``_allocate``,
    ``_forward`` and ``_backward``.
    """

    min_bottom = 2
    #: Recurrent state blobs, in Caffe's RecurrentInputBlobNames order.
    state_names = ()

    def __init__(self, param, phase):
        super().__init__(param, phase)
        exposed = len(self.state_names) if param.recurrent_param.expose_hidden else 0
        self.max_bottom = 3 + exposed
        self.exact_num_top = 1 + exposed

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def layer_setup(self, bottom, top):
        p = self.param.recurrent_param
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise self.error(f"bottom[0] must have at least 2 axes -- (#timesteps, #streams, "
                             f"...), got shape {x.shape}")
        self.T, self.N = x.shape[:2]
        if cont.num_axes != 2 or cont.shape != (self.T, self.N):
            raise self.error(f"bottom[1] (cont) must be (#timesteps, #streams) = "
                             f"{(self.T, self.N)}, got shape {cont.shape}")
        self.expose_hidden = p.expose_hidden
        exposed = len(self.state_names) if self.expose_hidden else 0
        self.static_input = len(bottom) > 2 + exposed
        if self.expose_hidden and len(bottom) < 2 + exposed:
            raise self.error(f"expose_hidden needs the initial states "
                             f"{', '.join(self.state_names)} as bottoms after x, cont "
                             f"(and x_static); got {len(bottom)} bottoms")
        if self.static_input:
            s = bottom[2]
            if s.num_axes < 1 or s.shape[0] != self.N:
                raise self.error(f"bottom[2] (x_static) must be (#streams = {self.N}, ...), "
                                 f"got shape {s.shape}")
        self.hidden = p.num_output
        if self.hidden <= 0:
            raise self.error("num_output must be positive")
        self.input_dim = x.count_range(2)
        self.static_dim = bottom[2].count_range(1) if self.static_input else 0
        if not self.blobs:
            self.blobs = self._make_params(p)
        self.param_propagate_down = [True] * len(self.blobs)
        self.state = None
        self._shapes = None

    def _make_params(self, p):
        """Create and fill the owned param blobs in Caffe's layer order (see module doc)."""
        blobs = []
        for shape, filler, owned in self._param_specs(p):
            blob = Blob(shape)
            fillers.fill(blob, filler)
            if owned:
                blobs.append(blob)
        return blobs

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2 or x.shape[0] != self.T:
            raise self.error(f"input number of timesteps changed: expected {self.T}, got shape "
                             f"{x.shape}")
        self.N = x.shape[1]
        if cont.shape != (self.T, self.N):
            raise self.error(f"bottom[1] (cont) must be {(self.T, self.N)}, got {cont.shape}")
        if x.count_range(2) != self.input_dim:
            raise self.error(f"input size changed: {x.count_range(2)} per item, expected "
                             f"{self.input_dim}")
        state_shape = (1, self.N, self.hidden)
        if self.static_input:
            s = bottom[2]
            if s.shape[0] != self.N or s.count_range(1) != self.static_dim:
                raise self.error(f"bottom[2] (x_static) must be ({self.N}, "
                                 f"{self.static_dim} values), got {s.shape}")
        if self.expose_hidden:
            for name, b in zip(self.state_names, bottom[2 + self.static_input:]):
                if b.shape != state_shape:
                    raise self.error(f"bottom {name} must be {state_shape}, got {b.shape}")
        top[0].reshape((self.T, self.N, self.hidden))
        for t in top[1:]:
            t.reshape(state_shape)
        xp = get_array_module(x.data)
        key = (self.N, xp.__name__)
        if key != self._shapes:
            self._allocate(xp)
            if self.state is None or self.state[0].shape != state_shape:
                # Caffe's recurrent state: zero at first, the last timestep's after each pass.
                self.state = [xp.zeros(state_shape, f32) for _ in self.state_names]
            self._shapes = key

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        if self.expose_hidden:
            first = 2 + self.static_input
            init = [b.data.reshape(self.N, self.hidden) for b in bottom[first:]]
        else:
            init = [s.reshape(self.N, self.hidden) for s in self.state]
        final = self._forward(xp, bottom, top, init)
        for s, f in zip(self.state, final):
            s.reshape(self.N, self.hidden)[...] = f
        for t, f in zip(top[1:], final):
            t.data.reshape(self.N, self.hidden)[...] = f

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("cannot backpropagate to sequence indicators (bottom 1, cont)")
        xp = get_array_module(top[0].diff)
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        self._backward(xp, top, propagate_down, bottom, ppd)
        if self.expose_hidden:
            # Caffe shares only the data of the exposed initial states with the unrolled net,
            # so no gradient reaches them (nor comes from the final-state tops).
            for i in range(2 + self.static_input, len(bottom)):
                if propagate_down[i]:
                    bottom[i].diff[...] = 0

    # -- shared pieces -----------------------------------------------------------------------
    def _input_transform(self, xp, bottom, w, b, out):
        """``out`` (T, N, G) = x W^T + b over all timesteps (Caffe's ``x_transform``)."""
        x = bottom[0].data.reshape(self.T * self.N, self.input_dim)
        flat = out.reshape(self.T * self.N, -1)
        xp.matmul(x, w.T, out=flat)
        flat += b

    def _static_transform(self, xp, bottom, w):
        """(N, G) = x_static W_static^T, or None without a static input."""
        if not self.static_input:
            return None
        return xp.matmul(bottom[2].data.reshape(self.N, self.static_dim), w.T)

    def _input_backward(self, xp, bottom, propagate_down, ppd, d, k_w, k_b, k_s):
        """Gradients through the input and static transforms from ``d`` (T, N, G), the diff of
        the summed pre-activations: W_x, b, x, and W_static, x_static."""
        rows = d.reshape(self.T * self.N, -1)
        x = bottom[0].data.reshape(self.T * self.N, self.input_dim)
        if ppd[k_w]:
            self.blobs[k_w].diff += xp.matmul(rows.T, x)
        if ppd[k_b]:
            self.blobs[k_b].diff += rows.sum(axis=0)
        if propagate_down[0]:
            xp.matmul(rows, self.blobs[k_w].data,
                      out=bottom[0].diff.reshape(self.T * self.N, self.input_dim))
        if self.static_input and (ppd[k_s] or propagate_down[2]):
            # Caffe's Split over the T uses of the static term sums their diffs in time order.
            ds = d[0].copy()
            for t in range(1, self.T):
                ds += d[t]
            if ppd[k_s]:
                self.blobs[k_s].diff += xp.matmul(
                    ds.T, bottom[2].data.reshape(self.N, self.static_dim))
            if propagate_down[2]:
                xp.matmul(ds, self.blobs[k_s].data,
                          out=bottom[2].diff.reshape(self.N, self.static_dim))


@register("RNN")
class RNNLayer(_RecurrentBase):
    """Elman recurrent net: ``h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h
    [+ W_xh_static x_static])``, output ``o_t = tanh(W_ho h_t + b_o)``.

    Shapes: bottoms x (T, N, ...), cont (T, N), [x_static (N, ...)], [h_0 (1, N, H) with
    expose_hidden]; tops o (T, N, H), [h_T (1, N, H) with expose_hidden]. float32.

    Params (Caffe's order): W_xh (H, D), b_h (H,), [W_xh_static (H, D_static)], W_hh (H, H),
    W_ho (H, H), b_o (H,); weights from ``weight_filler``, biases from ``bias_filler``.

    Fields read (recurrent_param): num_output, weight_filler, bias_filler, expose_hidden,
    debug_info (no effect).

    Raises:
        CaffeError: bad bottom shapes, a changed number of timesteps, num_output <= 0, and
            backward asked to propagate to ``cont``.

    Caffe: src/caffe/layers/recurrent_layer.cpp, src/caffe/layers/rnn_layer.cpp.
    """

    state_names = ("h_0",)

    def _param_specs(self, p):
        h = self.hidden
        specs = [((h, self.input_dim), p.weight_filler, True), ((h,), p.bias_filler, True)]
        if self.static_input:
            specs.append(((h, self.static_dim), p.weight_filler, True))
        for t in range(self.T):
            specs += [((h, h), p.weight_filler, t == 0), ((h, h), p.weight_filler, t == 0),
                      ((h,), p.bias_filler, t == 0)]
        return specs

    def _allocate(self, xp):
        shape = (self.T, self.N, self.hidden)
        self.pre = xp.empty(shape, f32)       # W_xh x + b_h, then the diff of h's input
        self.hc = xp.empty(shape, f32)        # cont_t * h_{t-1}
        self.h = xp.empty(shape, f32)         # hidden states

    def _forward(self, xp, bottom, top, init):
        w_xh, b_h = self.blobs[0].data, self.blobs[1].data
        k = 2 + self.static_input
        w_hh, w_ho, b_o = (b.data for b in self.blobs[k:k + 3])
        self._input_transform(xp, bottom, w_xh, b_h, self.pre)
        static = self._static_transform(xp, bottom, self.blobs[2].data) \
            if self.static_input else None
        cont = bottom[1].data
        h_prev = init[0]
        for t in range(self.T):
            xp.multiply(h_prev, cont[t][:, None], out=self.hc[t])
            a = xp.matmul(self.hc[t], w_hh.T)
            a += self.pre[t]
            if static is not None:
                a += static
            xp.tanh(a, out=self.h[t])
            h_prev = self.h[t]
        o = top[0].data.reshape(self.T * self.N, self.hidden)
        xp.matmul(self.h.reshape(self.T * self.N, self.hidden), w_ho.T, out=o)
        o += b_o
        xp.tanh(o, out=o)
        return [self.h[self.T - 1]]

    def _backward(self, xp, top, propagate_down, bottom, ppd):
        k = 2 + self.static_input
        w_hh, w_ho = self.blobs[k].data, self.blobs[k + 1].data
        tn, hd = self.T * self.N, self.hidden
        o = top[0].data.reshape(tn, hd)
        dz = top[0].diff.reshape(tn, hd) * (f32(1) - o * o)
        h = self.h.reshape(tn, hd)
        if ppd[k + 1]:
            self.blobs[k + 1].diff += xp.matmul(dz.T, h)
        if ppd[k + 2]:
            self.blobs[k + 2].diff += dz.sum(axis=0)
        dh_out = xp.matmul(dz, w_ho).reshape(self.T, self.N, hd)
        da = self.pre                          # the forward's W_xh x + b_h is no longer needed
        cont = bottom[1].data
        dh = dh_out[self.T - 1]
        for t in range(self.T - 1, -1, -1):
            xp.multiply(dh, f32(1) - self.h[t] * self.h[t], out=da[t])
            if t:
                dh = xp.matmul(da[t], w_hh)
                dh *= cont[t][:, None]
                dh += dh_out[t - 1]
        if ppd[k]:
            self.blobs[k].diff += xp.matmul(da.reshape(tn, hd).T, self.hc.reshape(tn, hd))
        self._input_backward(xp, bottom, propagate_down, ppd, da, 0, 1, 2)


@register("LSTM")
class LSTMLayer(_RecurrentBase):
    """Long short-term memory over T timesteps, Caffe's LSTM (gates i, f, o, g).

    Per timestep: ``gates_t = W_hc (cont_t h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static]``,
    then the LSTM unit (see :class:`LSTMUnitLayer`): ``c_t = cont_t sigmoid(f) c_{t-1}
    + sigmoid(i) tanh(g)``, ``h_t = sigmoid(o) tanh(c_t)``.

    Shapes: bottoms x (T, N, ...), cont (T, N), [x_static (N, ...)], [h_0, c_0 (1, N, H) with
    expose_hidden]; tops h (T, N, H), [h_T, c_T (1, N, H) with expose_hidden]. float32.

    Params (Caffe's order): W_xc (4H, D), b_c (4H,), [W_xc_static (4H, D_static)], W_hc (4H, H);
    the 4H rows are the gates i, f, o, g. Weights from ``weight_filler``, bias from
    ``bias_filler``.

    Fields read (recurrent_param): num_output, weight_filler, bias_filler, expose_hidden,
    debug_info (no effect).

    Raises:
        CaffeError: bad bottom shapes, a changed number of timesteps, num_output <= 0, and
            backward asked to propagate to ``cont``.

    Caffe: src/caffe/layers/recurrent_layer.cpp, src/caffe/layers/lstm_layer.cpp,
    src/caffe/layers/lstm_unit_layer.cpp.
    """

    state_names = ("h_0", "c_0")

    def _param_specs(self, p):
        g, h = 4 * self.hidden, self.hidden
        specs = [((g, self.input_dim), p.weight_filler, True), ((g,), p.bias_filler, True)]
        if self.static_input:
            specs.append(((g, self.static_dim), p.weight_filler, True))
        specs += [((g, h), p.weight_filler, t == 0) for t in range(self.T)]
        return specs

    def _allocate(self, xp):
        shape = (self.T, self.N, self.hidden)
        self.xw = xp.empty((self.T, self.N, 4 * self.hidden), f32)   # W_xc x + b_c
        self.acts = xp.empty((self.T, self.N, 4 * self.hidden), f32)  # gate activations
        self.hc = xp.empty(shape, f32)        # cont_t * h_{t-1}
        self.c = xp.empty(shape, f32)         # cell states
        self.tanh_c = xp.empty(shape, f32)
        self._c_init = xp.empty((self.N, self.hidden), f32)   # c_0, needed again by backward

    def _forward(self, xp, bottom, top, init):
        w_xc, b_c = self.blobs[0].data, self.blobs[1].data
        w_hc = self.blobs[-1].data
        self._input_transform(xp, bottom, w_xc, b_c, self.xw)
        static = self._static_transform(xp, bottom, self.blobs[2].data) \
            if self.static_input else None
        cont = bottom[1].data
        h = top[0].data
        h_prev, c_prev = init
        for t in range(self.T):
            xp.multiply(h_prev, cont[t][:, None], out=self.hc[t])
            gates = self.acts[t]
            xp.matmul(self.hc[t], w_hc.T, out=gates)
            gates += self.xw[t]
            if static is not None:
                gates += static
            unit_forward(xp, c_prev, gates, cont[t], gates, self.c[t], self.tanh_c[t], h[t])
            h_prev, c_prev = h[t], self.c[t]
        return [h[self.T - 1], self.c[self.T - 1]]

    def _backward(self, xp, top, propagate_down, bottom, ppd):
        w_hc = self.blobs[-1].data
        cont = bottom[1].data
        dtop = top[0].diff
        dgates = self.xw                       # the forward's W_xc x + b_c is no longer needed
        dc = xp.zeros((self.N, self.hidden), f32)   # Caffe's c_T diff is always 0
        dh = dtop[self.T - 1]
        for t in range(self.T - 1, -1, -1):
            c_prev = self.c[t - 1] if t else self._c0(bottom)
            unit_backward(xp, c_prev, self.acts[t], self.tanh_c[t], dc, dh, dgates[t],
                          dc if t else None)
            if t:
                dh = xp.matmul(dgates[t], w_hc)
                dh *= cont[t][:, None]
                dh += dtop[t - 1]
        tn = self.T * self.N
        if ppd[-1]:
            self.blobs[-1].diff += xp.matmul(dgates.reshape(tn, -1).T,
                                             self.hc.reshape(tn, self.hidden))
        self._input_backward(xp, bottom, propagate_down, ppd, dgates, 0, 1, 2)

    def _c0(self, bottom):
        if self.expose_hidden:
            return bottom[-1].data.reshape(self.N, self.hidden)
        return self._c_init

    def forward(self, bottom, top):
        # The initial cell state is needed again by backward (c_prev of the first step).
        if not self.expose_hidden:
            self._c_init[...] = self.state[1].reshape(self.N, self.hidden)
        super().forward(bottom, top)
