"""Caffe's random streams: Boost's distributions bit for bit, and Caffe's draws in Caffe's order.

Golden sources, none of them the code under test:
- a straightforward scalar transcription of Boost.Random's algorithms (``BoostReference``
  below: one value at a time, one word at a time, as ``normal_distribution.hpp``,
  ``exponential_distribution.hpp``, ``uniform_01.hpp`` and ``bernoulli_distribution.hpp`` of
  Boost >= 1.56 read), fed by NumPy's raw MT19937 words;
- shared/caffe_reference/training: the ``<case>_iter_0.caffemodel`` weights real Caffe wrote
  after building each solver, and the Dropout masks of ``mlp_dropout``.
"""
import math
import shutil
import time
from pathlib import Path

import numpy
import pytest

import caffe_engine
from caffe_engine import rng, solvers
from caffe_engine.io import prototxt as pio
from caffe_engine.proto import caffe_pb2

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TRAINING = SHARED / "caffe_reference" / "training"
TRAIN_CASES = sorted(p.name for p in TRAINING.iterdir() if p.is_dir()) if TRAINING.is_dir() else []

f32 = numpy.float32


# ------------------------------------------------------------------------------------------------
# The reference: Boost's algorithms, one scalar step at a time
# ------------------------------------------------------------------------------------------------
class BoostReference:
    """Boost.Random's float distributions over a list of 32-bit words, consumed one by one."""

    def __init__(self, words):
        self.words = [int(w) for w in words]
        self.pos = 0
        self.tails = self.wedge_tests = 0      # how often the rare paths ran

    def eng(self):
        u = self.words[self.pos]
        self.pos += 1
        return u

    # generate_int_float_pair<float, 8> on a 32-bit engine: one word; the 8 low bits are the
    # int, the remaining 24 bits (u >> 8) times 2**-24 the float.
    def int_float_pair(self):
        u = self.eng()
        return f32(u >> 8) * f32(1.0 / (1 << 24)), u & 255

    def uniform_01(self):
        factor = f32(1) / (f32(4294967295) + f32(1))
        while True:
            result = f32(self.eng()) * factor
            if result < f32(1):
                return result

    def exponential(self):
        table_x, table_y = rng._EXP_X, rng._EXP_Y
        shift = f32(0)
        while True:
            r, i = self.int_float_pair()
            x = r * f32(table_x[i])
            if x < f32(table_x[i + 1]):
                return shift + x
            if i == 0:
                shift += f32(table_x[1])
            else:
                y01 = self.uniform_01()
                y = f32(table_y[i]) + y01 * f32(table_y[i + 1] - table_y[i])
                y_above_ubound = f32(table_x[i] - table_x[i + 1]) * y01 - (f32(table_x[i]) - x)
                y_above_lbound = y - (f32(table_y[i + 1])
                                      + (f32(table_x[i + 1]) - x) * f32(table_y[i + 1]))
                if y_above_ubound < 0 and (y_above_lbound <= 0 or y < f32(math.exp(-float(x)))):
                    return x + shift

    def normal_tail(self):
        tail_start = f32(rng._NORMAL_X[1])
        while True:
            x = self.exponential() / f32(1) / tail_start
            y = self.exponential() / f32(1)
            if f32(2) * y > x * x:
                return x + tail_start

    def unit_normal(self):
        table_x, table_y = rng._NORMAL_X, rng._NORMAL_Y
        while True:
            r, i = self.int_float_pair()
            sign = f32((i & 1) * 2 - 1)
            i = i >> 1
            x = r * f32(table_x[i])
            if float(x) < table_x[i + 1]:          # float promoted to double, as in C++
                return x * sign
            if i == 0:
                self.tails += 1
                return self.normal_tail() * sign
            self.wedge_tests += 1
            y = f32(table_y[i]) + self.uniform_01() * f32(table_y[i + 1] - table_y[i])
            if y < f32(math.exp(float((-x * x) / f32(2)))):
                return x * sign

    def gaussian(self, n, mu, sigma):
        return numpy.array([self.unit_normal() * f32(sigma) + f32(mu) for _ in range(n)], f32)

    def bernoulli(self, n, p, real):
        p = real(p)
        out = []
        for _ in range(n):
            if p == 0:
                out.append(0)
            else:
                out.append(int(real(self.eng()) <= p * real(4294967295)))
        return numpy.array(out, numpy.uint8)


