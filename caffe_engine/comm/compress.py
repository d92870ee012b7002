"""Gradient compression for the bucket allreduce: ``none``, ``fp16``, ``topk``, ``gtopk``.

A :class:`Compression` holds the settings (method, density, error feedback); a
:class:`BucketCompressor` (one per gradient bucket, :class:`~.buckets.GradientSync` makes them)
holds that bucket's residual and runs the compressed sum of one flat float32 buffer over the
ranks, in place, through an :class:`Exchange` (MPI point-to-point on the communicator's own
duplicate, counting every byte it sends and receives). The communicator runs it like a dense
allreduce, on its progress thread
(:meth:`.communicator.MPICommunicator.allreduce_compressed_async_`), so compressed buckets
still overlap backward. The transfers follow their own schedule whatever ``--comm`` is (the
binary tree of :mod:`.tree` for ``fp16`` and ``gtopk``, all-to-all for ``topk``).

Methods (``n`` floats in a bucket, ``k = ceil(density * n)``, at least 1, at most n):

``none``
    Not handled here: :class:`~.buckets.GradientSync` keeps the dense path, untouched.
``fp16``
    FireCaffe's binary tree, whole bucket per message, float16 on the wire. Rounding to float16
    happens exactly where a value goes onto the wire, and nowhere else: (1) a leaf's own
    gradient; (2) an inner rank's partial sum (its own float32 gradient, *not* rounded, plus its
    children's float16 partial sums widened to float32, added in float32 in child order) before
    it goes up; (3) the root's total, once, before the broadcast — and the root keeps the rounded
    total too, so every rank ends with the same bits. The mean's ``* float32(1/P)`` is applied
    after, in float32. Values beyond float16's range (65504) become inf; below 6e-8 they flush
    to zero.
``topk`` (Shi et al.'s Top-k S-SGD)
    Each rank selects the k entries of largest magnitude (of its gradient plus its residual with
    error feedback), sends its sparse set to every other rank (all-gather, ``P - 1`` messages of
    ``8 k`` bytes), and every rank sums the P sets into a dense buffer in rank order (rank 0's
    values, then + rank 1's, ...: the parameter server's order).
``gtopk`` (Shi et al.'s gTop-k S-SGD, arXiv:1901.04359)
    Up the binary tree (:func:`.tree.tree_children`), each rank merges its own sparse set with its
    children's (sum on equal indices: own + child 1 + child 2, the dense tree's order), keeps the
    global top k of the union, and sends those k up; the root's final set is broadcast down the
    tree, and every rank's buffer becomes that sparse set (zeros elsewhere). Entries a rank
    selected but that are not in the final set go back into its residual.

Wire format of a sparse set (``topk``, ``gtopk``): one message of ``8 k`` bytes, an int32 array
of ``2 k`` words: the k indices (int32, ascending, into the bucket) then the k values (float32
bit patterns). Every message of one bucket has the same size on every rank (all ranks have the
same n, hence the same k), so receives are posted with exact sizes.

Selection (:func:`topk_indices`): the k largest ``|v|``; ties at the threshold go to the lowest
indices; NaN counts as larger than everything. Deterministic, O(n) (``numpy.partition``).

Error feedback (default on): per bucket, a float32 residual of n entries is kept on each rank:
``residual += grad``; select from ``residual``; the selected values are sent and their residual
entries set to 0 (``gtopk``: those not in the global set are put back). Off: the unselected
entries are dropped. When k = n (density 1.0) every entry is sent and the residual is identically
zero, so it is neither kept nor added (this keeps ``-0.0`` gradients bit for bit).

Density 1.0: ``topk`` sums in rank order, so it equals ``--comm ps`` bit for bit (and ``tree``
for P <= 3, where the tree's order is the rank order); ``gtopk`` sums in the tree's order, so it
equals ``--comm tree`` bit for bit. The two agree within float32 rounding (bitwise for P <= 3).

Determinism: selection, merge order and topology are fixed; every rank ends with the root's (or
the same rank-ordered) bits; same seed, same P, same bits.
"""
import math

import numpy

from ..errors import CaffeError
from .tree import tree_children, tree_parent

METHODS = ("none", "fp16", "topk", "gtopk")
DEFAULT_DENSITY = 0.001

TAG_TOPK = 41
TAG_GTOPK_UP = 42
TAG_GTOPK_DOWN = 43
TAG_FP16_UP = 44
TAG_FP16_DOWN = 45

#: Bytes of one sparse entry on the wire: an int32 index and a float32 value.
ENTRY_BYTES = 8


# --------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------
def check_method(method, what="compress"):
    """``method`` if it is one of :data:`METHODS`, else a one-line CaffeError."""
    if method not in METHODS:
        raise CaffeError(f"{what} must be none, fp16, topk or gtopk, got '{method}'")
    return method


