"""The archive audit's own schedule (core/archive_schedule.py) with an injected clock: no sleeping."""

from __future__ import annotations

import pytest

from core.archive_schedule import Schedule, next_run_ms

H, M, S = 3_600_000, 60_000, 1_000
T0 = 1_795_870_800_000  # a UTC hour boundary (2026-11-28T11:00Z)


@pytest.mark.parametrize(("now", "every", "margin", "expected"), [
    (T0, H, 5 * M, T0 + 5 * M),                  # at the boundary: this hour's margin is ahead
    (T0 + 4 * M, H, 5 * M, T0 + 5 * M),
    (T0 + 5 * M, H, 5 * M, T0 + H + 5 * M),      # at the due time: strictly after, the next one
    (T0 + 30 * M, H, 5 * M, T0 + H + 5 * M),
    (T0 + H - 1, H, 0, T0 + H),
    (T0 + 7 * S, 10 * S, 2 * S, T0 + 12 * S),    # any period, counted from the epoch
])
def test_the_next_run_is_the_next_boundary_plus_the_margin(now, every, margin, expected):
    assert next_run_ms(now, every, margin) == expected


@pytest.mark.parametrize(("every", "margin"), [(H, H), (H, -1), (H, 2 * H)])
def test_a_margin_outside_the_period_is_refused(every, margin):
    with pytest.raises(ValueError, match="margin"):
        next_run_ms(T0, every, margin)


class FakeTime:
    """A clock that moves only when the schedule waits; asks to stop after ``stop_after`` waits."""

    def __init__(self, start_ms: int, stop_after: int) -> None:
        self.now = start_ms
        self.waits: list[float] = []
        self.stop_after = stop_after

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        if len(self.waits) > self.stop_after:
            return True  # SIGTERM arrived during this wait
        self.now += int(seconds * 1000)
        return False


def test_runs_at_each_hour_plus_margin_survives_a_failed_run_and_stops_on_request(caplog):
    t = FakeTime(T0 + 20 * M, stop_after=3)
    ran_at: list[int] = []

    def run() -> None:
        ran_at.append(t.now)
        t.now += 7 * M  # a run takes a while: the next wait is shorter
        if len(ran_at) == 2:
            raise OSError("the object store is down")

    s = Schedule(3600, 300, lambda: t.now, t.wait, run)
    s.loop()
    assert ran_at == [T0 + H + 5 * M, T0 + 2 * H + 5 * M, T0 + 3 * H + 5 * M]
    assert t.waits == [45 * 60, 53 * 60, 53 * 60, 53 * 60]  # the fourth wait was cut short by the stop
    assert (s.runs, s.failures) == (3, 1)
    assert "the next run at the next boundary retries" in caplog.text and "object store is down" in caplog.text


def test_a_stop_during_the_first_wait_runs_nothing():
    t = FakeTime(T0, stop_after=0)
    s = Schedule(3600, 300, lambda: t.now, t.wait, lambda: pytest.fail("ran"))
    s.loop()
    assert s.runs == 0 and t.waits == [300]


def test_a_run_longer_than_the_period_skips_to_the_next_boundary():
    t = FakeTime(T0, stop_after=2)
    ran_at: list[int] = []

    def run() -> None:
        ran_at.append(t.now)
        t.now += H + 10 * M  # past the next due time: nothing is owed for it

    Schedule(3600, 300, lambda: t.now, t.wait, run).loop()
    assert ran_at == [T0 + 5 * M, T0 + 2 * H + 5 * M]
