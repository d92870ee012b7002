"""Boost.Random's float32 distributions on Caffe's mt19937 stream, compiled.

The same arithmetic as the NumPy code of :mod:`caffe_engine.rng` (which documents it and stays
the reference), one try at a time, with the mt19937 words made here too (NumPy's own
``mt19937_gen`` and tempering, on the key and position of the stream's ``MT19937`` bit generator,
which the caller reads and writes back): the gaussian filler of a 61M-weight net (AlexNet, drawn
once for the train net and once for the test net, as Caffe does) took about 45 ns a value in
vectorised NumPy, against about 5 here. Every operation is the float32 (or float64) operation
of the NumPy code, in the same order, without fast-math: the values and the words consumed are
the same, bit for bit.

Each kernel takes ``key`` (uint32, 624) and ``cursor`` (int64: mt19937's position, then the
number of ``pend`` words used) and reads the stream's words held back (``pend``, uint32) before
new ones.
"""
import numpy
from numba import njit

_N = 624
_M = 397
_MATRIX_A = 0x9908B0DF
_UPPER = 0x80000000
_LOWER = 0x7FFFFFFF


@njit(cache=True, nogil=True)
def _twist(key):
    """mt19937_gen: the next 624 words of state, in place."""
    for i in range(_N - _M):
        y = (key[i] & _UPPER) | (key[i + 1] & _LOWER)
        key[i] = key[i + _M] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
    for i in range(_N - _M, _N - 1):
        y = (key[i] & _UPPER) | (key[i + 1] & _LOWER)
        key[i] = key[i + _M - _N] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)
    y = (key[_N - 1] & _UPPER) | (key[0] & _LOWER)
    key[_N - 1] = key[_M - 1] ^ (y >> 1) ^ (_MATRIX_A if y & 1 else 0)


@njit(cache=True, nogil=True, inline="always")
def _temper(y):
    """mt19937's tempering of one state word (uint64 holding 32 bits)."""
    y ^= y >> numpy.uint64(11)
    y ^= (y << numpy.uint64(7)) & numpy.uint64(0x9D2C5680)
    y ^= (y << numpy.uint64(15)) & numpy.uint64(0xEFC60000)
    y ^= y >> numpy.uint64(18)
    return y


@njit(cache=True, nogil=True)
def _word(key, pend, pos, used):
    """The next word: (word, mt19937 position, pend words used). For the rare paths only: a
    call that takes arrays counts their references, which costs more than the word; the hot
    loops below fetch their words inline."""
    if used < pend.shape[0]:
        return numpy.uint64(pend[used]), pos, used + 1
    if pos >= _N:
        _twist(key)
        pos = 0
    return _temper(numpy.uint64(key[pos])), pos + 1, used


@njit(cache=True, nogil=True, error_model="numpy")
def _uniform01(key, pend, pos, used):
    """``uniform_01<float>``: ``float(u) * 2**-32``, drawn again while it rounds to 1."""
    while True:
        u, pos, used = _word(key, pend, pos, used)
        r = numpy.float32(u) * numpy.float32(2.0 ** -32)
        if r < numpy.float32(1.0):
            return r, pos, used


@njit(cache=True, nogil=True, error_model="numpy")
def _unit_exponential(key, pend, pos, used, ex32, ey32, ex_step32, ey_step32):
    """``unit_exponential_distribution<float>`` (256 strips)."""
    shift = numpy.float32(0.0)
    while True:
        u, pos, used = _word(key, pend, pos, used)
        r = numpy.float32(u >> numpy.uint64(8)) * numpy.float32(2.0 ** -24)
        i = numpy.intp(u & numpy.uint64(0xFF))
        x = r * ex32[i]
        if x < ex32[i + 1]:
            return shift + x, pos, used
        if i == 0:
            shift = shift + ex32[1]
            continue
        y01, pos, used = _uniform01(key, pend, pos, used)
        y = ey32[i] + y01 * ey_step32[i]
        above_upper = ex_step32[i] * y01 - (ex32[i] - x)
        above_lower = y - (ey32[i + 1] + (ex32[i + 1] - x) * ey32[i + 1])
        if above_upper < numpy.float32(0.0) and (
                above_lower <= numpy.float32(0.0)
                or y < numpy.float32(numpy.exp(numpy.float64(-x)))):
            return x + shift, pos, used


