"""MG-WFBP: which layers' gradients to send together (``--bucket_mb auto``), from measured times.

Wait-free backpropagation (WFBP) starts each layer's allreduce as soon as backward has produced
its gradient, so communication overlaps the rest of backward; but every message pays a start-up
cost alpha, and a net with many small layers pays it many times. Merged-gradient WFBP (Shi, Chu
and Li, "MG-WFBP: Efficient data communication for distributed synchronous SGD algorithms",
INFOCOM 2019; journal version arXiv:1912.09268) merges a layer's gradients into the next layer's
message exactly when that is cheaper, with one pass over the layers in backward order.

The model. Layers l = L .. 1 in backward order; layer l's backward takes ``t_b(l)`` and ends at
``e(l)``; a message of m bytes takes ``t_c(m) = alpha + beta * m`` on the communicator (the fitted
alpha-beta model of :mod:`.allreduce_cost`, or one measured at start); messages go one after
another. A group's message starts at ``max(end of the previous message, e(last layer of the
group))``. Merge rule (the greedy step of MG-WFBP, optimal by the paper's theorem): the group
that holds layer l is extended to layer l-1 when

    e(l-1) < tau_c(l) + alpha

where ``tau_c(l)`` is when the group's message could start if it were closed at l. Why: waiting
for layer l-1 delays the group's message by ``e(l-1) - tau_c(l)`` (nothing if the channel is
busy until then) and saves one start-up alpha; sending separately never gains more than that.

The planner (:func:`optimal_groups`) solves the same objective — the end of the last message,
over every way of cutting the backward-ordered layers into consecutive messages — exactly, by
dynamic programming: the best end of the messages up to layer j is
``min over i of max(best(i - 1), e(j)) + t_c(bytes of layers i..j)``, which is optimal because
what follows a prefix depends only on when its last message ends, and later is never better
(O(L^2) for L layers: microseconds for any real net). The greedy rule above
(:func:`merge_rule_groups`) is kept for comparison: on 3,000 random instances of this model (up to
8 layers, against every partition) it matched the optimum in 88 %, and was up to 14 % slower in
the others (median 0.1 %); the dynamic program matched every one.

Layers without learnable params (ReLU, pooling, loss) produce no message: their backward time is
added to the next layer's (they only delay it). This module is pure arithmetic on lists; the
solver measures (:class:`BackwardTimer`) and applies the plan (``GradientSync(plan=...)``).
"""
import time

import numpy

from .buckets import plan_buckets


def simulate(groups, backward_s, nbytes, alpha, beta):
    """Times of one backward pass with ``groups`` sent as merged messages.

    Args:
        groups: lists of positions into ``backward_s`` (backward order), contiguous, in order.
        backward_s: seconds of backward of each gradient layer (backward order; a layer's time
            includes the param-less layers run just before it).
        nbytes: gradient bytes each layer sends.
        alpha, beta: seconds per message and per byte.

    Returns:
        (backward_end_s, comm_end_s): when backward ends and when the last message arrives,
        from the start of backward.
    """
    ends = numpy.cumsum(numpy.asarray(backward_s, dtype=float))
    channel = 0.0
    for group in groups:
        start = max(channel, ends[group[-1]])
        channel = start + alpha + beta * sum(nbytes[k] for k in group)
    return (float(ends[-1]) if len(ends) else 0.0), channel


def merge_rule_groups(backward_s, nbytes, alpha, beta):
    """MG-WFBP's greedy merge rule over consecutive layers (backward order); for comparison.

    Args: as :func:`simulate`.

    Returns:
        list of groups (lists of positions, in order), every position exactly once.
    """
    n = len(backward_s)
    if n == 0:
        return []
    ends = numpy.cumsum(numpy.asarray(backward_s, dtype=float))
    groups, current, channel = [], [0], 0.0
    for pos in range(1, n + 1):
        could_start = max(channel, ends[current[-1]])
        if pos < n and ends[pos] < could_start + alpha:
            current.append(pos)                  # waiting for layer pos costs less than alpha
            continue
        groups.append(current)
        channel = could_start + alpha + beta * sum(nbytes[k] for k in current)
        current = [pos]
    return groups


