"""The solver step of one learnable param on the device, fused into one kernel, and its norms.

Caffe: src/caffe/solvers/sgd_solver.cpp (``Normalize``, ``Regularize``), the update rules of
src/caffe/solvers/{sgd,nesterov,adagrad,rmsprop,adadelta,adam}_solver.cpp, then
``Blob::Update`` (``data -= diff``). Caffe's own GPU kernels (``*_solver.cu``) fuse only the rule
and let the compiler contract ``a * b + c`` into a multiply-add; here the whole step is one
kernel launch per param, and every float32 operation is rounded on its own, in the order of
the reference set's step (:func:`..reference.solver.step`, the CPU branch of Caffe), so the
GPU, the emulator and the reference agree bit for bit:

* each multiply, add, subtract, divide and square root goes through an explicitly rounded
  intrinsic (``__fmul_rn``, ``__fadd_rn``, ``__fsub_rn``, ``__fdiv_rn``, ``__fsqrt_rn``), which
  NVRTC never contracts into an FMA whatever ``--fmad`` says; for the emulator (``g++``, no
  ``__CUDACC__``) the helpers are the plain C++ operators, which ``-ffp-contract=off`` keeps
  unfused;
* the hyper-parameters and their complements (``1 - momentum``, ``1 + momentum``) are float32
  kernel arguments computed on the host in float32, as the reference computes them;
* the rate is a float32 argument, or, when the caller holds it on the device (a 0-d float32
  array, e.g. LARC's rate computed from :func:`param_norms` without leaving the device), read
  by the kernel from device memory: no host round trip either way.

The norms (:func:`param_norms`) are sums of squares accumulated in float64: one launch computes
deterministic strided partial sums of both arrays (no atomics, no shared memory), a small
reduction of the partials and a square root finish them on the device.
"""
import numpy

from ...backend import get_array_module
from ..reference import solver as reference
from ..reference.solver import adam_correction
from ..update_rules import RULES, require
from .device import float32, int32
from .source import Source

f32 = numpy.float32

#: update rule (declared in :mod:`..update_rules`) -> the kernel that runs its fused step
KERNELS = {"SGD": "ce_solver_sgd", "Nesterov": "ce_solver_nesterov",
           "AdaGrad": "ce_solver_adagrad", "RMSProp": "ce_solver_rmsprop",
           "AdaDelta": "ce_solver_adadelta", "Adam": "ce_solver_adam"}
#: partial sums at most per array in :func:`param_norms` (one thread each)
NORM_PARTS = 1 << 16

_STEP_PARAMS = r"""(const int n, float* data, float* diff, float* h0, float* h1,
    const float* rate_on_device, const int rate_from_device, const float rate_arg,
    const float beta1, const float one_minus_beta1, const float one_plus_beta1,
    const float beta2, const float one_minus_beta2, const float delta, const float correction,
    const int normalise, const float iter_scale, const int regularise, const float decay,
    const int l1)"""
_STEP_ARGS = ("(n, data, diff, h0, h1, rate_on_device, rate_from_device, rate_arg, beta1, "
              "one_minus_beta1, one_plus_beta1, beta2, one_minus_beta2, delta, correction, "
              "normalise, iter_scale, regularise, decay, l1)")

#: the declared code of each rule of :data:`KERNELS`, as the macros the CUDA source tests
_RULE_CODES = "\n// Rule codes, as caffe_engine/kernels/update_rules.py declares them.\n" + "".join(
    f"#define CE_SV_{name.upper()} {RULES[name].code}\n" for name in KERNELS)

