"""The cpu kernel set's thread team: every part runs once per call, errors come back, and the
polling hand-off (and the sleeping one) never loses or repeats a part."""
import numpy
import pytest

pytest.importorskip("numba")
from numba import njit  # noqa: E402

from caffe_engine.kernels.cpu.team import Team, spin_until  # noqa: E402


@njit(nogil=True)
def _mark(out, call, t, parts):
    """out[call, t] += parts (a part that ran twice, or not at all, shows)."""
    out[call, t] += parts


@pytest.mark.parametrize("spin", [0.0, 100e-6, 5e-3])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_part_runs_once_per_call(spin, threads):
    team = Team(threads, spin=spin)
    calls = 300
    out = numpy.zeros((calls, threads), numpy.int64)
    for call in range(calls):
        team.run(_mark, out, call)
    numpy.testing.assert_array_equal(out, numpy.full((calls, threads), threads))


def test_parts_fewer_than_threads():
    team = Team(3, spin=100e-6)
    out = numpy.zeros((2, 3), numpy.int64)
    team.run(_mark, out, 0, parts=2)
    team.run(_mark, out, 1, parts=1)
    numpy.testing.assert_array_equal(out, [[2, 2, 0], [1, 0, 0]])


def _fail_on(bad):
    def part(t, parts):
        if t == bad:
            raise ValueError(f"part {t}")
    return part


@pytest.mark.parametrize("bad", [0, 1])
def test_a_part_error_reaches_the_caller_and_the_team_goes_on(bad):
    team = Team(2, spin=100e-6)
    with pytest.raises(ValueError, match=f"part {bad}"):
        team.run(_fail_on(bad))
    out = numpy.zeros((1, 2), numpy.int64)
    team.run(_mark, out, 0)
    numpy.testing.assert_array_equal(out, [[2, 2]])


def test_spin_until_sees_the_value_or_gives_up():
    counters = numpy.array([0, 7], numpy.int64)
    assert spin_until(counters, 1, 7, 1)
    assert not spin_until(counters, 0, 1, 1000)
