"""One endpoint's figures for the last 24 hours, for the console's endpoint page.

* requests by status class, per hour, the success rate and p50/p99 latency: the attempts of the
  endpoint's deliveries created in the window, from its own history (DeliveryService, so tenancy
  is the service's), read up to a bound (``MAX_DELIVERIES``; reached: "at least", and said).
  A request is counted in the hour it started; a reserved row (no outcome yet) is not a request.
* breaker transitions: how often the job's per-endpoint ``breaker_open`` gauge changed in the
  window, from Prometheus -- only when the job exports per-endpoint series
  (``dispatch.per_endpoint_metrics``); otherwise None, and the page shows the breaker's current
  state from the job's report instead.

``summarise`` is the pure part (table-tested with fixed times); ``read`` calls the services.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from control_plane.domain import Attempt, Principal
from control_plane.history import stats
from control_plane.history.deliveries import DeliveryService
from core.outcomes import ErrorClass, HttpResult
from core.telemetry import status_class

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
WINDOW_HOURS = 24
MAX_DELIVERIES = 1000
PAGE = 200
READERS = 8  # concurrent delivery reads
CLASSES = ("2xx", "3xx", "4xx", "5xx", "timeout", "network", "tls", "refused", "internal")


@dataclass(frozen=True)
class Figures:
    since_ms: int
    hours: list[tuple[int, dict[str, int]]]  # (hour start ms, status class -> requests), oldest first
    requests: int
    success_rate: float | None  # 2xx / requests; None without requests
    p50_ms: int | None
    p99_ms: int | None
    capped: bool  # the read stopped at MAX_DELIVERIES: at least these
    breaker_transitions: int | None = None  # None: no per-endpoint series to count them from


def percentile(sorted_values: Sequence[int], p: float) -> int | None:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def attempt_class(a: Attempt) -> str | None:
    """A finished request's status class, as the job's status_class metric counts it; None for a
    reserved row (no outcome) and a request never sent."""
    if a.http_status is None and not a.error_class:
        return None
    if a.outcome == "not_sent":
        return None
    try:
        error = ErrorClass(a.error_class) if a.error_class else None
    except ValueError:
        error = ErrorClass.INTERNAL
    return status_class(HttpResult(a.http_status, error))


def summarise(attempts: Iterable[Attempt], now_ms: int, capped: bool = False,
              hours: int = WINDOW_HOURS) -> Figures:
    first_hour = (now_ms // HOUR_MS - hours + 1) * HOUR_MS
    buckets: dict[int, Counter[str]] = {first_hour + i * HOUR_MS: Counter() for i in range(hours)}
    latencies: list[int] = []
    ok = total = 0
    for a in attempts:
        cls = attempt_class(a)
        if cls is None or a.started_at_ms is None or a.started_at_ms < first_hour or a.started_at_ms > now_ms:
            continue
        buckets[a.started_at_ms // HOUR_MS * HOUR_MS][cls] += 1
        total += 1
        ok += cls == "2xx"
        if a.latency_ms is not None:
            latencies.append(a.latency_ms)
    latencies.sort()
    return Figures(first_hour, [(h, {c: n for c, n in sorted(counts.items())}) for h, counts in buckets.items()],
                   total, ok / total if total else None, percentile(latencies, 50), percentile(latencies, 99),
                   capped)


def read(deliveries: DeliveryService, principal: Principal, endpoint_id: str, now_ms: int,
         prometheus_url: str = "", query: Callable[[str, str], list[dict]] = stats.query) -> Figures:
    since = (now_ms // HOUR_MS - WINDOW_HOURS + 1) * HOUR_MS
    ids: list[str] = []
    cursor = ""
    capped = False
    while True:
        page = deliveries.list(principal, endpoint_id, [], since, None, PAGE, cursor)
        ids += [d.delivery_id for d in page.items]
        cursor = page.next_cursor
        if len(ids) >= MAX_DELIVERIES:
            capped, ids = bool(cursor) or len(ids) > MAX_DELIVERIES, ids[:MAX_DELIVERIES]
            break
        if not cursor:
            break
    with ThreadPoolExecutor(READERS, thread_name_prefix="figures") as pool:
        details = list(pool.map(lambda d: deliveries.get(principal, d), ids))
    figures = summarise((a for d in details for a in d.attempts), now_ms, capped)
    transitions = breaker_transitions(prometheus_url, endpoint_id, query) if prometheus_url else None
    return Figures(figures.since_ms, figures.hours, figures.requests, figures.success_rate, figures.p50_ms,
                   figures.p99_ms, figures.capped, transitions)


def breaker_transitions(prometheus_url: str, endpoint_id: str,
                        query: Callable[[str, str], list[dict]] = stats.query) -> int | None:
    """Changes of the endpoint's breaker_open gauge over the window; None when the job exports no
    per-endpoint series or Prometheus does not answer (the page says so, it does not fail)."""
    if not endpoint_id.replace("_", "").isalnum():
        return None  # never put an unexpected string into PromQL
    promql = (f"sum(changes(flink_taskmanager_job_task_operator_endpoint_id_breaker_open"
              f'{{endpoint_id="{endpoint_id}"}}[{WINDOW_HOURS}h]))')
    try:
        series = query(prometheus_url, promql)
    except stats.PrometheusError as exc:
        log.info("breaker transitions of %s: %s", endpoint_id, exc)
        return None
    if not series:
        return None
    return int(float(series[0]["value"][1]))
