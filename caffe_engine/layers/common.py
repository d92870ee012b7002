"""Common layers: Input, InnerProduct, and the layers that move, combine or select data.

Input, InnerProduct, Concat, Slice, Flatten, Reshape, Crop, Tile, Eltwise, Silence, Reduction,
ArgMax, BatchReindex, Filter, Embed, Parameter, Bias, Scale.

Caffe: src/caffe/layers/<name>_layer.cpp for each (input, inner_product, concat, slice, flatten,
reshape, crop, tile, eltwise, silence, reduction, argmax, batch_reindex, filter, embed,
parameter, bias, scale).
"""
import numpy

from .. import fillers, kernels
from ..backend import get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register

f32 = numpy.float32


@register("Input")
class InputLayer(Layer):
    """Net inputs: tops shaped once from ``input_param.shape``, filled by the caller.

    Shapes: one ``shape`` for every top, one per top, or none (the caller shapes the tops).
    Forward and backward do nothing; ``reshape`` keeps whatever shape the caller has since given
    a top (pycaffe's ``net.blobs['data'].reshape(...)``).

    Fields read (input_param): shape (repeated BlobShape, each ``dim`` a non-negative int).

    Raises:
        CaffeError: bottoms given; the number of shapes is neither 0, 1 nor the number of tops.

    Caffe: src/caffe/layers/input_layer.cpp.
    """

    exact_num_bottom = 0
    min_top = 1

    def layer_setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(f"must specify 'shape' once, once per top blob, or not at all: "
                             f"{len(top)} tops vs. {len(shapes)} shapes")
        for i, t in enumerate(top):
            if shapes:
                t.reshape(tuple(shapes[0 if len(shapes) == 1 else i].dim))

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass


@register("InnerProduct")
class InnerProductLayer(Layer):
    """Fully connected layer: ``top = bottom @ W.T + b`` over the axes from ``axis`` on.

    Shapes: bottom (d0, ..., d_{axis-1}, *K) is read as (M, K) with ``M = count(0, axis)``,
    ``K = count(axis)``; top is (d0, ..., d_{axis-1}, num_output). float32.

    Params: ``blobs[0]`` weights (num_output, K), or (K, num_output) with ``transpose``;
    ``blobs[1]`` bias (num_output,) when ``bias_term``. Filled with ``weight_filler`` then
    ``bias_filler`` (both default constant 0).

    Fields read (inner_product_param): num_output (required, > 0), bias_term (true), axis (1),
    transpose (false), weight_filler, bias_filler.

    Raises:
        CaffeError: num_output missing; a later bottom whose ``count(axis)`` differs from K.

    Caffe: src/caffe/layers/inner_product_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        self.num_output = p.num_output
        if self.num_output <= 0:
            raise self.error("num_output must be specified and > 0")
        self.bias_term = p.bias_term
        self.transpose = p.transpose
        self.axis = bottom[0].canonical_axis(p.axis)
        self.k = bottom[0].count_range(self.axis)
        if not self.blobs:
            shape = (self.k, self.num_output) if self.transpose else (self.num_output, self.k)
            self.blobs = [Blob(shape)]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.num_output,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        axis = bottom[0].canonical_axis(self.param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.k:
            raise self.error(f"input size incompatible with inner product parameters: "
                             f"bottom {bottom[0].shape} gives K = {k}, weights expect {self.k}")
        self.m = bottom[0].count_range(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.num_output,))
        self.kernels = kernels.for_array(bottom[0].data)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        self.kernels.matmul(x, self.blobs[0].data, y, trans_b=not self.transpose)
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.m, self.num_output)
        x = bottom[0].data.reshape(self.m, self.k)
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        if ppd[0]:
            if self.transpose:
                self.kernels.matmul(x, dy, self.blobs[0].diff, accumulate=True, trans_a=True)
            else:
                self.kernels.matmul(dy, x, self.blobs[0].diff, accumulate=True, trans_a=True)
        if self.bias_term and ppd[1]:
            self.blobs[1].diff += dy.sum(axis=0)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.m, self.k)
            self.kernels.matmul(dy, self.blobs[0].data, dx, trans_b=self.transpose)


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def _axis(layer, blob, axis):
    """``blob.canonical_axis(axis)`` with a CaffeError naming the layer."""
    try:
        return blob.canonical_axis(axis)
    except IndexError as exc:
        raise layer.error(str(exc)) from None


def _share_view(top, bottom, shape):
    """Make ``top`` a view of ``bottom``'s data and diff with another ``shape`` (same count).

    Caffe's ``ShareData`` + ``ShareDiff`` across a reshape (Flatten, Reshape): no copy, and a
    diff written into the top is the bottom's diff.
    """
    shape = tuple(int(d) for d in shape)
    if top.shape != shape:
        top.reshape(shape)
    top.data = bottom.data.reshape(shape)
    top.diff = bottom.diff.reshape(shape)


def _share_whole(top, bottom):
    """``top`` shares ``bottom``'s data and diff arrays (one-bottom Concat, one-top Slice)."""
    top.share_data(bottom)
    top.share_diff(bottom)


def _scatter_add(xp, target, indices, values):
    """``target[indices[i]] += values[i]`` for every i, repeated indices summed.

    On NumPy the additions happen one by one in the order of ``indices`` (``ufunc.at``), which is
    the order of Caffe's CPU loops; on CuPy they are atomic adds.
    """
    if xp is numpy:
        numpy.add.at(target, indices, values)
    else:  # pragma: no cover - GPU only
        import cupyx
        cupyx.scatter_add(target, indices, values)


def _buffer(current, shape, xp, dtype=f32):
    """``current`` if it already has ``shape`` on ``xp``, else a new empty array."""
    if current is None or current.shape != tuple(shape) or get_array_module(current) is not xp:
        return xp.empty(shape, dtype)
    return current