def check_density(density, what="density"):
    """``density`` as a float in (0, 1] (a float32 from a prototxt read back at 7 digits).

    Raises:
        CaffeError: not a number or outside (0, 1] (one line).
    """
    try:
        value = float(density)
    except (TypeError, ValueError):
        raise CaffeError(f"{what} must be a number in (0, 1], got {density!r}") from None
    if not 0.0 < value <= 1.0:
        raise CaffeError(f"{what} must be in (0, 1], got {density!r}")
    return float(f"{value:.7g}")


def k_for(count, density):
    """Entries kept of ``count``: ceil(density * count), at least 1, at most ``count``."""
    if count <= 0:
        return 0
    return max(1, min(int(count), math.ceil(round(density * count, 6))))


class Compression:
    """The settings of a run: ``method`` (:data:`METHODS`), ``density``, ``error_feedback``.

    Raises:
        CaffeError: an unknown method or a density outside (0, 1] (one line).
    """

    def __init__(self, method="none", density=DEFAULT_DENSITY, error_feedback=True):
        self.method = check_method(method)
        self.density = check_density(density)
        self.error_feedback = bool(error_feedback)

    @property
    def sparse(self):
        return self.method in ("topk", "gtopk")

    def for_bucket(self, count, residual=None):
        """A :class:`BucketCompressor` for a bucket of ``count`` floats (``residual``: one
        carried over, else zeros)."""
        return BucketCompressor(self, count, residual)

    def describe(self):
        """``"gtopk, density 0.001, error feedback on"`` (``"fp16"``, ``"none"``)."""
        if not self.sparse:
            return self.method
        return (f"{self.method}, density {self.density:g}, error feedback "
                f"{'on' if self.error_feedback else 'off'}")

    def __eq__(self, other):
        return isinstance(other, Compression) and (self.method, self.density,
                                                   self.error_feedback) == (
            other.method, other.density, other.error_feedback)

    def __repr__(self):
        return f"<Compression {self.describe()}>"


def from_param(param, method=None, density=None, error_feedback=None):
    """The settings of a run: the solver's ``comm_param`` block (engine-only), overridden by the
    arguments that are not None (the command-line flags). None when the result is ``none``.

    Raises:
        CaffeError: a bad method or density, from either source (one line).
    """
    block = param.comm_param if param is not None and param.HasField("comm_param") else None
    m = method if method is not None else (block.compress if block is not None else "none")
    d = density if density is not None else (block.density if block is not None
                                             else DEFAULT_DENSITY)
    e = error_feedback if error_feedback is not None else (
        block.error_feedback if block is not None else True)
    where = "comm_param" if method is None and block is not None else "--comm_compress"
    check_method(m, f"{where}: compress" if where == "comm_param" else where)
    check_density(d, "comm_param: density" if density is None and block is not None
                  else "--comm_density")
    settings = Compression(m, d, e)
    return None if settings.method == "none" else settings


# --------------------------------------------------------------------------------------------
# NumPy reference pieces (no MPI)
# --------------------------------------------------------------------------------------------
def topk_indices(values, k):
    """Indices (int32, ascending) of the ``k`` entries of largest magnitude of ``values``.

    Ties at the k-th magnitude go to the lowest indices; NaN is larger than everything.
    """
    values = numpy.asarray(values).reshape(-1)
    n = values.size
    if k >= n:
        return numpy.arange(n, dtype=numpy.int32)
    if k <= 0:
        return numpy.empty(0, numpy.int32)
    mag = numpy.abs(values)
    nan = numpy.isnan(mag)
    if nan.any():
        mag[nan] = numpy.inf
    threshold = numpy.partition(mag, n - k)[n - k]     # the k-th largest magnitude
    above = numpy.flatnonzero(mag > threshold)
    ties = numpy.flatnonzero(mag == threshold)[:k - above.size]
    picked = numpy.concatenate([above, ties])
    picked.sort()
    return picked.astype(numpy.int32)


def merge_sparse(parts):
    """Sum sparse sets on equal indices, in the order of ``parts``.

    Args:
        parts: list of (indices int32 ascending unique, values float32).

    Returns:
        (indices, values): the union (ascending) and, at each index, the first part's value
        plus the next parts' values in order (float32 adds; a value is copied, not added to
        zero, where it comes first, so -0.0 stays -0.0).
    """
    if len(parts) == 1:
        return parts[0]
    allidx = numpy.concatenate([p[0] for p in parts])
    union, inverse = numpy.unique(allidx, return_inverse=True)
    out = numpy.zeros(union.size, numpy.float32)
    seen = numpy.zeros(union.size, bool)
    start = 0
    for idx, vals in parts:
        pos = inverse[start:start + idx.size]
        start += idx.size
        fresh = ~seen[pos]
        out[pos[fresh]] = vals[fresh]
        old = pos[~fresh]
        out[old] = out[old] + vals[~fresh]
        seen[pos] = True
    return union.astype(numpy.int32), out


