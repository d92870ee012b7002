"""SPP: spatial pyramid pooling, one Pooling layer per level.

Caffe: src/caffe/layers/spp_layer.cpp.
"""
from ..backend import get_array_module
from ..blob import Blob
from ..proto import caffe_pb2
from .base import Layer, register
from .pooling import PoolingLayer


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