@njit(cache=True, nogil=True, error_model="numpy")
def gaussian(key, cursor, pend, out, sigma, mu, nx32, nx_next, ny32, ny_step32, tail_start, ex32,
             ey32, ex_step32, ey_step32):
    """``out`` (float32) = ``z * sigma + mu`` for Boost's ``unit_normal_distribution<float>``
    values ``z``."""
    pos = cursor[0]
    used = cursor[1]
    held = pend.shape[0]
    for k in range(out.shape[0]):
        while True:
            if used < held:
                u = numpy.uint64(pend[used])
                used += 1
            else:
                if pos >= _N:
                    _twist(key)
                    pos = 0
                u = _temper(numpy.uint64(key[pos]))
                pos += 1
            r = numpy.float32(u >> numpy.uint64(8)) * numpy.float32(2.0 ** -24)
            bits = u & numpy.uint64(0xFF)
            i = numpy.intp(bits >> numpy.uint64(1))
            x = r * nx32[i]
            if bits & numpy.uint64(1):
                sign = numpy.float32(1.0)
            else:
                sign = numpy.float32(-1.0)
            if numpy.float64(x) < nx_next[i]:
                out[k] = (x * sign) * sigma + mu
                break
            if i == 0:
                # the tail beyond X[1]: pairs of exponentials until 2 y > x^2
                while True:
                    e, pos, used = _unit_exponential(key, pend, pos, used, ex32, ey32, ex_step32,
                                                     ey_step32)
                    xt = e / tail_start
                    y, pos, used = _unit_exponential(key, pend, pos, used, ex32, ey32, ex_step32,
                                                     ey_step32)
                    if numpy.float32(2.0) * y > xt * xt:
                        break
                out[k] = ((xt + tail_start) * sign) * sigma + mu
                break
            u01, pos, used = _uniform01(key, pend, pos, used)
            y = ny32[i] + u01 * ny_step32[i]
            if y < numpy.float32(numpy.exp(numpy.float64((-x * x) / numpy.float32(2.0)))):
                out[k] = (x * sign) * sigma + mu
                break
    cursor[0] = pos
    cursor[1] = used


@njit(cache=True, nogil=True, error_model="numpy")
def uniform(key, cursor, pend, out, a, span, hi):
    """``out`` (float32) = ``float(u) / 2**32 * span + a`` for the words ``u`` whose value
    stays below ``hi`` (the others are skipped: Boost draws again)."""
    pos = cursor[0]
    used = cursor[1]
    held = pend.shape[0]
    for k in range(out.shape[0]):
        while True:
            if used < held:
                u = numpy.uint64(pend[used])
                used += 1
            else:
                if pos >= _N:
                    _twist(key)
                    pos = 0
                u = _temper(numpy.uint64(key[pos]))
                pos += 1
            v = numpy.float32(u) / numpy.float32(2.0 ** 32) * span + a
            if v < hi:
                out[k] = v
                break
    cursor[0] = pos
    cursor[1] = used


@njit(cache=True, nogil=True, error_model="numpy")
def bernoulli(key, cursor, pend, out, threshold, single):
    """``out`` (uint8) = 1 where the next word ``u`` has ``dtype(u) <= threshold``, one word a
    value: ``dtype`` float32 where ``single`` (its rounding of ``u``), else float64 (exact).
    ``threshold`` (float64) is ``p * dtype(2**32 - 1)`` already rounded to ``dtype``."""
    pos = cursor[0]
    used = cursor[1]
    held = pend.shape[0]
    for k in range(out.shape[0]):
        if used < held:
            u = numpy.uint64(pend[used])
            used += 1
        else:
            if pos >= _N:
                _twist(key)
                pos = 0
            u = _temper(numpy.uint64(key[pos]))
            pos += 1
        if single:
            out[k] = numpy.uint8(numpy.float64(numpy.float32(u)) <= threshold)
        else:
            out[k] = numpy.uint8(numpy.float64(u) <= threshold)
    cursor[0] = pos
    cursor[1] = used