def _axis_slice(axis, start, stop):
    return (slice(None),) * axis + (slice(start, stop),)


# ------------------------------------------------------------------------------------------------
# Concat, Slice, Flatten, Reshape, Crop, Tile
# ------------------------------------------------------------------------------------------------
@register("Concat")
class ConcatLayer(Layer):
    """Join the bottoms along one axis.

    Shapes: every bottom has the same number of axes and the same dims except along ``axis``;
    top has their sum there. float32. With a single bottom the top shares its data and diff.
    Backward hands each bottom its slice of the top diff.

    Fields read (concat_param): axis (1, may be negative), concat_dim (legacy, non-negative;
    used instead of axis when given).

    Raises:
        CaffeError: both axis and concat_dim given; axis out of range; bottoms whose axes or
        dims disagree.

    Caffe: src/caffe/layers/concat_layer.cpp.
    """

    min_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.concat_param
        if p.HasField("axis") and p.HasField("concat_dim"):
            raise self.error("Either axis or concat_dim should be specified; not both.")

    def reshape(self, bottom, top):
        p = self.param.concat_param
        first = bottom[0]
        if p.HasField("concat_dim"):
            axis = p.concat_dim
            if axis >= first.num_axes:
                raise self.error(f"concat_dim {axis} out of range for a {first.num_axes}-axis "
                                 "bottom")
        else:
            axis = _axis(self, first, p.axis)
        shape = list(first.shape)
        self.sizes = [first.shape[axis]]
        for i, b in enumerate(bottom[1:], 1):
            if b.num_axes != first.num_axes:
                raise self.error(f"all inputs must have the same number of axes: bottom 0 is "
                                 f"{first.shape}, bottom {i} is {b.shape}")
            for j in range(first.num_axes):
                if j != axis and b.shape[j] != first.shape[j]:
                    raise self.error(f"all inputs must have the same shape, except at concat "
                                     f"axis {axis}: bottom 0 is {first.shape}, bottom {i} is "
                                     f"{b.shape}")
            shape[axis] += b.shape[axis]
            self.sizes.append(b.shape[axis])
        self.axis = axis
        if len(bottom) == 1:
            _share_whole(top[0], first)
        else:
            top[0].reshape(shape)

    def forward(self, bottom, top):
        if len(bottom) == 1:
            _share_whole(top[0], bottom[0])
            return
        offset = 0
        for b, size in zip(bottom, self.sizes):
            top[0].data[_axis_slice(self.axis, offset, offset + size)] = b.data
            offset += size

    def backward(self, top, propagate_down, bottom):
        if len(bottom) == 1:
            return
        offset = 0
        for b, size, down in zip(bottom, self.sizes, propagate_down):
            if down:
                b.diff[...] = top[0].diff[_axis_slice(self.axis, offset, offset + size)]
            offset += size


@register("Slice")
class SliceLayer(Layer):
    """Cut the bottom along one axis into the tops, at ``slice_point``s or into equal parts.

    Shapes: bottom any; top k spans ``[slice_point[k-1], slice_point[k])`` along ``axis``
    (from 0 and to the end at the ends). Without slice points the axis is split into
    ``len(top)`` equal parts. float32. With a single top it shares the bottom's data and diff.
    Backward writes each top diff into its place in the bottom diff.

    Fields read (slice_param): axis (1, may be negative), slice_point (repeated, increasing),
    slice_dim (legacy, used instead of axis when given).

    Raises:
        CaffeError: both axis and slice_dim given; axis out of range; not ``len(top) - 1``
        slice points; points not increasing or past the end; an axis that the tops do not
        divide evenly.

    Caffe: src/caffe/layers/slice_layer.cpp.
    """

    exact_num_bottom = 1
    min_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.slice_param
        if p.HasField("axis") and p.HasField("slice_dim"):
            raise self.error("Either axis or slice_dim should be specified; not both.")
        self.slice_points = list(p.slice_point)

    def reshape(self, bottom, top):
        p = self.param.slice_param
        b = bottom[0]
        if p.HasField("slice_dim"):
            axis = p.slice_dim
            if axis >= b.num_axes:
                raise self.error(f"slice_dim {axis} out of range for a {b.num_axes}-axis bottom")
        else:
            axis = _axis(self, b, p.axis)
        length = b.shape[axis]
        if self.slice_points:
            if len(self.slice_points) != len(top) - 1:
                raise self.error(f"{len(self.slice_points)} slice points given for {len(top)} "
                                 "tops (need one fewer than the tops)")
            if len(top) > length:
                raise self.error(f"{len(top)} tops cannot slice an axis of size {length}")
            sizes, prev = [], 0
            for point in self.slice_points:
                if point <= prev:
                    raise self.error(f"slice points must be increasing and positive, got "
                                     f"{self.slice_points}")
                sizes.append(point - prev)
                prev = point
            if prev > length:
                raise self.error(f"slice point {prev} beyond the axis size {length}")
            sizes.append(length - prev)
        else:
            if length % len(top):
                raise self.error(f"number of top blobs ({len(top)}) should evenly divide the "
                                 f"input slice axis ({length})")
            sizes = [length // len(top)] * len(top)
        self.axis, self.sizes = axis, sizes
        if len(top) == 1:
            _share_whole(top[0], b)
            return
        for t, size in zip(top, sizes):
            shape = list(b.shape)
            shape[axis] = size
            t.reshape(shape)

    def forward(self, bottom, top):
        if len(top) == 1:
            _share_whole(top[0], bottom[0])
            return
        offset = 0
        for t, size in zip(top, self.sizes):
            t.data[...] = bottom[0].data[_axis_slice(self.axis, offset, offset + size)]
            offset += size

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0] or len(top) == 1:
            return
        offset = 0
        for t, size in zip(top, self.sizes):
            bottom[0].diff[_axis_slice(self.axis, offset, offset + size)] = t.diff
            offset += size


