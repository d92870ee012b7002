"""Caffe's random streams.

Caffe (src/caffe/common.cpp, include/caffe/util/rng.hpp, src/caffe/util/math_functions.cpp) keeps
one ``boost::mt19937`` per process, seeded with ``random_seed`` through mt19937's
``init_genrand``; every draw takes 32-bit words from it. NumPy's legacy ``RandomState(int)``
seeds its MT19937 with the same ``init_genrand``, so its raw words are Caffe's words: we take
the words from it and apply Boost.Random's distributions ourselves, in float32 as Caffe does.

Exact so far: the raw words, ``uniform`` (Boost's ``uniform_real<float>`` on
``[a, nextafter(b))``) and everything built on it (uniform and xavier fillers), ``rand_int``.
``gaussian`` is not yet Boost's ziggurat (a later change brings it); it draws from the same
stream so the order of draws is kept wherever a gaussian takes one word per value.
"""
import os
import time

import numpy

_TWO_32 = numpy.float32(2.0 ** 32)


class CaffeRNG:
    """One mt19937 stream with Caffe's distributions.

    Args:
        seed: int in [0, 2**32); ``None`` derives one from the clock and pid as Caffe does.
    """

    def __init__(self, seed=None):
        if seed is None or seed < 0:
            seed = (int(time.time() * 1e6) ^ (os.getpid() << 16)) & 0xFFFFFFFF
        self.seed = int(seed) & 0xFFFFFFFF
        self._mt = numpy.random.RandomState(self.seed)._bit_generator

    def words(self, n):
        """``n`` raw 32-bit words as a uint32 array of shape (n,)."""
        return self._mt.random_raw(int(n)).astype(numpy.uint32)

    def word(self):
        """One raw word as a Python int (Caffe's ``caffe_rng_rand()``)."""
        return int(self._mt.random_raw())

    def rand_int(self, n):
        """``caffe_rng_rand() % n``: Caffe's ``Rand(n)`` in the data transformer."""
        return self.word() % int(n)

    def uniform(self, n, a, b):
        """``n`` float32 samples of Boost ``uniform_real<float>(a, nextafter(b))``.

        Each sample is ``float(u) / 2**32 * (b' - a) + a`` in float32, redrawn when it reaches
        ``b'`` (which float32 rounding makes possible for u near 2**32).
        """
        a = numpy.float32(a)
        hi = numpy.nextafter(numpy.float32(b), numpy.float32(numpy.inf))
        span = numpy.float32(hi - a)
        out = numpy.empty(int(n), numpy.float32)
        filled = 0
        while filled < n:
            # Draw as many words as samples still missing. A rejected word is simply skipped:
            # Boost redraws for the same sample, which is the next word in the stream.
            vals = self.words(n - filled).astype(numpy.float32) / _TWO_32 * span + a
            vals = vals[vals < hi]
            out[filled:filled + vals.size] = vals
            filled += vals.size
        return out

    def gaussian(self, n, mu, sigma):
        """``n`` float32 normal samples (placeholder for Boost's ziggurat; see module doc)."""
        u1 = (self.words(n).astype(numpy.float64) + 0.5) / 2.0 ** 32
        u2 = numpy.random.RandomState(int(self.words(1)[0])).random_sample(int(n))
        z = numpy.sqrt(-2.0 * numpy.log(u1)) * numpy.cos(2.0 * numpy.pi * u2)
        return (numpy.float32(mu) + numpy.float32(sigma) * z.astype(numpy.float32)).astype(numpy.float32)

    def bernoulli(self, n, p):
        """``n`` uint8 samples of Boost ``bernoulli_distribution(p)`` (1 with probability p)."""
        u = self.words(n).astype(numpy.float64)
        # Boost: for p == 0 always 0; else eng() - min <= p * (max - min).
        if p <= 0:
            return numpy.zeros(int(n), numpy.uint8)
        return (u <= p * 4294967295.0).astype(numpy.uint8)


_global = {"rng": CaffeRNG()}


def set_random_seed(seed):
    """Reseed the process-wide stream (Caffe::set_random_seed); ``seed < 0`` picks one from the clock."""
    _global["rng"] = CaffeRNG(seed)


def get_rng():
    """The process-wide stream that fillers, data layers and dropout draw from."""
    return _global["rng"]
