"""How the CPU kernels cut their work: one frozen object, made once per kernel set.

Tests construct their own (one thread, tiny blocks) to reach every edge of the blocking;
``CpuTuning.from_environment()`` is what the engine uses.
"""
from dataclasses import dataclass

from ... import environment
from ...backend import cpu_cores


def _thread_budget():
    """Threads for the kernels: the CPUs this process may use, capped by OMP_NUM_THREADS
    (then NUMBA_NUM_THREADS) when set to a positive number."""
    cores = cpu_cores()
    for var in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        try:
            value = int(environment.raw(var))
        except (TypeError, ValueError):      # unset, or not a number
            continue
        if value > 0:
            return max(1, min(cores, value))
    return cores


@dataclass(frozen=True)
class CpuTuning:
    """Work division of the Numba kernels.

    Attributes:
        threads: parallel parts of every kernel (each thread takes every ``threads``-th block).
        block_columns: output positions per block of the convolutions (whole output rows,
            at least one): the block's column slices stay in the L2 cache.
        kc: rows of the column matrix per slice (rounded up to the micro-kernel's rows).
        skew: floats added to the row length of the column buffers, so that rows are not a
            multiple of 4 KiB apart (such rows share a few sets of the L1 cache and evict each
            other while the micro-kernel walks down a strip of them).
        images_per_chunk: images interleaved innermost in a convolution's packed input
            (0: chosen per layer from ``chunk_candidates`` by the cost model of
            :func:`.conv.choose_chunk`, with ``gemm_rate`` FLOP/s for the micro-kernel and
            ``copy_cost`` / ``interleave_cost`` seconds per float copied / gathered; measured
            on the development machine, two threads: cifar10_quick's conv1 writes its 3.3 M
            outputs in 1.5-2 ms with one image a chunk, 4.5 ms with three).
        backward_data: how a stride-1 convolution's data gradient is computed: "flip" (a
            convolution of the top diff with the flipped filters), "col2im" (W^T dy, then
            the scattered adds), or "auto" (the cheaper by :func:`.conv.flip_pays`).
        gemm_kc: rows of B per packed slice in InnerProduct's GEMM (:mod:`.gemm`).
        gemm_pack_bytes: most bytes of B that GEMM packs at a time, per thread (whole column
            panels of ``gemm_kc`` rows; 4 MiB: a share of the L3 cache, and the scratch memory
            stays small when C is wide).
        handoff_spin: seconds a thread of the team polls for the next hand-off before it
            sleeps (:mod:`.team`; 0: sleep at once).
    """

    threads: int = 1
    block_columns: int = 256
    kc: int = 256
    skew: int = 16
    images_per_chunk: int = 0
    chunk_candidates: tuple = (1, 2, 3, 4, 6, 8, 12, 16)
    gemm_rate: float = 150e9
    copy_cost: float = 0.5e-9
    interleave_cost: float = 1.4e-9
    backward_data: str = "auto"
    gemm_kc: int = 1024
    gemm_pack_bytes: int = 4 << 20
    handoff_spin: float = 100e-6

    @classmethod
    def from_environment(cls):
        """The engine's tuning: every usable core (see :func:`_thread_budget`)."""
        return cls(threads=_thread_budget())