def merge_topk(parts, k):
    """:func:`merge_sparse` of ``parts`` then the top ``k`` of the union (gTop-k's merge)."""
    idx, vals = merge_sparse(parts)
    keep = topk_indices(vals, k)
    if keep.size == idx.size:
        return idx, vals
    return idx[keep], vals[keep]


def densify(flat, idx, vals):
    """Write the sparse set into ``flat``: zeros, then ``vals`` at ``idx``."""
    if idx.size == flat.size:   # every index (ascending): the values are the buffer
        flat[...] = vals
        return flat
    flat[...] = 0
    flat[idx] = vals
    return flat


def pack(idx, vals, out=None):
    """The wire form of a sparse set: int32 array of ``2 k`` words (indices, then value bits)."""
    k = idx.size
    out = numpy.empty(2 * k, numpy.int32) if out is None else out
    out[:k] = idx
    out[k:] = vals.view(numpy.int32)
    return out


def unpack(wire):
    """(indices, values) of a wire message (views into it)."""
    k = wire.size // 2
    return wire[:k], wire[k:].view(numpy.float32)


def gtopk_reference(sets, k, branching=2):
    """The global set gTop-k computes from every rank's local sparse set (``sets`` in rank
    order), merging up the heap tree as :meth:`BucketCompressor._gtopk` does over MPI."""
    size = len(sets)

    def up(rank):
        parts = [sets[rank]] + [up(c) for c in tree_children(rank, size, branching)]
        return merge_topk(parts, k) if len(parts) > 1 else parts[0]

    return up(0)


def fp16_reference(buffers, branching=2):
    """The float32 sum the fp16 tree computes from every rank's float32 buffer (rank order),
    with the same rounding points as :meth:`BucketCompressor._fp16` (see the module docstring)."""
    size = len(buffers)

    def up(rank):
        acc = numpy.array(buffers[rank], numpy.float32)
        for c in tree_children(rank, size, branching):
            numpy.add(acc, up(c).astype(numpy.float32), out=acc)
        return acc.astype(numpy.float16)

    return up(0).astype(numpy.float32)


# --------------------------------------------------------------------------------------------
# Transfers
# --------------------------------------------------------------------------------------------
class Exchange:
    """MPI point-to-point over one mpi4py communicator, counting bytes and messages.

    Every buffer goes as ``MPI.BYTE`` (its exact bytes: int32 / float32 / float16 words).
    ``comm`` None (a world of one) allows no transfer.
    """

    def __init__(self, comm, MPI):
        self.comm, self.MPI = comm, MPI
        self.sent = self.received = self.messages = 0

    def _spec(self, arr):
        return [arr.view(numpy.uint8), self.MPI.BYTE]

    def isend(self, arr, dest, tag):
        self.sent += arr.nbytes
        self.messages += 1
        return self.comm.Isend(self._spec(arr), dest=dest, tag=tag)

    def send(self, arr, dest, tag):
        self.sent += arr.nbytes
        self.messages += 1
        self.comm.Send(self._spec(arr), dest=dest, tag=tag)

    def irecv(self, arr, source, tag):
        self.received += arr.nbytes
        return self.comm.Irecv(self._spec(arr), source=source, tag=tag)

    def recv(self, arr, source, tag):
        self.received += arr.nbytes
        self.comm.Recv(self._spec(arr), source=source, tag=tag)

    def waitall(self, requests):
        if requests:
            self.MPI.Request.Waitall(requests)


