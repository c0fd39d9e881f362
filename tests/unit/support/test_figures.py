"""The figures a fault's verdict is judged by (tests/support/figures.py) and how a verdict holds
them to their bounds (tests/support/faults.FaultResult): plain numbers, no stack."""

from __future__ import annotations

import pytest

from tests.support.faults import FaultResult
from tests.support.figures import HEALTHY_P99_BOUND_MS, RESCALE_PAUSE_BOUND_S, longest_silence, p99


@pytest.mark.parametrize(("values", "expected"), [
    ([], None),
    ([7.0], 7.0),
    ([3.0, 1.0], 1.0),  # floor(1.98) - 1 = index 0
    (list(range(1, 101)), 99),  # of 100 values the 99th smallest
    (list(range(1, 51)), 49),  # of fewer, not the largest: one outlier alone is not the figure
    ([*[10.0] * 199, 25_800.0], 10.0),
    ([*[10.0] * 197, *[25_800.0] * 3], 25_800.0),  # three in 200 are more than 1 %
])
def test_p99_is_the_element_at_floor_99_percent_minus_one(values, expected):
    assert p99(values) == expected


def test_p99_takes_any_iterable_in_any_order():
    assert p99(v for v in [5.0, 1.0, 3.0, 2.0, 4.0]) == 4.0


@pytest.mark.parametrize(("times", "since", "expected"), [
    ([], 10.0, None),
    ([1.0, 2.0], 10.0, None),  # nothing after the fault: a loss, not a pause
    ([1.0, 2.0, 13.0], 10.0, 3.0),  # the gap that began before the fault counts from it
    ([11.0, 12.0, 20.0, 20.5], 10.0, 8.0),
    ([12.0], 10.0, None),  # a first request after the fault with none before: no gap to measure
    ([20.5, 11.0, 20.0, 12.0], 10.0, 8.0),  # unsorted
    ([9.0, 9.5, 10.2, 10.4], 10.0, 0.2),
])
def test_longest_silence_is_the_longest_gap_after_the_fault(times, since, expected):
    assert longest_silence(times, since) == (None if expected is None else pytest.approx(expected))


def _result(**figures) -> FaultResult:
    base = dict(fault="f", expected=10, succeeded=10, final_other=0, gaps=0, duplicates=0, duplicate_bound=0,
                unexplained_duplicates=0, max_oldest_new_age_s=1.0, retry_amplification=1.0, healthy_p99_ms=500.0)
    return FaultResult(**{**base, **figures})


@pytest.mark.parametrize(("figures", "passed", "over"), [
    ({}, True, []),  # no bound: the figures are reported only
    ({"healthy_p99_ms": 25_800.0}, True, []),
    ({"healthy_p99_ms": 25_800.0, "healthy_p99_bound_ms": HEALTHY_P99_BOUND_MS}, False,
     ["healthy p99 25800 ms > 10000 ms"]),
    ({"healthy_p99_ms": 10_000.0, "healthy_p99_bound_ms": HEALTHY_P99_BOUND_MS}, True, []),
    ({"healthy_p99_ms": None, "healthy_p99_bound_ms": HEALTHY_P99_BOUND_MS}, False, ["healthy p99 none > 10000 ms"]),
    ({"pause_s": 49.6, "pause_bound_s": RESCALE_PAUSE_BOUND_S}, False, ["pause 49.6 s > 15 s"]),
    ({"pause_s": 4.2, "pause_bound_s": RESCALE_PAUSE_BOUND_S}, True, []),
    ({"pause_s": None, "pause_bound_s": RESCALE_PAUSE_BOUND_S}, False, ["pause none > 15 s"]),
    ({"healthy_p99_ms": 17_100.0, "healthy_p99_bound_ms": HEALTHY_P99_BOUND_MS, "pause_s": 36.0,
      "pause_bound_s": RESCALE_PAUSE_BOUND_S}, False, ["healthy p99 17100 ms > 10000 ms", "pause 36.0 s > 15 s"]),
])
def test_a_bound_is_part_of_the_verdict_and_its_line_names_the_figure(figures, passed, over):
    r = _result(**figures)
    assert r.passed is passed
    assert r.over_bounds() == over
    line = r.line()
    assert line.startswith(f"fault f: {'PASS' if passed else 'FAIL'}")
    for reason in over:
        assert reason in line


def test_the_line_states_the_bound_beside_the_figure():
    line = _result(healthy_p99_ms=493.0, healthy_p99_bound_ms=HEALTHY_P99_BOUND_MS, pause_s=3.2,
                   pause_bound_s=RESCALE_PAUSE_BOUND_S).line()
    assert "healthy_p99_ms=493 (bound 10000)" in line and "pause_s=3.2 (bound 15)" in line


def test_a_loss_fails_whatever_the_figures():
    assert not _result(succeeded=9, healthy_p99_bound_ms=HEALTHY_P99_BOUND_MS).passed


def test_the_bounds_are_the_briefs():
    assert HEALTHY_P99_BOUND_MS == 10_000
    assert RESCALE_PAUSE_BOUND_S == 15
