"""Convolution as Caffe computes it, in readable array code: im2col, a GEMM, col2im.

Caffe: src/caffe/layers/base_conv_layer.cpp and src/caffe/util/im2col.cpp. Any number of
spatial axes, groups, padding, stride and dilation; NumPy or CuPy arrays (``xp``). The column
matrix of a chunk of images is one strided view of the zero-padded input, copied once; chunks
keep it under :data:`COLUMN_FLOATS` floats.
"""
import itertools
import math

from ...backend import get_array_module

#: Most floats one chunk's column matrix may hold (64 MiB).
COLUMN_FLOATS = 1 << 24


def padded(xp, x, pad):
    """``x`` (n, C, *S) with ``pad[d]`` zeros before and after spatial axis ``d``."""
    out = xp.zeros(x.shape[:2] + tuple(s + 2 * p for s, p in zip(x.shape[2:], pad)), x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in
                                           zip(pad, x.shape[2:]))] = x
    return out


def im2col(x, kernel, stride, pad, dilation, out_shape):
    """Caffe's column matrix of every image of ``x`` (n, C, *S): (n, C, *kernel, *out_shape),
    entry ``[i, c, k..., o...] = x[i, c, o * stride - pad + k * dilation]`` (0 in the padding).
    """
    xp = get_array_module(x)
    xpad = padded(xp, x, pad)
    d = len(kernel)
    strides = xpad.strides
    view = xp.lib.stride_tricks.as_strided(
        xpad, xpad.shape[:2] + tuple(kernel) + tuple(out_shape),
        strides[:2] + tuple(dl * s for dl, s in zip(dilation, strides[2:]))
        + tuple(st * s for st, s in zip(stride, strides[2:2 + d])))
    return xp.ascontiguousarray(view)


def col2im(col, in_shape, kernel, stride, pad, dilation):
    """The adjoint of :func:`im2col`: add every entry of ``col`` (n, C, *kernel, *out) back onto
    the input position it came from; returns (n, C, *in_shape). Each position sums its entries
    in Caffe's order (kernel offsets row-major)."""
    xp = get_array_module(col)
    d = len(kernel)
    out_shape = col.shape[2 + d:]
    acc = xp.zeros(col.shape[:2] + tuple(s + 2 * p for s, p in zip(in_shape, pad)), col.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = tuple(slice(k * dl, k * dl + st * (o - 1) + 1, st)
                       for k, dl, st, o in zip(offset, dilation, stride, out_shape))
        acc[(slice(None), slice(None)) + window] += col[(slice(None), slice(None)) + offset]
    return acc[(slice(None), slice(None)) + tuple(slice(p, p + s) for p, s in
                                                  zip(pad, in_shape))]


class ConvPlan:
    """One convolution geometry (:class:`..geometry.ConvGeometry`), any number of spatial axes.

    ``x`` (N, C, *in_spatial), ``y``/``dy`` (N, M, *out_spatial), ``w`` (M, C / G, *kernel),
    ``bias``/``db`` (M,), float32, NumPy or CuPy. ``weight_grad`` and ``bias_grad`` accumulate;
    ``forward`` and ``backward_data`` overwrite.

    :attr:`backward_data_in_place` says whether ``backward_data`` may be given ``dx`` in the
    memory of ``dy`` (a geometry whose input and output have one shape): every kernel set's
    plans have it. Here it may: each chunk's ``dy`` is read whole into its columns before that
    chunk's ``dx`` is written, and no chunk reads another's.
    """

    backward_data_in_place = True

    def __init__(self, geometry):
        g = self.geometry = geometry
        self.positions = math.prod(g.out_spatial)
        self.chunk = max(1, min(g.num, COLUMN_FLOATS // max(1, g.group * g.kernel_dim
                                                           * self.positions)))

    def _chunks(self):
        for n0 in range(0, self.geometry.num, self.chunk):
            yield n0, min(self.geometry.num, n0 + self.chunk)

    def _columns(self, x):
        """(n, G, Kg, P): the column matrices of the images of ``x``, by group."""
        g = self.geometry
        col = im2col(x, g.kernel, g.stride, g.pad, g.dilation, g.out_spatial)
        return col.reshape(x.shape[0], g.group, g.kernel_dim, self.positions)

    def _grouped(self, a, channels):
        g = self.geometry
        return a.reshape(a.shape[0], g.group, channels // g.group, self.positions)

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: none)."""
        xp = get_array_module(x)
        g = self.geometry
        weights = w.reshape(g.group, g.num_output // g.group, g.kernel_dim)
        for n0, n1 in self._chunks():
            out = xp.matmul(weights, self._columns(x[n0:n1]))
            out = out.reshape(y[n0:n1].shape)
            if bias is not None:
                out += bias.reshape((1, -1) + (1,) * len(g.out_spatial))
            y[n0:n1] = out

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input: col2im(W^T dy)."""
        xp = get_array_module(dy)
        g = self.geometry
        weights_t = w.reshape(g.group, g.num_output // g.group, g.kernel_dim).transpose(0, 2, 1)
        for n0, n1 in self._chunks():
            col = xp.matmul(weights_t, self._grouped(dy[n0:n1], g.num_output))
            col = col.reshape((n1 - n0, g.channels) + g.kernel + g.out_spatial)
            dx[n0:n1] = col2im(col, g.in_spatial, g.kernel, g.stride, g.pad, g.dilation)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights, image by image (Caffe's order)."""
        xp = get_array_module(x)
        g = self.geometry
        acc = dw.reshape(g.group, g.num_output // g.group, g.kernel_dim)
        for n0, n1 in self._chunks():
            col = self._columns(x[n0:n1])
            top = self._grouped(dy[n0:n1], g.num_output)
            for i in range(n1 - n0):
                acc += xp.matmul(top[i], col[i].transpose(0, 2, 1))

    def bias_grad(self, dy, db):
        """``db +=`` ``dy`` summed over positions, then over images."""
        g = self.geometry
        db += dy.reshape(g.num, g.num_output, self.positions).sum(axis=2).sum(axis=0)
