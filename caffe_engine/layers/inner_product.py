"""InnerProduct: the fully connected layer, on the kernel set's GEMM; optionally model parallel.

Caffe: src/caffe/layers/inner_product_layer.cpp. Model (hybrid) parallelism over a group of
ranks: PCL-DNN, Das et al., arXiv:1602.06709, section 3 (see :mod:`.model_parallel`).
"""
from .. import fillers, kernels
from ..backend import get_array_module
from ..blob import Blob
from . import scratch
from .base import Layer, register
from .model_parallel import all_slice_bounds, gather_param, slice_param


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

    Model parallel (:meth:`set_model_parallel`, group size G > 1): ``blobs`` hold this rank's
    slice s of the N output neurons, (n_s, K) / (K, n_s) and (n_s,); the top keeps its full
    shape (..., N). Forward: X_g = allgather(X) (G*M, K); Y_s = X_g W_s^T + b_s (G*M, n_s);
    all-to-all puts this rank's M rows of every slice in its top. Backward: all-to-all of the
    top diffs gives dY_s (G*M, n_s); dW_s += dY_s^T X_g, db_s += column sums of dY_s (this
    group's samples only: the replicas' sum is the solver's); the bottom diff is the
    reduce-scatter (sum) of dY_s W_s (G*M, K) over the group.

    Raises:
        CaffeError: num_output missing; a later bottom whose ``count(axis)`` differs from K;
            see :meth:`set_model_parallel`.

    Caffe: src/caffe/layers/inner_product_layer.cpp.
    """

    exact_num_bottom = 1
    exact_num_top = 1
    _group = None           # the GroupCollectives once sliced (G > 1), else None

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        self.num_output = p.num_output
        if self.num_output <= 0:
            raise self.error("num_output must be specified and > 0")
        self.full_num_output = self.num_output
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

    # -- model parallelism ------------------------------------------------------------------
    @property
    def model_parallel(self):
        """The :class:`~.model_parallel.GroupCollectives` this layer is sliced over, or None
        (plain layer, G = 1)."""
        return self._group

    def set_model_parallel(self, group):
        """Hold only slice ``group.rank`` of the output neurons from now on (G = ``group.size``).

        Called after setup, before the first forward, with the full params in ``blobs`` (the
        same values on every rank of the group). ``blobs`` become new Blob objects holding
        copies of the slice (:func:`.model_parallel.slice_param`); ``full_num_output`` stays N.
        ``group`` None or of size 1: the plain layer (only before slicing). The same group
        again: nothing happens.

        Raises:
            CaffeError (one line): a second, different group after slicing; G > num_output;
                param blobs whose shapes are not this layer's.

        Source: PCL-DNN arXiv:1602.06709 section 3.
        """
        size = 1 if group is None else int(group.size)
        if self._group is not None:
            if group is self._group:
                return
            raise self.error(f"already model parallel over a group of {self._group.size}; "
                             f"cannot change it to a group of {size}")
        if size == 1:
            return
        n = self.full_num_output
        if size > n:
            raise self.error(f"model parallel group of {size} ranks is larger than "
                             f"num_output {n}")
        which = ("weight", "bias")
        sliced = []
        for blob, kind in zip(self.blobs, which):
            part = slice_param(blob.data, n, size, group.rank, self.transpose, kind)
            new = Blob(part.shape, xp=get_array_module(part))
            new.data[...] = part
            sliced.append(new)
        self.blobs = sliced
        self._group = group
        self._bounds = all_slice_bounds(n, size)
        self._x_group = None

    def gather_params(self, diff=False):
        """The full params (W, then b), gathered from the group's slices: a list of new float32
        arrays of the plain layer's shapes. Collective over the group (every group rank calls
        it); without a group, copies of the blobs. ``diff``: gather the diffs instead (this
        group's sums, not yet summed over the replicas)."""
        arrays = [b.diff if diff else b.data for b in self.blobs]
        if self._group is None:
            return [a.copy() for a in arrays]
        return [gather_param(self._group, a, self.transpose, kind)
                for a, kind in zip(arrays, ("weight", "bias"))]

    # -- the contract -----------------------------------------------------------------------
    def reshape(self, bottom, top):
        axis = bottom[0].canonical_axis(self.param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.k:
            raise self.error(f"input size incompatible with inner product parameters: "
                             f"bottom {bottom[0].shape} gives K = {k}, weights expect {self.k}")
        self.m = bottom[0].count_range(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.num_output,))
        self.kernels = kernels.for_array(bottom[0].data)
        if self._group is not None:
            shape = (self._group.size * self.m, self.k)
            if self._x_group is None or self._x_group.shape != shape:
                xp = get_array_module(bottom[0].data)
                self._x_group = xp.empty(shape, bottom[0].data.dtype)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        if self._group is None:
            self._affine(x, y)
        else:
            self._forward_group(x, y)

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.m, self.num_output)
        ppd = getattr(self, "param_propagate_down", [True] * len(self.blobs))
        need_w = ppd[0]
        need_b = self.bias_term and ppd[1]
        if self._group is not None:
            return self._backward_group(dy, need_w, need_b, propagate_down[0], bottom)
        x = bottom[0].data.reshape(self.m, self.k)
        self._param_grads(x, dy, need_w, need_b)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.m, self.k)
            self.kernels.matmul(dy, self.blobs[0].data, dx, trans_b=self.transpose)

    # -- the products, shared by the plain and the model-parallel layer --------------------
    def _affine(self, x, y):
        """``y = x W^T + b`` for x (rows, K), y (rows, n) with this rank's W and b."""
        self.kernels.matmul(x, self.blobs[0].data, y, trans_b=not self.transpose)
        if self.bias_term:
            y += self.blobs[1].data

    def _param_grads(self, x, dy, need_w, need_b):
        """``dW += dy^T x`` (or ``x^T dy`` with transpose), ``db += sum(dy, rows)``."""
        if need_w:
            if self.transpose:
                self.kernels.matmul(x, dy, self.blobs[0].diff, accumulate=True, trans_a=True)
            else:
                self.kernels.matmul(dy, x, self.blobs[0].diff, accumulate=True, trans_a=True)
        if need_b:
            self.blobs[1].diff += dy.sum(axis=0)

    # -- the model-parallel data flow (PCL-DNN section 3) ----------------------------------
    def _column_blocks(self, like, slot):
        """G C-contiguous (M, n_j) arrays, one per slice j, viewing one scratch buffer."""
        flat = scratch.get(get_array_module(like), (self.m * self.num_output,), slot)
        blocks, at = [], 0
        for start, stop in self._bounds:
            count = self.m * (stop - start)
            blocks.append(flat[at:at + count].reshape(self.m, stop - start))
            at += count
        return blocks

    def _row_blocks(self, a):
        """The G row blocks (M, ...) of a (G*M, ...) array: views."""
        m = self.m
        return [a[j * m:(j + 1) * m] for j in range(self._group.size)]

    def _forward_group(self, x, y):
        """Allgather the bottoms, this slice's product, all-to-all of the rows."""
        group = self._group
        x_group = group.allgather_rows(x, out=self._x_group)
        start, stop = self._bounds[group.rank]
        y_slice = scratch.get(get_array_module(x), (x_group.shape[0], stop - start),
                              "ip_model_parallel_y")
        self._affine(x_group, y_slice)
        received = group.alltoall_rows(self._row_blocks(y_slice),
                                       out=self._column_blocks(x, "ip_model_parallel_cols"))
        for (start, stop), block in zip(self._bounds, received):
            y[:, start:stop] = block

    def _backward_group(self, dy, need_w, need_b, need_x, bottom):
        """All-to-all of the top diffs, this slice's param diffs, reduce-scatter of dX."""
        if not (need_w or need_b or need_x):
            return
        group, x_group = self._group, self._x_group
        sent = self._column_blocks(dy, "ip_model_parallel_cols")
        for (start, stop), block in zip(self._bounds, sent):
            block[...] = dy[:, start:stop]
        start, stop = self._bounds[group.rank]
        xp = get_array_module(dy)
        dy_slice = scratch.get(xp, (x_group.shape[0], stop - start), "ip_model_parallel_y")
        group.alltoall_rows(sent, out=self._row_blocks(dy_slice))
        self._param_grads(x_group, dy_slice, need_w, need_b)
        if need_x:
            dx_group = scratch.get(xp, x_group.shape, "ip_model_parallel_dx")
            self.kernels.matmul(dy_slice, self.blobs[0].data, dx_group, trans_b=self.transpose)
            group.reduce_scatter_rows(dx_group, out=bottom[0].diff.reshape(self.m, self.k))
