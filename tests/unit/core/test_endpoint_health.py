"""core.endpoint_health: the row the dispatcher writes per endpoint, when a breaker change writes
one at once, and a tenant's health aggregated from its endpoints' rows (fixed times)."""

from __future__ import annotations

import pytest

from core.breaker import BreakerState, CircuitState
from core.endpoint_health import STALE_AFTER_MS, EndpointReport, aggregate, breaker_changed, report
from core.telemetry import EndpointSummary

T0 = 1_800_000_000_000
OPEN = BreakerState(CircuitState.OPEN, 5, T0 - 1000, T0 + 29_000, 1)


@pytest.mark.parametrize("summary, breaker, at_quota, expected", [
    (EndpointSummary(new=2, retry=1, oldest_new_ms=T0 - 10, oldest_retry_ms=T0 - 50, held=3), OPEN, False,
     EndpointReport("ep", "t", 3, T0, CircuitState.OPEN, T0 + 29_000, T0 - 10, T0 - 50, False)),
    # a closed breaker carries no next probe, whatever the state kept of an earlier opening
    (EndpointSummary(new=1, oldest_new_ms=T0 - 10, held=1), BreakerState(open_until_ms=T0), True,
     EndpointReport("ep", "t", 1, T0, CircuitState.CLOSED, None, T0 - 10, None, True)),
    # at quota but holding nothing: not throttled (nothing waits for a slot)
    (EndpointSummary(), BreakerState(), True, EndpointReport("ep", "t", 0, T0, CircuitState.CLOSED)),
])
def test_the_reported_row(summary: EndpointSummary, breaker: BreakerState, at_quota: bool,
                          expected: EndpointReport) -> None:
    assert report("ep", "t", summary, breaker, at_quota, T0) == expected


@pytest.mark.parametrize("last, now, write", [
    (None, CircuitState.CLOSED, False),  # first pass of a closed endpoint: the cadence reports it
    (None, CircuitState.OPEN, True),  # a restore brought it back open
    (CircuitState.CLOSED, CircuitState.OPEN, True),
    (CircuitState.OPEN, CircuitState.OPEN, False),  # every pass behind an open breaker: no write
    (CircuitState.OPEN, CircuitState.HALF_OPEN, True),
    (CircuitState.HALF_OPEN, CircuitState.CLOSED, True),
])
def test_a_breaker_change_writes_a_row_at_once(last: CircuitState | None, now: CircuitState, write: bool) -> None:
    assert breaker_changed(last, now) is write


def _r(ep: str, pending: int, at: int = T0, breaker: CircuitState | None = CircuitState.CLOSED,
       new: int | None = None, retry: int | None = None, throttled: bool = False) -> EndpointReport:
    return EndpointReport(ep, "t", pending, at, breaker, T0 + 1 if breaker is CircuitState.OPEN else None,
                          new, retry, throttled)


@pytest.mark.parametrize("rows, listed, expected", [
    ([], ["a"], dict(pending=0, oldest_new_age_ms=None, oldest_retry_age_ms=None, open_breakers=(),
                     throttled=(), stale=(), last_report_ms=None, breakers={"a": "idle"})),
    ([_r("a", 2, new=T0 - 4000, retry=T0 - 9000, breaker=CircuitState.OPEN),
      _r("b", 1, new=T0 - 7000, throttled=True), _r("c", 0, at=T0 - 60_000, retry=T0 - 99_000)],
     ["a", "b", "c", "d"],
     # c holds nothing now: its old ages are not the tenant's
     dict(pending=3, oldest_new_age_ms=7000, oldest_retry_age_ms=9000, open_breakers=("a",), throttled=("b",),
          stale=(), last_report_ms=T0,
          breakers={"a": "open", "b": "closed", "c": "closed", "d": "idle"})),
    ([_r("a", 4, at=T0 - STALE_AFTER_MS - 1, new=T0 - 200_000, breaker=CircuitState.HALF_OPEN),
      _r("b", 1, breaker=None)], ["a", "b"],
     dict(pending=5, oldest_new_age_ms=200_000, oldest_retry_age_ms=None, open_breakers=("a",), throttled=(),
          stale=("a",), last_report_ms=T0, breakers={"a": "half open", "b": "not reported"})),
])
def test_a_tenants_health_from_its_endpoints_rows(rows: list[EndpointReport], listed: list[str],
                                                  expected: dict[str, object]) -> None:
    h = aggregate(rows, T0, listed)
    assert {k: getattr(h, k) for k in expected} == expected