def raw_words(seed, n):
    """mt19937's first ``n`` words for ``seed`` (init_genrand), independent of CaffeRNG."""
    return numpy.random.RandomState(seed)._bit_generator.random_raw(n).astype(numpy.uint32)


class ScriptedWords:
    """A bit generator stand-in that hands out a given word sequence (for adversarial streams)."""

    def __init__(self, words):
        self.words = numpy.asarray(words, numpy.uint64)
        self.pos = 0

    def random_raw(self, size=None):
        n = 1 if size is None else int(size)
        if self.pos + n > len(self.words):
            raise AssertionError("the stream read past the scripted words")
        out = self.words[self.pos:self.pos + n]
        self.pos += n
        return int(out[0]) if size is None else out.copy()


def scripted_rng(words):
    stream = rng.CaffeRNG(0)
    stream._mt = ScriptedWords(words)
    return stream


def bits_equal(a, b):
    a, b = numpy.asarray(a), numpy.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------------------------------
# Tables and raw words
# ------------------------------------------------------------------------------------------------
def test_ziggurat_tables_are_consistent():
    """Boost's tables as transcribed: y = f(x) and equal strip areas (catches a mistyped digit)."""
    for x, y, f, strips in ((rng._NORMAL_X, rng._NORMAL_Y, lambda v: numpy.exp(-v * v / 2), 128),
                            (rng._EXP_X, rng._EXP_Y, lambda v: numpy.exp(-v), 256)):
        assert len(x) == len(y) == strips + 1
        assert x[-1] == 0 and y[0] == 0 and y[-1] == 1
        numpy.testing.assert_allclose(f(x[1:]), y[1:], rtol=2e-15)
        area = x[1:-1] * (y[2:] - y[1:-1])
        numpy.testing.assert_allclose(area, area[0], rtol=1e-13)
        numpy.testing.assert_allclose(x[0] * y[1], area[0], rtol=1e-13)   # the base strip


def test_words_are_mt19937_init_genrand():
    # The 10000th output of mt19937 seeded with 5489 (the C++ standard's check value).
    assert int(rng.CaffeRNG(5489).words(10000)[-1]) == 4123659995
    stream = rng.CaffeRNG(1701)
    assert [stream.word() for _ in range(5)] == raw_words(1701, 5).tolist()


# ------------------------------------------------------------------------------------------------
# gaussian: the vectorised ziggurat against the scalar reference
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [1, 1701, 42, 4294967295])
def test_gaussian_matches_scalar_boost(seed):
    """250,000 values per seed (1e6 in all): every bit, and the stream position after them."""
    n = 250_000
    ref = BoostReference(raw_words(seed, int(n * 1.1)))
    expected = ref.gaussian(n, 0.2, 0.7)
    stream = rng.CaffeRNG(seed)
    got = stream.gaussian(n, 0.2, 0.7)
    assert bits_equal(got, expected)
    assert stream.word() == ref.eng()            # exactly as many words consumed as Boost
    # The slow paths really ran: about 1 value in 1,750 comes from the tail, 1 in 80 took a
    # wedge test, and a value costs about 1.03 words.
    assert ref.tails > 60 and ref.wedge_tests > 2000
    assert 1.01 < (ref.pos - 1) / n < 1.05


def test_gaussian_in_pieces_equals_one_draw():
    whole = rng.CaffeRNG(3).gaussian(50_001, 0, 1)
    stream = rng.CaffeRNG(3)
    parts = [stream.gaussian(k, 0, 1) for k in (1, 2, 997, 20_000, 29_001)]
    assert bits_equal(numpy.concatenate(parts), whole)


def test_gaussian_interleaved_with_other_draws():
    """Words a gaussian drew ahead are handed to the next draw of any kind, in order."""
    seed = 11
    ref = BoostReference(raw_words(seed, 10_000))
    stream = rng.CaffeRNG(seed)
    for k in (5, 17, 300):
        assert bits_equal(stream.gaussian(k, 1.5, 0.25), ref.gaussian(k, 1.5, 0.25))
        assert stream.word() == ref.eng()
        assert stream.words(3).tolist() == [ref.eng() for _ in range(3)]


