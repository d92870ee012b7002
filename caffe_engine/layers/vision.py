"""Vision layers: Convolution, Deconvolution, Im2col, Pooling and SPP, and the im2col/col2im
helpers they share.

Caffe: src/caffe/layers/base_conv_layer.cpp, conv_layer.cpp, deconv_layer.cpp,
im2col_layer.cpp, pooling_layer.cpp, spp_layer.cpp, src/caffe/util/im2col.cpp.

No layer loops over pixels in Python; the convolutions loop over chunks of images, each chunk
small enough for its columns to stay in the CPU's cache between the copy that writes them and
the GEMM that reads them (``CHUNK_IMAGES``, ``CHUNK_COLUMNS``).

* Convolution picks a path per layer by shape (see :class:`ConvolutionLayer`): im2col in a
  batch-last layout ``(C * prod(kernel), P * n)`` and one GEMM per group per chunk; a
  pixel-major im2row layout ``(n * P, prod(kernel) * C)`` for 2-D layers with 32-64 input
  channels; no columns at all for unpadded stride-1 1x1 layers; backward-data as a convolution
  of the top diff where a cost model says so. Caffe does one GEMM per image; the sums are the
  same, only BLAS's summation order differs. docs/performance.md measures each path.
* Deconvolution runs the same pieces the other way round (W^T GEMM then col2im forward; im2col of
  the top diff in backward); Im2col exposes the column buffer itself as its top.
* SPP runs one Pooling layer per pyramid level and concatenates the flattened results.
* Pooling loops over the ``kh * kw`` kernel offsets; each step is one array operation over every
  window at once. MAX gives exactly the value and argmax index of Caffe's row-major scan with its
  strict ``>`` from ``-FLT_MAX`` (first maximum wins, NaN never wins); AVE adds in Caffe's order.

Scratch arrays (padded input, columns, transposed outputs) live in one process-wide
:class:`Workspace`, reserved in ``reshape`` and shared by every convolution, as Caffe shares its
column buffer between the images of a batch.
"""
import collections
import concurrent.futures
import itertools
import math
import os
import threading

import numpy

from .. import fillers
from ..backend import cpu_cores, get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register

f32 = numpy.float32
FLT_MAX = numpy.finfo(f32).max

#: Most floats one im2col column buffer may hold (128 MiB); bigger batches are done in chunks.
COL_BUFFER_LIMIT = 1 << 25
#: Images per chunk of the im2col paths: a chunk's im2col copy, its GEMM and the scatter of the
#: result back to (N, C, ...) run on data that is still in the CPU's cache (measured best at 8
#: for LeNet, CIFAR-10 quick, NiN and the inception layers).
CHUNK_IMAGES = 8
#: Fewest GEMM columns (images x output positions) of one chunk: small planes take more than
#: CHUNK_IMAGES images, so that the GEMMs stay wide.
CHUNK_COLUMNS = 1024
#: Target floats of one chunk of the per-image 1x1 path (its weight-gradient products).
CHUNK_FLOATS = 1 << 20
#: 1x1 convolutions (stride 1, no pad) whose planes have at least this many positions run one
#: GEMM per image straight on the (N, C, H*W) arrays; smaller planes are stacked as columns.
POINTWISE_BATCHED_MIN = 1
#: Strided 2-D convolutions read their input by stride phase in im2col (long contiguous runs).
STRIDE_PHASES = True
#: 2-D convolutions (group 1, dilation 1, not an unpadded stride-1 1x1) with
#: ROWS_MIN_CHANNELS..ROWS_MAX_CHANNELS input channels run pixel-major ("im2row", see
#: ``_rows_forward``): the GEMMs put the images' positions on the long side and the channels on
#: the short one, the layout in which OpenBLAS ran a 32-channel chunk's three products at
#: 139-174 GFLOP/s on this machine where the channel-major layout ran them at 56-107.
#: Measured by layer shape (forward+backward): 3-40 % faster for 32-64 input channels, even
#: to slightly slower for more, slower for fewer (the im2row runs of KW * C floats get short).
#: ROWS_MIN_CHANNELS None: never; ROWS_MAX_CHANNELS None: no upper bound.
ROWS_MIN_CHANNELS = 32
ROWS_MAX_CHANNELS = 64
#: Threads sharing the elementwise work of a layer call (im2col/col2im copies, layout
#: transposes, pooling passes): the caller and ``COPY_THREADS - 1`` helpers, on NumPy arrays
#: only; BLAS runs its own threads for the GEMMs. None: the CPUs this process may use, capped by
#: OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS when set (the same budget as BLAS).
COPY_THREADS = 1
#: Fewest elements an operation must touch to be split between threads.
PARALLEL_MIN = 1 << 17
#: Floats of one block of planes in the pooling's phase layout (1 MiB): each block is laid out,
#: reduced and written back while it is in the cache.
POOL_BLOCK_FLOATS = 1 << 18
#: Cost model of the backward-data choice, in units of one im2col element copy: one col2im
#: element (a read-add-write into a scattered window) and one GEMM multiply-add.
COL2IM_COST = 1.5
GEMM_MAC_COST = 0.025


