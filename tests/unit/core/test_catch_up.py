"""Catch-up: judged from how late new deliveries arrive, held while late ones keep coming."""

from __future__ import annotations

import pytest

from core.catch_up import CatchUp


@pytest.mark.parametrize(("arrivals", "at", "behind"), [
    ([], 0, False),  # nothing seen: not behind
    ([(0, 999)], 999, False),  # 999 ms old on arrival: fresh enough
    ([(0, 1000)], 1000, True),  # 1 s old: behind
    ([(0, 1000)], 2999, True),  # held for 2 s after the last late arrival...
    ([(0, 1000)], 3000, False),  # ...and no longer
    ([(0, 1000), (2500, 2510)], 2999, True),  # a fresh arrival does not end it early
    ([(0, 1000), (1500, 2800)], 4700, True),  # each late arrival extends it
    ([(0, 1000), (1500, 2800)], 4800, False),
    ([(5000, 4000)], 4000, False),  # a timestamp from the future (skew): not late
])
def test_behind_from_the_age_of_arrivals(arrivals: list[tuple[int, int]], at: int, behind: bool) -> None:
    c = CatchUp(late_ms=1000, hold_ms=2000)
    for created, now in arrivals:
        c.arrived(created, now)
    assert c.behind(at) is behind


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        CatchUp(late_ms=0, hold_ms=1)
    with pytest.raises(ValueError):
        CatchUp(late_ms=1, hold_ms=-1)