@register("Flatten")
class FlattenLayer(Layer):
    """Merge axes ``axis`` .. ``end_axis`` into one; the top views the bottom (no copy).

    Shapes: bottom (d0, ..., dn); top (d0, ..., d_{axis-1}, prod(d_axis..d_end), d_{end+1}...).
    Default (N, C, H, W) -> (N, C*H*W). float32. Data and diff are shared with the bottom, so
    forward and backward do nothing.

    Fields read (flatten_param): axis (1), end_axis (-1); both may be negative.

    Raises:
        CaffeError: in-place use; an axis out of range.

    Caffe: src/caffe/layers/flatten_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("Flatten layer does not allow in-place computation")

    def reshape(self, bottom, top):
        p = self.param.flatten_param
        b = bottom[0]
        start, end = _axis(self, b, p.axis), _axis(self, b, p.end_axis)
        shape = b.shape[:start] + (b.count_range(start, end + 1),) + b.shape[end + 1:]
        _share_view(top[0], b, shape)

    def forward(self, bottom, top):
        self.reshape(bottom, top)

    def backward(self, top, propagate_down, bottom):
        pass


@register("Reshape")
class ReshapeLayer(Layer):
    """Give the bottom a new shape without copying; the top views the bottom's data and diff.

    ``reshape_param.shape`` replaces the bottom axes ``[axis, axis + num_axes)`` (all axes from
    ``axis`` on when ``num_axes`` is -1; a negative ``axis`` counts from the end, -1 meaning after
    the last axis). A dim of 0 copies the bottom's dim at the same position, and one dim may be
    -1, inferred from the count. Shapes: any; float32.

    Fields read (reshape_param): shape (BlobShape), axis (0), num_axes (-1).

    Raises:
        CaffeError: in-place use; more than one -1; a 0 with no bottom axis to copy; axis or
        num_axes out of range; a count the explicit dims do not divide; a shape whose count is
        not the bottom's.

    Caffe: src/caffe/layers/reshape_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("Reshape layer does not allow in-place computation")
        dims = list(self.param.reshape_param.shape.dim)
        self.copy_axes = [i for i, d in enumerate(dims) if d == 0]
        inferred = [i for i, d in enumerate(dims) if d == -1]
        if len(inferred) > 1:
            raise self.error("new shape contains multiple -1 dims; at most a single (1) value "
                             "of -1 may be specified")
        if any(d < -1 for d in dims):
            raise self.error(f"shape dims must be >= -1, got {dims}")
        self.inferred_axis = inferred[0] if inferred else -1
        self.constant_count = 1
        for d in dims:
            if d > 0:
                self.constant_count *= d
        self.dims = dims

    def reshape(self, bottom, top):
        p = self.param.reshape_param
        b = bottom[0]
        n = b.num_axes
        start = p.axis if p.axis >= 0 else n + p.axis + 1
        if not 0 <= start <= n:
            raise self.error(f"axis {p.axis} out of range for a {n}-axis bottom")
        if p.num_axes < -1:
            raise self.error("num_axes must be >= 0, or -1 for all")
        end = n if p.num_axes == -1 else start + p.num_axes
        if end > n:
            raise self.error(f"end_axis = axis + num_axes = {end} is out of range for a "
                             f"{n}-axis bottom")
        shape = list(b.shape[:start]) + list(self.dims) + list(b.shape[end:])
        for i in self.copy_axes:
            if start + i >= n:
                raise self.error("new shape contains a 0, but there was no corresponding "
                                 "bottom axis to copy")
            shape[start + i] = b.shape[start + i]
        if self.inferred_axis >= 0:
            explicit = self.constant_count * b.count_range(0, start) * b.count_range(end)
            for i in self.copy_axes:
                explicit *= shape[start + i]
            if explicit == 0 or b.count % explicit:
                raise self.error(f"bottom count ({b.count}) must be divisible by the product of "
                                 f"the specified dimensions ({explicit}); bottom shape {b.shape}")
            shape[start + self.inferred_axis] = b.count // explicit
        count = 1
        for d in shape:
            count *= d
        if count != b.count:
            raise self.error(f"output count must match input count: shape {tuple(shape)} "
                             f"({count}) from bottom {b.shape} ({b.count})")
        _share_view(top[0], b, shape)

    def forward(self, bottom, top):
        _share_view(top[0], bottom[0], top[0].shape)

    def backward(self, top, propagate_down, bottom):
        pass


