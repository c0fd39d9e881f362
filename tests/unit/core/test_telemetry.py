"""core/telemetry.py: status classes, cumulative latency buckets and the dispatcher's gauges."""

from __future__ import annotations

import pytest

from core.breaker import CircuitState
from core.outcomes import ErrorClass, HttpResult
from core.telemetry import (
    BUCKET_LABELS,
    DispatcherGauges,
    EndpointView,
    PendingView,
    aggregate,
    bucket_labels,
    status_class,
    summarize,
)

CLASSES = [
    # result                                               -> class
    (HttpResult(200), "2xx"),
    (HttpResult(204), "2xx"),
    (HttpResult(301), "3xx"),
    (HttpResult(410), "4xx"),
    (HttpResult(429, ErrorClass.HTTP_429), "4xx"),
    (HttpResult(503), "5xx"),
    (HttpResult(200, ErrorClass.BODY_TOO_LARGE), "2xx"),  # informational error: the status decides
    (HttpResult(101), "2xx"),  # odd statuses land in the nearest family, never a new label
    (HttpResult(999), "5xx"),
    (HttpResult(None, ErrorClass.TIMEOUT), "timeout"),
    (HttpResult(None, ErrorClass.CONNECT), "network"),
    (HttpResult(None, ErrorClass.RESET), "network"),
    (HttpResult(None, ErrorClass.DNS), "network"),
    (HttpResult(None, ErrorClass.PROTOCOL), "network"),
    (HttpResult(None, ErrorClass.TLS), "tls"),
    (HttpResult(None, ErrorClass.EGRESS_REFUSED), "refused"),
    (HttpResult(None, ErrorClass.INTERNAL), "internal"),
]


@pytest.mark.parametrize(("result", "expected"), CLASSES)
def test_status_class(result: HttpResult, expected: str) -> None:
    assert status_class(result) == expected


BUCKETS = [
    # value ms -> smallest bucket holding it (every larger one holds it too)
    (0, "10"),
    (10, "10"),
    (11, "25"),
    (9_999, "10000"),
    (10_000, "10000"),
    (10_001, "30000"),
    (300_000, "300000"),
    (300_001, "inf"),
    (-5, "10"),  # clock skew: an arrival after the attempt counts as the fastest bucket
]


@pytest.mark.parametrize(("value", "smallest"), BUCKETS)
def test_buckets_are_cumulative(value: int, smallest: str) -> None:
    labels = bucket_labels(value)
    assert labels[0] == smallest
    assert labels == BUCKET_LABELS[BUCKET_LABELS.index(smallest):]
    assert labels[-1] == "inf"


def ep(*pending: tuple[int, bool], parked: bool = False, breaker: CircuitState = CircuitState.CLOSED,
       spilled: int = 0, spilled_oldest_ms: int | None = None) -> EndpointView:
    return EndpointView(tuple(PendingView(c, a) for c, a in pending), spilled, spilled_oldest_ms, breaker, parked)


def dispatcher_gauges(endpoints: list[EndpointView], tenants_at_quota: int) -> DispatcherGauges:
    return aggregate((summarize(e) for e in endpoints), tenants_at_quota)


def test_gauges_split_new_retry_and_parked() -> None:
    g = dispatcher_gauges([
        ep((1_000, False), (500, True)),                                   # healthy: one new, one retry
        ep((200, False), (300, True), parked=True, breaker=CircuitState.OPEN),  # failing endpoint
        ep(breaker=CircuitState.HALF_OPEN, spilled=4, spilled_oldest_ms=800),   # overflow only
        ep(),
    ], tenants_at_quota=2)
    assert (g.pending_new, g.pending_retry) == (1 + 1 + 4, 2)
    assert g.oldest_new_ms == 800  # the overflow queue's head, on an endpoint free to send
    assert g.oldest_parked_new_ms == 200  # the new delivery waiting behind the open breaker
    assert g.oldest_retry_ms == 300
    assert (g.endpoints, g.breakers_open, g.breakers_half_open, g.endpoints_parked, g.tenants_at_quota) == (
        4, 1, 1, 1, 2)
    assert (g.age_ms(g.oldest_new_ms, 10_800), g.age_ms(None, 10_800), g.age_ms(20_000, 10_000)) == (10_000, 0, 0)


def test_a_summary_keeps_what_the_gauges_and_the_per_endpoint_series_need() -> None:
    s = summarize(ep((1_000, False), (500, True), (700, True), spilled=2, spilled_oldest_ms=1_200))
    assert (s.new, s.retry, s.oldest_new_ms, s.oldest_retry_ms, s.held) == (3, 2, 1_000, 500, 5)


def test_no_endpoints_no_ages() -> None:
    g = dispatcher_gauges([], tenants_at_quota=0)
    assert (g.oldest_new_ms, g.oldest_parked_new_ms, g.oldest_retry_ms, g.pending_new) == (None, None, None, 0)
    assert not g.ageing


@pytest.mark.parametrize("field", ["oldest_new_ms", "oldest_parked_new_ms", "oldest_retry_ms"])
def test_any_oldest_arrival_makes_the_gauges_ageing(field: str) -> None:
    assert DispatcherGauges(**{field: 1_000}).ageing