_CODE = _RULE_CODES + r"""
// Rounded float32 (and float64) arithmetic that the compiler may not fuse.
#ifdef __CUDACC__
__device__ __forceinline__ float ce_sv_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float ce_sv_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float ce_sv_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float ce_sv_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float ce_sv_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double ce_sv_dsq_add(double s, double x) {
  return __dadd_rn(s, __dmul_rn(x, x));
}
#else
__device__ float ce_sv_mul(float a, float b) { return a * b; }
__device__ float ce_sv_add(float a, float b) { return a + b; }
__device__ float ce_sv_sub(float a, float b) { return a - b; }
__device__ float ce_sv_div(float a, float b) { return a / b; }
__device__ float ce_sv_sqrt(float a) { return sqrtf(a); }
__device__ double ce_sv_dsq_add(double s, double x) { return s + x * x; }
#endif

// NumPy's sign: 1, -1, +0 for both zeros, NaN for NaN.
__device__ __forceinline__ float ce_sv_sign(float w) {
  return w > 0.0f ? 1.0f : (w < 0.0f ? -1.0f : (w != w ? w : 0.0f));
}

// RULE: a rule's code (the CE_SV_* macros above); beta1 is the momentum (RMSProp: rms_decay),
// beta2 Adam's momentum2; h1 is read and written by the rules of TWO_SETS (AdaDelta, Adam).
template <int RULE, int TWO_SETS>
__device__ __forceinline__ void ce_solver_step_body""" + _STEP_PARAMS + r""" {
  const float rate = rate_from_device ? rate_on_device[0] : rate_arg;
  const float adam_rate = ce_sv_mul(rate, correction);
  CE_KERNEL_LOOP(i, n) {
    const float w = data[i];
    float g = diff[i];
    if (normalise) g = ce_sv_mul(g, iter_scale);                       // Normalize
    if (regularise)                                                   // Regularize
      g = ce_sv_add(g, l1 ? ce_sv_mul(ce_sv_sign(w), decay) : ce_sv_mul(w, decay));
    float v0 = h0[i];
    float v1 = 0.0f;
    if (RULE == CE_SV_SGD) {              // h = m h + rate g; g = h
      v0 = ce_sv_add(ce_sv_mul(v0, beta1), ce_sv_mul(g, rate));
      g = v0;
    } else if (RULE == CE_SV_NESTEROV) {  // h' = m h + rate g; g = (1 + m) h' - m h
      const float old = v0;
      v0 = ce_sv_add(ce_sv_mul(old, beta1), ce_sv_mul(g, rate));
      g = ce_sv_add(ce_sv_mul(old, -beta1), ce_sv_mul(v0, one_plus_beta1));
    } else if (RULE == CE_SV_ADAGRAD) {   // h += g g; g = rate (g / (sqrt(h) + delta))
      v0 = ce_sv_add(v0, ce_sv_mul(g, g));
      g = ce_sv_mul(ce_sv_div(g, ce_sv_add(ce_sv_sqrt(v0), delta)), rate);
    } else if (RULE == CE_SV_RMSPROP) {   // h = d h + (1 - d) g g; g = rate (g / (sqrt(h) + delta))
      v0 = ce_sv_add(ce_sv_mul(v0, beta1), ce_sv_mul(ce_sv_mul(g, g), one_minus_beta1));
      g = ce_sv_mul(ce_sv_div(g, ce_sv_add(ce_sv_sqrt(v0), delta)), rate);
    } else if (RULE == CE_SV_ADADELTA) {  // h0 squared gradients, h1 squared updates
      v1 = h1[i];
      v0 = ce_sv_add(ce_sv_mul(v0, beta1), ce_sv_mul(ce_sv_mul(g, g), one_minus_beta1));
      g = ce_sv_mul(g, ce_sv_sqrt(ce_sv_div(ce_sv_add(v1, delta), ce_sv_add(v0, delta))));
      v1 = ce_sv_add(ce_sv_mul(v1, beta1), ce_sv_mul(ce_sv_mul(g, g), one_minus_beta1));
      g = ce_sv_mul(g, rate);
    } else if (RULE == CE_SV_ADAM) {      // h0 = m, h1 = v; g = rate corr. (m / (sqrt(v) + delta))
      v1 = h1[i];
      v0 = ce_sv_add(ce_sv_mul(v0, beta1), ce_sv_mul(g, one_minus_beta1));
      v1 = ce_sv_add(ce_sv_mul(v1, beta2), ce_sv_mul(ce_sv_mul(g, g), one_minus_beta2));
      g = ce_sv_mul(ce_sv_div(v0, ce_sv_add(ce_sv_sqrt(v1), delta)), adam_rate);
    }
    h0[i] = v0;
    if (TWO_SETS) h1[i] = v1;
    diff[i] = g;                                                      // the update value
    data[i] = ce_sv_sub(w, g);                                        // Blob::Update
  }
}
""" + "".join(
    f'\nextern "C" __global__ void {name}{_STEP_PARAMS} {{\n'
    f"  ce_solver_step_body<CE_SV_{rule.upper()}, {int(RULES[rule].history_sets > 1)}>"
    f"{_STEP_ARGS};\n}}\n"
    for rule, name in KERNELS.items()) + r"""
// Sums of squares of a and b (n floats each) in float64: thread t adds up elements t,
// t + parts, t + 2 parts, ... (neighbouring threads read neighbouring elements) into
// partial[t] (a) and partial[parts + t] (b).
extern "C" __global__ void ce_param_sumsq(const int parts, const int n, const float* a,
                                          const float* b, double* partial) {
  CE_KERNEL_LOOP(t, parts) {
    double sa = 0.0, sb = 0.0;
    for (long long i = t; i < n; i += parts) {
      sa = ce_sv_dsq_add(sa, (double)a[i]);
      sb = ce_sv_dsq_add(sb, (double)b[i]);
    }
    partial[t] = sa;
    partial[parts + t] = sb;
  }
}
"""

