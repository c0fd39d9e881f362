"""Delivery history in Cassandra, written for the dispatcher.

Prepared statements and asynchronous execution; the writes of many deliveries travel together
as unlogged batches (:mod:`operators.write_batcher`, which says why and what it measured). Every
write is an idempotent upsert keyed by delivery_id (and attempt number), so redoing one after a
restore, a timeout or a failed batch cannot create a second logical row.

Creation rows are written ``USING TIMESTAMP`` = the delivery's creation time: a re-processed event
re-writes identical creation cells, and its ``status = 'pending'`` can never overwrite a later
status the dispatcher wrote (Cassandra keeps the cell with the newest write timestamp).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from cassandra.cluster import Cluster, ResponseFuture, Session
from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
from cassandra.query import BatchStatement, BatchType

from core.dispatch import AttemptRecord
from core.fanout import NewDelivery
from core.records import EventRecord
from core.settings import CassandraSettings
from operators.write_batcher import AllOf, BatchCompletion, Completion, Statement, WriteBatcher


def _ts(ms: int | None) -> dt.datetime | None:
    return None if ms is None else dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _day(ms: int) -> dt.date:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).date()


def _hour(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms // 3_600_000 * 3600, tz=dt.UTC)


class CassandraHistory:
    def __init__(self, settings: CassandraSettings) -> None:
        self._settings = settings
        self._cluster = Cluster(
            settings.contact_points,
            port=settings.port,
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc)),
            # v4, not v5: v5 frames carry checksums the driver computes in Python (~2 % of the
            # dispatcher's interpreter in a profile); loopback/LAN TCP already checksums.
            protocol_version=4,
        )
        self._session: Session = self._cluster.connect(settings.keyspace)
        self._sem: asyncio.Semaphore | None = None
        self._prepare()
        self._batcher = WriteBatcher(
            self._send_batch, max_statements=settings.history_batch_max_statements,
            max_bytes=settings.history_batch_max_bytes, linger_s=settings.history_batch_linger_ms / 1000)

    def _prepare(self) -> None:
        p = self._session.prepare
        self._insert_event = p(
            "INSERT INTO events (event_id, tenant_id, event_type, schema_version, object_id, object_version,"
            " occurred_at, payload, payload_sha256, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?) USING TIMESTAMP ?"
        )
        self._insert_delivery = p(
            "INSERT INTO deliveries (delivery_id, event_id, tenant_id, endpoint_id, endpoint_config_version,"
            " event_type, created_at, expires_at, status, attempt_count, auto_retry_active, next_attempt_at)"
            " VALUES (?,?,?,?,?,?,?,?,'pending',0,true,?) USING TIMESTAMP ?"
        )
        self._insert_by_event = p(
            "INSERT INTO deliveries_by_event (event_id, endpoint_id, delivery_id, tenant_id,"
            " endpoint_config_version, created_at) VALUES (?,?,?,?,?,?) USING TIMESTAMP ?"
        )
        self._insert_by_endpoint = p(
            "INSERT INTO deliveries_by_endpoint (tenant_id, endpoint_id, day, created_at, delivery_id, event_id,"
            " event_type, status, attempt_count) VALUES (?,?,?,?,?,?,?,'pending',0) USING TIMESTAMP ?"
        )
        self._insert_attempt = p(
            "INSERT INTO attempts (delivery_id, attempt_number, attempt_id, endpoint_id, endpoint_config_version,"
            " url, started_at, finished_at, http_status, latency_ms, outcome, error_class, response_sha256,"
            " response_prefix, signing_key_versions, manual) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
        )
        self._insert_attempt_by_endpoint = p(
            "INSERT INTO attempts_by_endpoint (endpoint_id, hour, started_at, delivery_id, attempt_number,"
            " tenant_id, outcome, http_status, error_class, latency_ms, manual) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
        )
        self._update_delivery = p(
            "UPDATE deliveries SET status=?, attempt_count=?, next_attempt_at=?, last_http_status=?,"
            " last_error_class=?, auto_retry_active=?, updated_at=? WHERE delivery_id=?"
        )
        self._update_by_endpoint = p(
            "UPDATE deliveries_by_endpoint SET status=?, attempt_count=?, last_http_status=?, updated_at=?"
            " WHERE tenant_id=? AND endpoint_id=? AND day=? AND created_at=? AND delivery_id=?"
        )
        self._select_delivery = p(
            "SELECT event_id, tenant_id, endpoint_id, endpoint_config_version, created_at, expires_at, status,"
            " attempt_count, auto_retry_active FROM deliveries WHERE delivery_id=?"
        )
        self._select_event = p(
            "SELECT event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at,"
            " payload FROM events WHERE event_id=?"
        )

    async def _run(self, stmt: Any, params: Any) -> Any:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._settings.max_concurrent_writes)
        async with self._sem:
            return await _await(self._session.execute_async(stmt, params))

    def persist(self, d: NewDelivery, write_event: bool = True) -> Completion:
        """Payload and delivery rows, durable before the first attempt. The event row (the
        payload) joins the batch when it is small; a large one is a request of its own so a
        batch never nears Cassandra's batch size limit."""
        e = d.event
        wts = d.created_at_ms * 1000
        created = _ts(d.created_at_ms)
        statements: list[Statement] = [
            (self._insert_delivery, (d.delivery_id, e.event_id, d.tenant_id, d.endpoint_id,
                                     d.endpoint_config_version, e.event_type, created,
                                     _ts(d.expires_at_ms), created, wts)),
            (self._insert_by_event, (e.event_id, d.endpoint_id, d.delivery_id, d.tenant_id,
                                     d.endpoint_config_version, created, wts)),
            (self._insert_by_endpoint, (d.tenant_id, d.endpoint_id, _day(d.created_at_ms), created,
                                        d.delivery_id, e.event_id, e.event_type, wts)),
        ]
        if not write_event:
            return self._batcher.add(statements)
        event = (self._insert_event, (
            e.event_id, e.tenant_id, e.event_type, e.schema_version, e.object_id, e.object_version,
            _ts(e.occurred_at_ms), e.payload, e.payload_sha256, created, wts))
        if len(e.payload) <= self._settings.history_batch_inline_payload_bytes:
            return self._batcher.add([*statements, event])
        alone = BatchCompletion()
        self._session.execute_async(*event).add_callbacks(alone.succeed, alone.fail)
        return AllOf([self._batcher.add(statements), alone])

    def record(self, d: NewDelivery, r: AttemptRecord, attempt_count: int) -> Completion:
        """The attempt rows and the delivery's new status."""
        now = _ts(r.finished_at_ms)
        statements: list[Statement] = [
            (self._update_delivery, (
                r.delivery_status, attempt_count, _ts(r.next_attempt_at_ms), r.http_status, r.error_class,
                r.auto_retry_active, now, d.delivery_id)),
            (self._update_by_endpoint, (
                r.delivery_status, attempt_count, r.http_status, now, d.tenant_id, d.endpoint_id,
                _day(d.created_at_ms), _ts(d.created_at_ms), d.delivery_id)),
        ]
        if r.attempt_number > 0:
            statements.append((self._insert_attempt, (
                d.delivery_id, r.attempt_number, f"{d.delivery_id}/{r.attempt_number}", d.endpoint_id,
                r.endpoint_config_version, r.url, _ts(r.started_at_ms), now, r.http_status, r.latency_ms,
                r.outcome, r.error_class, r.response_sha256, r.response_prefix,
                list(r.signing_key_versions), r.manual)))
            statements.append((self._insert_attempt_by_endpoint, (
                d.endpoint_id, _hour(r.started_at_ms), _ts(r.started_at_ms), d.delivery_id, r.attempt_number,
                d.tenant_id, r.outcome, r.http_status, r.error_class, r.latency_ms, r.manual)))
        return self._batcher.add(statements)

    def flush_if_due(self) -> None:
        """Send the open batch if its oldest write has waited long enough (called every pass)."""
        self._batcher.flush_if_due()

    def flush(self) -> None:
        self._batcher.flush()

    def _send_batch(self, statements: list[Statement], completion: BatchCompletion) -> None:
        if len(statements) == 1:
            rf = self._session.execute_async(*statements[0])
        else:
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for stmt, params in statements:
                batch.add(stmt, params)
            rf = self._session.execute_async(batch)
        rf.add_callbacks(completion.succeed, completion.fail)

    async def load_for_replay(self, delivery_id: str) -> tuple[NewDelivery, int, bool] | None:
        """The stored delivery (with its immutable payload), its attempt count and whether automatic
        retries are still active; None when the delivery is unknown or outside the history window."""
        rows = await self._run(self._select_delivery, (delivery_id,))
        row = rows[0] if rows else None
        if row is None:
            return None
        ev_rows = await self._run(self._select_event, (row.event_id,))
        ev = ev_rows[0] if ev_rows else None
        if ev is None:
            return None
        event = EventRecord(
            event_id=ev.event_id, tenant_id=ev.tenant_id, event_type=ev.event_type,
            schema_version=ev.schema_version or "", object_id=ev.object_id or "",
            object_version=ev.object_version or 0, occurred_at_ms=_ms(ev.occurred_at), payload=ev.payload or b"",
        )
        d = NewDelivery(
            delivery_id=delivery_id, event=event, endpoint_id=row.endpoint_id, tenant_id=row.tenant_id,
            endpoint_config_version=row.endpoint_config_version or 0, created_at_ms=_ms(row.created_at),
            expires_at_ms=_ms(row.expires_at),
        )
        return d, row.attempt_count or 0, bool(row.auto_retry_active) and row.status in (None, "pending")

    def close(self) -> None:
        self.flush()
        self._cluster.shutdown()


def _ms(value: dt.datetime | None) -> int:
    if value is None:
        return 0
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


def _await(rf: ResponseFuture) -> asyncio.Future[Any]:
    """Bridge the driver's callback future (its own I/O thread) into the running asyncio loop."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def ok(rows: Any) -> None:
        loop.call_soon_threadsafe(_set, fut, rows, None)

    def err(exc: BaseException) -> None:
        loop.call_soon_threadsafe(_set, fut, None, exc)

    rf.add_callbacks(ok, err)
    return fut


def _set(fut: asyncio.Future[Any], rows: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(rows)

