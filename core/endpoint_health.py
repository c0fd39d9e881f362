"""An endpoint's health as the delivery job reports it, and a tenant's as the console shows it.

The dispatcher already writes one row per endpoint it holds deliveries for to Cassandra
(endpoint_backlogs, every BACKLOG_REPORT_MS) so that reconciliation can tell a delivery held
behind a failing endpoint from an orphaned one. That row also carries what only the job knows:
the breaker (closed / open until T / half open), the arrival of the oldest delivery not yet
attempted and of the oldest one retrying, and whether the endpoint has work while its tenant
uses its whole quota of in-flight requests. Readers need no metrics pipeline: this is on by default.

Write cost: none per delivery. A row is written at the existing report cadence, when the job
stops holding an endpoint's deliveries (as before), and when the breaker changes state -- at
most about three writes per open period (opened, probing, re-opened or closed), however many
deliveries the endpoint has. Ages are written as arrival times, so a reader computes the age at
read time; between two reports it may be up to one report interval stale.

Old rows (a job from before these columns) carry no breaker: ``breaker`` is None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from core.breaker import BreakerState, CircuitState
from core.telemetry import EndpointSummary


@dataclass(frozen=True)
class EndpointReport:
    """One endpoint_backlogs row."""

    endpoint_id: str
    tenant_id: str
    pending: int  # deliveries the job holds for it (memory and overflow queue)
    reported_at_ms: int
    breaker: CircuitState | None = None  # None: written by a job that did not report it
    open_until_ms: int | None = None  # an open breaker's next probe
    oldest_new_ms: int | None = None  # arrival of the oldest delivery not yet attempted
    oldest_retry_ms: int | None = None  # arrival of the oldest delivery being retried
    throttled: bool = False  # has work while its tenant uses every slot of its quota


def report(endpoint_id: str, tenant_id: str, summary: EndpointSummary, breaker: BreakerState,
           tenant_at_quota: bool, now_ms: int) -> EndpointReport:
    """The row the dispatcher writes for an endpoint it holds (``summary``) or no longer holds
    (an empty summary)."""
    return EndpointReport(
        endpoint_id=endpoint_id, tenant_id=tenant_id, pending=summary.held, reported_at_ms=now_ms,
        breaker=breaker.state,
        open_until_ms=breaker.open_until_ms if breaker.state is not CircuitState.CLOSED else None,
        oldest_new_ms=summary.oldest_new_ms, oldest_retry_ms=summary.oldest_retry_ms,
        throttled=tenant_at_quota and summary.held > 0)


def breaker_changed(last_reported: CircuitState | None, now: CircuitState) -> bool:
    """Whether the breaker moved since the endpoint's last row: a row is written at once, so
    readers see an opening without waiting for the next report. An endpoint not reported by
    this incarnation yet (None) counts as closed: a breaker a restore brings back open is
    reported at its first pass."""
    return now is not (last_reported or CircuitState.CLOSED)


# -- what the console shows ------------------------------------------------------------------------

# A row of an endpoint still holding deliveries that is older than this says the job stopped
# reporting it (job down, or an incarnation that never touched the endpoint yet): shown as stale.
STALE_AFTER_MS = 3 * 30_000


def breaker_label(r: EndpointReport | None) -> str:
    """closed | open | half open | idle (no row: nothing held in the last day) | not reported."""
    if r is None:
        return "idle"
    if r.breaker is None:
        return "not reported"
    return r.breaker.value.replace("_", " ")


@dataclass(frozen=True)
class TenantHealth:
    """A tenant's endpoints' rows, aggregated."""

    pending: int = 0
    oldest_new_age_ms: int | None = None
    oldest_retry_age_ms: int | None = None
    open_breakers: tuple[str, ...] = ()  # endpoint ids, open or half open
    throttled: tuple[str, ...] = ()  # endpoint ids waiting while the tenant is at quota
    stale: tuple[str, ...] = ()  # endpoint ids still holding deliveries whose row is old
    last_report_ms: int | None = None
    breakers: dict[str, str] = field(default_factory=dict)  # endpoint_id -> breaker_label


def aggregate(reports: Iterable[EndpointReport], now_ms: int, endpoint_ids: Iterable[str] = ()) -> TenantHealth:
    """Ages at ``now_ms`` from the oldest arrivals; ``endpoint_ids``: endpoints to label even
    without a row (idle)."""
    rows = {r.endpoint_id: r for r in reports}
    pending = 0
    oldest_new: int | None = None
    oldest_retry: int | None = None
    opened: list[str] = []
    throttled: list[str] = []
    stale: list[str] = []
    last: int | None = None
    for r in rows.values():
        pending += r.pending
        last = r.reported_at_ms if last is None else max(last, r.reported_at_ms)
        if r.pending > 0:
            oldest_new = _min(oldest_new, r.oldest_new_ms)
            oldest_retry = _min(oldest_retry, r.oldest_retry_ms)
            if now_ms - r.reported_at_ms > STALE_AFTER_MS:
                stale.append(r.endpoint_id)
            if r.throttled:
                throttled.append(r.endpoint_id)
        if r.breaker in (CircuitState.OPEN, CircuitState.HALF_OPEN):
            opened.append(r.endpoint_id)
    labels = {ep: breaker_label(rows.get(ep)) for ep in [*endpoint_ids, *rows]}
    return TenantHealth(
        pending=pending,
        oldest_new_age_ms=None if oldest_new is None else max(0, now_ms - oldest_new),
        oldest_retry_age_ms=None if oldest_retry is None else max(0, now_ms - oldest_retry),
        open_breakers=tuple(sorted(opened)), throttled=tuple(sorted(throttled)), stale=tuple(sorted(stale)),
        last_report_ms=last, breakers=labels)


def _min(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)