def adversarial_words(seed, n):
    """Random words, a third turned into tail starts and some into uniforms that round to 1."""
    gen = numpy.random.RandomState(seed)
    words = gen.randint(0, 2 ** 32, size=n, dtype=numpy.uint64)
    tail = gen.rand(n) < 0.3
    # Strip 0 (low bits 0 or 1) with r near 1, so x = r * X[0] >= X[1]: a tail start.
    words[tail] = (gen.randint(0xF00000, 0x1000000, size=tail.sum()).astype(numpy.uint64) << 8) | \
        gen.randint(0, 2, size=tail.sum()).astype(numpy.uint64)
    near_top = gen.rand(n) < 0.05
    words[near_top] = gen.randint(2 ** 32 - 200, 2 ** 32, size=near_top.sum(), dtype=numpy.uint64)
    return words


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_gaussian_on_adversarial_stream(monkeypatch, chunk):
    """Tails, wedge tests, uniforms rounding to 1 and block boundaries everywhere."""
    monkeypatch.setattr(rng, "_CHUNK", chunk)
    words = adversarial_words(chunk, 60_000)
    ref = BoostReference(words)
    expected = ref.gaussian(4000, 0.0, 1.0)
    stream = scripted_rng(words)
    got = numpy.concatenate([stream.gaussian(k, 0.0, 1.0) for k in (1, 999, 3000)])
    assert bits_equal(got, expected)
    assert stream.word() == ref.eng()


def test_wedge_uniform_rounding_to_one_is_redrawn():
    # Word 1: strip 5, x beyond X[6] (fails the fast test); word 2 rounds to 1.0 and is redrawn;
    # word 3 is the wedge's uniform.
    first = (0xFFFFFF << 8) | (5 << 1) | 1
    words = [first, 0xFFFFFFFF, 0, 123456789, 987654321] + raw_words(5, 500).tolist()
    ref = BoostReference(words)
    expected = ref.gaussian(3, 0, 1)
    stream = scripted_rng(words)
    assert bits_equal(stream.gaussian(3, 0, 1), expected)
    assert stream.word() == ref.eng()


def test_gaussian_determinism_and_seeds():
    a = rng.CaffeRNG(123).gaussian(1000, 0, 1)
    assert bits_equal(a, rng.CaffeRNG(123).gaussian(1000, 0, 1))
    assert not numpy.array_equal(a, rng.CaffeRNG(124).gaussian(1000, 0, 1))
    rng.set_random_seed(123)
    assert bits_equal(rng.get_rng().gaussian(1000, 0, 1), a)


def test_gaussian_moments():
    v = rng.CaffeRNG(5).gaussian(400_000, 0, 1).astype(numpy.float64)
    assert abs(v.mean()) < 0.01 and abs(v.std() - 1) < 0.01
    assert abs(((v > 3.4426198558966521214) | (v < -3.4426198558966521214)).mean() - 5.76e-4) < 2e-4


def test_gaussian_speed():
    """Timing only (GoogLeNet draws about 7 M gaussians when it is initialised)."""
    stream = rng.CaffeRNG(1)
    start = time.perf_counter()
    stream.gaussian(7_000_000, 0, 0.01)
    print(f"\n7M gaussians: {time.perf_counter() - start:.2f} s")


# ------------------------------------------------------------------------------------------------
# The compiled draws (caffe_engine/kernels/cpu/rng.py: mt19937 and the distributions in Numba)
# ------------------------------------------------------------------------------------------------
def _needs_compiled():
    pytest.importorskip("numba")


def _uniform_expected(words, n, a, b):
    hi = numpy.nextafter(f32(b), f32(numpy.inf))
    out, k = [], 0
    while len(out) < n:
        v = f32(words[k]) / (f32(4294967295) + f32(1)) * (hi - f32(a)) + f32(a)
        k += 1
        if v < hi:
            out.append(v)
    return numpy.array(out, f32), k


@pytest.mark.parametrize("seed", [1, 1701, 4294967295])
def test_compiled_gaussian_matches_scalar_boost(monkeypatch, seed):
    """Every bit and the stream position, across many mt19937 regenerations (624 words)."""
    _needs_compiled()
    monkeypatch.setattr(rng, "_COMPILED_MIN", 0)
    n = 200_000
    ref = BoostReference(raw_words(seed, int(n * 1.1)))
    stream = rng.CaffeRNG(seed)
    got = numpy.concatenate([stream.gaussian(k, 0.2, 0.7) for k in (1, 623, 625, n - 1249)])
    assert bits_equal(got, ref.gaussian(n, 0.2, 0.7))
    assert stream.words(3).tolist() == [ref.eng() for _ in range(3)]
    assert ref.tails > 50 and ref.wedge_tests > 1500


