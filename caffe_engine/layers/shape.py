"""Shape layers: Flatten and Reshape (a new shape over the same data, no copy), Crop and Tile
(a window of the bottom, or copies of it).

Caffe: src/caffe/layers/<name>_layer.cpp for each (flatten, reshape, crop, tile).
"""
from ..backend import get_array_module
from ._helpers import _axis
from .base import Layer, register


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
        if end < start:     # Blob::count(start, end) CHECK_LE(start, end)
            raise self.error(f"end_axis ({p.end_axis}) comes before axis ({p.axis}) for a "
                             f"{len(b.shape)}-axis blob {tuple(b.shape)}")
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
