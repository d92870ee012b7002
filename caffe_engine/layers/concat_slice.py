"""Concat and Slice: join bottoms along one axis, and cut one bottom along an axis into tops.

Caffe: src/caffe/layers/concat_layer.cpp, src/caffe/layers/slice_layer.cpp.
"""
from ._helpers import _axis, _share_whole
from .base import Layer, register


def _axis_slice(axis, start, stop):
    return (slice(None),) * axis + (slice(start, stop),)


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