# --------------------------------------------------------------------------------------------
# One bucket
# --------------------------------------------------------------------------------------------
class BucketCompressor:
    """The compressed sum of one bucket's buffer over the ranks, with its residual.

    Attributes:
        settings: the :class:`Compression`.
        count, k: the bucket's floats and the entries sent (``count`` for fp16).
        residual: float32 array of ``count`` (error feedback with k < count), else None.
        sent, received, messages: this rank's bytes and messages of the last run.
        selected: the last run's local selection (indices) — for tests.
    """

    def __init__(self, settings, count, residual=None):
        self.settings = settings
        self.count = int(count)
        self.k = k_for(self.count, settings.density) if settings.sparse else self.count
        keep = settings.sparse and settings.error_feedback and self.k < self.count
        if keep:
            self.residual = (numpy.zeros(self.count, numpy.float32) if residual is None
                             else numpy.array(residual, numpy.float32).reshape(-1))
        else:
            self.residual = None
        self.sent = self.received = self.messages = 0
        self.selected = None

    # -- the parts ---------------------------------------------------------------------------
    def select(self, flat):
        """This rank's sparse set from ``flat`` (its gradient; plus the residual, which then
        loses the selected values). Returns (indices, values)."""
        if self.residual is not None:
            acc = self.residual
            numpy.add(acc, flat, out=acc)
        else:
            acc = flat
        idx = topk_indices(acc, self.k)
        vals = acc[idx]                  # a copy (fancy indexing)
        if self.residual is not None:
            acc[idx] = 0
        self.selected = idx
        return idx, vals

    def give_back(self, idx, vals, global_idx):
        """gTop-k: the entries this rank sent that are not in the global set return to its
        residual (nothing without error feedback)."""
        if self.residual is None or idx.size == 0:
            return
        lost = ~numpy.isin(idx, global_idx, assume_unique=True)
        self.residual[idx[lost]] = vals[lost]

    # -- the run -----------------------------------------------------------------------------
    def allreduce_sum_(self, comm, MPI, rank, size, flat):
        """Replace ``flat`` (host float32, this rank's gradient) by the compressed sum over the
        ranks; every rank ends with the same bits. ``comm`` None needs ``size`` 1."""
        ex = Exchange(comm, MPI)
        method = self.settings.method
        if method == "fp16":
            self._fp16(ex, rank, size, flat)
        elif method == "topk":
            self._topk(ex, rank, size, flat)
        elif method == "gtopk":
            self._gtopk(ex, rank, size, flat)
        else:
            raise CaffeError(f"compressed allreduce: method '{method}' has no compressed path")
        self.sent, self.received, self.messages = ex.sent, ex.received, ex.messages
        return flat

    def _fp16(self, ex, rank, size, flat):
        n = flat.size
        children = tree_children(rank, size)
        parent = tree_parent(rank)
        wires = [numpy.empty(n, numpy.float16) for _ in children]
        ex.waitall([ex.irecv(w, c, TAG_FP16_UP) for w, c in zip(wires, children)])
        for w in wires:                                   # own (float32) + children, in order
            numpy.add(flat, w, out=flat)                  # float16 widened exactly
        half = flat.astype(numpy.float16)                 # rounding: onto the wire / the total
        if parent is not None:
            ex.send(half, parent, TAG_FP16_UP)
            ex.recv(half, parent, TAG_FP16_DOWN)
        ex.waitall([ex.isend(half, c, TAG_FP16_DOWN) for c in children])
        flat[...] = half                                  # exact widening

    def _topk(self, ex, rank, size, flat):
        idx, vals = self.select(flat)
        k = idx.size
        mine = pack(idx, vals)
        wires = [mine if r == rank else numpy.empty(2 * k, numpy.int32) for r in range(size)]
        requests = [ex.irecv(wires[r], r, TAG_TOPK) for r in range(size) if r != rank]
        requests += [ex.isend(mine, r, TAG_TOPK) for r in range(size) if r != rank]
        ex.waitall(requests)
        gidx, gvals = merge_sparse([unpack(w) for w in wires])     # rank order
        densify(flat, gidx, gvals)

    def _gtopk(self, ex, rank, size, flat):
        idx, vals = self.select(flat)
        k = idx.size
        children = tree_children(rank, size)
        parent = tree_parent(rank)
        wires = [numpy.empty(2 * k, numpy.int32) for _ in children]
        ex.waitall([ex.irecv(w, c, TAG_GTOPK_UP) for w, c in zip(wires, children)])
        if children:
            gidx, gvals = merge_topk([(idx, vals)] + [unpack(w) for w in wires], k)
        else:
            gidx, gvals = idx, vals
        final = pack(gidx, gvals)
        if parent is not None:                            # up, then the root's set comes down
            ex.send(final, parent, TAG_GTOPK_UP)
            ex.recv(final, parent, TAG_GTOPK_DOWN)
        ex.waitall([ex.isend(final, c, TAG_GTOPK_DOWN) for c in children])
        gidx, gvals = unpack(final)
        self.give_back(idx, vals, gidx)
        densify(flat, gidx, gvals)


# --------------------------------------------------------------------------------------------
# Byte bounds (for the log and the benchmark)
# --------------------------------------------------------------------------------------------
def dense_ring_bytes(count, size):
    """Bytes one rank sends in a float32 ring allreduce of ``count`` floats: 2 (P-1)/P n 4."""
    return 2 * (size - 1) * 4 * count / size if size > 1 else 0.0


def gtopk_bound(k, size):
    """Shi et al.'s bound on one rank's gTop-k bytes: 2 k log2(P) (value + index bytes)."""
    return 2 * k * math.log2(size) * ENTRY_BYTES if size > 1 else 0.0


def topk_bytes(k, size):
    """Bytes one rank sends (and receives) in the Top-k all-gather: (P - 1) k 8."""
    return (size - 1) * k * ENTRY_BYTES