def test_compiled_draws_take_the_held_back_words_first(monkeypatch):
    """Tails, wedge uniforms rounding to 1, a uniform rejected at the top, held-back words."""
    _needs_compiled()
    monkeypatch.setattr(rng, "_COMPILED_MIN", 0)
    held = adversarial_words(3, 6000)
    stream = rng.CaffeRNG(77)
    stream._pending = held.astype(numpy.uint32)
    words = numpy.concatenate([held, raw_words(77, 20_000).astype(numpy.uint64)])
    ref = BoostReference(words)
    assert bits_equal(stream.gaussian(800, -1.0, 0.01), ref.gaussian(800, -1.0, 0.01))
    assert ref.tails > 100 and ref.pos < len(held) - 2000
    rest = words[ref.pos:]
    expected, used = _uniform_expected(rest, 5000, 0.0, 1.0)
    assert used > 5000                   # the adversarial words near 2**32 were rejected
    assert bits_equal(stream.uniform(5000, 0.0, 1.0), expected)
    assert stream.word() == int(rest[used])


def test_compiled_and_numpy_draws_agree(monkeypatch):
    """The same stream through either implementation, over draws big and small."""
    _needs_compiled()
    draws = [("gaussian", 300_001, 0.0, 0.01), ("uniform", 262_144, -0.3, 0.3),
             ("gaussian", 5, 1.0, 2.0), ("uniform", 1_000_003, 0.0, 1.0),
             ("gaussian", 1 << 19, 0.5, 3.0)]
    results = []
    for minimum in (0, 1 << 62):
        monkeypatch.setattr(rng, "_COMPILED_MIN", minimum)
        stream = rng.CaffeRNG(12345)
        results.append([getattr(stream, kind)(n, a, b) for kind, n, a, b in draws]
                       + [stream.words(5)])
    for compiled, numpy_path in zip(*results):
        assert bits_equal(compiled, numpy_path)


def test_compiled_and_numpy_bernoulli_agree(monkeypatch):
    """Dropout's float64 and the sparse filler's float32 bernoulli, compiled and in NumPy, with
    held-back words first (their thresholds' rounding is where the two dtypes differ)."""
    _needs_compiled()
    results = []
    for minimum in (0, 1 << 62):
        monkeypatch.setattr(rng, "_COMPILED_MIN", minimum)
        stream = rng.CaffeRNG(4321)
        stream._pending = adversarial_words(5, 3000).astype(numpy.uint32)
        results.append([stream.bernoulli(2000, 0.5), stream.bernoulli(700_001, 1 - 0.3),
                        stream.bernoulli(50_000, 0.1, numpy.float32),
                        stream.bernoulli(1000, 1.0), stream.words(5)])
    for compiled, numpy_path in zip(*results):
        assert compiled.dtype == numpy_path.dtype
        numpy.testing.assert_array_equal(compiled, numpy_path)
    assert 0.65 < results[0][1].mean() < 0.75


def test_draws_into_a_given_array(monkeypatch):
    _needs_compiled()
    for minimum in (0, 1 << 62):
        monkeypatch.setattr(rng, "_COMPILED_MIN", minimum)
        out = numpy.full((4, 5), 7, f32)
        assert rng.CaffeRNG(8).gaussian(20, 0, 1, out=out) is out
        assert bits_equal(out.reshape(-1), rng.CaffeRNG(8).gaussian(20, 0, 1))
        assert rng.CaffeRNG(8).uniform(20, -1, 1, out=out) is out
        assert bits_equal(out.reshape(-1), rng.CaffeRNG(8).uniform(20, -1, 1))
    with pytest.raises(ValueError):
        rng.CaffeRNG(8).gaussian(20, 0, 1, out=numpy.zeros(20, numpy.float64))


@pytest.mark.parametrize("filler", ['type: "gaussian" std: 0.01', 'type: "xavier"',
                                    'type: "msra"', 'type: "uniform" min: -2 max: 3',
                                    'type: "gaussian" std: 0.5 sparse: 3'])