# ------------------------------------------------------------------------------------------------
# Workspace and im2col / col2im
# ------------------------------------------------------------------------------------------------
class Workspace:
    """Flat float32 scratch buffers, one per (array module, device, slot name), grown on demand.

    Layers call :meth:`reserve` from ``reshape`` (so that allocation happens there, not in
    forward) and :meth:`get` from forward/backward for a view of the wanted shape. A view is
    only valid until the next ``get`` of the same slot by any layer: never keep one across calls.
    """

    def __init__(self):
        self._buffers = {}

    @staticmethod
    def _key(xp, slot):
        device = xp.cuda.Device().id if xp.__name__ == "cupy" else None
        return xp.__name__, device, slot

    def reserve(self, xp, slot, count):
        """Make sure slot ``slot`` holds at least ``count`` floats."""
        key = self._key(xp, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < count:
            self._buffers[key] = xp.empty(max(int(count), 1), f32)

    def get(self, xp, slot, shape):
        """A C-contiguous float32 view of ``shape`` on slot ``slot`` (contents undefined)."""
        count = math.prod(shape)
        self.reserve(xp, slot, count)
        return self._buffers[self._key(xp, slot)][:count].reshape(shape)

    def get_typed(self, xp, slot, shape, dtype):
        """A C-contiguous view of ``shape`` and ``dtype`` on slot ``slot`` (contents undefined)."""
        dtype = numpy.dtype(dtype)
        count = math.prod(shape)
        floats = -(-count * dtype.itemsize // 4)
        self.reserve(xp, slot, floats)
        buf = self._buffers[self._key(xp, slot)]
        return buf[:floats].view(dtype)[:count].reshape(shape)

    def clear(self):
        """Drop every buffer (frees the memory)."""
        self._buffers.clear()


workspace = Workspace()


def _budget_threads():
    n = cpu_cores()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        try:
            value = int(os.environ[var])
        except (KeyError, ValueError):
            continue
        if value > 0:
            return max(1, min(n, value))
    return max(1, n)


class _Splitter:
    """Runs ``fn(lo, hi)`` over parts of ``range(n)`` on the caller and helper threads.

    For elementwise NumPy work on disjoint slices (NumPy releases the GIL inside its loops).
    The helper pool is made on first use, rebuilt after a fork, and left to
    ``concurrent.futures`` to join at exit (its threads are idle between calls).
    """

    def __init__(self):
        self._pool = None
        self._budget = None
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        self._pool = None
        self._lock = threading.Lock()

    def threads(self):
        if COPY_THREADS is not None:
            return max(1, int(COPY_THREADS))
        if self._budget is None:
            self._budget = _budget_threads()
        return self._budget

    def run(self, fn, n, size, xp=numpy):
        """``fn(lo, hi)`` for parts covering ``range(n)``; split when ``size`` (elements the
        whole call touches) is at least ``PARALLEL_MIN``."""
        parts = min(self.threads(), n) if size >= PARALLEL_MIN and xp is numpy else 1
        if parts <= 1:
            fn(0, n)
            return
        with self._lock:
            if self._pool is None or self._pool._max_workers < parts - 1:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    parts - 1, thread_name_prefix="caffe_engine-copy")
            pool = self._pool
        bounds = [n * i // parts for i in range(parts + 1)]
        futures = [pool.submit(fn, bounds[i], bounds[i + 1]) for i in range(1, parts)]
        try:
            fn(bounds[0], bounds[1])
        finally:
            for f in futures:
                f.result()


splitter = _Splitter()


def conv_output_shape(in_shape, kernel, stride, pad, dilation):
    """Caffe's convolution output size per spatial axis: ``(S + 2p - (d(k-1)+1)) // s + 1``."""
    return tuple((s + 2 * p - (d * (k - 1) + 1)) // st + 1
                 for s, k, st, p, d in zip(in_shape, kernel, stride, pad, dilation))


def im2col(x, kernel, stride, dilation, out_shape, col):
    """Copy every receptive field of a (padded) batch into a column buffer, in one strided copy.

    Args:
        x: array (N, C, *S), already padded; any strides.
        kernel, stride, dilation, out_shape: tuples, one int per spatial axis.
        col: output array (C, *kernel, N, *out_shape), C-contiguous. Row ``(c, k...)``, column
            ``(n, o...)`` holds ``x[n, c, o * stride + k * dilation]`` -- Caffe's column order
            within each image, images side by side.
    """
    xp = get_array_module(x)
    sn, sc = x.strides[:2]
    ss = x.strides[2:]
    view_shape = (x.shape[1],) + tuple(kernel) + (x.shape[0],) + tuple(out_shape)
    view_strides = ((sc,) + tuple(d * s for d, s in zip(dilation, ss)) + (sn,)
                    + tuple(st * s for st, s in zip(stride, ss)))
    col[...] = xp.lib.stride_tricks.as_strided(x, view_shape, view_strides)


def col2im(col, kernel, stride, dilation, out_shape, x):
    """Add each column back onto the input positions it was read from (im2col's adjoint).

    Overlapping windows accumulate. ``x`` (N, C, *S_padded) must be zeroed by the caller;
    ``col`` has im2col's layout (C, *kernel, N, *out_shape). One array operation per kernel
    offset.
    """
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(slice(k * d, k * d + st * (o - 1) + 1, st)
                       for k, d, st, o in zip(offset, dilation, stride, out_shape))
        x[(slice(None), slice(None)) + window] += col[(slice(None),) + offset].swapaxes(0, 1)


def _im2col_batch_last(xt, kernel, stride, dilation, col):
    """im2col in the batch-last layout, in one strided copy.

    Args:
        xt: array (C, *S, n), already padded, C-contiguous.
        kernel, stride, dilation: tuples, one int per spatial axis.
        col: output (C, *kernel, *out, n), C-contiguous: ``col[c, k..., o..., i]`` is
            ``xt[c, o * stride + k * dilation, i]``.
    """
    d = len(kernel)
    ss = xt.strides[1:1 + d]
    view_strides = ((xt.strides[0],) + tuple(dl * s for dl, s in zip(dilation, ss))
                    + tuple(st * s for st, s in zip(stride, ss)) + (xt.strides[-1],))
    view = _strided_view(xt, col.shape, view_strides)

    def part(lo, hi):
        col[lo:hi] = view[lo:hi]
    splitter.run(part, col.shape[0], col.size, get_array_module(col))


def _strided_view(a, shape, strides):
    """``as_strided(a, shape, strides)`` (a read-only use), without NumPy's slow wrapper."""
    if isinstance(a, numpy.ndarray) and a.flags.c_contiguous:
        return numpy.ndarray(shape, a.dtype, buffer=a, strides=strides)
    return get_array_module(a).lib.stride_tricks.as_strided(a, shape, strides)


def _im2col_phases(phases, kernel, col):
    """2-D im2col (dilation 1) from an input laid out by stride phase.

    Args:
        phases: (sh, sw, C, rows_h, rows_w, n): ``phases[r, c, ch, a, b]`` is padded input
            row ``a * sh + r``, column ``b * sw + c`` (batch-last).
        kernel: (kh, kw).
        col: output (C, kh, kw, out_h, out_w, n), as :func:`_im2col_batch_last`'s.

    Kernel rows ``i = r, r + sh, ...`` all read phase row ``r`` at row offsets 0, 1, ...: one
    strided copy per phase, each with contiguous runs of ``out_w * n`` floats.
    """
    sh, sw = phases.shape[:2]
    c, kh, kw, out_h, out_w, n = col.shape
    for r in range(min(sh, kh)):
        for q in range(min(sw, kw)):
            src = phases[r, q]
            st = src.strides
            shape = (c, len(range(r, kh, sh)), len(range(q, kw, sw)), out_h, out_w, n)
            view = _strided_view(src, shape, (st[0], st[1], st[2], st[1], st[2], st[3]))
            dest = col[:, r::sh, q::sw]

            def part(lo, hi, dest=dest, view=view):
                dest[lo:hi] = view[lo:hi]
            splitter.run(part, c, dest.size, get_array_module(col))


def _copy_split(dest, src, axis, xp):
    """``dest[...] = src``, split between threads along ``axis`` (0 or 1)."""
    def part(lo, hi):
        if axis == 0:
            dest[lo:hi] = src[lo:hi]
        else:
            dest[:, lo:hi] = src[:, lo:hi]
    splitter.run(part, dest.shape[axis], dest.size, xp)


def _col2im_batch_last(col, kernel, stride, dilation, xt):
    """The adjoint of :func:`_im2col_batch_last`: add every column onto ``xt`` (C, *S, n).

    ``xt`` must be zeroed by the caller; one array operation per kernel offset, offsets in
    Caffe's (row-major) order.
    """
    d = len(kernel)
    out_shape = col.shape[1 + d:1 + 2 * d]
    steps = [(offset, tuple(slice(k * dl, k * dl + st * (o - 1) + 1, st)
                            for k, dl, st, o in zip(offset, dilation, stride, out_shape)))
             for offset in itertools.product(*(range(k) for k in kernel))]

    def part(lo, hi):
        rows, cols = xt[lo:hi], col[lo:hi]
        for offset, window in steps:
            rows[(slice(None),) + window] += cols[(slice(None),) + offset]
    splitter.run(part, col.shape[0], col.size, get_array_module(col))


def _spatial_values(layer, param, name, default, num_axes):
    """Read a repeated per-axis field (kernel_size, stride, pad, dilation) with its _h/_w form.

    Follows Caffe's BaseConvolutionLayer::LayerSetUp: the _h/_w pair is 2-D only and excludes the
    repeated field; the repeated field is given 0 times (default), once, or once per axis.
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


# ------------------------------------------------------------------------------------------------
# Convolution, Deconvolution
# ------------------------------------------------------------------------------------------------
def deconv_output_shape(in_shape, kernel, stride, pad, dilation):
    """Caffe's deconvolution output size per spatial axis: ``s (S - 1) + d (k - 1) + 1 - 2p``."""
    return tuple(st * (s - 1) + d * (k - 1) + 1 - 2 * p
                 for s, k, st, p, d in zip(in_shape, kernel, stride, pad, dilation))


class _ConvolutionBase(Layer):
    """What Convolution and Deconvolution share (Caffe's BaseConvolutionLayer).

    Both are described in terms of the *convolution* they are built on: it maps an image side
    (``conv_in_channels``, ``conv_in_spatial``) to a column side (``conv_out_channels``,
    ``conv_out_spatial``) through weights (conv_out_channels, conv_in_channels / group, *kernel).
    Convolution runs it forward (bottom = image side, top = column side); Deconvolution
    (``reverse``) runs it backward (bottom = column side, top = image side), exactly as Caffe's
    DeconvolutionLayer calls ``backward_cpu_gemm`` in its forward pass and ``forward_cpu_gemm``
    and ``weight_cpu_gemm`` on the top diff in its backward pass.

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
        d = self.num_spatial
        self.kernel = _spatial_values(self, p, "kernel_size", None, d)
        self.stride = _spatial_values(self, p, "stride", 1, d)
        self.pad = _spatial_values(self, p, "pad", 0, d)
        self.dilation = _spatial_values(self, p, "dilation", 1, d)
        if min(self.kernel) <= 0:
            raise self.error(f"filter dimensions must be nonzero, got kernel {self.kernel}")
        if min(self.stride) <= 0:
            raise self.error(f"stride dimensions must be nonzero, got stride {self.stride}")
        if min(self.pad) < 0 or min(self.dilation) <= 0:
            raise self.error(f"pad must be >= 0 and dilation > 0, got pad {self.pad}, "
                             f"dilation {self.dilation}")
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
        top_shape = shape[:axis] + (self.num_output,) + self.out_spatial
        for t in top:
            t.reshape(top_shape)
        if self.reverse:
            self.conv_in_spatial, self.conv_out_spatial = self.out_spatial, self.in_spatial
        else:
            self.conv_in_spatial, self.conv_out_spatial = self.in_spatial, self.out_spatial
        self.padded = any(self.pad)
        self.padded_spatial = tuple(s + 2 * p for s, p in zip(self.conv_in_spatial, self.pad))
        # Strided 2-D im2col reads the input by stride phase (see _columns): the padded plane
        # rounded up to whole phases, and the phase rows each kernel reach needs.
        self.phased = (STRIDE_PHASES and self.num_spatial == 2 and any(s > 1 for s in self.stride)
                       and all(d == 1 for d in self.dilation))
        if self.phased:
            self.phase_rows = tuple(
                -(-max(sz, (o + (k - 1) // st) * st) // st)
                for sz, o, k, st in zip(self.padded_spatial, self.conv_out_spatial, self.kernel,
                                        self.stride))
        self.out_count = int(numpy.prod(self.conv_out_spatial))
        self.in_count = int(numpy.prod(self.conv_in_spatial))
        self.kernel_dim = (self.conv_in_channels // self.group) * int(numpy.prod(self.kernel))
        self.pointwise = (not self.padded and all(k == 1 for k in self.kernel)
                          and all(s == 1 for s in self.stride))
        # 1x1 convolutions over large planes: one GEMM per image on the NCHW arrays themselves.
        self.batched = (self.pointwise and not self.reverse
                        and self.out_count >= POINTWISE_BATCHED_MIN)
        col_per_image = self.kernel_dim * self.group * self.out_count
        self.rowwise = (ROWS_MIN_CHANNELS is not None and not self.reverse and not self.pointwise
                        and self.num_spatial == 2 and self.group == 1
                        and all(d == 1 for d in self.dilation)
                        and self.conv_in_channels >= ROWS_MIN_CHANNELS
                        and (ROWS_MAX_CHANNELS is None
                             or self.conv_in_channels <= ROWS_MAX_CHANNELS))
        self.flip_backward = self._flip_backward_pays()
        if self.flip_backward:
            # The backward-data convolution's columns: (C_out * prod(kernel)) x in positions.
            col_per_image = max(col_per_image, self.conv_out_channels
                                * int(numpy.prod(self.kernel)) * self.in_count)
        if self.rowwise:
            # GEMM rows (images x positions) of about CHUNK_COLUMNS: measured best, the chunk's
            # rows stay in the cache between the im2row copy and the GEMM.
            chunk = max(1, min(-(-CHUNK_COLUMNS // self.out_count),
                               COL_BUFFER_LIMIT // max(col_per_image, 1)))
        elif self.batched:
            per_image = max(self.conv_out_channels * self.kernel_dim,
                            (self.conv_out_channels + self.conv_in_channels) * self.out_count)
            chunk = max(1, 2 * CHUNK_FLOATS // per_image)
        else:
            images = max(CHUNK_IMAGES, -(-CHUNK_COLUMNS // max(self.out_count, 1)))
            chunk = max(1, min(images, COL_BUFFER_LIMIT // max(col_per_image, 1)))
        chunk = min(chunk, self.num)
        # Even chunks: 100 images in chunks of at most 8 -> 13 chunks of 7 or 8.
        chunks = -(-self.num // chunk)
        self.chunk = -(-self.num // chunks)
        xp = get_array_module(bottom[0].data)
        if self.batched:
            workspace.reserve(xp, "wgrad", self.chunk * self.conv_out_channels * self.kernel_dim)
            return
        n = self.chunk
        if self.rowwise:
            self._reserve_rows(xp, n)
            return
        workspace.reserve(xp, "col", col_per_image * n)
        workspace.reserve(xp, "gemm", n * max(self.conv_out_channels * self.out_count,
                                              self.conv_in_channels * self.in_count))
        workspace.reserve(xp, "wgrad", self.conv_out_channels * self.kernel_dim)
        workspace.reserve(xp, "wacc", self.conv_out_channels * self.kernel_dim)
        pad = n * self.conv_in_channels * int(numpy.prod(self.padded_spatial))
        if self.phased:
            phased = n * self.conv_in_channels * math.prod(
                r * st for r, st in zip(self.phase_rows, self.stride))
            pad = max(pad, phased)
            workspace.reserve(xp, "phase", phased)
        if self.flip_backward:
            pad = max(pad, n * self.conv_out_channels * int(numpy.prod(self.flip_padded)))
        workspace.reserve(xp, "pad", pad)

    def _flip_backward_pays(self):
        """Whether backward-data should run as a convolution of the top diff (see ``backward``).

        Possible for stride 1 when no pad exceeds the dilated kernel extent; chosen when the
        cost model says the im2col of the top diff plus its GEMM is cheaper than the GEMM plus
        col2im of the usual path (col2im adds, it costs ``COL2IM_COST`` im2col copies).
        """
        if self.reverse or self.pointwise or any(s != 1 for s in self.stride):
            return False
        q = tuple(d * (k - 1) - p for k, d, p in zip(self.kernel, self.dilation, self.pad))
        if min(q) < 0:
            return False
        self.flip_pad = q
        self.flip_padded = tuple(o + 2 * p for o, p in zip(self.conv_out_spatial, q))
        g = self.group
        m_g, c_g = self.conv_out_channels // g, self.conv_in_channels // g
        usual = self.conv_in_channels * self.out_count * (COL2IM_COST + m_g * GEMM_MAC_COST)
        flipped = self.conv_out_channels * self.in_count * (1 + c_g * GEMM_MAC_COST)
        return flipped < usual

    # -- the convolution's pieces, on a chunk of n images ------------------------------------
    def _chunks(self):
        for n0 in range(0, self.num, self.chunk):
            yield n0, min(self.num, n0 + self.chunk)

    def _batch_last(self, xp, x, pad, padded_spatial):
        """``x`` (n, C, *S) transposed to (C, *S_padded, n) in the workspace, zero borders.

        The batch-last layout: every spatial window slice of it has contiguous runs of
        ``out_width * n`` floats, so im2col and col2im copy long rows even for small planes.
        """
        n, c = x.shape[:2]
        d = self.num_spatial
        xt = workspace.get(xp, "pad", (c,) + padded_spatial + (n,))
        borders, inner = [], []
        for axis, (p, size) in enumerate(zip(pad, x.shape[2:])):
            if p:
                lead = (slice(None),) * axis
                borders += [lead + (slice(0, p),), lead + (slice(p + size, None),)]
            inner.append(slice(p, p + size))
        inner = (slice(None),) + tuple(inner)
        xc = x.transpose((1,) + tuple(range(2, 2 + d)) + (0,))

        def part(lo, hi):
            rows = xt[lo:hi]
            for border in borders:
                rows[(slice(None),) + border] = 0
            rows[inner] = xc[lo:hi]
        splitter.run(part, c, xt.size, xp)
        return xt

    def _columns(self, xp, x):
        """im2col of an image-side chunk ``x`` (n, C_in, *S_in) into the workspace.

        Returns the columns as (group, kernel_dim, P * n), P = prod(conv_out_spatial): row
        ``(c, k...)`` (Caffe's row order), column ``(o..., image)``.
        """
        n = x.shape[0]
        col = workspace.get(xp, "col", (self.conv_in_channels,) + self.kernel
                            + self.conv_out_spatial + (n,))
        if self.phased:
            # Strided: lay the padded batch-last input out by stride phase first, so that every
            # kernel offset reads runs of out_width * n floats instead of n.
            (sh, sw), (rh, rw) = self.stride, self.phase_rows
            xt = self._batch_last(xp, x, self.pad, (rh * sh, rw * sw))
            c = self.conv_in_channels
            phases = workspace.get(xp, "phase", (sh, sw, c, rh, rw, n))
            grid = xt.reshape(c, rh, sh, rw, sw, n).transpose(2, 4, 0, 1, 3, 5)
            _copy_split(phases, grid, 0, xp)
            _im2col_phases(phases, self.kernel, col)
        else:
            xt = self._batch_last(xp, x, self.pad, self.padded_spatial)
            _im2col_batch_last(xt, self.kernel, self.stride, self.dilation, col)
        return col.reshape(self.group, self.kernel_dim, self.out_count * n)

    def _image(self, xp, dcol, x):
        """col2im of columns ``dcol`` (group, kernel_dim, P * n) into ``x`` (n, C_in, *S_in).

        ``x`` is overwritten. Each image position sums its columns in kernel-offset order, as
        Caffe's col2im does.
        """
        n = x.shape[0]
        d = self.num_spatial
        to_nchw = (d + 1,) + tuple(range(d + 1))
        dcol = dcol.reshape((self.conv_in_channels,) + self.kernel + self.conv_out_spatial
                            + (n,))
        c = self.conv_in_channels
        if self.pointwise:
            src = dcol.reshape((c,) + self.conv_out_spatial + (n,)).transpose(to_nchw)
        else:
            xt = workspace.get(xp, "pad", (c,) + self.padded_spatial + (n,))
            xt.fill(0)
            _col2im_batch_last(dcol, self.kernel, self.stride, self.dilation, xt)
            inner = tuple(slice(p, p + s) for p, s in zip(self.pad, self.conv_in_spatial))
            src = xt[(slice(None),) + inner].transpose(to_nchw)
        _copy_split(x, src, 1, xp)

    def _grouped(self, xp, y):
        """A column-side chunk ``y`` (n, C_out, P) regrouped as (group, C_out / group, P * n)."""
        n = y.shape[0]
        m, p = self.conv_out_channels, self.out_count
        yt = workspace.get(xp, "gemm", (m, p, n))
        _copy_split(yt, y.transpose(1, 2, 0), 0, xp)
        return yt.reshape(self.group, m // self.group, p * n)

    def _apply_weights(self, xp, col, y, bias=None):
        """``y`` (n, C_out, P) = W @ columns ``col`` (+ ``bias`` (C_out, 1)): the conv GEMM."""
        n = y.shape[0]
        g, m, p = self.group, self.conv_out_channels, self.out_count
        out = workspace.get(xp, "gemm", (g, m // g, p * n))
        xp.matmul(self._weights(), col, out=out)
        out = out.reshape(m, p, n).transpose(2, 0, 1)

        def part(lo, hi):
            if bias is not None:
                xp.add(out[:, lo:hi], bias[lo:hi], out=y[:, lo:hi])
            else:
                y[:, lo:hi] = out[:, lo:hi]
        splitter.run(part, m, y.size, xp)

    def _weight_grad(self, xp, a, b, acc, first):
        """The weight gradient of one chunk, transposed: ``acc`` (group, K, M / g) = (or +=,
        unless ``first``) ``b @ a^T`` per group, for ``a`` (group, M / g, N) and ``b``
        (group, K, N), ``acc`` from :meth:`_weight_grad_acc`; the caller adds ``acc^T`` to the
        blob's diff once, after the last chunk.

        Transposed because OpenBLAS runs this long-inner-dimension product 1.15-2.1x faster
        with the K side as the output's rows (e.g. 32 x 800 over 2048 columns: 148 against 81
        GFLOP/s; 16 x 1600: 111 against 52; 192 x 2400: 166 against 144), measured at 10-192
        output channels. (The pixel-major path's product measured the same either way round:
        146 against 142 GFLOP/s at 32 x 800.)
        """
        if first:
            xp.matmul(b, a.transpose(0, 2, 1), out=acc)
            return
        prod = workspace.get(xp, "wgrad", acc.shape)
        xp.matmul(b, a.transpose(0, 2, 1), out=prod)
        acc += prod

    def _weight_grad_acc(self, xp):
        """The workspace accumulator of :meth:`_weight_grad`: (group, K, C_out / group)."""
        return workspace.get(xp, "wacc", (self.group, self.kernel_dim,
                                          self.conv_out_channels // self.group))

    def _weights(self):
        g = self.group
        return self.blobs[0].data.reshape(g, self.conv_out_channels // g, self.kernel_dim)

    def _flipped_weights(self, xp):
        """The weights of backward-data as a convolution: (group, C_in / g, C_out / g * K).

        Entry ``[g, c, (m, k)]`` is ``W[g * (C_out / g) + m, c, kernel - 1 - k]`` (every
        spatial axis reversed; ``k`` runs over the kernel's prod(kernel) offsets): the
        transposed, rotated filter bank.
        """
        g, d = self.group, self.num_spatial
        m_g, c_g = self.conv_out_channels // g, self.conv_in_channels // g
        w = self.blobs[0].data.reshape((g, m_g, c_g) + self.kernel)
        w = w[(Ellipsis,) + (slice(None, None, -1),) * d]
        w = w.transpose((0, 2, 1) + tuple(range(3, 3 + d)))
        return xp.ascontiguousarray(w).reshape(g, c_g, m_g * int(numpy.prod(self.kernel)))

    def _flip_backward_data(self, xp, w_flip, dy, dx):
        """``dx`` (n, C_in, *S_in) = the correlation of the padded ``dy`` (n, C_out, *S_out)
        with the flipped filters: the same sums as W^T @ dy followed by col2im, for stride 1.
        """
        n = dy.shape[0]
        g, d = self.group, self.num_spatial
        dyt = self._batch_last(xp, dy, self.flip_pad, self.flip_padded)
        col = workspace.get(xp, "col", (self.conv_out_channels,) + self.kernel
                            + self.conv_in_spatial + (n,))
        _im2col_batch_last(dyt, self.kernel, self.stride, self.dilation, col)
        col = col.reshape(g, w_flip.shape[2], self.in_count * n)
        out = workspace.get(xp, "gemm", (g, self.conv_in_channels // g, self.in_count * n))
        xp.matmul(w_flip, col, out=out)
        _copy_split(dx, out.reshape((self.conv_in_channels,) + self.conv_in_spatial
                                    + (n,)).transpose((d + 1,) + tuple(range(d + 1))), 1, xp)

    # -- the pixel-major ("im2row") path, on a chunk of n images -----------------------------
    def _reserve_rows(self, xp, n):
        """Workspace of the pixel-major path for chunks of ``n`` images (see ``_rows_forward``)."""
        (kh, kw), (ph, pw) = self.kernel, self.pad
        c, m = self.conv_in_channels, self.conv_out_channels
        ks = kh * kw
        (h, w), (oh, ow) = self.conv_in_spatial, self.conv_out_spatial
        pad = (h + 2 * ph) * (w + 2 * pw) * c
        col = self.out_count * ks * c
        if self.flip_backward:
            (qh, qw) = self.flip_pad
            pad = max(pad, (oh + 2 * qh) * (ow + 2 * qw) * m)
            col = max(col, self.in_count * ks * m)
        workspace.reserve(xp, "pad", n * pad)
        workspace.reserve(xp, "col", n * col)
        workspace.reserve(xp, "gemm", n * max(self.out_count * m, self.in_count * c))
        workspace.reserve(xp, "wgrad", m * ks * c)
        for slot in ("wrows", "wflip", "wacc"):
            workspace.reserve(xp, slot, m * ks * c)

    def _nhwc(self, xp, src, pad):
        """``src`` (n, H, W, C) (any strides) copied into the workspace as (n, H + 2 pad_h,
        W + 2 pad_w, C), C-contiguous, with zero borders."""
        n, h, w, c = src.shape
        ph, pw = pad
        xh = workspace.get(xp, "pad", (n, h + 2 * ph, w + 2 * pw, c))
        if ph:
            xh[:, :ph] = 0
            xh[:, ph + h:] = 0
        if pw:
            xh[:, ph:ph + h, :pw] = 0
            xh[:, ph:ph + h, pw + w:] = 0
        xh[:, ph:ph + h, pw:pw + w] = src
        return xh

    def _im2row(self, xp, xh, out_shape, stride):
        """The pixel-major im2col of a padded (n, Hp, Wp, C) chunk, in one strided copy.

        Returns (n * OH * OW, KH * KW * C) from the workspace: row ``(i, oh, ow)``, column
        ``(kh, kw, c)`` holds ``xh[i, oh * stride_h + kh, ow * stride_w + kw, c]``. Each (kh)
        run of ``KW * C`` floats is contiguous in ``xh``, so the copy moves long runs.
        """
        n, _, _, c = xh.shape
        (kh, kw), (oh, ow), (sh, sw) = self.kernel, out_shape, stride
        s0, s1, s2, s3 = xh.strides
        view = _strided_view(xh, (n, oh, ow, kh, kw * c), (s0, sh * s1, sw * s2, s1, s3))
        rows = workspace.get(xp, "col", (n, oh, ow, kh, kw * c))
        rows[...] = view
        return rows.reshape(n * oh * ow, kh * kw * c)

    def _weights_rows(self, xp):
        """The weights as (C_out, KH * KW * C_in), columns in the im2row order (kh, kw, c)."""
        m = self.conv_out_channels
        wr = workspace.get(xp, "wrows", (m,) + self.kernel + (self.conv_in_channels,))
        wr[...] = self.blobs[0].data.transpose(0, 2, 3, 1)
        return wr.reshape(m, -1)

    def _flipped_weights_rows(self, xp):
        """Backward-data's weights as (KH * KW * C_out, C_in): row ``(kh, kw, m)``, column
        ``c`` is ``W[m, c, KH - 1 - kh, KW - 1 - kw]`` (the rotated, transposed filter bank)."""
        (kh, kw), m, c = self.kernel, self.conv_out_channels, self.conv_in_channels
        wf = workspace.get(xp, "wflip", (kh, kw, m, c))
        wf[...] = self.blobs[0].data[:, :, ::-1, ::-1].transpose(2, 3, 0, 1)
        return wf.reshape(kh * kw * m, c)

    def _rows_forward(self, xp, wr, x, y, bias):
        """``y`` (n, C_out, P) = conv(``x`` (n, C_in, H, W)) (+ ``bias`` (C_out, 1)), as
        ``im2row(x) @ W_rows^T``: one (n P, K) x (K, C_out) GEMM, then the (n, P, C_out)
        product transposed into the NCHW top."""
        n = x.shape[0]
        m, p = self.conv_out_channels, self.out_count
        xh = self._nhwc(xp, x.transpose(0, 2, 3, 1), self.pad)
        rows = self._im2row(xp, xh, self.conv_out_spatial, self.stride)
        out = workspace.get(xp, "gemm", (n * p, m))
        xp.matmul(rows, wr.T, out=out)
        src = out.reshape(n, p, m).transpose(0, 2, 1)
        if bias is not None:
            xp.add(src, bias, out=y)
        else:
            y[...] = src

    def _rows_backward(self, xp, wr, wf, x, dy, dx, acc, first, do_x):
        """Backward of the pixel-major path on one chunk.

        ``dy`` (n, C_out, OH, OW) is laid out pixel-major once (``dy_rows`` (n P, C_out));
        unless ``acc`` is None, ``acc`` (1, K, C_out) (+)= ``im2row(x)^T @ dy_rows`` through
        :meth:`_weight_grad` (K in the im2row order (kh, kw, c)); ``dx`` (n, C_in, H, W) is either
        the correlation of the padded ``dy`` with the flipped filters ``wf`` (stride 1, when
        :meth:`_flip_backward_pays`) or ``dy_rows @ W_rows`` added back onto the input
        positions in kernel-offset order (Caffe's col2im).
        """
        n = x.shape[0]
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        (h, w), (oh, ow) = self.conv_in_spatial, self.conv_out_spatial
        c, m = self.conv_in_channels, self.conv_out_channels
        dyr = workspace.get(xp, "gemm", (n, oh, ow, m))
        dyr[...] = dy.transpose(0, 2, 3, 1)
        dyr2 = dyr.reshape(n * oh * ow, m)
        if acc is not None:
            rows = self._im2row(xp, self._nhwc(xp, x.transpose(0, 2, 3, 1), self.pad),
                                self.conv_out_spatial, self.stride)
            self._weight_grad(xp, dyr2.T[None], rows.T[None], acc, first)
        if not do_x:
            return
        if self.flip_backward:
            dyh = self._nhwc(xp, dyr, self.flip_pad)
            rows = self._im2row(xp, dyh, self.conv_in_spatial, (1, 1))
            # The product goes where dy_rows was: dy_rows is not read again.
            dxr = workspace.get(xp, "gemm", (n, h, w, c))
            xp.matmul(rows, wf, out=dxr.reshape(n * h * w, c))
            dx[...] = dxr.transpose(0, 3, 1, 2)
            return
        dcol = workspace.get(xp, "col", (n, oh, ow, kh, kw, c))
        xp.matmul(dyr2, wr, out=dcol.reshape(n * oh * ow, kh * kw * c))
        dxh = workspace.get(xp, "pad", (n, h + 2 * ph, w + 2 * pw, c))
        dxh.fill(0)
        # Each position sums its kernel offsets in Caffe's col2im order (row-major). Narrow
        # outputs add a whole kernel row (KW * C contiguous floats) per output column, from the
        # last column to the first so that each position still sees j increasing; wide ones
        # add one offset's (OH, OW, C) window at a time.
        by_column = ow <= 2 * kw
        for i in range(kh):
            rows = slice(i, i + sh * (oh - 1) + 1, sh)
            if by_column:
                for q in range(ow - 1, -1, -1):
                    dxh[:, rows, q * sw:q * sw + kw] += dcol[:, :, q, i]
            else:
                for j in range(kw):
                    dxh[:, rows, j:j + sw * (ow - 1) + 1:sw] += dcol[:, :, :, i, j]
        dx[...] = dxh[:, ph:ph + h, pw:pw + w].transpose(0, 3, 1, 2)

    def _param_flags(self):
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        return ppd[0], self.bias_term and ppd[1]


@register("Convolution")
class ConvolutionLayer(_ConvolutionBase):
    """N-D convolution with groups, padding, stride and dilation (Caffe's im2col + GEMM).

    Shapes: bottom (N, C, *S) (leading axes before ``axis`` are all batch axes), top
    (N, num_output, *out) with ``out = (S + 2 pad - (dilation (kernel - 1) + 1)) // stride + 1``.
    Several bottoms (all of one shape) give as many tops, sharing the weights. float32 throughout.

    Params: ``blobs[0]`` weights (num_output, C / group, *kernel), ``blobs[1]`` bias
    (num_output,) when ``bias_term``; filled with ``weight_filler`` then ``bias_filler``.

    Fields read (convolution_param): num_output (required, > 0), bias_term (true),
    kernel_size / kernel_h + kernel_w (required), stride / stride_h + stride_w (1),
    pad / pad_h + pad_w (0), dilation (1), group (1), axis (1), weight_filler, bias_filler
    (constant 0). ``engine`` and ``force_nd_im2col`` are accepted and ignored.

    Paths (same sums as Caffe's, in BLAS's order):

    * generic: per cache-sized chunk of images, im2col into (C * K, n * P), one GEMM per
      group, the result scattered back to (n, C_out, P) with the bias added;
    * pixel-major, for 2-D, group 1, dilation 1 and 32-64 input channels
      (``ROWS_MIN_CHANNELS``..``ROWS_MAX_CHANNELS``): per chunk of images the padded input in
      (n, H, W, C), im2row into (n * P, KH * KW * C), one GEMM with the weights in (kh, kw, c)
      order, the (n * P, C_out) product transposed into the top; backward the same way round;
    * 1x1, stride 1, no pad, planes of at least ``POINTWISE_BATCHED_MIN`` positions: no
      im2col at all, one GEMM per image on the NCHW arrays (``W @ x[n]``, ``W^T @ dy[n]``);
    * backward-data for stride 1 (when :meth:`_flip_backward_pays`): ``dx`` is the correlation
      of the zero-padded ``dy`` with the flipped, transposed filters (im2col of ``dy`` and one
      GEMM) instead of ``W^T @ dy`` followed by col2im's scattered adds.

    Raises:
        CaffeError: missing or inconsistent kernel/stride/pad/dilation fields, non-positive
            num_output/kernel/stride, channels or num_output not divisible by group, changed
            input channels or axis count, bottoms of different shapes, an output size < 1.

    Caffe: src/caffe/layers/base_conv_layer.cpp, src/caffe/layers/conv_layer.cpp.
    """

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        bias = self.blobs[1].data[:, None] if self.bias_term else None
        g = self.group
        wr = self._weights_rows(xp) if self.rowwise else None
        for b, t in zip(bottom, top):
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            y = t.data.reshape(self.num, self.num_output, self.out_count)
            if self.batched:
                w = self._weights()
                for n0, n1 in self._chunks():
                    ys = y[n0:n1].reshape(n1 - n0, g, self.num_output // g, self.out_count)
                    xp.matmul(w, x[n0:n1].reshape(n1 - n0, g, -1, self.out_count), out=ys)
                    if bias is not None:
                        y[n0:n1] += bias
                continue
            if self.rowwise:
                for n0, n1 in self._chunks():
                    self._rows_forward(xp, wr, x[n0:n1], y[n0:n1], bias)
                continue
            for n0, n1 in self._chunks():
                self._apply_weights(xp, self._columns(xp, x[n0:n1]), y[n0:n1], bias)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        do_w, do_b = self._param_flags()
        w = self._weights()
        w_diff = self.blobs[0].diff.reshape(w.shape)
        w_flip = w_rows = None
        if any(propagate_down[:len(bottom)]):
            if self.flip_backward:
                flipped = self._flipped_weights_rows if self.rowwise else self._flipped_weights
                w_flip = flipped(xp)
            elif self.rowwise:
                w_rows = self._weights_rows(xp)
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape(self.num, self.num_output, self.out_count)
            if do_b:
                # Per image and channel a product with ones (Caffe's gemv), then over images:
                # five times faster than NumPy's reduction over the non-adjacent axes (0, 2).
                plane_sums = dy.reshape(-1, self.out_count) @ xp.ones(self.out_count, f32)
                self.blobs[1].diff += plane_sums.reshape(self.num, self.num_output).sum(axis=0)
            if not (do_w or propagate_down[i]):
                continue
            x = b.data.reshape((self.num, self.channels) + self.in_spatial)
            dx = b.diff.reshape((self.num, self.channels) + self.in_spatial)
            if self.batched:
                self._backward_batched(xp, w, w_diff, x, dy, dx, do_w, propagate_down[i])
                continue
            if self.rowwise:
                self._backward_rows(xp, x, dy, dx, w_diff, w_rows, w_flip, do_w,
                                    propagate_down[i])
                continue
            acc = self._weight_grad_acc(xp) if do_w else None
            for n0, n1 in self._chunks():
                n = n1 - n0
                if do_w or not self.flip_backward:
                    dyt = self._grouped(xp, dy[n0:n1])
                if do_w:
                    self._weight_grad(xp, dyt, self._columns(xp, x[n0:n1]), acc, n0 == 0)
                if not propagate_down[i]:
                    continue
                if self.flip_backward:
                    dy_img = dy[n0:n1].reshape((n, self.num_output) + self.out_spatial)
                    self._flip_backward_data(xp, w_flip, dy_img, dx[n0:n1])
                else:
                    dcol = workspace.get(xp, "col", (self.group, self.kernel_dim,
                                                     n * self.out_count))
                    xp.matmul(w.transpose(0, 2, 1), dyt, out=dcol)
                    self._image(xp, dcol, dx[n0:n1])
            if do_w:
                w_diff += acc.transpose(0, 2, 1)

    def _backward_rows(self, xp, x, dy, dx, w_diff, wr, wf, do_w, do_x):
        """Backward of the pixel-major path over the batch, chunk by chunk (``wr``: the
        weights in im2row order, for backward-data through col2im; ``wf``: the flipped ones);
        the weight gradient is summed in the im2row order and added to ``w_diff`` once."""
        m = self.conv_out_channels
        acc = self._weight_grad_acc(xp) if do_w else None
        dy = dy.reshape((self.num, m) + self.conv_out_spatial)
        for n0, n1 in self._chunks():
            self._rows_backward(xp, wr, wf, x[n0:n1], dy[n0:n1], dx[n0:n1], acc, n0 == 0, do_x)
        if do_w:
            # acc[0] is ((kh, kw, c), m); the blob's diff is (m, (c, kh, kw)).
            w_diff += acc[0].reshape(self.kernel + (-1, m)).transpose(3, 2, 0, 1).reshape(
                w_diff.shape)

    def _backward_batched(self, xp, w, w_diff, x, dy, dx, do_w, do_x):
        """Backward of the per-image 1x1 path: ``dW += sum_n dy[n] x[n]^T``, ``dx = W^T dy``."""
        g, p = self.group, self.out_count
        for n0, n1 in self._chunks():
            n = n1 - n0
            dys = dy[n0:n1].reshape(n, g, -1, p)
            if do_w:
                prod = workspace.get(xp, "wgrad", (n,) + w.shape)
                xs = x[n0:n1].reshape(n, g, -1, p)
                xp.matmul(dys, xs.transpose(0, 1, 3, 2), out=prod)
                w_diff += prod.sum(axis=0)
            if do_x:
                xp.matmul(w.transpose(0, 2, 1), dys, out=dx[n0:n1].reshape(n, g, -1, p))


@register("Deconvolution")
class DeconvolutionLayer(_ConvolutionBase):
    """Transposed convolution: the adjoint of Convolution with the same parameters.

    Shapes: bottom (N, C, *S), top (N, num_output, *out) with
    ``out = stride (S - 1) + dilation (kernel - 1) + 1 - 2 pad``. Several bottoms (one shape)
    give as many tops, sharing the weights. float32 throughout.

    Forward scatters every input pixel through the kernel (W^T @ x, then col2im, then the
    bias); backward takes the im2col of the top diff: ``dW += x @ col(dy)^T`` and
    ``dx = W @ col(dy)``, as Caffe's deconv_layer.cpp.

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
        xp = get_array_module(bottom[0].data)
        bias_shape = (1, self.num_output) + (1,) * self.num_spatial
        for b, t in zip(bottom, top):
            x = b.data.reshape(self.num, self.channels, self.out_count)
            y = t.data.reshape((self.num, self.num_output) + self.out_spatial)
            for n0, n1 in self._chunks():
                n = n1 - n0
                xt = self._grouped(xp, x[n0:n1])
                dcol = workspace.get(xp, "col", (self.group, self.kernel_dim, n * self.out_count))
                xp.matmul(self._weights().transpose(0, 2, 1), xt, out=dcol)
                self._image(xp, dcol, y[n0:n1])
            if self.bias_term:
                y += self.blobs[1].data.reshape(bias_shape)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        do_w, do_b = self._param_flags()
        w_diff = self.blobs[0].diff.reshape(self._weights().shape)
        spatial_axes = tuple(range(2, 2 + self.num_spatial))
        for i, (b, t) in enumerate(zip(bottom, top)):
            dy = t.diff.reshape((self.num, self.num_output) + self.out_spatial)
            if do_b:
                self.blobs[1].diff += dy.sum(axis=(0,) + spatial_axes)
            if not (do_w or propagate_down[i]):
                continue
            x = b.data.reshape(self.num, self.channels, self.out_count)
            dx = b.diff.reshape(self.num, self.channels, self.out_count)
            acc = self._weight_grad_acc(xp) if do_w else None
            for n0, n1 in self._chunks():
                col = self._columns(xp, dy[n0:n1])
                if do_w:
                    self._weight_grad(xp, self._grouped(xp, x[n0:n1]), col, acc, n0 == 0)
                if propagate_down[i]:
                    self._apply_weights(xp, col, dx[n0:n1])
            if do_w:
                w_diff += acc.transpose(0, 2, 1)


# ------------------------------------------------------------------------------------------------
# Im2col
# ------------------------------------------------------------------------------------------------
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

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        self.channel_axis = bottom[0].canonical_axis(p.axis)
        self.num_spatial = bottom[0].num_axes - self.channel_axis - 1
        if self.num_spatial < 1:
            raise self.error(f"needs at least one spatial axis after axis {self.channel_axis}, "
                             f"got a bottom of shape {bottom[0].shape}")
        d = self.num_spatial
        self.kernel = _spatial_values(self, p, "kernel_size", None, d)
        self.stride = _spatial_values(self, p, "stride", 1, d)
        self.pad = _spatial_values(self, p, "pad", 0, d)
        self.dilation = _spatial_values(self, p, "dilation", 1, d)
        if min(self.kernel) <= 0:
            raise self.error(f"filter dimensions must be nonzero, got kernel {self.kernel}")
        if min(self.stride) <= 0:
            raise self.error(f"stride dimensions must be nonzero, got stride {self.stride}")
        if min(self.pad) < 0 or min(self.dilation) <= 0:
            raise self.error(f"pad must be >= 0 and dilation > 0, got pad {self.pad}, "
                             f"dilation {self.dilation}")

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
        self.padded = any(self.pad)
        self.padded_spatial = tuple(s + 2 * p for s, p in zip(self.in_spatial, self.pad))
        if self.padded:
            workspace.reserve(get_array_module(bottom[0].data), "pad",
                              self.num * self.channels * int(numpy.prod(self.padded_spatial)))

    def _column_view(self, array):
        """The top array seen in im2col's layout (C, *kernel, N, *out) (a strided view)."""
        d = self.num_spatial
        view = array.reshape((self.num, self.channels) + self.kernel + self.out_spatial)
        return view.transpose((1,) + tuple(range(2, 2 + d)) + (0,)
                              + tuple(range(2 + d, 2 + 2 * d)))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape((self.num, self.channels) + self.in_spatial)
        if self.padded:
            xpad = workspace.get(xp, "pad", (self.num, self.channels) + self.padded_spatial)
            xpad.fill(0)
            inner = tuple(slice(p, p + s) for p, s in zip(self.pad, self.in_spatial))
            xpad[(slice(None), slice(None)) + inner] = x
            x = xpad
        im2col(x, self.kernel, self.stride, self.dilation, self.out_spatial,
               self._column_view(top[0].data))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dx = bottom[0].diff.reshape((self.num, self.channels) + self.in_spatial)
        dcol = self._column_view(top[0].diff)
        if self.padded:
            dpad = workspace.get(xp, "pad", (self.num, self.channels) + self.padded_spatial)
            dpad.fill(0)
            col2im(dcol, self.kernel, self.stride, self.dilation, self.out_spatial, dpad)
            inner = tuple(slice(p, p + s) for p, s in zip(self.pad, self.in_spatial))
            dx[...] = dpad[(slice(None), slice(None)) + inner]
        else:
            dx[...] = 0
            col2im(dcol, self.kernel, self.stride, self.dilation, self.out_spatial, dx)

# ------------------------------------------------------------------------------------------------
# Pooling
# ------------------------------------------------------------------------------------------------
_MAX = caffe_pb2.PoolingParameter.MAX
_AVE = caffe_pb2.PoolingParameter.AVE
_STOCHASTIC = caffe_pb2.PoolingParameter.STOCHASTIC


def pooled_size(size, kernel, stride, pad, ceil_mode=True):
    """Caffe's pooling output size along one axis.

    ``ceil((size + 2 pad - kernel) / stride) + 1`` (``floor`` when not ``ceil_mode``); with
    ``pad > 0`` the last window is dropped when it would start at or beyond ``size + pad``.
    """
    span = size + 2 * pad - kernel
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if pad and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _phase_span(phase, stride, pad, size, rows):
    """Where the input rows of one stride phase land: (first phase row, first input row).

    Padded row ``u = h + pad`` goes to phase ``u % stride``, row ``u // stride``. Returns the
    phase row and input row of the first input row ``h >= 0`` in phase ``phase``, or
    ``(0, None)`` when there is none.
    """
    h0 = (phase - pad) % stride
    if h0 >= size:
        return 0, None
    return (h0 + pad) // stride, h0


#: One block's scratch arrays of the phase-layout pooling (see ``PoolingLayer._blocks``).
_PoolScratch = collections.namedtuple("_PoolScratch", ["z", "wide", "mask", "mark", "share"])


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

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), "
                             f"got shape {shape}")
        xp = get_array_module(bottom[0].data)
        if (shape, xp.__name__) == getattr(self, "_reshaped_for", None):
            for t in top:
                t.reshape(self.top_shape)
            return
        n, c, h, w = shape
        if self.global_pooling:
            self.kernel = (h, w)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        out_h = pooled_size(h, kh, sh, ph, self.ceil_mode)
        out_w = pooled_size(w, kw, sw, pw, self.ceil_mode)
        if out_h < 1 or out_w < 1:
            raise self.error(f"kernel {self.kernel} larger than the padded input {(h, w)}")
        self.in_hw, self.out_hw = (h, w), (out_h, out_w)
        self.top_shape = (n, c, out_h, out_w)
        for t in top:
            t.reshape(self.top_shape)
        # Whole-plane windows (global pooling): one reduction instead of kh * kw steps.
        self.whole_plane = out_h == out_w == 1 and not any(self.pad) and kh >= h and kw >= w
        if not self.whole_plane:
            self._phase_geometry(n * c, h, w, out_h, out_w)
        if self.method == _MAX:
            if self.whole_plane:
                self.argmax = xp.empty((n, c, out_h, out_w), numpy.int32)
            else:
                # code = K - k for the first offset k (row-major) holding the window's max.
                k = kh * kw
                dtype = numpy.int8 if k < 127 else numpy.int16 if k < 2 ** 15 - 1 else numpy.int32
                self.code = xp.empty((n * c, out_h * self.phase_w), dtype)
                # Flat input index of an output's window origin, and i*W + j per offset k.
                base = ((numpy.arange(out_h) * sh - ph)[:, None] * w
                        + (numpy.arange(out_w) * sw - pw)[None, :])
                self.window_base = xp.asarray(base.astype(numpy.int32))
                self.offset_index = xp.asarray(numpy.array(
                    [i * w + j for i in range(kh) for j in range(kw)] + [0], numpy.int32))
        elif self.method == _AVE:
            hs = numpy.arange(out_h) * sh - ph
            ws = numpy.arange(out_w) * sw - pw
            size_h = numpy.minimum(hs + kh, h + ph) - hs
            size_w = numpy.minimum(ws + kw, w + pw) - ws
            self.divisor = xp.asarray((size_h[:, None] * size_w[None, :]).astype(f32))
        # The tables above depend only on the bottom's shape: rebuilt only when it changes.
        self._reshaped_for = (shape, xp.__name__)

    # -- the phase layout ----------------------------------------------------------------------
    def _phase_geometry(self, planes, h, w, out_h, out_w):
        """Lay out the (conceptually padded) input by stride phase so that every kernel offset
        reads one contiguous run per plane.

        Padded row ``u = h + pad_h`` is row ``u // stride_h`` of phase ``u % stride_h`` (and the
        same for columns). Kernel offset ``(i, j)`` of output ``(oh, ow)`` then reads phase
        ``(i % sh, j % sw)`` at row ``oh + i // sh``, column ``ow + j // sw``. Each phase plane
        is stored flat with rows of ``phase_w = out_w + (kw - 1) // sw`` columns, so offset
        ``(i, j)`` is the run ``[a * phase_w + b, + out_h * phase_w)``: a "wide" output with
        ``phase_w - out_w`` extra columns per row that are computed and then dropped.
        """
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.pad
        ah, aw = (kh - 1) // sh, (kw - 1) // sw
        rows, cols = out_h + ah, out_w + aw
        self.phase_w = cols
        self.phase_len = rows * cols + aw          # + slack read only by the dropped columns
        self.phase_shape = (sh, sw, planes, self.phase_len)
        self.wide = out_h * cols
        # Per kernel offset (row-major): its phase and the start of its run.
        self.runs = [(i % sh, j % sw, (i // sh) * cols + j // sw)
                     for i in range(kh) for j in range(kw)]
        # Per phase: the input rows/columns it holds, and where they go in the phase plane.
        self.phase_copies = []
        for r in range(sh):
            a0, h0 = _phase_span(r, sh, ph, h, rows)
            for c in range(sw):
                b0, w0 = _phase_span(c, sw, pw, w, cols)
                nh = len(range(h0, h, sh)) if h0 is not None else 0
                nw = len(range(w0, w, sw)) if w0 is not None else 0
                nh, nw = min(nh, rows - a0), min(nw, cols - b0)
                if nh > 0 and nw > 0:
                    self.phase_copies.append((r, c, slice(a0, a0 + nh), slice(b0, b0 + nw),
                                              slice(h0, h0 + (nh - 1) * sh + 1, sh),
                                              slice(w0, w0 + (nw - 1) * sw + 1, sw)))
        covered = sum((s[2].stop - s[2].start) * (s[3].stop - s[3].start)
                      for s in self.phase_copies)
        self.covers_input = covered == h * w

    def _to_phases(self, xp, z, x, fill, lo, hi):
        """Planes ``lo:hi`` of ``x`` (N, C, H, W) into the phase layout ``z`` (sh, sw, hi - lo,
        phase_len), with padding = ``fill``."""
        rows = self.phase_len // self.phase_w
        z.fill(fill)
        grid = z[..., :rows * self.phase_w].reshape(z.shape[:3] + (rows, self.phase_w))
        xs = x.reshape((-1,) + x.shape[2:])[lo:hi]
        for r, c, a, b, hs, ws in self.phase_copies:
            grid[r, c, :, a, b] = xs[:, hs, ws]

    def _from_phases(self, z, dx, lo, hi):
        """The phase-layout gradient ``z`` of planes ``lo:hi`` gathered back into ``dx``
        (N, C, H, W), overwritten."""
        rows = self.phase_len // self.phase_w
        grid = z[..., :rows * self.phase_w].reshape(z.shape[:3] + (rows, self.phase_w))
        dxs = dx.reshape((-1,) + dx.shape[2:])[lo:hi]
        if not self.covers_input:
            dxs.fill(0)
        for r, c, a, b, hs, ws in self.phase_copies:
            dxs[:, hs, ws] = grid[r, c, :, a, b]

    def _blocks(self, xp, planes, fn):
        """``fn(bufs, lo, hi)`` for blocks of planes small enough to stay in the cache.

        ``bufs`` holds the block's scratch arrays (each for ``hi - lo`` planes): ``z`` the phase
        layout (sh, sw, n, phase_len), ``wide`` float32 (n, out_h * phase_w), ``mask`` bool and
        ``mark`` (the code's dtype) like ``wide``, ``share`` float32 like ``wide``. The blocks
        are shared out between threads, each with scratch arrays of its own.
        """
        per_plane = self.phase_shape[0] * self.phase_shape[1] * self.phase_len
        block = max(1, min(planes, POOL_BLOCK_FLOATS // per_plane))
        blocks = -(-planes // block)
        threads = min(splitter.threads(), blocks) if xp is numpy else 1
        starts = {blocks * i // threads: i for i in range(threads)}
        code_dtype = self.code.dtype if self.method == _MAX else numpy.int8

        def run(first, last):
            slot = f"pool{starts[first]}"
            z_all = workspace.get(xp, slot, self.phase_shape[:2] + (block, self.phase_len))
            wide = (block, self.wide)
            full = _PoolScratch(z_all, workspace.get(xp, slot + "w", wide),
                                workspace.get_typed(xp, slot + "m", wide, numpy.bool_),
                                workspace.get_typed(xp, slot + "k", wide, code_dtype),
                                workspace.get(xp, slot + "s", wide))
            for i in range(first, last):
                lo, hi = i * block, min(planes, (i + 1) * block)
                n = hi - lo
                fn(_PoolScratch(full.z[:, :, :n], full.wide[:n], full.mask[:n], full.mark[:n],
                                full.share[:n]), lo, hi)
        if threads <= 1:
            run(0, blocks)
        else:
            splitter.run(run, blocks, PARALLEL_MIN, xp)

    def _wide_view(self, wide):
        """A wide (n, out_h * phase_w) array as (n, out_h, out_w) (the kept columns)."""
        out_h, out_w = self.out_hw
        return wide.reshape(wide.shape[0], out_h, self.phase_w)[..., :out_w]

    def forward(self, bottom, top):
        if self.method == _STOCHASTIC:
            raise self.error("STOCHASTIC pooling is not implemented in the CPU engine "
                             "(Caffe: 'Not Implemented Yet'); use MAX or AVE")
        xp = get_array_module(bottom[0].data)
        x, y = bottom[0].data, top[0].data
        if self.whole_plane:
            if self.method == _MAX:
                self._max_whole_plane(xp, x, y)
                if len(top) > 1:
                    top[1].data[...] = self.argmax
            else:
                y[...] = x.sum(axis=(2, 3), keepdims=True)
                y /= self.divisor
            return
        planes = x.shape[0] * x.shape[1]
        ys = y.reshape(planes, self.out_hw[0], self.out_hw[1])
        if self.method == _MAX:
            self._blocks(xp, planes, lambda bufs, lo, hi: self._max_planes(xp, bufs, x, ys,
                                                                           lo, hi))
            if len(top) > 1:
                kept = self._wide_view(self.code).reshape(y.shape)
                index = self.window_base + self.offset_index[len(self.runs)
                                                             - kept.astype(numpy.int32)]
                top[1].data[...] = xp.where(kept > 0, index, -1)
        else:
            def ave(bufs, lo, hi):
                z, total = bufs.z, bufs.wide
                self._to_phases(xp, z, x, 0, lo, hi)
                total.fill(0)
                for r, c, start in self.runs:
                    total += z[r, c, :, start:start + self.wide]
                xp.divide(self._wide_view(total), self.divisor, out=ys[lo:hi])
            self._blocks(xp, planes, ave)

    def _max_planes(self, xp, bufs, x, ys, lo, hi):
        """MAX forward of planes ``lo:hi`` (see ``forward``) in the block scratch ``bufs``."""
        # Caffe scans each window in row-major order and keeps a value when it is strictly
        # greater than the running max, which starts at -FLT_MAX: NaN never wins, padding
        # (-inf here) never wins, and no index is kept when nothing beat -FLT_MAX.
        z, best, found, mark = bufs.z, bufs.wide, bufs.mask, bufs.mark
        self._to_phases(xp, z, x, -numpy.inf, lo, hi)
        best.fill(-FLT_MAX)
        for r, c, start in self.runs:
            xp.fmax(best, z[r, c, :, start:start + self.wide], out=best)
        # code = K - k for the first offset k holding the max (the strict > of the scan keeps
        # the first), 0 where nothing beat -FLT_MAX. Branch-free int8/16 arithmetic.
        code, count = self.code[lo:hi], len(self.runs)
        code.fill(0)
        for k, (r, c, start) in enumerate(self.runs):
            xp.equal(z[r, c, :, start:start + self.wide], best, out=found)
            xp.multiply(found, code.dtype.type(count - k), out=mark)
            xp.maximum(code, mark, out=code)
        xp.greater(best, -FLT_MAX, out=found)
        code *= found
        ys[lo:hi] = self._wide_view(best)

    def _max_whole_plane(self, xp, x, y):
        """MAX over each whole (H, W) plane with Caffe's semantics (see ``forward``)."""
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        best = xp.where(xp.isnan(flat), f32(-numpy.inf), flat).max(axis=2)
        xp.maximum(best, -FLT_MAX, out=best)
        first = (flat == best[..., None]).argmax(axis=2)
        self.argmax[...] = xp.where(best > -FLT_MAX, first, -1).reshape(self.argmax.shape)
        y[...] = best.reshape(y.shape)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.method == _STOCHASTIC:
            raise self.error("STOCHASTIC pooling is not implemented in the CPU engine")
        xp = get_array_module(top[0].diff)
        dy, dx = top[0].diff, bottom[0].diff
        if self.whole_plane:
            if self.method == _MAX:
                n, c = dx.shape[:2]
                plane = xp.arange(dx.shape[2] * dx.shape[3], dtype=numpy.int32)
                dx.reshape(n, c, -1)[...] = xp.where(plane == self.argmax.reshape(n, c, 1),
                                                     dy.reshape(n, c, 1), f32(0))
            else:
                dx[...] = dy / self.divisor
            return
        # The adjoint of forward in the phase layout: each offset's run adds its share.
        planes = dy.shape[0] * dy.shape[1]
        out_h, out_w = self.out_hw
        dys = dy.reshape(planes, out_h, out_w)
        count = len(self.runs)

        def part(bufs, lo, hi):
            z, g = bufs.z, bufs.wide
            grid = g.reshape(hi - lo, out_h, self.phase_w)
            if self.method == _MAX:
                grid[..., :out_w] = dys[lo:hi]
            else:
                xp.divide(dys[lo:hi], self.divisor, out=grid[..., :out_w])
            grid[..., out_w:] = 0
            z.fill(0)
            if self.method == _MAX:
                hit, share = bufs.mask, bufs.share
                for k, (r, c, start) in enumerate(self.runs):
                    xp.equal(self.code[lo:hi], count - k, out=hit)
                    xp.multiply(g, hit, out=share)
                    z[r, c, :, start:start + self.wide] += share
            else:
                for r, c, start in self.runs:
                    z[r, c, :, start:start + self.wide] += g
            self._from_phases(z, dx, lo, hi)
        self._blocks(xp, planes, part)


# ------------------------------------------------------------------------------------------------
# SPP
# ------------------------------------------------------------------------------------------------
def spp_pooling_param(level, height, width, pool):
    """Caffe's SPPLayer::GetPoolingParam: the pooling of pyramid level ``level``.

    ``2**level`` bins per axis: kernel ``ceil(size / bins)``, stride = kernel, and pad
    ``(kernel * bins - size + 1) // 2``, so that the windows cover the whole plane.

    Returns:
        caffe_pb2.PoolingParameter with kernel_h/w, stride_h/w, pad_h/w and ``pool``.
    """
    bins = 2 ** level
    p = caffe_pb2.PoolingParameter(pool=pool)
    kh, kw = -(-height // bins), -(-width // bins)
    p.kernel_h, p.kernel_w = kh, kw
    p.stride_h, p.stride_w = kh, kw
    p.pad_h, p.pad_w = (kh * bins - height + 1) // 2, (kw * bins - width + 1) // 2
    return p


@register("SPP")
class SPPLayer(Layer):
    """Spatial pyramid pooling: pool at ``pyramid_height`` levels, flatten and concatenate.

    Level ``l`` pools each (H, W) plane into about ``2**l x 2**l`` bins with the Pooling layer's
    own numerics (see :func:`spp_pooling_param`). Shapes: bottom (N, C, H, W); top (N, sum over
    levels of C * PH_l * PW_l), the levels in order 0, 1, ...; with ``pyramid_height: 1`` the
    top is the single pooling's (N, C, PH, PW), as in Caffe. float32. Backward sums the levels'
    diffs in level order, as Caffe's internal Split does.

    Fields read (spp_param): pyramid_height (required in practice; 0 levels is an error),
    pool (MAX; AVE; STOCHASTIC raises at forward, as Pooling).

    Raises:
        CaffeError: a bottom that is not 4-D or has an empty plane, pyramid_height < 1, and any
            level whose pooling Caffe refuses (a pad not smaller than the kernel, when a plane is
            too small for 2**l bins).

    Caffe: src/caffe/layers/spp_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.spp_param
        self.pyramid_height = p.pyramid_height
        if self.pyramid_height < 1:
            raise self.error(f"pyramid_height must be >= 1, got {self.pyramid_height}")
        self.pool = p.pool
        self._reshaped_for = None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) != 4:
            raise self.error(f"input must have 4 axes (num, channels, height, width), "
                             f"got shape {shape}")
        n, c, h, w = shape
        if h <= 0 or w <= 0:
            raise self.error(f"input dimensions cannot be zero, got shape {shape}")
        xp = get_array_module(bottom[0].data)
        if (shape, xp.__name__) != self._reshaped_for:
            # Caffe rebuilds its pooling layers whenever the bottom shape changes.
            self.levels = []
            for level in range(self.pyramid_height):
                lp = caffe_pb2.LayerParameter(name=f"{self.name}_level{level}", type="Pooling")
                lp.pooling_param.CopyFrom(spp_pooling_param(level, h, w, self.pool))
                pool = PoolingLayer(lp, self.phase)
                out = Blob((), xp=xp)
                pool.setup(bottom, [out])
                self.levels.append((pool, out))
            self.split = Blob(shape, xp=xp)    # the input again, with a diff of its own
            self._reshaped_for = (shape, xp.__name__)
        for pool, out in self.levels:
            pool.reshape(bottom, [out])
        if self.pyramid_height == 1:
            top[0].reshape(self.levels[0][1].shape)
        else:
            self.widths = [out.count_range(1) for _, out in self.levels]
            top[0].reshape((n, sum(self.widths)))

    def forward(self, bottom, top):
        if self.pyramid_height == 1:
            self.levels[0][0].forward(bottom, top)
            return
        offset = 0
        for (pool, out), width in zip(self.levels, self.widths):
            pool.forward(bottom, [out])
            top[0].data[:, offset:offset + width] = out.data.reshape(out.shape[0], width)
            offset += width

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if self.pyramid_height == 1:
            self.levels[0][0].backward(top, propagate_down, bottom)
            return
        split = self.split
        split.data = bottom[0].data
        offset = 0
        for level, ((pool, out), width) in enumerate(zip(self.levels, self.widths)):
            out.diff[...] = top[0].diff[:, offset:offset + width].reshape(out.shape)
            offset += width
            # Level 0 writes the bottom diff; each further level is added on, in level order.
            pool.backward([out], [True], [bottom[0] if level == 0 else split])
            if level:
                bottom[0].diff += split.diff
