"""The cpu kernel set: Numba kernels for NumPy arrays (see :mod:`caffe_engine.kernels`).

2-D convolution (:mod:`.conv`, :mod:`.conv_plan`; depthwise ones :mod:`.depthwise`), the matrix
products of InnerProduct (:mod:`.gemm`), pooling (:mod:`.pooling`), ACROSS_CHANNELS LRN
(:mod:`.lrn`), ReLU (:mod:`.neuron`), BatchNorm's and Scale's per-channel passes
(:mod:`.channelwise`), the fused solver step (:mod:`.solver`) and the data transform
(:mod:`.transform`), built on the SIMD intrinsics of :mod:`.simd`; everything else (N-D
convolution, WITHIN_CHANNEL LRN, im2col) is the reference set's. How the work is cut is one
frozen :class:`.tuning.CpuTuning`; scratch memory is one :class:`.workspace.Workspace`.
Kernels are compiled on first use and cached on disk (Numba's ``cache=True``), so a second
process loads them instead of compiling. Each parallel kernel is a serial ``nogil`` function run
in parts by a :class:`.team.Team` of threads.
"""
import numpy

from ..numba_import import import_numba
from ..reference import ReferenceKernels

import_numba()      # before the kernels' modules import Numba: see import_numba
from .stale_cache import drop_stale_cache  # noqa: E402

drop_stale_cache(__path__[0])   # before the kernels load Numba's cache: see stale_cache
from . import (channelwise, conv_plan, depthwise, gemm, lrn, neuron, pooling,  # noqa: E402
               simd, solver, strided_pointwise, transform)
from .team import Team  # noqa: E402
from .tuning import CpuTuning  # noqa: E402
from .workspace import Workspace  # noqa: E402


def _quiet_blas():
    """Limit the BLAS behind NumPy to one thread (once per process). Every product of the
    engine's hot loops runs on the kernels' own threads; a BLAS thread pool beside them spins
    after each call and, on two cores, took the core a kernel's thread was waiting for
    (LeNet's iteration: 75 ms against 28 with one BLAS thread, on the development machine)."""
    global _quieted
    if _quieted:
        return
    _quieted = True
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


_quieted = False


def _contiguous(*arrays):
    """Whether every array given (None: absent) is C-contiguous float32, as the fused
    per-channel passes need."""
    return all(a is None or (a.flags.c_contiguous and a.dtype == numpy.float32) for a in arrays)


def _vectors(*vectors):
    """Per-channel operands as flat contiguous float32 vectors (None stays None)."""
    return [None if v is None else numpy.ascontiguousarray(v, numpy.float32).reshape(-1)
            for v in vectors]


class CpuKernels(ReferenceKernels):
    """The kernel interface in Numba, for NumPy arrays.

    Args:
        tuning: a :class:`CpuTuning` (default: :meth:`CpuTuning.from_environment`).
    """

    name = "cpu"

    def __init__(self, tuning=None):
        self.workspace = Workspace()
        self.retune(tuning or CpuTuning.from_environment())
        _quiet_blas()

    def describe(self):
        """The set in one phrase for the start-up line: Numba's version, the threads and the
        vector width the kernels were compiled for."""
        import numba
        width = simd.vector_width()
        isa = "AVX-512" if width == 16 else "AVX2 or older"
        threads = self.tuning.threads
        return (f"cpu (Numba {numba.__version__}, {threads} thread{'s' if threads != 1 else ''}, "
                f"{isa}: {width} floats a vector)")

    def retune(self, tuning):
        """Use ``tuning`` (and a team of its ``threads``) for the plans made from now on."""
        self.tuning = tuning
        self.team = Team(tuning.threads, tuning.handoff_spin)

    def matmul(self, a, b, c, accumulate=False, trans_a=False, trans_b=False):
        gemm.product(a, b, c, accumulate, self.tuning, self.workspace, self.team, trans_a,
                     trans_b)

    def relu_forward(self, x, y, negative_slope):
        if not (x.flags.c_contiguous and y.flags.c_contiguous):
            return super().relu_forward(x, y, negative_slope)
        neuron.relu_forward(x, y, negative_slope, self.team)

    def relu_backward(self, x, dy, dx, negative_slope):
        if not (x.flags.c_contiguous and dy.flags.c_contiguous and dx.flags.c_contiguous):
            return super().relu_backward(x, dy, dx, negative_slope)
        neuron.relu_backward(x, dy, dx, negative_slope, self.team)

    def channel_sum(self, a, alpha=None):
        if not _contiguous(a):
            return super().channel_sum(a, alpha)
        return channelwise.channel_sum(a, alpha, self.team)

    def batch_norm_forward(self, x, mean, std, x_norm, y, scale=None, bias=None, slope=None):
        if not _contiguous(x, x_norm, y):
            return super().batch_norm_forward(x, mean, std, x_norm, y, scale, bias, slope)
        mean, std, scale, bias = _vectors(mean, std, scale, bias)
        channelwise.batch_norm_forward(x, mean, std, x_norm, y, scale, bias, slope, self.team)

    def batch_norm_stats_forward(self, x, inv, eps, x_norm, y, std, scale=None, bias=None,
                                 slope=None):
        if not _contiguous(x, x_norm, y, std) or x.size == 0:
            return super().batch_norm_stats_forward(x, inv, eps, x_norm, y, std, scale, bias,
                                                    slope)
        scale, bias = _vectors(scale, bias)
        return channelwise.batch_norm_stats_forward(x, inv, eps, x_norm, y, std.reshape(-1),
                                                    scale, bias, slope, self.team)

    def batch_norm_backward(self, dy, x_norm, std, dx, factor=None, scale=None, y=None,
                            slope=None):
        if not _contiguous(dy, x_norm, dx, y) or dy.size == 0:
            return super().batch_norm_backward(dy, x_norm, std, dx, factor, scale, y, slope)
        std, scale = _vectors(std, scale)
        return channelwise.batch_norm_backward(dy, x_norm, std, dx, factor, scale, y, slope,
                                               self.team)

    def scale_shift(self, x, scale, bias, y):
        if not _contiguous(x, y):
            return super().scale_shift(x, scale, bias, y)
        channelwise.scale_shift(x, scale.reshape(-1),
                                bias.reshape(-1) if bias is not None else None, y, self.team)

    def scale_grad(self, dy, x, scale, product=None, dx=None):
        if not _contiguous(dy, x, product, dx):
            return super().scale_grad(dy, x, scale, product, dx)
        channelwise.scale_grad(dy, x, scale.reshape(-1), product, dx, self.team)

    def conv(self, geometry):
        if len(geometry.kernel) != 2:
            return super().conv(geometry)
        if depthwise.is_depthwise(geometry):
            return depthwise.DepthwisePlan(geometry, self.team)
        if strided_pointwise.is_strided_pointwise(geometry):
            return strided_pointwise.StridedPointwisePlan(geometry, self.tuning, self.workspace,
                                                          self.team)
        return conv_plan.make(geometry, self.tuning, self.workspace, self.team)

    def pooling(self, geometry):
        return pooling.PoolPlan(geometry, self.team)

    def lrn(self, geometry):
        return lrn.LRNPlan(geometry, self.team)

    def update(self, rule):
        return solver.make_step(rule, self.team)

    def param_norms(self, data, diff):
        if not (data.flags.c_contiguous and diff.flags.c_contiguous):
            return super().param_norms(data, diff)
        return solver.param_norms(data, diff)

    @staticmethod
    def transform(batch, out, params, mean, scale):
        transform.transform(batch, out, params, mean, scale)