def optimal_groups(backward_s, nbytes, alpha, beta):
    """The grouping of consecutive layers (backward order) whose last message ends first.

    Args: as :func:`simulate`.

    Returns:
        list of groups (lists of positions, in order), every position exactly once; among equal
        ends, the one whose last message is longest (fewer messages).
    """
    n = len(backward_s)
    ends = numpy.cumsum(numpy.asarray(backward_s, dtype=float))
    sizes = numpy.concatenate([[0], numpy.cumsum(numpy.asarray(nbytes, dtype=float))])
    best, first = [0.0] * (n + 1), [0] * (n + 1)
    for j in range(1, n + 1):
        best[j] = float("inf")
        for i in range(1, j + 1):           # longest last group first: ties keep it
            end = max(best[i - 1], ends[j - 1]) + alpha + beta * (sizes[j] - sizes[i - 1])
            if end < best[j] - 1e-15:
                best[j], first[j] = end, i
    groups, j = [], n
    while j > 0:
        groups.append(list(range(first[j] - 1, j)))
        j = first[j] - 1
    return groups[::-1]


def size_groups(nbytes, bucket_bytes):
    """Fixed-size grouping of consecutive layers (what ``--bucket_mb X`` does), for comparing:
    :func:`.buckets.plan_buckets` with each layer as one "param" of ``nbytes / 4`` floats."""
    return plan_buckets(nbytes, [-k for k in range(len(nbytes))], 4 * bucket_bytes)


class BackwardTimer:
    """Per-layer backward seconds of a net, from its before/after-backward hooks.

    ``start()`` arms it for one pass; ``layer_seconds()`` returns {layer index: seconds} of the
    last armed pass. Costs two ``perf_counter`` calls per layer while armed, nothing otherwise.
    """

    def __init__(self, net):
        self.armed = False
        self._begin = {}
        self.seconds = {}
        net.before_backward(self._before, sees_blobs=False)
        net.after_backward(self._after, sees_blobs=False)

    def start(self):
        self.armed = True
        self.seconds = {}

    def stop(self):
        self.armed = False

    def _before(self, i):
        if self.armed:
            self._begin[i] = time.perf_counter()

    def _after(self, i):
        if self.armed and i in self._begin:
            self.seconds[i] = time.perf_counter() - self._begin.pop(i)


def backward_profile(ready_layers, counts, layer_seconds, num_layers):
    """The gradient layers of a net in backward order, with their seconds and bytes.

    Returns:
        (by_layer, grad_layers, backward_s, nbytes): {layer: its param indices}; the layers
        with params, highest first; each one's backward seconds plus those of the param-less
        layers run just before it; each one's float32 gradient bytes.
    """
    by_layer = {}
    for k, layer in enumerate(ready_layers):
        by_layer.setdefault(layer, []).append(k)
    grad_layers = sorted(by_layer, reverse=True)
    backward_s, nbytes, pending = [], [], 0.0
    for i in range(num_layers - 1, -1, -1):
        pending += layer_seconds.get(i, 0.0)
        if i in by_layer:
            backward_s.append(pending)
            nbytes.append(4 * sum(int(counts[k]) for k in by_layer[i]))
            pending = 0.0
    return by_layer, grad_layers, backward_s, nbytes


def layer_plan(ready_layers, counts, layer_seconds, num_layers, alpha, beta):
    """MG-WFBP buckets of a net's params from its measured per-layer backward times.

    Args:
        ready_layers: each param's ready layer (:func:`.buckets.param_ready_layers`).
        counts: each param's element count (float32).
        layer_seconds: {layer index: median backward seconds} (missing layers count 0).
        num_layers: number of layers of the net.
        alpha, beta: seconds per message, seconds per byte (the communicator's).

    Returns:
        (buckets, groups_info): buckets as lists of param indices in launch order (for
        ``GradientSync(plan=...)``), and for each bucket (first layer, last layer, bytes).
    """
    by_layer, grad_layers, backward_s, nbytes = backward_profile(ready_layers, counts,
                                                                 layer_seconds, num_layers)
    groups = optimal_groups(backward_s, nbytes, alpha, beta)
    buckets = [[k for p in g for k in by_layer[grad_layers[p]]] for g in groups]
    info = [(grad_layers[g[0]], grad_layers[g[-1]], sum(nbytes[p] for p in g)) for g in groups]
    return buckets, info


