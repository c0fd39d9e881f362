"""The :class:`~control_plane.store.protocols.HistoryStore` in Cassandra: the delivery history the
Flink job writes (cassandra/schema/001_history.cql and later; both schemas while the old tables'
rows live, core/history_rows.py), read here; the control plane writes only the audit rows of
replay requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

from control_plane.domain import Attempt, DeliveryDetail, DeliveryStatus, DeliverySummary, ReplayAudit, attempt_outcome
from control_plane.store.cql import DRIVER_ERRORS, CassandraTables, dt, ms, unavailable, unavailable_on_driver_error
from control_plane.store.protocols import HistoryPosition
from core import history_rows
from core.history_buckets import HISTORY_BUCKETS
from core.records import REPLAY


class CassandraHistoryStore(CassandraTables):
    STATEMENTS = {
        # Both schemas: delivery_history first, the old tables for what it lacks (core/history_rows.py).
        "delivery_get": history_rows.SELECT_NEW,
        "delivery_get_old": history_rows.SELECT_OLD_DELIVERY,
        "attempts_get_old": history_rows.SELECT_OLD_ATTEMPTS,
        "replay_insert": "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, "
        "requested_at, reason, action) VALUES (?, ?, ?, ?, ?, ?, ?)",
        "replay_insert_new": "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, "
        "requested_at, reason, action) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS",
        "replays_get": "SELECT * FROM replay_requests WHERE delivery_id = ?",
        "deliveries_by_day": "SELECT created_at, delivery_id, event_id, event_type, status, "
        "attempt_count, last_http_status, updated_at FROM deliveries_by_endpoint "
        "WHERE tenant_id = ? AND endpoint_id = ? AND day = ? "
        "AND created_at >= ? AND created_at <= ?",
        "deliveries_by_day_bucket": "SELECT created_at, delivery_id, event_id, event_type, status, "
        "attempt_count, last_http_status, updated_at FROM endpoint_deliveries "
        "WHERE tenant_id = ? AND endpoint_id = ? AND day = ? AND bucket = ? "
        "AND created_at >= ? AND created_at <= ?",
    }

    @unavailable_on_driver_error
    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        row, rows = history_rows.split(self._execute("delivery_get", (delivery_id,)))
        if history_rows.needs_old(row):
            old, old_attempts = self._execute_all([("delivery_get_old", (delivery_id,)),
                                                   ("attempts_get_old", (delivery_id,))])
            row, rows = history_rows.merge(row, rows, next(old, None), old_attempts)
        if row is None:
            return None
        return delivery_detail(row, rows, self._execute("replays_get", (delivery_id,)))

    @unavailable_on_driver_error
    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        params = (audit.delivery_id, audit.request_id, audit.tenant_id, audit.requested_by,
                  dt(audit.requested_at_ms), audit.reason, audit.action)
        if if_new:
            return self._applied("replay_insert_new", params)
        self._first("replay_insert", params)
        return True

    def iter_endpoint_deliveries(
        self,
        tenant_id: str,
        endpoint_id: str,
        start_ms: int,
        end_ms: int,
        after: HistoryPosition | None,
    ) -> Iterator[DeliverySummary]:
        # Partitions per (endpoint, UTC day, bucket): walk the days newest first, reading a day's
        # buckets at once and merging them newest first (core.history_buckets). The unbucketed
        # table written before them is read beside them until its rows expire; a delivery made
        # before an upgrade and finished after it has a row in both, merged into one.
        upper_ms = end_ms - 1 if after is None else min(end_ms - 1, after[0])
        if upper_ms < start_ms:
            return
        day = _utc_day(upper_ms)
        first_day = _utc_day(start_ms)
        try:
            while day >= first_day:
                bounds = (dt(start_ms), dt(upper_ms))
                sources = self._execute_all(
                    [("deliveries_by_day", (tenant_id, endpoint_id, day, *bounds))]
                    + [("deliveries_by_day_bucket", (tenant_id, endpoint_id, day, b, *bounds))
                       for b in range(HISTORY_BUCKETS)])
                for row in _merged(sources):
                    summary = _summary(row, tenant_id, endpoint_id)
                    if after is not None and summary.created_at_ms == after[0] \
                            and summary.delivery_id <= after[1]:
                        continue  # same millisecond as the cursor, already returned
                    yield summary
                day -= timedelta(days=1)
        except DRIVER_ERRORS as exc:
            raise unavailable(exc) from exc


def delivery_detail(row: dict[str, Any], attempt_rows: list[dict[str, Any]], replay_rows: Iterable[dict[str, Any]],
                    tier: str = "hot") -> DeliveryDetail:
    """A delivery from its rows (core/history_rows.py's shape), whichever tier they came from."""
    latest = history_rows.top_attempt_number(attempt_rows)
    return DeliveryDetail(
        summary=_summary(row, row["tenant_id"] or "", row["endpoint_id"] or ""),
        endpoint_config_version=row["endpoint_config_version"],
        auto_retry_active=bool(row["auto_retry_active"]),
        expires_at_ms=ms(row["expires_at"]),
        next_attempt_at_ms=ms(row["next_attempt_at"]),
        last_error_class=row["last_error_class"] or "",
        attempts=tuple(_attempt(a, latest) for a in attempt_rows),
        replays=tuple(sorted((_replay(r) for r in replay_rows), key=lambda r: (r.requested_at_ms, r.request_id))),
        tier=tier,
    )


def _summary(row: dict[str, Any], tenant_id: str, endpoint_id: str) -> DeliverySummary:
    return DeliverySummary(
        delivery_id=row["delivery_id"],
        event_id=row["event_id"] or "",
        tenant_id=tenant_id,
        endpoint_id=endpoint_id,
        event_type=row["event_type"] or "",
        status=DeliveryStatus.parse(row["status"]),
        attempt_count=row["attempt_count"] or 0,
        last_http_status=row["last_http_status"],
        created_at_ms=ms(row["created_at"]) or 0,
        updated_at_ms=ms(row["updated_at"]),
    )


def _attempt(row: dict[str, Any], latest_number: int) -> Attempt:
    # A reserved row has only its number, id, endpoint, config version and reservation time.
    return Attempt(
        attempt_number=row["attempt_number"],
        attempt_id=row["attempt_id"] or "",
        started_at_ms=ms(row["started_at"]),
        finished_at_ms=ms(row["finished_at"]),
        http_status=row["http_status"],
        latency_ms=row["latency_ms"],
        outcome=attempt_outcome(row["outcome"] or "", row["attempt_number"], latest_number),
        error_class=row["error_class"] or "",
        manual=bool(row["manual"]),
        endpoint_config_version=row["endpoint_config_version"],
        url=row["url"] or "",
        signing_key_versions=tuple(row["signing_key_versions"] or ()),
        response_sha256=row["response_sha256"] or "",
        response_prefix=row["response_prefix"] or "",
    )


def _replay(row: dict[str, Any]) -> ReplayAudit:
    return ReplayAudit(delivery_id=row["delivery_id"], request_id=row["request_id"], tenant_id=row["tenant_id"] or "",
                       requested_by=row["requested_by"] or "", requested_at_ms=ms(row["requested_at"]) or 0,
                       reason=row["reason"] or "", action=row.get("action") or REPLAY)  # null: written before skips


def _merged(sources: list[Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """Rows of several newest-first partitions as one newest-first stream; rows of one delivery
    from the old and the new table (sources[0] is the old one) come out as one, the new table's
    cells winning where it has them."""
    def keyed(i: int, src: Iterator[dict[str, Any]]) -> Iterator[tuple[tuple[int, str, int], dict[str, Any]]]:
        for r in src:
            yield (-(ms(r["created_at"]) or 0), r["delivery_id"], i), r

    streams = [keyed(i, src) for i, src in enumerate(sources)]
    pending: dict[str, Any] | None = None
    for (_, did, _), row in heapq.merge(*streams, key=lambda kv: kv[0]):
        if pending is not None and pending["delivery_id"] == did:
            pending = {**pending, **{k: v for k, v in row.items() if v is not None}}
            continue
        if pending is not None:
            yield pending
        pending = row
    if pending is not None:
        yield pending


def _utc_day(ms: int) -> date:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).date()
