"""The delivery job's per-endpoint reports (endpoint_backlogs; what a row holds and when it is
written: core/endpoint_health.py), read for the console: a tenant's endpoints by point reads,
every tenant's by one bounded scan of the table.

The table holds one row per endpoint a job held deliveries for in the last day (its TTL), so the
scan reads the active endpoints only; it stops at SCAN_LIMIT rows and says so.
"""

from __future__ import annotations

import calendar
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from cassandra import DriverException
from cassandra.cluster import NoHostAvailable, Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement, SimpleStatement

from control_plane.domain import Principal
from control_plane.errors import Unavailable
from core.breaker import CircuitState
from core.endpoint_health import EndpointReport, TenantHealth, aggregate

SCAN_LIMIT = 10_000
_COLUMNS = ("endpoint_id, tenant_id, pending, reported_at, breaker, breaker_open_until, oldest_new_at,"
            " oldest_retry_at, throttled")


class EndpointHealthStore(Protocol):
    def for_endpoints(self, endpoint_ids: Sequence[str]) -> list[EndpointReport]:
        """The rows of these endpoints (none for an endpoint without one)."""
        ...

    def scan(self, limit: int) -> tuple[list[EndpointReport], bool]:
        """Up to ``limit`` rows of any endpoint, and whether more were left unread."""
        ...


class EndpointHealthService:
    def __init__(self, store: EndpointHealthStore, now_ms: Callable[[], int]) -> None:
        self._store = store
        self._now_ms = now_ms

    def tenant(self, principal: Principal, endpoint_ids: Sequence[str]) -> TenantHealth:
        """The tenant's health from the rows of ``endpoint_ids`` (the caller's own endpoints:
        a row of another tenant's endpoint is never counted)."""
        rows = [r for r in self._store.for_endpoints(endpoint_ids) if r.tenant_id == principal.tenant_id]
        return aggregate(rows, self._now_ms(), endpoint_ids)

    def by_tenant(self) -> tuple[dict[str, TenantHealth], bool]:
        """Operator view: every tenant with a row saying the job holds deliveries for it or a
        breaker not closed, and whether the scan stopped at its bound."""
        rows, capped = self._store.scan(SCAN_LIMIT)
        tenants: defaultdict[str, list[EndpointReport]] = defaultdict(list)
        for r in rows:
            if r.pending > 0 or r.breaker in (CircuitState.OPEN, CircuitState.HALF_OPEN):
                tenants[r.tenant_id].append(r)
        now = self._now_ms()
        return {t: aggregate(rs, now) for t, rs in sorted(tenants.items())}, capped


class CassandraEndpointHealth:
    """Statements are prepared on first use: a control plane whose keyspace lacks the columns
    (cassandra/schema/016_endpoint_health.cql not applied yet) still serves everything else."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._by_id: PreparedStatement | None = None

    def for_endpoints(self, endpoint_ids: Sequence[str]) -> list[EndpointReport]:
        if not endpoint_ids:
            return []
        try:
            if self._by_id is None:
                self._by_id = self._session.prepare(f"SELECT {_COLUMNS} FROM endpoint_backlogs WHERE endpoint_id=?")
            results = execute_concurrent_with_args(self._session, self._by_id, [(e,) for e in endpoint_ids],
                                                   concurrency=32, raise_on_first_error=True)
            return [_report(row) for _, rows in results for row in rows]
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"the job's endpoint reports are unavailable ({type(exc).__name__})") from exc

    def scan(self, limit: int) -> tuple[list[EndpointReport], bool]:
        out: list[EndpointReport] = []
        try:
            for row in self._session.execute(SimpleStatement(f"SELECT {_COLUMNS} FROM endpoint_backlogs",
                                                             fetch_size=1000)):
                if len(out) == limit:
                    return out, True
                out.append(_report(row))
        except (DriverException, NoHostAvailable) as exc:
            raise Unavailable(f"the job's endpoint reports are unavailable ({type(exc).__name__})") from exc
        return out, False


def _report(row: Any) -> EndpointReport:
    r = row if isinstance(row, dict) else row._asdict()
    return EndpointReport(
        endpoint_id=r["endpoint_id"], tenant_id=r["tenant_id"] or "", pending=r["pending"] or 0,
        reported_at_ms=_ms(r["reported_at"]) or 0,
        breaker=CircuitState(r["breaker"]) if r["breaker"] in set(CircuitState) else None,
        open_until_ms=_ms(r["breaker_open_until"]), oldest_new_ms=_ms(r["oldest_new_at"]),
        oldest_retry_ms=_ms(r["oldest_retry_at"]), throttled=bool(r["throttled"]))


def _ms(value: datetime | None) -> int | None:
    # The driver returns naive UTC datetimes.
    if value is None:
        return None
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000