def measure_alpha_beta(comm, small=4 << 10, large=4 << 20, reps=5):
    """Seconds per message and per byte of ``comm``'s blocking allreduce, measured now.

    Collective: every rank times ``reps`` allreduces of ``small`` and of ``large`` bytes (after
    one warm-up each); the medians of rank 0 give the line through the two points, and every
    rank returns rank 0's values.

    Returns:
        (alpha_s, beta_s_per_byte), both >= 0.
    """
    times = {}
    for nbytes in (small, large):
        buf = numpy.zeros(nbytes // 4, numpy.float32)
        comm.allreduce_(buf, op="sum")
        runs = []
        for _ in range(reps):
            t0 = time.perf_counter()
            comm.allreduce_(buf, op="sum")
            runs.append(time.perf_counter() - t0)
        times[nbytes] = float(numpy.median(runs))
    beta = max(0.0, (times[large] - times[small]) / (large - small))
    alpha = max(0.0, times[small] - beta * small)
    return tuple(comm.allgather_object((alpha, beta))[0])


def model_alpha_beta(path, algorithm, procs):
    """Per-message and per-byte seconds of ``algorithm`` at ``procs`` ranks from a fitted cost
    model file (:class:`.allreduce_cost.AlphaBetaModel`; tools/cost_model.py writes it), or
    None for an algorithm the model has no formula for (``hier``, ``nccl``: their cost depends
    on the node layout; the caller measures instead).

    Raises:
        CaffeError: unreadable file, or no parameters for the algorithm in it.
    """
    from .allreduce_cost import ALGORITHMS, AlphaBetaModel
    model = AlphaBetaModel.load(path)
    if algorithm not in ALGORITHMS:
        return None
    alpha = model.predict(algorithm, 0, procs)
    return alpha, (model.predict(algorithm, 1 << 20, procs) - alpha) / (1 << 20)


class AutoBuckets:
    """``--bucket_mb auto``: measure backward, plan with the alpha-beta model, try the plan
    against the buckets in use, keep the faster.

    The solver calls :meth:`on_start` at the start of every iteration on every rank (its
    ``on_start`` callback, after the tests, where all ranks are together). Iterations
    ``1 .. measure_iters`` (the first, 0, warms up) time every layer's backward; at the start of
    the next one rank 0's medians and the communicator's alpha and beta (from ``model_path``
    when given — the cost model file — else measured by :func:`measure_alpha_beta`) give the
    MG-WFBP plan (:func:`layer_plan`).

    The model's alpha is what a message costs between iterations; inside one, with backward
    beside it, a message can cost several times more (measured on 2 cores: about 10 ms per
    extra bucket in training against a 1-3 ms alpha), and overlap may buy nothing where no core
    is idle. So the plan is *tried*: the next ``2 * trial_iters`` iterations alternate between
    it and the buckets in use (the ``--bucket_mb`` default's), and their whole-iteration times
    (rank 0's, start to start) decide. When the plan has more messages than the current buckets
    and lost, the in-training cost of a message is calibrated from the difference
    (:func:`calibrated_alpha`), and the plan that alpha gives is tried against the winner in the
    same way, once. The winner is applied on every rank (rank 0's choice) and logged. With a
    model file, its modification time is checked every ``check_every`` iterations (collective:
    rank 0's answer) and a changed file is re-read and the plan tried again from the same
    backward measurements.

    Args:
        net: the training net; sync: its :class:`~.buckets.GradientSync`; comm: the
            communicator; log: a ``logging`` logger (rank 0 logs).
        model_path: cost model file, or None to measure alpha and beta.
        measure_iters: iterations whose backward is timed (after iteration 0).
        trial_iters: iterations each plan runs in a trial (alternating; >= 1).
        check_every: iterations between checks of the model file.

    Attributes:
        plan_info: the applied plan's buckets as (first layer, last layer, bytes), or None
            while nothing has been planned.
        trials: [(label, buckets, median seconds per iteration)] of the finished trials.
    """

    def __init__(self, net, sync, comm, model_path=None, measure_iters=5, check_every=100,
                 log=None, trial_iters=4):
        self.net, self.sync, self.comm, self.log = net, sync, comm, log
        self.model_path, self.measure_iters, self.check_every = model_path, measure_iters, \
            check_every
        self.trial_iters = max(1, int(trial_iters))
        self.timer = BackwardTimer(net)
        self.samples = []
        self.layer_seconds = None
        self.model_mtime = None
        self.plan_info = None
        self.trials = []
        self._trial = None          # the running trial: see _start_trial
        self._running = None        # (plan label, start time) of the iteration under way

    # -- the iteration boundary (every rank) ---------------------------------------------------
    def on_start(self, iteration):
        """Between iterations: record the last measured pass or trial iteration, plan when
        enough are measured (or re-plan when the model file changed), run the trial's next
        iteration, arm the timer for a measured iteration."""
        now = time.perf_counter()
        if self._running is not None:
            label, began = self._running
            self._trial["times"][label].append(now - began)
            self._running = None
        if self.timer.armed:
            self.timer.stop()
            self.samples.append(dict(self.timer.seconds))
            if len(self.samples) == self.measure_iters:
                self.layer_seconds = self._medians()
                self._plan()
        elif self._trial is None and self.model_path and self.layer_seconds is not None \
                and iteration % self.check_every == 0 and self._model_changed():
            self._plan()
        if self._trial is not None:
            self._trial_step(now)
        if self.layer_seconds is None and iteration >= 1:
            self.timer.start()

    # -- planning --------------------------------------------------------------------------
    def _medians(self):
        layers = sorted({i for s in self.samples for i in s})
        mine = {i: float(numpy.median([s.get(i, 0.0) for s in self.samples])) for i in layers}
        return self.comm.allgather_object(mine)[0]

    def _model_changed(self):
        import os
        try:
            mtime = os.stat(self.model_path).st_mtime_ns
        except OSError:
            mtime = None
        return self.comm.allgather_object(mtime != self.model_mtime)[0]

    def _alpha_beta(self):
        import os
        if self.model_path:
            self.model_mtime = os.stat(self.model_path).st_mtime_ns
            terms = model_alpha_beta(self.model_path, self.comm.name, self.comm.size)
            if terms is not None:
                return terms + (f"cost model {self.model_path}",)
            return measure_alpha_beta(self.comm) + (
                f"measured: the cost model has no formula for '{self.comm.name}'",)
        return measure_alpha_beta(self.comm) + ("measured",)

    def _layer_plan(self, alpha, beta):
        return layer_plan(self.sync.ready_layers, [b.count for b in self.net.learnable_params],
                          self.layer_seconds, len(self.net.layers), alpha, beta)

    def _current(self):
        """The buckets in use (lists of param indices) and their (first, last, bytes) info."""
        buckets = [list(b.params) for b in self.sync.buckets]
        info = []
        for b in self.sync.buckets:
            layers = [self.sync.ready_layers[k] for k in b.params]
            info.append((max(layers), min(layers), 4 * b.count))
        return buckets, info

    def _plan(self):
        alpha, beta, source = self._alpha_beta()
        buckets, info = self._layer_plan(alpha, beta)
        current = self._current()
        self.alpha, self.beta, self.source = alpha, beta, source
        if self.log is not None and self.comm.rank == 0:
            self.log.info("%s", self.describe(info, alpha, beta, source))
        if _same(buckets, current[0]):
            self._apply(current, "the plan is the buckets in use")
            return
        self._start_trial([("in use", current), ("MG-WFBP", (buckets, info))], calibrate=True)

    # -- trials ------------------------------------------------------------------------------
    def _start_trial(self, plans, calibrate):
        """Alternate ``plans`` [(label, (buckets, info))] iteration by iteration, the second
        first, ``trial_iters`` iterations each."""
        order = [label for _ in range(self.trial_iters) for label, _ in reversed(plans)]
        self._trial = {"plans": dict(plans), "labels": [label for label, _ in plans],
                       "order": order, "times": {label: [] for label, _ in plans},
                       "calibrate": calibrate}

    def _trial_step(self, now):
        trial = self._trial
        if trial["order"]:
            label = trial["order"].pop(0)
            buckets = trial["plans"][label][0]
            if not _same(buckets, [list(b.params) for b in self.sync.buckets]):
                self.sync.set_plan(buckets)
            self._running = (label, time.perf_counter())
            return
        mine = {label: float(numpy.median(t)) for label, t in trial["times"].items()}
        medians = self.comm.allgather_object(mine)[0]          # rank 0's, on every rank
        for label in trial["labels"]:
            self.trials.append((label, trial["plans"][label][0], medians[label]))
        size = {label: len(trial["plans"][label][0]) for label in trial["labels"]}
        best = min(trial["labels"], key=lambda label: (medians[label], size[label]))
        self._trial = None
        summary = ", ".join(f"{label} ({size[label]} bucket(s)) "
                            f"{medians[label] * 1e3:.3g} ms" for label in trial["labels"])
        if self.log is not None and self.comm.rank == 0:
            self.log.info("Buckets (--bucket_mb auto): tried, median iteration: %s", summary)
        if trial["calibrate"]:
            few, many = sorted(trial["labels"], key=size.get)
            if best == few and size[many] > size[few]:
                alpha = calibrated_alpha(self, trial["plans"][few][0], trial["plans"][many][0],
                                         medians[few], medians[many])
                buckets, info = self._layer_plan(alpha, self.beta)
                tried = [trial["plans"][label][0] for label in trial["labels"]]
                if not any(_same(buckets, t) for t in tried):
                    if self.log is not None and self.comm.rank == 0:
                        self.log.info("%s", self.describe(info, alpha, self.beta,
                                                          "calibrated in training"))
                    self._start_trial([(best, trial["plans"][best]),
                                       ("calibrated", (buckets, info))], calibrate=False)
                    return
        self._apply(trial["plans"][best], f"kept: {best}")

    def _apply(self, plan, why):
        buckets, info = plan
        if not _same(buckets, [list(b.params) for b in self.sync.buckets]):
            self.sync.set_plan(buckets)
        self.plan_info = info
        if self.log is not None and self.comm.rank == 0:
            names = [layer.name for layer in self.net.layers]
            parts = ", ".join(f"{_label(names, f, l)} {_human(n)}" for f, l, n in info)
            self.log.info("Buckets (--bucket_mb auto): %d bucket(s): %s (%s)", len(info), parts,
                          why)

    def describe(self, info, alpha, beta, source):
        """One line: the buckets (layers, bytes) and the predicted end of backward and of the
        last message, beside one fixed 25 MiB bucket's."""
        names = [layer.name for layer in self.net.layers] if hasattr(self.net, "layers") else []
        _, _, per_layer, nbytes = backward_profile(
            self.sync.ready_layers, [b.count for b in self.net.learnable_params],
            self.layer_seconds, len(self.net.layers))
        bucket_groups = optimal_groups(per_layer, nbytes, alpha, beta)
        backward_end, comm_end = simulate(bucket_groups, per_layer, nbytes, alpha, beta)
        fixed = simulate(size_groups(nbytes, 25 << 20), per_layer, nbytes, alpha, beta)[1]
        parts = ", ".join(f"{_label(names, f, l)} {_human(n)}" for f, l, n in info)
        return (f"Buckets (--bucket_mb auto, MG-WFBP): alpha {alpha * 1e3:.3g} ms, beta "
                f"{beta * 1e9:.3g} ns/byte ({source}); {len(info)} bucket(s): {parts}; predicted "
                f"backward {backward_end * 1e3:.3g} ms, last message ends {comm_end * 1e3:.3g} ms"
                f" (one 25 MiB bucket: {fixed * 1e3:.3g} ms)")


def calibrated_alpha(planner, few, many, seconds_few, seconds_many):
    """The per-message cost that makes the model agree with a trial that the plan with more
    messages lost.

    The model (:func:`simulate`, the planner's alpha and beta and measured backward) predicts
    the end of the last message for both plans; the measured iterations differ by
    ``seconds_many - seconds_few``. Whatever the model misses is charged to the extra messages:
    ``alpha + ((measured difference) - (predicted difference)) / (extra messages)``, never below
    the planner's alpha.

    Args:
        planner: the :class:`AutoBuckets` (its net, sync, layer_seconds, alpha, beta).
        few, many: the two plans (lists of param indices), ``many`` with more buckets.
        seconds_few, seconds_many: their median iteration seconds.

    Returns:
        seconds per message.
    """
    _, grad_layers, per_layer, nbytes = backward_profile(
        planner.sync.ready_layers, [b.count for b in planner.net.learnable_params],
        planner.layer_seconds, len(planner.net.layers))
    position = {layer: j for j, layer in enumerate(grad_layers)}

    def groups(buckets):
        out = []
        for ks in buckets:
            layers = sorted({position[planner.sync.ready_layers[k]] for k in ks})
            out.append(layers)
        return out

    predicted = [simulate(groups(plan), per_layer, nbytes, planner.alpha, planner.beta)[1]
                 for plan in (few, many)]
    extra = len(many) - len(few)
    missed = (seconds_many - seconds_few) - (predicted[1] - predicted[0])
    return planner.alpha + max(0.0, missed) / max(1, extra)


def _same(a, b):
    return [list(x) for x in a] == [list(x) for x in b]


def _label(names, first, last):
    a = names[first] if first < len(names) else str(first)
    b = names[last] if last < len(names) else str(last)
    return a if first == last else f"{a}..{b}"


def _human(nbytes):
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{nbytes} B"
