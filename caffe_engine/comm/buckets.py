"""Gradient buckets: allreduce the param diffs in fixed-size pieces while backward still runs.

Horovod's tensor fusion / PyTorch DDP's buckets on a static graph. When the net is built the
learnable params are ordered by the moment backward finishes them — reverse layer order — and
packed into buckets of about ``bucket_mb`` MiB. A param's gradient is final once backward has run
the *lowest-indexed* layer that uses it (a shared param, ``ParamSpec.name``, is accumulated by
every layer sharing it), so each bucket has a ``ready_layer``: the bucket may be reduced as soon
as backward has finished that layer. :class:`~.data_parallel.DataParallel` (the solver's
data-parallel callback) drives it:

    sync = GradientSync(net, comm, bucket_mb=25)
    # each iteration, around the last forward/backward of iter_size (on_pass):
    sync.begin()                                    # arm the per-layer callback
    net.backward_from_to(...)                       # net calls sync.on_layer_backward_done(i)
    sync.finish()                                   # on_gradients_ready: the rest, wait, diffs

Each bucket *holds* its own flat float32 buffer (NumPy or CuPy, as the diffs): a ready bucket
copies its params' diffs in, starts ``comm.allreduce_async_`` on it, and ``finish`` writes the
averaged values back into the diffs. The two copies cost little next to the transfer and keep
the net's blobs untouched (no re-pointing of diffs into a shared buffer, which shared params and
layers that replace arrays would break). Every rank launches the buckets in the same order (the
bucket order, fixed at build time), whatever the timing of the callbacks.

Without ``begin()`` (or without a per-layer hook in the net) ``finish()`` reduces all buckets
at once; the result is the same, only the overlap is lost. ``overlap=False`` (or the environment
variable ``CAFFE_GRAD_OVERLAP=0``, read when the object is made) does that on purpose: the hook
launches nothing and ``finish()`` reduces every bucket after backward, for measuring what the
overlap buys (tools/scaling_check.py ``--overlap off``).

Compression (``compress=``, a :class:`~.compress.Compression`; :mod:`.compress`): each bucket
gets a :class:`~.compress.BucketCompressor` (its own k and residual) and is launched with the
communicator's ``allreduce_compressed_async_`` instead of ``allreduce_async_``; ``None`` or
``"none"`` is the dense path above, unchanged. The bytes each compressed bucket sent and
received are summed per iteration (``traffic``). A new plan (:meth:`GradientSync.set_plan`)
carries each param's residual over into its new bucket.

Caffe: src/caffe/parallel.cpp (NCCL::run per layer with ``layer_wise_reduce``, then the scale by
1 / solver_count), include/caffe/net.hpp (``add_after_backward``).
"""

import numpy

from .. import backend, environment
from ..errors import CaffeError


def _array_pointer(a):
    if type(a).__module__.startswith("cupy"):
        return a.data.ptr
    return a.__array_interface__["data"][0]


def param_ready_layers(net):
    """For each of ``net.learnable_params``, the lowest layer index whose blobs include it.

    Sharers of a param (``ParamSpec.name``) view the owner's diff, so they are matched by the
    diff array's memory address. A param no layer lists gets 0 (ready only at the end).
    """
    owner = {_array_pointer(b.diff): k for k, b in enumerate(net.learnable_params)}
    ready = [None] * len(net.learnable_params)
    for i, layer in enumerate(net.layers):
        for blob in layer.blobs:
            k = owner.get(_array_pointer(blob.diff))
            if k is not None:
                ready[k] = i if ready[k] is None else min(ready[k], i)
    return [0 if r is None else r for r in ready]


