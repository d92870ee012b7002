"""Model (hybrid) parallelism of InnerProduct: the output-neuron slices and the group protocol.

PCL-DNN's hybrid parallelism (Das et al., arXiv:1602.06709, section 3, "model parallelism" and
"hybrid parallelism"): the P ranks of a data-parallel run form P/G groups of G consecutive
ranks; rank ``group_rank`` of a group holds slice ``s = group_rank`` of a fully connected
layer's N output neurons (its rows of W and its bias entries), and the group exchanges
activations and output gradients instead of weight gradients. Groups are data parallel with
each other: the slice's gradients are summed over its P/G replicas.

This module holds what the layer side needs and nothing of MPI (``layers`` must not import
``comm``; ``tools/import_graph.py --check`` enforces it):

* :func:`slice_bounds`: which neurons slice ``s`` of ``G`` holds (``numpy.array_split``'s
  convention: the first ``N % G`` slices get one more);
* :class:`GroupCollectives`: the protocol the layer calls, implemented over MPI by
  :class:`caffe_engine.comm.model_parallel.GroupCollectivesMPI` (duck-typed: any object
  with these attributes and methods will do), and here by :class:`LocalGroup` (one rank);
* :func:`slice_param` / :func:`gather_param`: a full param (or solver history of the same
  shape) cut to one slice, and the slices of a group put together again.

Caffe: src/caffe/layers/inner_product_layer.cpp (W is (N, K), or (K, N) with ``transpose``).
"""
from ..errors import CaffeError

WHICH = ("weight", "bias")


def slice_bounds(n, size, index):
    """``(start, stop)`` of slice ``index`` of ``size`` over ``n`` items.

    ``numpy.array_split``'s convention: the first ``n % size`` slices hold ``n // size + 1``
    items, the others ``n // size``; slices may be empty when ``size > n``.

    Raises:
        CaffeError: ``size < 1``, ``index`` outside ``0 .. size-1`` or ``n < 0``.

    Source: PCL-DNN arXiv:1602.06709 section 3 (each node of a group holds N/G output neurons).
    """
    n, size, index = int(n), int(size), int(index)
    if size < 1 or not 0 <= index < size or n < 0:
        raise CaffeError(f"slice_bounds: slice {index} of {size} over {n} items is undefined")
    base, extra = divmod(n, size)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def all_slice_bounds(n, size):
    """``[slice_bounds(n, size, s) for s in range(size)]``."""
    return [slice_bounds(n, size, s) for s in range(size)]


class GroupCollectives:
    """The protocol of a model-parallel group, as the layer calls it (duck-typed).

    Every method is a blocking collective: every rank of the group calls it, in the same order,
    with arrays of the same dtype (float32) and shapes that agree as described. Arrays are
    C-contiguous NumPy (an implementation may also take CuPy arrays and stage them).

    Attributes:
        rank: this rank's place in the group, ``0 .. size-1`` (the slice it holds).
        size: G, the number of ranks of the group.

    Implementations: :class:`LocalGroup` (G = 1) here; over MPI,
    :class:`caffe_engine.comm.model_parallel.GroupCollectivesMPI`.
    """

    rank = 0
    size = 1

    def allgather_rows(self, x, out=None):
        """Every rank's ``x`` (m, k), stacked in group-rank order: (G*m, k) float32.

        ``m`` and ``k`` are the same on every rank. ``out``: an optional C-contiguous (G*m, k)
        array to write into (returned)."""
        raise NotImplementedError

    def alltoall_rows(self, blocks, out=None):
        """Send ``blocks[j]`` to group rank j; return the G arrays received, ``[j]`` from j.

        ``blocks``: G C-contiguous float32 arrays; ``blocks[j]`` on rank i has the shape of
        ``out[i]`` on rank j. ``out``: an optional list of G C-contiguous arrays to receive
        into (``out[rank]`` gets a copy of ``blocks[rank]``); without it, the received arrays
        have the shapes their senders gave them."""
        raise NotImplementedError

    def reduce_scatter_rows(self, x, out=None):
        """``x`` (G*m, k) summed over the group, of which this rank keeps rows
        ``rank*m .. (rank+1)*m``: (m, k) float32 (summation order: the implementation's).
        ``out``: an optional C-contiguous (m, k) array to write into (returned)."""
        raise NotImplementedError

    def allgather_arrays(self, x, axis):
        """Every rank's ``x`` concatenated along ``axis`` in group-rank order; the lengths
        along ``axis`` may differ (uneven slices), the other dims agree. For snapshots and
        :func:`gather_param`; returns a new float32 array."""
        raise NotImplementedError


class LocalGroup(GroupCollectives):
    """A group of one rank (G = 1): every collective is the identity (copies into ``out``)."""

    rank = 0
    size = 1

    def allgather_rows(self, x, out=None):
        return _into(out, x)

    def alltoall_rows(self, blocks, out=None):
        if len(blocks) != 1:
            raise CaffeError(f"alltoall_rows: {len(blocks)} blocks for a group of 1")
        return [_into(None if out is None else out[0], blocks[0])]

    def reduce_scatter_rows(self, x, out=None):
        return _into(out, x)

    def allgather_arrays(self, x, axis):
        return x.copy()


def _into(out, x):
    if out is None:
        return x
    out[...] = x.reshape(out.shape)
    return out


def _check_which(which):
    if which not in WHICH:
        raise CaffeError(f"which must be 'weight' or 'bias', got {which!r}")


def param_slice_axis(transpose, which):
    """The axis of a param along which the output neurons lie: 0 for the bias and for W
    (N, K); 1 for W (K, N) with ``transpose``."""
    _check_which(which)
    return 1 if which == "weight" and transpose else 0


def slice_param(full, n, size, index, transpose, which):
    """A copy of slice ``index`` of ``size`` of a full InnerProduct param (or of solver history
    of the same shape).

    Args:
        full: W (n, K), or (K, n) with ``transpose``, or the bias (n,); float32 NumPy or CuPy.
        n: num_output (N).
        size, index: G and the slice (see :func:`slice_bounds`).
        transpose: the layer's ``inner_product_param.transpose``.
        which: "weight" or "bias".

    Returns:
        A new C-contiguous array: W[start:stop] (n_s, K), W[:, start:stop] (K, n_s) or
        b[start:stop] (n_s,), same dtype and array module as ``full``.

    Raises:
        CaffeError: ``which`` unknown, or ``full`` whose neuron axis is not ``n`` long.

    Source: PCL-DNN arXiv:1602.06709 section 3; Caffe's inner_product_layer.cpp (W's layout).
    """
    axis = param_slice_axis(transpose, which)
    if full.ndim <= axis or full.shape[axis] != n:
        raise CaffeError(f"slice_param: a {which} of shape {tuple(full.shape)} has no axis "
                         f"{axis} of num_output {n} (transpose {bool(transpose)})")
    start, stop = slice_bounds(n, size, index)
    part = full[start:stop] if axis == 0 else full[:, start:stop]
    return part.copy()


def gather_param(group, part, transpose, which):
    """The full param from the slices of every rank of ``group`` (collective: every group rank
    calls it, in the same order as the other collectives).

    Args:
        group: a :class:`GroupCollectives`.
        part: this rank's slice, as :func:`slice_param` made it.
        transpose, which: as for :func:`slice_param`.

    Returns:
        The full array, W (N, K) / (K, N) or b (N,), float32, new.

    Raises:
        CaffeError: ``which`` unknown.
    """
    return group.allgather_arrays(part, param_slice_axis(transpose, which))
