"""What the console's health strip and operator view show, and where each figure comes from.

Tenant health strip (per tenant, so from the tenant's own history through DeliveryService: the
job's metrics are never per tenant):

* oldest pending: the oldest delivery still pending on the tenant's endpoints. A delivery ends
  within the 24 h retry deadline, so the scan covers the last 25 hours (bounded; a bound reached
  is shown as "at least").
* last hour by status class: deliveries created in the last hour by their last answer
  (2xx/3xx/4xx/5xx, or none yet), and the share of finished ones that succeeded.
* breakers: the dispatcher's per-endpoint breaker gauge in Prometheus, when the job exports
  per-endpoint series (dispatch.per_endpoint_metrics); otherwise "not exported" -- the breaker
  lives in Flink state only, and the console does not guess it from the history.

`summarise` is the pure part (table-tested); the rest reads.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from control_plane import stats
from control_plane.domain import FINAL_STATUSES, Attempt, DeliveryStatus, DeliverySummary, Principal
from control_plane.errors import ControlPlaneError
from core.outcomes import ErrorClass, HttpResult
from core.telemetry import status_class
from core.timeutil import ms_to_iso

if TYPE_CHECKING:
    from control_plane.console.app import ConsoleServices

log = logging.getLogger(__name__)

HOUR_MS = 3600 * 1000
PENDING_WINDOW_MS = 25 * HOUR_MS
ENDPOINTS_SCANNED = 20
PAGES_PER_ENDPOINT = 5
PAGE = 200
CLASSES = ("2xx", "3xx", "4xx", "5xx", "no answer")
BREAKER = "flink_taskmanager_job_task_operator_endpoint_id_breaker_open"


@dataclass(frozen=True)
class Health:
    oldest_pending_age_ms: int | None
    oldest_pending_capped: bool  # the scan stopped at its bound: the oldest is at least this old
    last_hour: dict[str, int]  # status class of the last answer -> deliveries created in the last hour
    success_ratio: float | None  # succeeded / finished, last hour; None when none finished
    breakers: dict[str, str] = field(default_factory=dict)  # endpoint_id -> open | closed | not exported


def summarise(now_ms: int, last_hour: Iterable[DeliverySummary], pending: Iterable[DeliverySummary],
              capped: bool) -> Health:
    classes: Counter[str] = Counter()
    finished = succeeded = 0
    for d in last_hour:
        code = d.last_http_status
        classes["no answer" if not code else f"{min(max(code // 100, 2), 5)}xx"] += 1
        if d.status in FINAL_STATUSES:
            finished += 1
            succeeded += d.status is DeliveryStatus.SUCCEEDED
    oldest = min((d.created_at_ms for d in pending if d.status is DeliveryStatus.PENDING), default=None)
    return Health(
        oldest_pending_age_ms=None if oldest is None else max(0, now_ms - oldest),
        oldest_pending_capped=capped,
        last_hour={c: classes.get(c, 0) for c in CLASSES},
        success_ratio=succeeded / finished if finished else None,
    )


def attempt_class(a: Attempt) -> str:
    """An attempt's status class, as the job's status_class_attempts metric counts it."""
    if a.http_status is None and not a.error_class:
        return "-"  # reserved: no outcome yet
    try:
        error = ErrorClass(a.error_class) if a.error_class else None
    except ValueError:
        error = ErrorClass.INTERNAL
    if a.http_status is None and error is None:
        return "-"
    return status_class(HttpResult(a.http_status, error))


def tenant_health(services: ConsoleServices, principal: Principal, endpoint_ids: Sequence[str]) -> Health:
    now = services.now_ms()
    recent: list[DeliverySummary] = []
    pending: list[DeliverySummary] = []
    capped = False
    for endpoint_id in endpoint_ids[:ENDPOINTS_SCANNED]:
        recent += _scan(services, principal, endpoint_id, [], now - HOUR_MS)[0]
        rows, more = _scan(services, principal, endpoint_id, [DeliveryStatus.PENDING], now - PENDING_WINDOW_MS)
        pending += rows
        capped |= more
    health = summarise(now, recent, pending, capped or len(endpoint_ids) > ENDPOINTS_SCANNED)
    return Health(**{**health.__dict__, "breakers": breakers(services, endpoint_ids)})


def _scan(services: ConsoleServices, principal: Principal, endpoint_id: str, statuses: list[DeliveryStatus],
          since_ms: int) -> tuple[list[DeliverySummary], bool]:
    rows: list[DeliverySummary] = []
    cursor = ""
    for _ in range(PAGES_PER_ENDPOINT):
        page = services.deliveries.list(principal, endpoint_id, statuses, since_ms, None, PAGE, cursor)
        rows += page.items
        cursor = page.next_cursor
        if not cursor:
            return rows, False
    return rows, True


def breakers(services: ConsoleServices, endpoint_ids: Sequence[str]) -> dict[str, str]:
    prometheus = services.prometheus_url
    shown = list(endpoint_ids[:ENDPOINTS_SCANNED])
    if not prometheus or not shown:
        return dict.fromkeys(shown, "unknown")
    try:
        series = stats.query(prometheus, f'max by (endpoint_id) ({BREAKER}{{endpoint_id=~"{"|".join(shown)}"}})',
                             timeout=2.0)
    except stats.PrometheusError as exc:
        log.warning("console: breaker states unavailable: %s", exc)
        return dict.fromkeys(shown, "unknown")
    seen = {s["metric"].get("endpoint_id"): float(s["value"][1]) for s in series}
    return {ep: ("not exported" if ep not in seen else "open" if seen[ep] >= 1 else "closed") for ep in shown}


@dataclass(frozen=True)
class TenantRow:
    tenant_id: str
    name: str
    endpoints: int


@dataclass(frozen=True)
class OperatorView:
    tenants: list[TenantRow]
    tenants_capped: bool
    jobs: dict[str, Any]  # job name -> stats.JobHealth
    alerts: list[str]
    metrics_error: str
    gaps: dict[str, int] | None  # the periodic reconciler's last run; None before its first
    gaps_window: str
    links: dict[str, str]


MAX_TENANTS = 200


def operator_view(services: ConsoleServices) -> OperatorView:
    tenants: list[TenantRow] = []
    capped = False
    for i, tenant_id in enumerate(services.store.iter_tenant_ids()):
        if i == MAX_TENANTS:
            capped = True
            break
        tenant = services.store.get_tenant(tenant_id)
        endpoints = services.store.list_endpoints(tenant_id, "", 101)
        tenants.append(TenantRow(tenant_id, tenant.name if tenant else "", len(endpoints)))
    jobs: dict[str, Any] = {}
    alerts: list[str] = []
    error = ""
    prometheus = services.prometheus_url
    try:
        jobs, alerts = stats.collect(prometheus) if prometheus else ({}, [])
    except stats.PrometheusError as exc:
        error = str(exc)
    except ControlPlaneError as exc:
        error = exc.message
    report = services.reconciler.last_report
    window = ""
    if report is not None:
        window = f"{ms_to_iso(report.since_ms)} .. {ms_to_iso(report.until_ms)}"
    return OperatorView(sorted(tenants, key=lambda t: t.tenant_id), capped, jobs, alerts, error,
                        report.gap_counts() if report is not None else None, window, services.links)