def test_fill_draws_into_the_blob_as_a_separate_draw_would(monkeypatch, filler):
    """fillers.fill writes a NumPy blob in place (the same array, no copy), with the values and
    the stream position of drawing into a new array and copying (the compiled and the NumPy
    draws alike)."""
    from google.protobuf import text_format
    from caffe_engine import fillers
    from caffe_engine.blob import Blob
    param = text_format.Parse(filler, caffe_pb2.FillerParameter())
    shape = (300, 20, 3, 3)
    for minimum in (0, 1 << 62):
        monkeypatch.setattr(rng, "_COMPILED_MIN", minimum)
        blob = Blob(shape)
        array = blob.data
        stream = rng.CaffeRNG(31)
        fillers.fill(blob, param, stream)
        assert blob.data is array
        expected_stream = rng.CaffeRNG(31)
        expected = fillers.FILLERS[param.type](param, shape, expected_stream)
        assert bits_equal(blob.data, expected)
        assert stream.word() == expected_stream.word()


BOOST_DUMP = r"""
#include <boost/math/special_functions/next.hpp>
#include <boost/random.hpp>
#include <cstdio>
#include <limits>
#include <vector>
int main() {   // caffe_rng_gaussian then caffe_rng_uniform (math_functions.cpp), seed 1701
  boost::mt19937 rng(1701);
  std::vector<float> a(1500000), b(700000);
  boost::normal_distribution<float> nd(0.5f, 0.01f);
  boost::variate_generator<boost::mt19937*, boost::normal_distribution<float> > g(&rng, nd);
  for (auto& x : a) x = g();
  boost::uniform_real<float> ud(-0.1f, boost::math::nextafter<float>(
      0.1f, std::numeric_limits<float>::max()));
  boost::variate_generator<boost::mt19937*, boost::uniform_real<float> > u(&rng, ud);
  for (auto& x : b) x = u();
  unsigned next = rng();
  fwrite(a.data(), 4, a.size(), stdout); fwrite(b.data(), 4, b.size(), stdout);
  fwrite(&next, 4, 1, stdout);
}
"""


def test_compiled_draws_match_real_boost(tmp_path):
    """Boost.Random itself (when g++ and Boost's headers are there), as Caffe calls it: the
    compiled gaussian and uniform give its floats bit for bit, and the stream goes on from the
    same word."""
    import subprocess
    _needs_compiled()
    if shutil.which("g++") is None or not Path("/usr/include/boost/random.hpp").exists():
        pytest.skip("needs g++ and Boost's headers")
    (tmp_path / "dump.cpp").write_text(BOOST_DUMP)
    subprocess.run(["g++", "-O2", "-o", str(tmp_path / "dump"), str(tmp_path / "dump.cpp")],
                   check=True, timeout=300)
    ref = numpy.frombuffer(subprocess.run([str(tmp_path / "dump")], check=True,
                                          capture_output=True, timeout=300).stdout, numpy.uint32)
    stream = rng.CaffeRNG(1701)
    got = numpy.concatenate([stream.gaussian(1_500_000, 0.5, 0.01).view(numpy.uint32),
                             stream.uniform(700_000, -0.1, 0.1).view(numpy.uint32)])
    assert numpy.array_equal(got, ref[:-1])
    assert stream.word() == int(ref[-1])


# ------------------------------------------------------------------------------------------------
# uniform and bernoulli
# ------------------------------------------------------------------------------------------------
def test_uniform_matches_boost_uniform_real():
    words = raw_words(9, 2000)
    stream = rng.CaffeRNG(9)
    got = stream.uniform(1000, -0.5, 1.5)
    hi = numpy.nextafter(f32(1.5), f32(2))
    expected, k = [], 0
    while len(expected) < 1000:
        v = f32(words[k]) / (f32(4294967295) + f32(1)) * (hi - f32(-0.5)) + f32(-0.5)
        k += 1
        if v < hi:
            expected.append(v)
    assert bits_equal(got, numpy.array(expected, f32))
    assert stream.word() == int(words[k])


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("p", [0.2, 0.5, 1 - float(f32(0.2)), 3 / 7, 1e-9])
def test_bernoulli_matches_boost(dtype, p):
    words = raw_words(21, 20_000)
    ref = BoostReference(words)
    stream = rng.CaffeRNG(21)
    assert bits_equal(stream.bernoulli(10_000, p, dtype=dtype), ref.bernoulli(10_000, p, dtype))
    assert stream.word() == ref.eng()