@register("Crop")
class CropLayer(Layer):
    """Crop bottom 0 to the shape of bottom 1 along the axes from ``axis`` on.

    Shapes: bottom 0 (data) and bottom 1 (reference) with the same number of axes; top takes
    bottom 0's dims before ``axis`` and bottom 1's from ``axis`` on, cut out at ``offset``.
    float32. Backward writes the top diff into the cropped window of bottom 0's diff and zero
    elsewhere; the reference never gets a gradient.

    Fields read (crop_param): axis (2, may be negative), offset (repeated: none = all 0, one =
    the same for every cropped axis, or one per axis from ``axis`` on).

    Raises:
        CaffeError: axis out of range; a wrong number of offsets; a crop window that does not fit.

    Caffe: src/caffe/layers/crop_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.crop_param
        n = bottom[0].num_axes
        self.start_axis = _axis(self, bottom[0], p.axis)
        if len(p.offset) > 1 and self.start_axis + len(p.offset) != n:
            raise self.error("number of offset values specified must be equal to the number of "
                             f"dimensions following axis: {len(p.offset)} offsets, axis "
                             f"{self.start_axis}, {n}-axis bottom")

    def reshape(self, bottom, top):
        p = self.param.crop_param
        data, ref = bottom
        n = data.num_axes
        if ref.num_axes != n:
            raise self.error(f"data {data.shape} and reference {ref.shape} must have the same "
                             "number of axes")
        shape, index = [], []
        for i in range(n):
            offset, size = 0, data.shape[i]
            if i >= self.start_axis:
                size = ref.shape[i]
                if len(p.offset) == 1:
                    offset = p.offset[0]
                elif len(p.offset) > 1:
                    offset = p.offset[i - self.start_axis]
                if data.shape[i] - offset < size:
                    raise self.error(f"invalid crop parameters in dimension {i}: offset {offset}"
                                     f" + size {size} > {data.shape[i]}")
            shape.append(size)
            index.append(slice(offset, offset + size))
        self.window = tuple(index)
        top[0].reshape(shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.window]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        bottom[0].diff[...] = 0
        bottom[0].diff[self.window] = top[0].diff


@register("Tile")
class TileLayer(Layer):
    """Repeat the bottom ``tiles`` times along ``axis`` (each block of axes ``axis..`` whole).

    Shapes: bottom (d0, ..., d_axis, ...); top the same with ``d_axis * tiles``. float32.
    Backward sums the top diff over the copies.

    Fields read (tile_param): axis (1, may be negative), tiles (required, > 0).

    Raises:
        CaffeError: tiles missing or not positive; axis out of range.

    Caffe: src/caffe/layers/tile_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.tile_param
        if not p.HasField("tiles"):
            raise self.error("number of tiles must be specified")
        if p.tiles <= 0:
            raise self.error(f"number of tiles must be positive, got {p.tiles}")
        self.tiles = p.tiles

    def reshape(self, bottom, top):
        b = bottom[0]
        axis = _axis(self, b, self.param.tile_param.axis)
        self.outer, self.inner = b.count_range(0, axis), b.count_range(axis)
        shape = list(b.shape)
        shape[axis] *= self.tiles
        top[0].reshape(shape)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.outer, 1, self.inner)
        top[0].data.reshape(self.outer, self.tiles, self.inner)[...] = x

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        dy = top[0].diff.reshape(self.outer, self.tiles, self.inner)
        xp.sum(dy, axis=1, out=bottom[0].diff.reshape(self.outer, self.inner))


# ------------------------------------------------------------------------------------------------
# Eltwise, Silence, Reduction, ArgMax
# ------------------------------------------------------------------------------------------------
_ELTWISE = caffe_pb2.EltwiseParameter


@register("Eltwise")
class EltwiseLayer(Layer):
    """Elementwise product, weighted sum or maximum of two or more equally shaped bottoms.

    Shapes: every bottom the same shape; top as they are. float32.

    * PROD: ``top = x0 * x1 * ...``. Gradient to bottom i: the product of the other bottoms times
      the top diff (``stable_prod_grad``), or ``top / x_i * top_diff`` (faster, unstable at 0).
    * SUM: ``top = sum_i coeff_i * x_i`` (coeff default 1); gradient ``coeff_i * top_diff``.
    * MAX: ``top = max_i x_i``; an argmax per element (int32) routes the gradient. Caffe's
      ties: between bottoms 0 and 1 the later wins, after that the earlier one stays.

    Fields read (eltwise_param): operation (SUM), coeff (repeated; SUM only), stable_prod_grad
    (true).

    Raises:
        CaffeError: coeff given with PROD; a coeff count that is not the bottom count; bottoms
        of different shapes.

    Caffe: src/caffe/layers/eltwise_layer.cpp.
    """

    min_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.eltwise_param
        self.op = p.operation
        if self.op == _ELTWISE.PROD and len(p.coeff):
            raise self.error("Eltwise layer only takes coefficients for summation.")
        if len(p.coeff) not in (0, len(bottom)):
            raise self.error(f"Eltwise Layer takes one coefficient per bottom blob: "
                             f"{len(p.coeff)} for {len(bottom)} bottoms")
        self.coeffs = [f32(c) for c in p.coeff] or [f32(1)] * len(bottom)
        self.stable_prod_grad = p.stable_prod_grad
        self.max_idx = None

    def reshape(self, bottom, top):
        for i, b in enumerate(bottom[1:], 1):
            if b.shape != bottom[0].shape:
                raise self.error(f"bottom {i} shape {b.shape} differs from bottom 0 shape "
                                 f"{bottom[0].shape}")
        top[0].reshape(bottom[0].shape)
        if self.op == _ELTWISE.MAX:
            xp = get_array_module(bottom[0].data)
            self.max_idx = _buffer(self.max_idx, bottom[0].shape, xp, numpy.int32)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        if self.op == _ELTWISE.PROD:
            xp.multiply(bottom[0].data, bottom[1].data, out=y)
            for b in bottom[2:]:
                y *= b.data
        elif self.op == _ELTWISE.SUM:
            if self.coeffs[0] == 1:
                xp.copyto(y, bottom[0].data)
            else:
                xp.multiply(bottom[0].data, self.coeffs[0], out=y)
            for b, c in zip(bottom[1:], self.coeffs[1:]):
                y += b.data if c == 1 else b.data * c
        elif self.op == _ELTWISE.MAX:
            a, b = bottom[0].data, bottom[1].data
            idx = self.max_idx
            first = a > b
            xp.copyto(idx, xp.where(first, 0, 1).astype(numpy.int32))
            xp.copyto(y, xp.where(first, a, b))
            for i, blob in enumerate(bottom[2:], 2):
                better = blob.data > y
                idx[better] = i
                xp.copyto(y, blob.data, where=better)
        else:
            raise self.error(f"unknown elementwise operation {self.op}")

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        dy, y = top[0].diff, top[0].data
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            dx = b.diff
            if self.op == _ELTWISE.PROD:
                if self.stable_prod_grad:
                    others = [o.data for j, o in enumerate(bottom) if j != i]
                    xp.copyto(dx, others[0])
                    for o in others[1:]:
                        dx *= o
                else:
                    xp.divide(y, b.data, out=dx)
                dx *= dy
            elif self.op == _ELTWISE.SUM:
                if self.coeffs[i] == 1:
                    xp.copyto(dx, dy)
                else:
                    xp.multiply(dy, self.coeffs[i], out=dx)
            else:
                xp.multiply(dy, self.max_idx == i, out=dx)


