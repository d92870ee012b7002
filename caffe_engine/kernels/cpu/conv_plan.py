"""The plan a 2-D Convolution layer holds on the CPU: geometry, blocks and tables, made once.

See :mod:`.conv` for the kernels and the layout they share.
"""
import dataclasses

import numpy

from . import conv, gemm
from .conv import MR, MR_NARROW, NR, round_up


def slack_after(a):
    """Floats of the allocation that holds ``a`` (C-contiguous) past ``a``'s last element:
    what a kernel may read beyond it (Blob arrays come with ``Blob.SLACK`` of them)."""
    if not isinstance(a, numpy.ndarray) or not a.flags.c_contiguous:
        return 0
    base = a
    while isinstance(base.base, numpy.ndarray):
        base = base.base
    end = a.__array_interface__["data"][0] + a.nbytes
    base_end = base.__array_interface__["data"][0] + base.nbytes
    return max(0, (base_end - end) // a.itemsize)


#: Floats a kernel may read past a packed or in-place input.
READ_PAST = NR + 16


class Conv2dPlan:
    """The CPU kernels of one 2-D convolution geometry (a :class:`...geometry.ConvGeometry`).

    Made in the layer's ``reshape``: picks the images per chunk and the blocks from ``tuning``,
    builds the offset tables, and draws scratch memory from ``workspace`` (shared by every
    layer of the kernel set, as Caffe shares its column buffer). Arrays are NumPy float32,
    C-contiguous: ``x`` (N, C, H, W), ``y``/``dy`` (N, M, OH, OW), ``w`` (M, C / G, kh, kw),
    ``bias``/``db`` (M,). ``weight_grad`` and ``bias_grad`` accumulate (Caffe's param-gradient
    rule); ``forward`` and ``backward_data`` overwrite.

    ``backward_data_in_place``: ``backward_data`` packs the whole of ``dy`` into the workspace
    (flipped or for col2im) before it writes ``dx``, so ``dx`` may be ``dy``'s memory -- except
    for a pointwise convolution, whose flipped data gradient may read ``dy`` where it is.
    """

    def __init__(self, geometry, tuning, workspace, team):
        g = self.geometry = geometry
        self.tuning = tuning
        self.workspace = workspace
        self.team = team
        self.threads = team.threads
        self.skew = tuning.skew
        self.kc = round_up(tuning.kc, MR)
        self.N, self.C, self.M, self.G = g.num, g.channels, g.num_output, g.group
        self.Cg, self.Mg = self.C // self.G, self.M // self.G
        (self.kh, self.kw), (self.sh, self.sw) = g.kernel, g.stride
        (self.ph, self.pw), (self.dh, self.dw) = g.pad, g.dilation
        (self.H, self.W), (self.OH, self.OW) = g.in_spatial, g.out_spatial
        self.Kg = self.Cg * self.kh * self.kw
        columns = tuning.block_columns
        # The input's packed layout and the blocks of output positions.
        self.Hs = -(-(self.H + 2 * self.ph) // self.sh)
        self.Ws = -(-(self.W + 2 * self.pw) // self.sw)
        # A 1x1, stride-1, unpadded convolution with one image a chunk reads its input as it is
        # (the packed layout is NCHW itself), when the array has slack past its end.
        self.pointwise = (g.kernel == (1, 1) and g.stride == (1, 1) and g.pad == (0, 0)
                          and g.dilation == (1, 1))
        self.backward_data_in_place = not self.pointwise
        # A pointwise convolution with at least 512 outputs, as many as its inputs or more,
        # takes its weight gradient as a plain product per image: the blocked kernel sweeps
        # its C x M partial sum once a block, and at that width the sweep costs more than the
        # products (2 threads, batch 32: ResNet-50's 128 -> 512 at 28x28 15.5 -> 12.5 ms, 256
        # -> 1024 at 14x14 15 -> 12, 512 -> 2048 at 7x7 26 -> 15; MobileNet's 1024 -> 1024 at
        # 7x7 22 -> 10). Narrower ones run as fast or faster through the blocked kernel now
        # that its threads share the blocks evenly (:func:`conv.my_blocks`): 512 -> 128 at
        # 28x28 22 -> 11 ms, 1024 -> 256 at 14x14 66 -> 11, MobileNet's 128 -> 128 at 56x56
        # 19 -> 13.5, 64 -> 256 at 56x56 19 either way.
        self.gemm_weight_grad = (self.pointwise and self.G == 1 and self.M >= self.C
                                 and self.M >= 512)
        self.NB = conv.choose_chunk(self.N, self.C, self.M, self.OH, self.OW, self.Ws, self.Kg,
                                    columns, tuning, in_place=self.pointwise)
        self.blocks = conv.plan_blocks(self.N, self.OH, self.OW, self.Ws, self.NB, columns)
        self.forward_blocks = conv.forward_blocks(self.N, self.OH, self.OW, self.Ws, self.NB,
                                                  columns)
        self.wg_narrow = conv.weight_grad_tile(self.M, self.G)[0] == MR_NARROW
        self.offs = conv.offsets(self.Cg, g.kernel, g.dilation, g.stride, self.Hs, self.Ws,
                                 self.NB, round_up(self.Kg, MR_NARROW if self.wg_narrow else MR))
        # Backward data as a forward convolution of the top diff, where stride 1 and no pad
        # exceeds the dilated kernel's extent - 1.
        flip_pad = tuple(d * (k - 1) - p for k, d, p in zip(g.kernel, g.dilation, g.pad))
        self.flip = (g.stride == (1, 1) and min(flip_pad) >= 0
                     and (tuning.backward_data == "flip"
                          or (tuning.backward_data == "auto" and conv.flip_pays(g))))
        if self.flip:
            self.fph, self.fpw = flip_pad
            self.fHs, self.fWs = self.OH + 2 * self.fph, self.OW + 2 * self.fpw
            fk = self.Mg * self.kh * self.kw
            # a pointwise convolution's top diff is read in place like its input (no pad)
            self.fNB = conv.choose_chunk(self.N, self.M, self.C, self.H, self.W, self.fWs, fk,
                                         columns, tuning, in_place=self.pointwise)
            self.flip_blocks = conv.forward_blocks(self.N, self.H, self.W, self.fWs,
                                                   self.fNB, columns)
            self.flip_offs = conv.offsets(self.Mg, g.kernel, g.dilation, (1, 1), self.fHs,
                                          self.fWs, self.fNB, fk)

    # -- helpers ---------------------------------------------------------------------------
    def _pack(self, slot, x, channels, h, w, ph, pw, sh, sw, hs, ws, nb):
        """``x`` (N, channels, h, w) packed (:func:`conv.pack`) in workspace slot ``slot``,
        then zeroed slack (blocks read up to a micro-kernel width and a row past the end)."""
        size = -(-self.N // nb) * channels * sh * sw * hs * ws * nb
        slack = (NR + ws) * nb + READ_PAST
        xt = self.workspace.get(slot, size + slack)
        self.team.run(conv.pack, x.reshape(-1), xt, self.N, channels, h, w, ph, pw, sh, sw, hs,
                      ws, nb)
        xt[size:size + slack] = 0
        return xt

    def _input(self, x):
        if self.pointwise and self.NB == 1 and slack_after(x) >= READ_PAST:
            return x.reshape(-1)
        return self._pack("conv_in", x, self.C, self.H, self.W, self.ph, self.pw, self.sh,
                          self.sw, self.Hs, self.Ws, self.NB)

    def _flip_input(self, dy):
        """The top diff in the flipped forward's layout: ``dy`` itself for a pointwise
        convolution with one image a chunk (its layout is NCHW, no pad) when it has slack,
        else packed."""
        if self.pointwise and self.fNB == 1 and slack_after(dy) >= READ_PAST:
            return dy.reshape(-1)
        return self._pack("conv_in", dy, self.M, self.OH, self.OW, self.fph, self.fpw, 1, 1,
                          self.fHs, self.fWs, self.fNB)

    def _packed_weights(self, w, rows, cols):
        """``w`` (G, rows, cols) in the micro-kernel's panels (:func:`conv.pack_panels`)."""
        G = self.G
        out = self.workspace.get("conv_w", G * round_up(rows, MR) * cols)
        return conv.pack_panels(w.reshape(G, rows, cols), out)

    def _scratch(self, floats):
        return self.workspace.get("conv_scratch", self.threads * floats), floats

    # -- the kernel interface --------------------------------------------------------------
    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias`` (``bias`` None: no bias)."""
        wp = self._packed_weights(w, self.Mg, self.Kg)
        xt = self._input(x)
        ws, stride = self._scratch(conv.forward_scratch(self.M, self.G,
                                                        self.forward_blocks[2], self.skew))
        self.team.run(conv.forward, xt, self.offs, wp, bias if bias is not None else wp,
                      bias is not None, y.reshape(-1), self.N, self.C, self.M, self.G, self.OH,
                      self.OW, self.Hs, self.Ws, self.sh, self.sw, self.NB, self.Kg,
                      *self.forward_blocks, self.kc, self.skew, ws, stride)

    def backward_data(self, dy, w, dx):
        """``dx`` = the gradient with respect to the input (overwritten)."""
        G, Mg, Cg, kh, kw = self.G, self.Mg, self.Cg, self.kh, self.kw
        if self.flip:
            # dx = correlation of dy (padded by extent - 1 - pad) with the flipped filters
            # W'[g, c, (m, i, j)] = W[g Mg + m, c, kh - 1 - i, kw - 1 - j].
            flipped = w.reshape(G, Mg, Cg, kh, kw)[..., ::-1, ::-1].transpose(0, 2, 1, 3, 4)
            wp = self._packed_weights(flipped, Cg, Mg * kh * kw)
            dyt = self._flip_input(dy)
            ws, stride = self._scratch(conv.forward_scratch(self.C, G, self.flip_blocks[2],
                                                            self.skew))
            self.team.run(conv.forward, dyt, self.flip_offs, wp, wp, False, dx.reshape(-1),
                          self.N, self.M, self.C, G, self.H, self.W, self.fHs, self.fWs, 1, 1,
                          self.fNB, Mg * kh * kw, *self.flip_blocks, self.kc, self.skew, ws,
                          stride)
            return
        wt = w.reshape(G, Mg, self.Kg).transpose(0, 2, 1)
        # (G, Kgpad, Mg), then MR zero rows: col2im's slices start at a channel's first row,
        # any row, and read whole tiles of MR rows
        kgpad = round_up(self.Kg, MR)
        size = G * kgpad * Mg
        wtp = self.workspace.get("conv_w", size + MR * Mg)[:size + MR * Mg]
        wtp[:size].reshape(G, kgpad, Mg)[:, :self.Kg] = wt
        wtp[:size].reshape(G, kgpad, Mg)[:, self.Kg:] = 0
        wtp[size:] = 0
        # The top diff in the wide numbering of the input's layout: (chunks, M, OH, Ws, NB).
        dyt = self._pack("conv_in", dy, self.M, self.OH, self.OW, 0, 0, 1, 1, self.OH, self.Ws,
                         self.NB)
        size = (-(-self.N // self.NB) * self.C * self.sh * self.sw * self.Hs * self.Ws
                * self.NB)
        dxt = self.workspace.get("conv_grad", size + (NR + self.Ws) * self.NB + NR)
        ws, stride = self._scratch(conv.col2im_scratch(self.blocks[2], self.kc, self.skew))
        self.team.run(conv.backward_data_col2im, dyt, self.offs, wtp, dxt, self.N, self.C,
                      self.M, G, self.OH, self.Hs, self.Ws, self.sh, self.sw, self.NB, self.Kg,
                      kh, kw, *self.blocks, self.kc, self.skew, ws, stride)
        self.team.run(conv.unpack, dxt, dx.reshape(-1), self.N, self.C, self.H, self.W,
                      self.ph, self.pw, self.sh, self.sw, self.Hs, self.Ws, self.NB)

    def weight_grad(self, x, dy, dw):
        """``dw +=`` the gradient with respect to the weights."""
        if self.gemm_weight_grad:
            # dW (M x C) += dY[n] (M x P) X[n]^T, image by image (Caffe's order of images)
            P = self.OH * self.OW
            gemm.sum_products_bt(dy.reshape(self.N, self.M, P), x.reshape(self.N, self.C, P),
                                 dw.reshape(self.M, self.C), self.tuning, self.workspace,
                                 self.team)
            return
        xt = self._input(x)
        ws, stride = self._scratch(conv.weight_grad_scratch(self.C, self.M, self.G, self.kh,
                                                            self.kw, self.blocks[2]))
        self.team.run(conv.weight_grad, xt, self.offs, dy.reshape(-1), self.N, self.C, self.M,
                      self.G, self.OH, self.OW, self.Hs, self.Ws, self.sh, self.sw, self.NB,
                      self.Kg, self.wg_narrow, *self.blocks, ws, stride)
        conv.weight_grad_sum(dw.reshape(-1), self.M, self.G, self.Kg, self.wg_narrow,
                             self.threads, ws, stride)

    def bias_grad(self, dy, db):
        """``db += dy`` summed over images and positions."""
        self.team.run(conv.bias_grad, dy.reshape(-1), db, self.N, self.M, self.OH * self.OW)


#: Floats of packed input (the forward's, or the top diff's for a flipped data gradient) one
#: plan call may hold in the workspace; a layer whose whole batch would take more runs in
#: sub-batches of images (:class:`SubBatchPlan`).
PACK_LIMIT = 1 << 24


def packed_per_image(plan):
    """Floats per image that a :class:`Conv2dPlan`'s calls pack into the workspace: the input
    (forward, weight gradient; none for a 1x1 convolution reading it in place), or the top diff
    (data gradient; with col2im's array beside it unless flipped)."""
    in_place = plan.pointwise and plan.NB == 1
    forward = 0 if in_place else plan.C * plan.sh * plan.sw * plan.Hs * plan.Ws
    if plan.flip:
        backward = plan.M * plan.fHs * plan.fWs
    else:
        backward = plan.M * plan.OH * plan.Ws + plan.C * plan.sh * plan.sw * plan.Hs * plan.Ws
    return max(forward, backward)


def make(geometry, tuning, workspace, team, limit=None):
    """A :class:`Conv2dPlan` for ``geometry``, or where its whole batch would pack more than
    ``limit`` floats (default :data:`PACK_LIMIT`) a :class:`SubBatchPlan` running it a few
    images at a time: VGG-16's conv1_2 at batch 32 packs 418 MB of input at once, and the
    workspace kept 526 MB after a training iteration (189 MB in sub-batches; its peak RSS 5270
    -> 4935 MB, the time per iteration within the machine's noise)."""
    limit = PACK_LIMIT if limit is None else limit
    plan = Conv2dPlan(geometry, tuning, workspace, team)
    per_image = packed_per_image(plan)
    if plan.N <= 1 or plan.N * per_image <= limit:
        return plan
    sub = max(plan.NB, limit // per_image // plan.NB * plan.NB)
    if sub >= plan.N:
        return plan
    return SubBatchPlan(geometry, sub, lambda g: Conv2dPlan(g, tuning, workspace, team))


class SubBatchPlan:
    """A convolution plan run over consecutive sub-batches of ``sub`` images (the last one
    shorter), each by a plan made for that many: the same interface and results as one plan
    over the batch (``weight_grad`` and ``bias_grad`` accumulate sub-batch after sub-batch,
    Caffe's order of images), with a workspace the size of a sub-batch's."""

    def __init__(self, geometry, sub, make_plan):
        self.geometry = geometry
        N = geometry.num
        self.slices = [(n, min(n + sub, N)) for n in range(0, N, sub)]
        sizes = {b - a for a, b in self.slices}
        self.plans = {s: make_plan(dataclasses.replace(geometry, num=s)) for s in sizes}
        # a sub-batch's dy and dx are the same images: in place where each plan is
        self.backward_data_in_place = all(p.backward_data_in_place for p in self.plans.values())

    def forward(self, x, w, bias, y):
        """``y = conv(x, w) + bias``, sub-batch by sub-batch."""
        for a, b in self.slices:
            self.plans[b - a].forward(x[a:b], w, bias, y[a:b])

    def backward_data(self, dy, w, dx):
        """``dx`` (overwritten), sub-batch by sub-batch."""
        for a, b in self.slices:
            self.plans[b - a].backward_data(dy[a:b], w, dx[a:b])

    def weight_grad(self, x, dy, dw):
        """``dw +=``, sub-batch by sub-batch."""
        for a, b in self.slices:
            self.plans[b - a].weight_grad(x[a:b], dy[a:b], dw)

    def bias_grad(self, dy, db):
        """``db +=``, sub-batch by sub-batch."""
        for a, b in self.slices:
            self.plans[b - a].bias_grad(dy[a:b], db)