def test_bernoulli_float_and_double_round_differently():
    # 2**31 + 1 rounds to 2**31 in float32, which equals 0.5 * float(2**32 - 1) = 2**31.
    words = [2 ** 31 + 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1]
    assert scripted_rng(words).bernoulli(4, 0.5, dtype=numpy.float32).tolist() == [1, 1, 1, 0]
    assert scripted_rng(words).bernoulli(4, 0.5, dtype=numpy.float64).tolist() == [0, 1, 0, 0]


def test_bernoulli_edge_probabilities():
    stream = rng.CaffeRNG(4)
    first = rng.CaffeRNG(4).word()
    for dtype in (numpy.float32, numpy.float64):
        assert stream.bernoulli(100, 0.0, dtype=dtype).tolist() == [0] * 100   # no draw
    assert stream.word() == first
    stream = rng.CaffeRNG(4)
    for dtype in (numpy.float32, numpy.float64):
        assert stream.bernoulli(100, 1.0, dtype=dtype).tolist() == [1] * 100   # one draw each
    assert stream.word() == int(raw_words(4, 201)[200])
    assert scripted_rng([2 ** 32 - 1]).bernoulli(1, 1.0).tolist() == [1]
    with pytest.raises(ValueError):
        rng.CaffeRNG(1).bernoulli(3, 1.5)
    with pytest.raises(ValueError):
        rng.CaffeRNG(1).bernoulli(3, -0.1)
    with pytest.raises(ValueError):
        rng.CaffeRNG(1).bernoulli(3, 0.5, dtype=numpy.int32)


# ------------------------------------------------------------------------------------------------
# Whole solvers against real Caffe
# ------------------------------------------------------------------------------------------------
def _case_dir(tmp_path, case):
    """The case copied to <tmp>/x/y/<case> with <tmp>/data -> shared/data (see the README)."""
    dest = tmp_path / "x" / "y" / case
    shutil.copytree(TRAINING / case, dest)
    (tmp_path / "data").symlink_to(SHARED / "data")
    return dest


def _solver_param(case_dir):
    param = pio.read_solver_param(str(case_dir / "solver.prototxt"))
    net = pio.read_net_param(str(case_dir / param.net))
    missing = sorted({layer.type for layer in net.layer} - set(caffe_engine.layer_type_list()))
    if missing:
        pytest.skip(f"layer types not registered yet: {', '.join(missing)}")
    if param.type not in solvers.SOLVERS:
        # Building the nets (and so the draws) is the same for every update rule.
        param.type = "SGD"
    return param


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_initial_weights_bit_exact(case, tmp_path, monkeypatch):
    """After solver construction (random_seed, no --weights): Caffe's iter_0 model, to the byte."""
    case_dir = _case_dir(tmp_path, case)
    monkeypatch.chdir(case_dir)
    param = _solver_param(case_dir)
    solver = caffe_engine.get_solver(param)
    got = solver.net.to_proto().SerializeToString()
    ref = (TRAINING / case / f"{case}_iter_0.caffemodel").read_bytes()
    if got != ref:
        ref_net = caffe_pb2.NetParameter.FromString(ref)
        got_layers = {layer.name: layer for layer in solver.net.to_proto().layer}
        diffs = []
        for layer in ref_net.layer:
            for i, blob in enumerate(layer.blobs):
                mine = got_layers[layer.name].blobs[i] if layer.name in got_layers else None
                if mine is None or not bits_equal(numpy.array(mine.data, f32),
                                                  numpy.array(blob.data, f32)):
                    diffs.append(f"{layer.name}/{i}")
        pytest.fail(f"{case}: serialized weights differ; blobs not bit-identical: "
                    f"{diffs or 'none (metadata)'}")


def test_dropout_masks_bit_exact(tmp_path, monkeypatch):
    """mlp_dropout: the masks of the first training forward are Caffe's (bernoulli<double>)."""
    case = "mlp_dropout"
    if case not in TRAIN_CASES:
        pytest.skip("no mlp_dropout fixture")
    case_dir = _case_dir(tmp_path, case)
    monkeypatch.chdir(case_dir)
    solver = caffe_engine.get_solver(_solver_param(case_dir))
    solver.step(1)
    names = list(solver.net.layer_names)
    for name in ("drop1", "drop2"):
        layer = solver.net.layers[names.index(name)]
        ref = numpy.load(TRAINING / case / f"dropout_mask_iter0_{name}.npy")
        mask = numpy.asarray(getattr(layer, "mask")).reshape(ref.shape)
        assert numpy.array_equal(mask.astype(numpy.uint8), ref), name