SOURCE = Source("solver", _CODE, tuple(KERNELS.values()) + ("ce_param_sumsq",))


def _on_device(device, *arrays):
    """Whether every array is a C-contiguous float32 array of ``device``'s array module."""
    return all(get_array_module(a) is device.xp and a.dtype == f32 and a.flags.c_contiguous
               for a in arrays)


def make_step(device, rule):
    """The cuda set's ``update(rule)``: ``step(data, diff, history, local_rate, hyper, decay,
    l1, iter_scale)`` with the contract and results of :func:`..reference.solver.step`, in one
    kernel launch.

    Args of ``step``:
        data, diff: float32 arrays of one shape on ``device`` (C-contiguous); ``diff`` is
            overwritten with the update value, ``data`` has it subtracted.
        history: list of float32 arrays of that shape (two for AdaDelta and Adam, else one).
        local_rate: the rate (``rate * lr_mult``): a host number (rounded to float32), or a
            0-d / one-element float32 array on the device, read by the kernel.
        hyper: :class:`..reference.solver.Hyper`; decay: the weight decay (0: none);
        l1: L1 regularisation instead of L2; iter_scale: the ``iter_size`` normalisation
            (1: none).

    Arrays the kernel cannot take (another array module, not float32, not C-contiguous) go
    through the reference step instead, with the same results.

    Raises:
        ValueError: ``rule`` is not declared in :mod:`..update_rules` or not one of
            :data:`KERNELS` (at make time); from ``step``, a history list of the wrong length,
            or a device-held rate of more than one element.
    """
    sets = require(rule, "cuda", KERNELS).history_sets
    kernel = KERNELS[rule]
    xp = device.xp

    def step(data, diff, history, local_rate, hyper, decay, l1, iter_scale):
        if len(history) != sets:
            raise ValueError(f"{rule} keeps {sets} history array(s), got {len(history)}")
        if not _on_device(device, data, diff, *history) or \
                any(h.size != data.size for h in history) or diff.size != data.size:
            reference.step(rule, data, diff, history, local_rate, hyper, decay, l1, iter_scale)
            return
        h0 = history[0]
        h1 = history[1] if sets > 1 else h0
        if isinstance(local_rate, xp.ndarray):
            if local_rate.size != 1:
                raise ValueError(f"a device-held rate must have one element, got shape "
                                 f"{local_rate.shape}")
            rate_array = xp.ascontiguousarray(local_rate, dtype=f32)
            from_device, rate = 1, f32(0)
        else:
            rate_array, from_device, rate = data, 0, f32(local_rate)
        beta1 = f32(hyper.rms_decay if rule == "RMSProp" else hyper.momentum)
        beta2 = f32(hyper.momentum2)
        correction = adam_correction(hyper) if rule == "Adam" else f32(0)
        decay = f32(decay)
        n = data.size
        device.launch(SOURCE, kernel, n, int32(n), data, diff, h0, h1, rate_array,
                      int32(from_device), rate, beta1, f32(f32(1) - beta1),
                      f32(f32(1) + beta1), beta2, f32(f32(1) - beta2), f32(hyper.delta),
                      f32(correction), int32(iter_scale != 1), float32(iter_scale),
                      int32(bool(decay)), decay, int32(bool(l1)))
    return step


def param_norms(device, data, diff):
    """``(||data||, ||diff||)`` of one param as float32 *device scalars*: 0-d CuPy arrays on a
    GPU (nothing is copied to the host, nothing waits for the device), ``numpy.float32`` on the
    emulator. The squares are summed in float64, rooted and rounded to float32 once, as
    :func:`..reference.solver.param_norms` does; only the summation order differs (strided
    partial sums), so the values agree with the reference's to float32 rounding (equal but for
    a tie-breaking last bit in rare cases).

    Args:
        data, diff: float32 C-contiguous arrays of one size on ``device``; others (another
            array module, not float32) go to the reference function (host float32 values).

    Raises:
        ValueError: ``data`` and ``diff`` differ in size.
    """
    if data.size != diff.size:
        raise ValueError(f"param_norms: data has {data.size} elements, diff {diff.size}")
    if not _on_device(device, data, diff):
        return reference.param_norms(data, diff)
    xp = device.xp
    n = data.size
    parts = min(n, NORM_PARTS)
    partial = xp.empty((2, parts), xp.float64)  # the kernel writes every entry
    device.launch(SOURCE, "ce_param_sumsq", parts, int32(parts), int32(n), data, diff, partial)
    norms = xp.sqrt(partial.sum(axis=1)).astype(f32)
    return norms[0], norms[1]
