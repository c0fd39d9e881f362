"""control_plane.history.endpoint_figures: an endpoint's last 24 h by hour and status class, with a fixed clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from control_plane.domain import Attempt, DeliveryDetail, DeliveryStatus, DeliverySummary, Page, Principal
from control_plane.history import endpoint_figures as ef
from control_plane.history import stats

HOUR = ef.HOUR_MS
NOW = 1_700_000_000_000 // HOUR * HOUR + 30 * 60_000  # half past an hour
THIS_HOUR = NOW // HOUR * HOUR
FIRST_HOUR = THIS_HOUR - 23 * HOUR


def attempt(at: int | None, status: int | None = 200, error: str = "", latency: int | None = 100,
            outcome: str = "succeeded") -> Attempt:
    return Attempt(1, "a", at, at, status, latency, outcome, error, False, 1, "https://x", (1,), "", "")


@pytest.mark.parametrize(("case", "attempts", "classes", "requests"), [
    ("a 2xx now", [attempt(NOW)], {"2xx": 1}, 1),
    ("a 503", [attempt(NOW, 503, "http_5xx")], {"5xx": 1}, 1),
    ("a 301 is a 3xx", [attempt(NOW, 301, "redirect")], {"3xx": 1}, 1),
    ("a 410 is a 4xx", [attempt(NOW, 410, "gone")], {"4xx": 1}, 1),
    ("a timeout has no status", [attempt(NOW, None, "timeout")], {"timeout": 1}, 1),
    ("connect refused is network", [attempt(NOW, None, "connect")], {"network": 1}, 1),
    ("egress refused", [attempt(NOW, None, "egress_refused")], {"refused": 1}, 1),
    ("an unknown error class is internal", [attempt(NOW, None, "???")], {"internal": 1}, 1),
    ("a reserved row is no request", [attempt(NOW, None, "", outcome="reserved")], {}, 0),
    ("a request never sent", [attempt(NOW, None, "egress_refused", outcome="not_sent")], {}, 0),
    ("older than the window", [attempt(FIRST_HOUR - 1)], {}, 0),
    ("in the future", [attempt(NOW + 1)], {}, 0),
    ("no start time", [attempt(None)], {}, 0),
])
def test_requests_are_counted_by_status_class(case: str, attempts: list[Attempt], classes: dict[str, int],
                                              requests: int) -> None:
    f = ef.summarise(attempts, NOW)
    total: dict[str, int] = {}
    for _, counts in f.hours:
        for c, n in counts.items():
            total[c] = total.get(c, 0) + n
    assert (total, f.requests) == (classes, requests), case


def test_twenty_four_hourly_buckets_oldest_first_each_request_in_the_hour_it_started() -> None:
    f = ef.summarise([attempt(FIRST_HOUR), attempt(THIS_HOUR - 1), attempt(THIS_HOUR + 5, 500, "http_5xx")], NOW)
    assert [h for h, _ in f.hours] == [FIRST_HOUR + i * HOUR for i in range(24)]
    assert f.since_ms == FIRST_HOUR
    assert f.hours[0][1] == {"2xx": 1}
    assert f.hours[22][1] == {"2xx": 1}
    assert f.hours[23][1] == {"5xx": 1}


def test_success_rate_and_latency_percentiles() -> None:
    attempts = [attempt(NOW, latency=ms) for ms in range(1, 99)] + \
        [attempt(NOW, 503, "http_5xx", latency=1000), attempt(NOW, None, "timeout", latency=None)]
    f = ef.summarise(attempts, NOW)
    assert f.requests == 100
    assert f.success_rate == pytest.approx(0.98)
    assert (f.p50_ms, f.p99_ms) == (50, 1000)


def test_no_requests_means_no_rate_and_no_latency() -> None:
    f = ef.summarise([], NOW)
    assert (f.requests, f.success_rate, f.p50_ms, f.p99_ms) == (0, None, None, None)
    assert len(f.hours) == 24


@pytest.mark.parametrize(("values", "p", "want"), [
    ([], 50, None), ([7], 50, 7), ([7], 99, 7), ([1, 2], 50, 1), ([1, 2, 3, 4], 50, 2), ([1, 2, 3, 4], 99, 4),
    (list(range(1, 101)), 99, 99), (list(range(1, 101)), 100, 100),
])
def test_percentile_is_nearest_rank(values: list[int], p: float, want: int | None) -> None:
    assert ef.percentile(values, p) == want


def prom(answer: list[dict] | Exception) -> Any:
    asked: list[str] = []

    def query(url: str, promql: str) -> list[dict]:
        asked.append(promql)
        if isinstance(answer, Exception):
            raise answer
        return answer
    query.asked = asked  # type: ignore[attr-defined]
    return query


@pytest.mark.parametrize(("answer", "want"), [
    ([{"metric": {}, "value": [0, "3"]}], 3),
    ([], None),  # no per-endpoint series
    (stats.PrometheusError("down"), None),
])
def test_breaker_transitions_from_the_per_endpoint_gauge(answer: Any, want: int | None) -> None:
    q = prom(answer)
    assert ef.breaker_transitions("http://p", "ep_1", q) == want
    assert q.asked == ['sum(changes(flink_taskmanager_job_task_operator_endpoint_id_breaker_open'
                       '{endpoint_id="ep_1"}[24h]))']


def test_an_unexpected_endpoint_id_never_reaches_promql() -> None:
    q = prom([{"metric": {}, "value": [0, "3"]}])
    assert ef.breaker_transitions("http://p", 'x"} or vector(1) #', q) is None
    assert q.asked == []


@dataclass
class FakeDeliveries:
    """DeliveryService's list/get over a fixed set, with its tenancy check."""

    attempts: dict[str, list[Attempt]]
    tenant: str = "t_1"
    listed: list[tuple[str, int | None]] = field(default_factory=list)

    def _summary(self, did: str) -> DeliverySummary:
        return DeliverySummary(did, "e", self.tenant, "ep_1", "x", DeliveryStatus.SUCCEEDED, 1, 200, NOW, NOW)

    def list(self, principal: Principal, endpoint_id: str, statuses: Any, since: int | None, until: int | None,
             limit: int, cursor: str) -> Page[DeliverySummary]:
        assert principal.tenant_id == self.tenant
        self.listed.append((cursor, since))
        ids = sorted(self.attempts)
        start = int(cursor or 0)
        nxt = start + limit
        return Page(tuple(self._summary(d) for d in ids[start:nxt]), str(nxt) if nxt < len(ids) else "")

    def get(self, principal: Principal, delivery_id: str) -> DeliveryDetail:
        return DeliveryDetail(self._summary(delivery_id), 1, False, None, None, "",
                              tuple(self.attempts[delivery_id]))


def test_read_pages_through_the_window_and_sums_every_deliverys_attempts() -> None:
    fake = FakeDeliveries({f"d{i:04d}": [attempt(NOW, 503, "http_5xx"), attempt(NOW)] for i in range(450)})
    f = ef.read(fake, Principal("t_1", "k", False), "ep_1", NOW)  # type: ignore[arg-type]
    assert (f.requests, f.success_rate, f.capped, f.breaker_transitions) == (900, 0.5, False, None)
    assert [c for c, _ in fake.listed] == ["", "200", "400"]
    assert {s for _, s in fake.listed} == {FIRST_HOUR}


def test_read_stops_at_its_bound_and_says_so() -> None:
    fake = FakeDeliveries({f"d{i:04d}": [attempt(NOW)] for i in range(ef.MAX_DELIVERIES + 10)})
    f = ef.read(fake, Principal("t_1", "k", False), "ep_1", NOW)  # type: ignore[arg-type]
    assert (f.requests, f.capped) == (ef.MAX_DELIVERIES, True)
