"""What the console's health strip and operator view show, and where each figure comes from.

Tenant health strip:

* oldest pending (new / retry), breakers, throttling: the delivery job's per-endpoint reports in
  Cassandra (control_plane.endpoints.health; core/endpoint_health.py says what a row holds and
  when it is written). On by default, no metrics pipeline needed; a row is at most one report
  interval (30 s) old, a breaker's change is written at once.
* last hour by status class: deliveries created in the last hour, from the tenant's own history
  through DeliveryService, by their last answer (2xx/3xx/4xx/5xx, or none yet), and the share of
  finished ones that succeeded. Bounded scan; a bound reached is shown as "at least".

`summarise` is the pure part (table-tested); the rest reads.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from control_plane.console.context import ConsoleServices
from control_plane.domain import FINAL_STATUSES, Attempt, DeliveryStatus, DeliverySummary, Principal
from control_plane.errors import ControlPlaneError
from control_plane.history import stats
from core.endpoint_health import TenantHealth
from core.outcomes import ErrorClass, HttpResult
from core.telemetry import status_class
from core.timeutil import ms_to_iso

log = logging.getLogger(__name__)

HOUR_MS = 3600 * 1000
ENDPOINTS_SCANNED = 20
PAGES_PER_ENDPOINT = 5
PAGE = 200
CLASSES = ("2xx", "3xx", "4xx", "5xx", "no answer")


@dataclass(frozen=True)
class Health:
    last_hour: dict[str, int]  # status class of the last answer -> deliveries created in the last hour
    last_hour_capped: bool  # the scan stopped at its bound: at least these
    success_ratio: float | None  # succeeded / finished, last hour; None when none finished
    job: TenantHealth  # the job's reports: ages, breakers, throttling
    job_error: str = ""  # why the job's reports could not be read ("" = they were)


def summarise(last_hour: Iterable[DeliverySummary]) -> tuple[dict[str, int], float | None]:
    """Deliveries by the status class of their last answer, and the share of finished ones that succeeded."""
    classes: Counter[str] = Counter()
    finished = succeeded = 0
    for d in last_hour:
        if d.status is DeliveryStatus.SKIPPED:  # never sent: no answer to classify
            continue
        code = d.last_http_status
        classes["no answer" if not code else f"{min(max(code // 100, 2), 5)}xx"] += 1
        if d.status in FINAL_STATUSES:
            finished += 1
            succeeded += d.status is DeliveryStatus.SUCCEEDED
    return {c: classes.get(c, 0) for c in CLASSES}, succeeded / finished if finished else None


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
    capped = len(endpoint_ids) > ENDPOINTS_SCANNED
    for endpoint_id in endpoint_ids[:ENDPOINTS_SCANNED]:
        rows, more = _scan(services, principal, endpoint_id, now - HOUR_MS)
        recent += rows
        capped |= more
    classes, ratio = summarise(recent)
    try:
        job, error = services.health.tenant(principal, endpoint_ids), ""
    except ControlPlaneError as exc:
        log.warning("console: %s", exc.message)
        job, error = TenantHealth(), exc.message
    return Health(classes, capped, ratio, job, error)


def _scan(services: ConsoleServices, principal: Principal, endpoint_id: str,
          since_ms: int) -> tuple[list[DeliverySummary], bool]:
    rows: list[DeliverySummary] = []
    cursor = ""
    for _ in range(PAGES_PER_ENDPOINT):
        page = services.deliveries.list(principal, endpoint_id, [], since_ms, None, PAGE, cursor)
        rows += page.items
        cursor = page.next_cursor
        if not cursor:
            return rows, False
    return rows, True


@dataclass(frozen=True)
class TenantRow:
    tenant_id: str
    name: str
    endpoints: int


@dataclass(frozen=True)
class OperatorView:
    tenants: list[TenantRow]
    tenants_capped: bool
    backlogs: dict[str, TenantHealth]  # tenant -> its endpoints' job reports (holding or breaker open)
    backlogs_capped: bool
    backlogs_error: str
    now_ms: int
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
    backlogs: dict[str, TenantHealth] = {}
    backlogs_capped, backlogs_error = False, ""
    try:
        backlogs, backlogs_capped = services.health.by_tenant()
    except ControlPlaneError as exc:
        backlogs_error = exc.message
    report = services.reconciler.last_report
    window = ""
    if report is not None:
        window = f"{ms_to_iso(report.since_ms)} .. {ms_to_iso(report.until_ms)}"
    return OperatorView(sorted(tenants, key=lambda t: t.tenant_id), capped, backlogs, backlogs_capped,
                        backlogs_error, services.now_ms(), jobs, alerts, error,
                        report.gap_counts() if report is not None else None, window, services.links)
