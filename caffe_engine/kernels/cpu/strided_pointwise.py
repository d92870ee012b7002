"""A strided 1x1 convolution (ResNet's downsampling projections and first bottleneck layers:
``kernel_size: 1 stride: 2``) as a copy of the input positions it reads, then an unstrided one.

Such a layer reads one input position in ``sh * sw``; the general plan (:mod:`.conv_plan`)
packs all of them into its stride-phase layout and multiplies through offset tables, which ran
ResNet-50's six of them at 80-140 GFLOP/s where their unstrided siblings reach 120-180. Here the
positions read are gathered into an (N, C, OH, OW) array, and an unstrided 1x1 plan (a plain
product per image, reading that array in place) does the rest: the forward and the weight
gradient on the gathered input; the data gradient into a gathered-shape array, scattered into
the bottom diff with zeros at the positions no output reads (Caffe's col2im of a 1x1 kernel
writes exactly that).

Arrays as :class:`.conv_plan.Conv2dPlan`'s: ``x``/``dx`` (N, C, H, W), ``y``/``dy`` (N, M, OH,
OW), ``w``/``dw`` (M, C, 1, 1), float32, C-contiguous.
"""
import dataclasses

from numba import njit

from .conv_plan import READ_PAST, Conv2dPlan

#: Planes below this many floats are copied on the caller's thread alone.
PARALLEL_MIN = 1 << 15


def is_strided_pointwise(geometry):
    """Whether a 2-D convolution is 1x1, unpadded, undilated, ungrouped and strided."""
    g = geometry
    return (len(g.kernel) == 2 and g.kernel == (1, 1) and g.pad == (0, 0)
            and g.dilation == (1, 1) and g.group == 1 and g.stride != (1, 1))


@njit(cache=True, nogil=True)
def _gather(x, xs, planes, H, W, OH, OW, sh, sw, t, parts):
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        for i in range(OH):
            src = (p * H + i * sh) * W
            dst = (p * OH + i) * OW
            for j in range(OW):
                xs[dst + j] = x[src + j * sw]


@njit(cache=True, nogil=True)
def _scatter(dxs, dx, planes, H, W, OH, OW, sh, sw, t, parts):
    for p in range(planes * t // parts, planes * (t + 1) // parts):
        base = p * H * W
        for k in range(H * W):
            dx[base + k] = 0.0
        for i in range(OH):
            dst = base + i * sh * W
            src = (p * OH + i) * OW
            for j in range(OW):
                dx[dst + j * sw] = dxs[src + j]


class StridedPointwisePlan:
    """The CPU kernels of one :func:`is_strided_pointwise` geometry, with the interface of
    :class:`.conv_plan.Conv2dPlan` (``forward`` and ``backward_data`` overwrite, ``weight_grad``
    and ``bias_grad`` accumulate), through an unstrided plan on the gathered positions."""

    #: input and output never have one shape (the stride is more than 1)
    backward_data_in_place = False

    def __init__(self, geometry, tuning, workspace, team):
        g = self.geometry = geometry
        self.workspace, self.team = workspace, team
        (self.H, self.W), (self.OH, self.OW) = g.in_spatial, g.out_spatial
        (self.sh, self.sw) = g.stride
        self.planes = g.num * g.channels
        self.size = self.planes * self.OH * self.OW
        self.parts = None if self.size >= PARALLEL_MIN else 1
        inner = dataclasses.replace(g, in_spatial=g.out_spatial, stride=(1, 1))
        self.inner = Conv2dPlan(inner, tuning, workspace, team)

    def _buffer(self):
        # the gathered array, with the slack the unstrided plan may read past it
        flat = self.workspace.get("conv_strided", self.size + READ_PAST)
        return flat[:self.size].reshape(self.geometry.num, self.geometry.channels, self.OH,
                                        self.OW)

    def _geometry_args(self):
        return self.planes, self.H, self.W, self.OH, self.OW, self.sh, self.sw

    def _gathered(self, x):
        xs = self._buffer()
        self.team.run(_gather, x.reshape(-1), xs.reshape(-1), *self._geometry_args(),
                      parts=self.parts)
        return xs

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: no bias)."""
        self.inner.forward(self._gathered(x), w, bias, y)

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        dxs = self._buffer()
        self.inner.backward_data(dy, w, dxs)
        self.team.run(_scatter, dxs.reshape(-1), dx.reshape(-1), *self._geometry_args(),
                      parts=self.parts)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights."""
        # gathered again: the workspace slot the forward used is every layer's in between
        # (keeping a gathered copy per layer would cost a quarter of its input's memory)
        self.inner.weight_grad(self._gathered(x), dy, dw)

    def bias_grad(self, dy, db):
        """``db +=`` ``dy`` summed over images and positions."""
        self.inner.bias_grad(dy, db)