def plan_buckets(counts, ready_layers, bucket_bytes):
    """Group params into buckets.

    Args:
        counts: element count of each param.
        ready_layers: each param's ready layer (see :func:`param_ready_layers`).
        bucket_bytes: cap on a bucket's float32 bytes; a param larger than the cap gets a bucket
            of its own; <= 0 puts each param in its own bucket.

    Returns:
        list of lists of param indices, in launch order (highest ready layer first; within a
        layer, param order).
    """
    order = sorted(range(len(counts)), key=lambda k: (-ready_layers[k], k))
    buckets, current, current_bytes = [], [], 0
    for k in order:
        nbytes = 4 * int(counts[k])
        if current and (bucket_bytes <= 0 or current_bytes + nbytes > bucket_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(k)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets


OVERLAP_VAR = "CAFFE_GRAD_OVERLAP"


def overlap_from_env(environ=None):
    """False when ``CAFFE_GRAD_OVERLAP`` is ``0``, ``off``, ``false`` or ``no`` (any case), else
    True (also unset or empty): whether :class:`GradientSync` overlaps by default."""
    return environment.read(OVERLAP_VAR, environ)


class Bucket:
    """Params reduced together: ``params`` (indices), ``offsets``, ``buffer``, ``ready_layer``."""

    def __init__(self, params, blobs, ready_layer, xp):
        self.params = params
        self.blobs = [blobs[k] for k in params]
        self.offsets = []
        total = 0
        for b in self.blobs:
            self.offsets.append(total)
            total += b.count
        self.count = total
        self.buffer = xp.zeros(total, numpy.float32)
        self.ready_layer = ready_layer
        self.handle = None
        self.compressor = None

    def pack(self):
        for blob, off in zip(self.blobs, self.offsets):
            self.buffer[off:off + blob.count] = blob.diff.reshape(-1)

    def unpack(self):
        for blob, off in zip(self.blobs, self.offsets):
            blob.diff[...] = self.buffer[off:off + blob.count].reshape(blob.diff.shape)


class GradientSync:
    """Averages (or sums) a net's param diffs over all ranks, bucket by bucket.

    Args:
        net: a built :class:`~caffe_engine.net.Net` (its ``learnable_params`` and ``layers``).
        comm: a communicator (:func:`~.communicator.get_communicator`).
        bucket_mb: bucket size cap in MiB (default 25, as DDP; <= 0: one bucket per param).
        op: "mean" (default; Caffe divides the summed diffs by the solver count) or "sum".
        plan: explicit buckets (lists of param indices, launch order) instead of ``bucket_mb``'s
            (see :meth:`set_plan`).
        overlap: launch each bucket from the per-layer hook as soon as backward has finished it
            (True), or reduce all buckets in :meth:`finish`, after backward (False: no overlap;
            :meth:`on_layer_backward_done` then does nothing). None (default): the environment
            variable ``CAFFE_GRAD_OVERLAP`` decides, read here, once: ``0``, ``off``, ``false``
            or ``no`` turn the overlap off, anything else (or unset) leaves it on. The same
            buckets are reduced in the same order either way, so the results are the same bits.
        compress: a :class:`~.compress.Compression` (fp16, topk, gtopk), or None / ``"none"``
            (default): the dense allreduce, exactly as without the option.

    Attributes:
        buckets: list of :class:`Bucket` in launch order.
        launched: number of buckets launched in the current iteration.
        overlap: whether buckets are launched during backward.
        compression: the :class:`~.compress.Compression`, or None (dense).
        traffic: with compression, (bytes sent, bytes received, messages) of this rank in the
            last :meth:`finish`; ``traffic_total`` and ``iterations`` add them up.

    Raises:
        CaffeError: op not "sum"/"mean"; a plan that is not a launch order of every param once.
    """

    def __init__(self, net, comm, bucket_mb=25.0, op="mean", plan=None, overlap=None,
                 compress=None):
        if op not in ("sum", "mean"):
            raise CaffeError(f"GradientSync: op must be 'sum' or 'mean', got {op!r}")
        if isinstance(compress, str):
            from .compress import Compression
            compress = Compression(compress)
        self.compression = None if compress is None or compress.method == "none" else compress
        self.traffic = (0, 0, 0)
        self.traffic_total = (0, 0, 0)
        self.iterations = 0
        self.buckets = []
        self.net = net
        self.comm = comm
        self.op = op
        self.overlap = overlap_from_env() if overlap is None else bool(overlap)
        self.bucket_bytes = int(float(bucket_mb) * (1 << 20))
        self.ready_layers = param_ready_layers(net)
        self.launched = 0
        self.armed = False
        if plan is None:
            plan = plan_buckets([b.count for b in net.learnable_params], self.ready_layers,
                                self.bucket_bytes)
        self.set_plan(plan)

    def set_plan(self, plan):
        """Use ``plan`` (lists of param indices, launch order) as the buckets from now on.

        Call between iterations, with the same plan on every rank. A bucket is launched once
        backward has finished the lowest ready layer of its params, in plan order.
        """
        blobs = list(self.net.learnable_params)
        if sorted(k for ks in plan for k in ks) != list(range(len(blobs))) or \
                any(not ks for ks in plan):
            raise CaffeError(f"GradientSync: a bucket plan must hold every one of the "
                             f"{len(blobs)} params once, got {plan}")
        xp = backend.get_array_module(blobs[0].diff) if blobs else numpy
        old = self.buckets
        self.buckets = [Bucket(list(ks), blobs, min(self.ready_layers[k] for k in ks), xp)
                        for ks in plan]
        if self.compression is not None:
            self._make_compressors(old)

    def _make_compressors(self, old):
        """A compressor per bucket; each param's residual carried over from ``old``."""
        residual = {}
        for bucket in old:
            r = bucket.compressor.residual if bucket.compressor is not None else None
            if r is not None:
                for k, blob, off in zip(bucket.params, bucket.blobs, bucket.offsets):
                    residual[k] = r[off:off + blob.count]
        for bucket in self.buckets:
            carried = None
            if any(k in residual for k in bucket.params):
                carried = numpy.concatenate([
                    residual[k] if k in residual else numpy.zeros(b.count, numpy.float32)
                    for k, b in zip(bucket.params, bucket.blobs)])
            bucket.compressor = self.compression.for_bucket(bucket.count, residual=carried)

    @property
    def active(self):
        """Whether there is anyone to talk to (size > 1)."""
        return self.comm.size > 1

    def begin(self):
        """Arm the per-layer callback for the coming backward pass (the last of iter_size)."""
        self.launched = 0
        self.armed = True

    def _launch(self, bucket):
        bucket.pack()
        if bucket.compressor is None:
            bucket.handle = self.comm.allreduce_async_(bucket.buffer, op=self.op)
        else:
            bucket.handle = self.comm.allreduce_compressed_async_(bucket.buffer,
                                                                  bucket.compressor, op=self.op)
        self.launched += 1

    def on_layer_backward_done(self, layer_index):
        """Backward has finished layer ``layer_index`` (called for every index, high to low):
        launch every bucket whose gradients are now final (nothing without overlap)."""
        if not self.armed or not self.active or not self.overlap:
            return
        while self.launched < len(self.buckets):
            bucket = self.buckets[self.launched]
            if bucket.ready_layer < layer_index:
                break
            self._launch(bucket)

    def finish(self):
        """Launch the remaining buckets, wait for all in order, write the results into diffs."""
        if not self.active:
            self.armed = False
            return
        if not self.armed:
            self.launched = 0
        while self.launched < len(self.buckets):
            self._launch(self.buckets[self.launched])
        for bucket in self.buckets:
            bucket.handle.wait()
            bucket.handle = None
            bucket.unpack()
        self.armed = False
        self.launched = 0
        if self.compression is not None:
            c = [b.compressor for b in self.buckets]
            self.traffic = (sum(x.sent for x in c), sum(x.received for x in c),
                            sum(x.messages for x in c))
            self.traffic_total = tuple(a + b for a, b in zip(self.traffic_total, self.traffic))
            self.iterations += 1