@register("Silence")
class SilenceLayer(Layer):
    """Swallow its bottoms (so they are not net outputs); backward zeroes their diffs.

    Shapes: any number of bottoms of any shape, no tops.

    Caffe: src/caffe/layers/silence_layer.cpp.
    """

    min_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for b, down in zip(bottom, propagate_down):
            if down:
                b.diff[...] = 0


_REDUCTION = caffe_pb2.ReductionParameter


@register("Reduction")
class ReductionLayer(Layer):
    """Reduce all axes from ``axis`` on to one number each, times ``coeff``.

    Shapes: bottom (d0, ..., dn) read as (count(0, axis), count(axis)); top (d0, ...,
    d_{axis-1}), a 0-axis scalar for ``axis = 0``. float32.

    Operations: SUM, ASUM (sum of ``|x|``), SUMSQ (sum of ``x**2``), MEAN (SUM with ``coeff``
    divided by the reduced count). Gradients: ``coeff * top_diff`` times 1, ``sign(x)``,
    ``2 x``, or 1 respectively.

    Fields read (reduction_param): operation (SUM), axis (0, may be negative), coeff (1).

    Raises:
        CaffeError: axis out of range; an unknown operation.

    Caffe: src/caffe/layers/reduction_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.reduction_param
        self.op = p.operation
        if self.op not in (_REDUCTION.SUM, _REDUCTION.ASUM, _REDUCTION.SUMSQ, _REDUCTION.MEAN):
            raise self.error(f"unknown reduction operation {self.op}")

    def reshape(self, bottom, top):
        p = self.param.reduction_param
        b = bottom[0]
        axis = _axis(self, b, p.axis)
        top[0].reshape(b.shape[:axis])
        self.num, self.dim = b.count_range(0, axis), b.count_range(axis)
        self.coeff = f32(p.coeff)
        if self.op == _REDUCTION.MEAN:
            self.coeff = f32(self.coeff / f32(self.dim))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self.num, self.dim)
        y = top[0].data.reshape(self.num)
        if self.op == _REDUCTION.ASUM:
            x = xp.abs(x)
        elif self.op == _REDUCTION.SUMSQ:
            x = x * x
        xp.sum(x, axis=1, out=y)
        if self.coeff != 1:
            y *= self.coeff

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        g = (top[0].diff.reshape(self.num, 1) * self.coeff)
        dx = bottom[0].diff.reshape(self.num, self.dim)
        x = bottom[0].data.reshape(self.num, self.dim)
        if self.op == _REDUCTION.ASUM:
            xp.sign(x, out=dx)
            dx *= g
        elif self.op == _REDUCTION.SUMSQ:
            xp.multiply(x, g * f32(2), out=dx)
        else:
            dx[...] = g


@register("ArgMax")
class ArgMaxLayer(Layer):
    """Indices (and optionally values) of the ``top_k`` largest entries.

    Without ``axis``: per item n of bottom (N, ...) over its ``count(1)`` values; top is
    (N, 1, top_k) -- or (N, 2, top_k) with ``out_max_val``, indices then values -- padded with
    1-dims to the bottom's number of axes (at least 3). With ``axis``: along that axis; top is
    the bottom's shape with ``top_k`` there, holding values if ``out_max_val`` else indices.
    Indices are float32 holding integers. Order: by value, descending; equal values by index,
    descending (Caffe's ``partial_sort`` with ``std::greater`` on (value, index) pairs).
    No backward.

    Fields read (argmax_param): out_max_val (false), top_k (1), axis (unset; may be negative).

    Raises:
        CaffeError: top_k < 1 or larger than the searched dimension; axis out of range;
        backward asked to propagate (Caffe: not implemented).

    Caffe: src/caffe/layers/argmax_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.argmax_param
        self.out_max_val, self.top_k = p.out_max_val, p.top_k
        self.has_axis = p.HasField("axis")
        if self.top_k < 1:
            raise self.error("top k must not be less than 1.")

    def reshape(self, bottom, top):
        b = bottom[0]
        if self.has_axis:
            axis = _axis(self, b, self.param.argmax_param.axis)
            if self.top_k > b.shape[axis]:
                raise self.error(f"top_k ({self.top_k}) must be less than or equal to the "
                                 f"dimension of the axis ({b.shape[axis]}).")
            self.view = (b.count_range(0, axis), b.shape[axis], b.count_range(axis + 1))
            shape = list(b.shape)
            shape[axis] = self.top_k
        else:
            if self.top_k > b.count_range(1):
                raise self.error(f"top_k ({self.top_k}) must be less than or equal to the "
                                 f"dimension of the flattened bottom blob per instance "
                                 f"({b.count_range(1)}).")
            self.view = (b.shape[0], b.count_range(1), 1)
            shape = [1] * max(3, b.num_axes)
            shape[0], shape[2] = b.shape[0], self.top_k
            if self.out_max_val:
                shape[1] = 2
        top[0].reshape(shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, dim, inner = self.view
        x = bottom[0].data.reshape(self.view)
        # Descending by (value, index): a stable ascending sort of the negated values, run over
        # the axis reversed so that among equal values the larger index comes first.
        reversed_neg = -x[:, ::-1, :]
        order = xp.argsort(reversed_neg, axis=1, kind="stable")[:, :self.top_k, :]
        index = (dim - 1) - order
        if self.has_axis:
            out = top[0].data.reshape(outer, self.top_k, inner)
            if self.out_max_val:
                out[...] = xp.take_along_axis(x, index, axis=1)
            else:
                out[...] = index
            return
        out = top[0].data.reshape(outer, -1)
        out[:, :self.top_k] = index[:, :, 0]
        if self.out_max_val:
            out[:, self.top_k:] = xp.take_along_axis(x, index, axis=1)[:, :, 0]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("ArgMax has no backward (Caffe: not implemented)")


# ------------------------------------------------------------------------------------------------
# BatchReindex, Filter, Embed, Parameter
# ------------------------------------------------------------------------------------------------
def _int_indices(layer, xp, values, limit, what):
    """Float index values -> integer array, checked to lie in [0, limit) (truncated like C)."""
    if values.size and bool(xp.any((values < 0) | (values >= limit))):
        bad = float(values[(values < 0) | (values >= limit)].ravel()[0])
        raise layer.error(f"{what} {bad:g} outside [0, {limit})")
    return values.astype(numpy.int64)


@register("BatchReindex")
class BatchReindexLayer(Layer):
    """Pick items of bottom 0 by the indices in bottom 1: ``top[i] = bottom0[idx[i]]``.

    Shapes: bottom 0 (N, ...), bottom 1 (M,) float32 holding integers in [0, N); top (M, ...).
    Backward sums the top diff of every pick into the picked item (zero for items never picked),
    in index order; the index bottom gets no gradient.

    Raises:
        CaffeError: bottom 1 not 1-D; an index outside [0, N); backward asked to propagate to
        the indices (Caffe aborts).

    Caffe: src/caffe/layers/batch_reindex_layer.cpp.
    """

    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise self.error(f"the index bottom must be 1-D, got shape {bottom[1].shape}")
        top[0].reshape((bottom[1].shape[0],) + bottom[0].shape[1:])

    def _indices(self, bottom):
        xp = get_array_module(bottom[1].data)
        return _int_indices(self, xp, bottom[1].data, bottom[0].shape[0], "reindex index")

    def forward(self, bottom, top):
        if top[0].count == 0:
            return
        top[0].data[...] = bottom[0].data[self._indices(bottom)]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise self.error("Cannot backprop to index.")
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        bottom[0].diff[...] = 0
        _scatter_add(xp, bottom[0].diff, self._indices(bottom), top[0].diff)


@register("Filter")
class FilterLayer(Layer):
    """Keep the items whose selector is non-zero: ``top_t = bottom_t[selector != 0]``.

    Shapes: bottoms 0..K-1 (N, ...) to filter, the last bottom the selector (N,) or (N, 1, ...)
    with singleton trailing dims; top t is (M, ...) with M the number of kept items (at setup,
    before any selector values exist, M = N as in Caffe). float32. Backward copies each top
    diff back to the kept items and zeroes the others; the selector gets no gradient.

    Raises:
        CaffeError: not one top fewer than bottoms; selector dims other than the first not 1;
        a bottom whose first dim differs from the selector's; backward asked to propagate to
        the selector (Caffe aborts).

    Caffe: src/caffe/layers/filter_layer.cpp.
    """

    min_bottom = 2
    min_top = 1

    def layer_setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise self.error(f"needs one top per filtered bottom: {len(bottom)} bottoms "
                             f"(the last is the selector), {len(top)} tops")
        self.first_reshape = True
        self.indices = None

    def reshape(self, bottom, top):
        sel = bottom[-1]
        if any(d != 1 for d in sel.shape[1:]):
            raise self.error(f"selector blob dimensions must be singletons (1), except the "
                             f"first: {sel.shape}")
        for i, b in enumerate(bottom[:-1]):
            if b.shape[0] != sel.shape[0]:
                raise self.error(f"each bottom should have the same 0th dimension as the "
                                 f"selector blob: bottom {i} {b.shape}, selector {sel.shape}")
        xp = get_array_module(sel.data)
        self.indices = xp.nonzero(sel.data.reshape(-1))[0]
        kept = int(self.indices.shape[0])
        if self.first_reshape:
            kept = bottom[0].shape[0]
            self.first_reshape = False
        for t, b in zip(top, bottom):
            t.reshape((kept,) + b.shape[1:])

    def forward(self, bottom, top):
        for t, b in zip(top, bottom):
            t.data[...] = b.data[self.indices]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise self.error("Layer cannot backpropagate to filter index inputs")
        for i, t in enumerate(top):
            if propagate_down[i]:
                bottom[i].diff[...] = 0
                bottom[i].diff[self.indices] = t.diff


@register("Embed")
class EmbedLayer(Layer):
    """Lookup table: ``top[..., :] = W[idx] + b`` for each integer index in the bottom.

    Shapes: bottom any shape (float32 holding integers in [0, input_dim)); top the bottom's
    shape plus (num_output,). Params: ``blobs[0]`` W (input_dim, num_output), ``blobs[1]`` b
    (num_output,) when ``bias_term``; filled with ``weight_filler`` then ``bias_filler``
    (default constant 0). Backward: W's rows get the top diffs of their lookups added one by one
    in bottom order; b the sum of all top diffs. The index bottom gets no gradient.

    Fields read (embed_param): num_output (> 0), input_dim (> 0), bias_term (true),
    weight_filler, bias_filler.

    Raises:
        CaffeError: num_output or input_dim missing; an index outside [0, input_dim) or not an
        integer; backward asked to propagate to the indices (Caffe aborts).

    Caffe: src/caffe/layers/embed_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.embed_param
        self.n, self.k, self.bias_term = p.num_output, p.input_dim, p.bias_term
        if self.n <= 0:
            raise self.error("EmbedLayer num_output must be positive.")
        if self.k <= 0:
            raise self.error("EmbedLayer input_dim must be positive.")
        if not self.blobs:
            self.blobs = [Blob((self.k, self.n))]
            fillers.fill(self.blobs[0], p.weight_filler)
            if self.bias_term:
                self.blobs.append(Blob((self.n,)))
                fillers.fill(self.blobs[1], p.bias_filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.n,))

    def _indices(self, bottom):
        xp = get_array_module(bottom[0].data)
        values = bottom[0].data.reshape(-1)
        idx = _int_indices(self, xp, values, self.k, "embedding index")
        if bool(xp.any(idx.astype(f32) != values)):
            raise self.error("non-integer input to an Embed layer")
        return idx

    def forward(self, bottom, top):
        y = top[0].data.reshape(-1, self.n)
        y[...] = self.blobs[0].data[self._indices(bottom)]
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise self.error("Can't backpropagate to EmbedLayer input.")
        xp = get_array_module(top[0].diff)
        dy = top[0].diff.reshape(-1, self.n)
        if self.param_propagate_down[0]:
            _scatter_add(xp, self.blobs[0].diff, self._indices(bottom), dy)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff += dy.sum(axis=0)


@register("Parameter")
class ParameterLayer(Layer):
    """A learnable blob exposed as a top: the top shares the param's data and diff.

    Shapes: top = ``parameter_param.shape``; float32. The blob starts at zero (no filler, no
    draws from the random stream); load or learn its values. A diff written into the top is the
    param's gradient.

    Fields read (parameter_param): shape (BlobShape).

    Caffe: src/caffe/layers/parameter_layer.cpp (include/caffe/layers/parameter_layer.hpp).
    """

    exact_num_bottom = 0
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        if not self.blobs:
            self.blobs = [Blob(tuple(self.param.parameter_param.shape.dim))]
        self.param_propagate_down = [True]

    def reshape(self, bottom, top):
        _share_whole(top[0], self.blobs[0])

    def forward(self, bottom, top):
        _share_whole(top[0], self.blobs[0])

    def backward(self, top, propagate_down, bottom):
        pass


# ------------------------------------------------------------------------------------------------
# Bias and Scale
# ------------------------------------------------------------------------------------------------
def _param_shape(layer, bottom0, axis, num_axes):
    """Shape of a learned Bias/Scale blob: ``bottom0.shape[axis : axis + num_axes]``."""
    axis = _axis(layer, bottom0, axis)
    if num_axes < -1:
        raise layer.error("num_axes must be non-negative, or -1 to extend to the end of "
                          "bottom[0]")
    if num_axes >= 0 and bottom0.num_axes < axis + num_axes:
        raise layer.error(f"parameter blob's shape extends past bottom[0]'s shape "
                          f"{bottom0.shape} when applied starting with axis {axis}")
    end = bottom0.num_axes if num_axes == -1 else axis + num_axes
    return bottom0.shape[axis:end]


def _broadcast_view(layer, bottom0, operand, axis_param, what):
    """(outer, dim, inner) with which ``operand`` (a blob) broadcasts over ``bottom0``.

    A scalar operand (0 axes) applies everywhere (axis 0); otherwise its dims must equal
    bottom0's from the canonical ``axis_param`` on.
    """
    axis = 0 if operand.num_axes == 0 else _axis(layer, bottom0, axis_param)
    if bottom0.num_axes < axis + operand.num_axes:
        raise layer.error(f"{what} blob's shape {operand.shape} extends past bottom[0]'s shape "
                          f"{bottom0.shape} when applied starting with axis {axis}")
    for i, d in enumerate(operand.shape):
        if bottom0.shape[axis + i] != d:
            raise layer.error(f"dimension mismatch between bottom[0] {bottom0.shape} (axis "
                              f"{axis + i}) and {what} {operand.shape} (axis {i})")
    return (bottom0.count_range(0, axis), operand.count,
            bottom0.count_range(axis + operand.num_axes))


@register("Bias")
class BiasLayer(Layer):
    """Add a bias broadcast over bottom 0: ``top = x + b`` (b learned, or bottom 1).

    Shapes: bottom 0 (d0, ..., dn); b has the dims ``d_axis .. d_{axis+num_axes-1}`` (a 0-axis
    scalar for ``num_axes: 0``); top as bottom 0. float32. In place allowed.
    Params (one bottom only): ``blobs[0]`` b, filled with ``filler`` (default constant 0).
    Backward: bottom 0 gets the top diff; b (param, accumulated; or bottom 1, overwritten) the
    top diff summed over the broadcast axes.

    Fields read (bias_param): axis (1, may be negative), num_axes (1; -1 = to the end; with two
    bottoms the shape of bottom 1 decides), filler.

    Raises:
        CaffeError: axis/num_axes out of range; b's dims not matching bottom 0's.

    Caffe: src/caffe/layers/bias_layer.cpp.
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.bias_param
        if len(bottom) == 1 and not self.blobs:
            self.blobs = [Blob(_param_shape(self, bottom[0], p.axis, p.num_axes))]
            fillers.fill(self.blobs[0], p.filler)
        self.param_propagate_down = [True] * len(self.blobs)

    def reshape(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.view = _broadcast_view(self, bottom[0], bias, self.param.bias_param.axis, "bias")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        bias = bottom[1] if len(bottom) > 1 else self.blobs[0]
        _add_bias(bottom[0], top[0], bias.data, self.view)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        if propagate_down[0] and top[0] is not bottom[0]:
            xp.copyto(bottom[0].diff, top[0].diff)
        if len(bottom) > 1:
            if propagate_down[1]:
                _bias_grad(top[0].diff, bottom[1].diff, self.view, accumulate=False)
        elif self.param_propagate_down[0]:
            _bias_grad(top[0].diff, self.blobs[0].diff, self.view, accumulate=True)


def _add_bias(src, dst, bias, view):
    """``dst = src + bias`` with ``bias`` (dim,) broadcast over the (outer, dim, inner) view."""
    xp = get_array_module(src.data)
    outer, dim, inner = view
    xp.add(src.data.reshape(view), bias.reshape(1, dim, 1), out=dst.data.reshape(view))


def _bias_grad(top_diff, target, view, accumulate):
    """Sum ``top_diff`` over outer and inner into ``target`` (dim,): ``+=`` or ``=``."""
    outer, dim, inner = view
    s = top_diff.reshape(view).sum(axis=2).sum(axis=0)
    if accumulate:
        target += s.reshape(target.shape)
    else:
        target[...] = s.reshape(target.shape)


@register("Scale")
class ScaleLayer(Layer):
    """Multiply bottom 0 by a scale broadcast over it, optionally plus a bias.

    ``top = x * s (+ b)``, with ``s`` learned (one bottom) or given as bottom 1, ``b`` learned.
    Shapes: bottom 0 (d0, ..., dn); s has the dims ``d_axis .. d_{axis+num_axes-1}`` (a 0-axis
    scalar for ``num_axes: 0``); b has s's shape; top as bottom 0. float32. In place allowed
    (the input is kept for the scale's gradient, as in Caffe).
    Params: one bottom: ``blobs[0]`` s (``filler``, default constant 1) and, with
    ``bias_term``, ``blobs[1]`` b (``bias_filler``, default constant 0); two bottoms: only b.
    Backward: bottom 0 gets ``top_diff * s``; s the sum of ``top_diff * x`` over the broadcast
    axes; b the sum of ``top_diff``. Like Caffe, the learned scale's gradient is *overwritten*
    rather than accumulated when the scale covers all of bottom 0 or when nothing precedes
    ``axis`` (outer size 1) while the scale has several values and something follows it.

    Fields read (scale_param): axis (1, may be negative), num_axes (1; -1 = to the end),
    filler, bias_term (false), bias_filler.

    Raises:
        CaffeError: axis/num_axes out of range; s's dims not matching bottom 0's.

    Caffe: src/caffe/layers/scale_layer.cpp (the bias through bias_layer.cpp).
    """

    min_bottom = 1
    max_bottom = 2
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.scale_param
        self.bias_term = p.bias_term
        loaded = bool(self.blobs)
        if len(bottom) == 1 and not loaded:
            self.blobs = [Blob(_param_shape(self, bottom[0], p.axis, p.num_axes))]
            if p.HasField("filler"):
                filler = p.filler
            else:
                filler = caffe_pb2.FillerParameter(type="constant", value=1.0)
            fillers.fill(self.blobs[0], filler)
        if self.bias_term and not loaded:
            num_axes = bottom[1].num_axes if len(bottom) > 1 else p.num_axes
            bias = Blob(_param_shape(self, bottom[0], p.axis, num_axes))
            fillers.fill(bias, p.bias_filler)
            self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)
        self.temp = None

    def reshape(self, bottom, top):
        p = self.param.scale_param
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        self.view = _broadcast_view(self, bottom[0], scale, p.axis, "scale")
        xp = get_array_module(bottom[0].data)
        if top[0] is bottom[0]:
            self.temp = _buffer(self.temp, bottom[0].shape, xp)
        else:
            top[0].reshape(bottom[0].shape)
        if self.bias_term:
            self.bias_view = _broadcast_view(self, bottom[0], self.blobs[-1], p.axis, "bias")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        if top[0] is bottom[0]:
            xp.copyto(self.temp, bottom[0].data)
        scale = bottom[1] if len(bottom) > 1 else self.blobs[0]
        outer, dim, inner = self.view
        xp.multiply(bottom[0].data.reshape(self.view), scale.data.reshape(1, dim, 1),
                    out=top[0].data.reshape(self.view))
        if self.bias_term:
            _add_bias(top[0], top[0], self.blobs[-1].data, self.bias_view)

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(top[0].diff)
        if self.bias_term and self.param_propagate_down[-1]:
            _bias_grad(top[0].diff, self.blobs[-1].diff, self.bias_view, accumulate=True)
        scale_param = len(bottom) == 1
        scale = self.blobs[0] if scale_param else bottom[1]
        outer, dim, inner = self.view
        if (scale_param and self.param_propagate_down[0]) or \
                (not scale_param and propagate_down[1]):
            # The product top_diff * x needs a bottom-sized scratch array. As in Caffe, that is
            # the bottom diff (overwritten below when it is wanted, garbage otherwise, as in
            # Caffe), or in place the saved input itself (no longer needed after this).
            in_place = top[0] is bottom[0]
            x = self.temp if in_place else bottom[0].data
            product = self.temp if in_place else bottom[0].diff
            xp.multiply(top[0].diff, x, out=product)
            sums = product.reshape(self.view).sum(axis=2).sum(axis=0)
            # Caffe accumulates a learned scale's gradient except in two layouts, where its
            # BLAS call writes the scale diff directly (eltwise: the product itself; outer 1 with
            # inner > 1 and several scales: gemv with beta 0). Kept for number-for-number
            # agreement, e.g. with iter_size > 1.
            eltwise = bottom[0].count == scale.count
            overwrite = eltwise or (outer == 1 and inner > 1 and dim > 1)
            if scale_param and not overwrite:
                scale.diff += sums.reshape(scale.shape)
            else:
                scale.diff[...] = sums.reshape(scale.shape)
        if propagate_down[0]:
            xp.multiply(top[0].diff.reshape(self.view), scale.data.reshape(1, dim, 1),
                        out=bottom[0].diff.reshape(self.view))
