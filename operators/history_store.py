"""Delivery history in Cassandra, written for the dispatcher.

Prepared statements and asynchronous execution; the writes of many deliveries travel together
as unlogged batches (:mod:`operators.write_batcher`, which says why). Every
write is an idempotent upsert keyed by delivery_id (and attempt number), so redoing one after a
restore, a timeout or a failed batch cannot create a second logical row.

**Write timestamps decide, not arrival order.** Every row the dispatcher rewrites carries an
explicit ``USING TIMESTAMP`` (Cassandra keeps the cell with the newest one), chosen so that what
must win does, whatever order writes land in: a stale incarnation's late write, a retried batch,
a re-created delivery.

* Creation rows: the delivery's creation time. A re-processed event re-writes identical cells.
* Status updates: the record's finish time plus a band by status (:func:`status_write_ts`), so a
  final status is never overwritten by a non-final one, and ``succeeded`` by nothing.
* Attempt rows: reserved at the reservation time, completed at the finish time plus a band, so an
  outcome is never overwritten by a late reservation of the same number.

**Attempt rows before requests** (:mod:`core.dispatch`). The row of the first request is reserved
in the creation batch, each later one in the batch that records the previous outcome; numbers
are never reused, so ``attempts`` keeps one row per request a receiver may have seen. A row still
``reserved`` once its delivery has moved on is a request whose outcome was never recorded (the
worker died while it was in flight).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, ResponseFuture, Session
from cassandra.policies import (
    ConstantSpeculativeExecutionPolicy,
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType

from core import archive_facts, history_rows
from core.dispatch import FINAL_STATUSES, AttemptRecord, DurableRecord, Intent
from core.endpoint_health import EndpointReport
from core.fanout import FanoutSnapshot, NewDelivery
from core.history_buckets import bucket_of
from core.ordering import KeyRowChange
from core.records import EventRecord, ReplayRequest
from core.settings import CassandraSettings
from operators.write_batcher import AllOf, BatchCompletion, Completion, Statement, WriteBatcher

# Timestamps (and dates, hours) are bound as the integers the native protocol carries, not
# datetime/date objects: the driver takes milliseconds for `timestamp` and 2**31 + days for `date`;
# building then unpacking a datetime per value was paid by the dispatcher's interpreter for every
# value of every delivery (docs/performance.md#the-taskmanagers-interpreter).
_DATE_EPOCH = 2**31


def _day(ms: int) -> int:
    return _DATE_EPOCH + ms // 86_400_000


def _hour(ms: int) -> int:
    return ms // 3_600_000 * 3_600_000


# One year in microseconds: longer than the 30-day history window, so a write in a lower band is
# older than one in a higher band for as long as the row lives, whatever the clocks said.
# The price: cells up to two years "in the future". TTLs count from the local write time, so
# expiry is unaffected; TWCS (endpoint_deliveries) files such cells in future windows, and
# Cassandra 5's maximum_timestamp guardrail, if enabled, must allow 2 years.
BAND_US = 365 * 24 * 3600 * 1_000_000
_STATUS_BAND = {"pending": 0, "failed": 1, "expired": 1, "succeeded": 2}


def status_write_ts(status: str, at_ms: int) -> int:
    """Write timestamp of a status update made at ``at_ms``. Pending sits in band 0 with the
    creation rows, failed/expired one band above, succeeded two: a later pending write (a
    re-created delivery, a stale incarnation's retry) loses to any final one, and a manual
    replay's success outranks the failure before it while its failure never undoes a success.
    Within a band the later write wins, as usual."""
    return at_ms * 1000 + _STATUS_BAND[status] * BAND_US


class CassandraHistory:
    """``hot_ttl_s``: how long the rows the archive keeps (events, attempts) live here; None: the
    whole history window (no archive). ``facts``: a list the archive facts of every write are
    appended to (core/archive_facts.py), taken by the dispatcher after each pass; None: none."""

    def __init__(self, settings: CassandraSettings, hot_ttl_s: int | None = None,
                 facts: list[archive_facts.Fact] | None = None) -> None:
        self._settings = settings
        self._hot_ttl_s = hot_ttl_s or settings.history_ttl_s
        self.facts = facts
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=settings.local_dc)),
            consistency_level=ConsistencyLevel.name_to_value[settings.consistency],
            serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL)
        self._cluster = Cluster(
            settings.contact_points,
            port=settings.port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            # v4, not v5: v5 frames carry checksums the driver computes in Python, in the
            # dispatcher's interpreter, and loopback/LAN TCP already checksums
            # (docs/performance.md#the-taskmanagers-interpreter).
            protocol_version=4,
            sockopts=settings.sockopts,
            # The default backs off to 600 s: after a Cassandra restart the dispatcher would hold
            # every delivery for up to ten minutes. Retry every <= 5 s, forever (the default gives
            # up after 64 tries).
            reconnection_policy=ExponentialReconnectionPolicy(0.5, settings.reconnect_max_delay_s, max_attempts=None),
        )
        self._session: Session = self._cluster.connect(settings.keyspace)
        if settings.speculative_delay_ms and len(self._cluster.metadata.all_hosts()) > 1:
            # A second try goes to the next replica of the query plan; a cluster of one node has
            # none, and would only pay a timer per request for it.
            profile.speculative_execution_policy = ConstantSpeculativeExecutionPolicy(
                settings.speculative_delay_ms / 1000, max_attempts=1)
        self._sem: asyncio.Semaphore | None = None
        self._prepare()
        self._batcher = WriteBatcher(
            self._send_batch, max_statements=settings.history_batch_max_statements,
            max_bytes=settings.history_batch_max_bytes, linger_s=settings.history_batch_linger_ms / 1000,
            min_interval_s=settings.history_batch_min_interval_ms / 1000)

    def _prepare(self) -> None:
        def p(cql: str) -> Any:
            # Every statement here is idempotent (explicit write timestamps or the same cells
            # again, no counters): the driver may send it to a second replica (speculative_delay_ms).
            stmt = self._session.prepare(cql)
            stmt.is_idempotent = True
            return stmt

        self._insert_event = p(
            "INSERT INTO events (event_id, tenant_id, event_type, schema_version, object_id, object_version,"
            " occurred_at, payload, payload_sha256, ingested_at) VALUES (?,?,?,?,?,?,?,?,?,?) USING TIMESTAMP ?"
            " AND TTL ?"
        )
        # The delivery's creation cells and its first request's reserved attempt row: one
        # statement, one partition (cassandra/schema/012_delivery_history.cql).
        self._insert_delivery = p(
            "INSERT INTO delivery_history (delivery_id, event_id, tenant_id, endpoint_id, endpoint_config_version,"
            " event_type, created_at, expires_at, status, attempt_count, auto_retry_active, next_attempt_at,"
            " attempt_number, attempt_id, config_version, started_at, outcome)"
            " VALUES (?,?,?,?,?,?,?,?,'pending',0,true,?,?,?,?,?,'reserved') USING TIMESTAMP ?"
        )
        self._insert_by_endpoint = p(
            "INSERT INTO endpoint_deliveries (tenant_id, endpoint_id, day, bucket, created_at, delivery_id, event_id,"
            " event_type, status, attempt_count) VALUES (?,?,?,?,?,?,?,?,'pending',0) USING TIMESTAMP ?"
        )
        self._reserve_attempt = p(
            "INSERT INTO delivery_history (delivery_id, attempt_number, attempt_id, config_version, started_at,"
            " outcome) VALUES (?,?,?,?,?,'reserved') USING TIMESTAMP ? AND TTL ?"
        )
        self._insert_attempt = p(
            "INSERT INTO delivery_history (delivery_id, attempt_number, attempt_id, config_version,"
            " url, started_at, finished_at, http_status, latency_ms, outcome, error_class, response_sha256,"
            " response_prefix, signing_key_versions, manual, requested_by, request_id)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) USING TIMESTAMP ? AND TTL ?"
        )
        self._insert_attempt_by_endpoint = p(
            "INSERT INTO endpoint_attempts (endpoint_id, hour, bucket, started_at, delivery_id, attempt_number,"
            " tenant_id, outcome, http_status, error_class, latency_ms, manual) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)"
        )
        self._update_delivery = p(
            "UPDATE delivery_history USING TIMESTAMP ? SET status=?, attempt_count=?, next_attempt_at=?,"
            " last_http_status=?, last_error_class=?, auto_retry_active=?, updated_at=? WHERE delivery_id=?"
        )
        self._update_last_number = p(
            "UPDATE delivery_history USING TIMESTAMP ? SET last_attempt_number=? WHERE delivery_id=?")
        self._update_by_endpoint = p(
            "UPDATE endpoint_deliveries USING TIMESTAMP ? SET status=?, attempt_count=?, last_http_status=?,"
            " updated_at=? WHERE tenant_id=? AND endpoint_id=? AND day=? AND bucket=? AND created_at=?"
            " AND delivery_id=?"
        )
        self._select_new = p(history_rows.SELECT_NEW)
        self._select_old_delivery = p(history_rows.SELECT_OLD_DELIVERY)
        self._select_old_attempts = p(history_rows.SELECT_OLD_ATTEMPTS)
        # A pair fan-out skipped (core.fanout.SkippedDelivery): the delivery's cells, final, with
        # no attempt row and the reason where a failure's class goes; and its endpoint index row.
        self._insert_skipped = p(
            "INSERT INTO delivery_history (delivery_id, event_id, tenant_id, endpoint_id, endpoint_config_version,"
            " event_type, created_at, status, attempt_count, auto_retry_active, last_error_class, updated_at)"
            " VALUES (?,?,?,?,?,?,?,'skipped',0,false,?,?) USING TIMESTAMP ?"
        )
        self._insert_skipped_by_endpoint = p(
            "INSERT INTO endpoint_deliveries (tenant_id, endpoint_id, day, bucket, created_at, delivery_id, event_id,"
            " event_type, status, attempt_count, updated_at) VALUES (?,?,?,?,?,?,?,?,'skipped',0,?) USING TIMESTAMP ?"
        )
        self._insert_snapshot = p(
            "INSERT INTO fanout_snapshots (hour, bucket, arrived_at, event_id, tenant_id, endpoints, degraded,"
            " source) VALUES (?,?,?,?,?,?,?,'job') USING TIMESTAMP ?"
        )
        self._report_backlog = p(
            # The pass's own time as the write time: reports are fire and forget, and two of them
            # (held 2, then idle 0) may reach Cassandra out of order; the later pass must win, or
            # reconciliation would take a drained endpoint for one holding deliveries.
            "INSERT INTO endpoint_backlogs (endpoint_id, tenant_id, pending, reported_at, breaker,"
            " breaker_open_until, oldest_new_at, oldest_retry_at, throttled) VALUES (?,?,?,?,?,?,?,?,?)"
            " USING TIMESTAMP ?"
        )
        self._block_key = p(
            "UPDATE blocked_ordering_keys USING TIMESTAMP ? SET head_delivery_id=?, head_event_id=?,"
            " head_object_version=?, attempts=?, last_http_status=?, last_error_class=?, next_attempt_at=?,"
            " waiting=?, updated_at=?, blocked_since=?"
            " WHERE tenant_id=? AND endpoint_id=? AND bucket=? AND ordering_key=?"
        )
        self._free_key = p(
            "DELETE FROM blocked_ordering_keys USING TIMESTAMP ?"
            " WHERE tenant_id=? AND endpoint_id=? AND bucket=? AND ordering_key=?"
        )
        # A replay the job refused (its window closed before the job read it): a row of the
        # request audit beside the request's own, action 'refused' (cassandra/schema/006, 010).
        self._insert_refusal = p(
            "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, requested_at, reason,"
            " action) VALUES (?,?,?,?,?,?,'refused') USING TIMESTAMP ?"
        )
        self._select_payload = p("SELECT payload FROM events WHERE event_id=?")
        self._select_event = p(
            "SELECT event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at,"
            " payload FROM events WHERE event_id=?"
        )

    async def _run(self, stmt: Any, params: Any) -> Any:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self._settings.max_concurrent_writes)
        async with self._sem:
            return await _await(self._session.execute_async(stmt, params))

    def persist(self, d: NewDelivery, intent: Intent, write_event: bool = True) -> Completion:
        """The delivery with the first request's reserved attempt row (one partition) and its
        endpoint index row, durable before that request. The event row (the payload) joins the
        batch when it is small; a large one is a request of its own so a batch never nears
        Cassandra's batch size limit."""
        e = d.event
        wts = d.created_at_ms * 1000
        created = d.created_at_ms
        statements: list[Statement] = [
            (self._insert_delivery, (d.delivery_id, e.event_id, d.tenant_id, d.endpoint_id,
                                     d.endpoint_config_version, e.event_type, created,
                                     d.expires_at_ms, created, intent.number, intent.attempt_id,
                                     d.endpoint_config_version, created, wts)),
            (self._insert_by_endpoint, (d.tenant_id, d.endpoint_id, _day(d.created_at_ms), bucket_of(d.delivery_id),
                                        created, d.delivery_id, e.event_id, e.event_type, wts)),
        ]
        if self.facts is not None:
            self.facts.append(archive_facts.created_fact(d, wts))
            if write_event:
                self.facts.append(archive_facts.event_fact(e, created))
        if not write_event:
            return self._batcher.add(statements)
        event = (self._insert_event, (
            e.event_id, e.tenant_id, e.event_type, e.schema_version, e.object_id, e.object_version,
            e.occurred_at_ms, e.payload, e.payload_sha256, created, wts, self._hot_ttl_s))
        if len(e.payload) <= self._settings.history_batch_inline_payload_bytes:
            return self._batcher.add([*statements, event])
        alone = BatchCompletion()
        self._session.execute_async(*event).add_callbacks(alone.succeed, alone.fail)
        return AllOf([self._batcher.add(statements), alone])

    def write_snapshot(self, s: FanoutSnapshot) -> Completion:
        """Fan-out's decision for one event, with the history rows of the pairs it skipped
        (identical cells on every re-write: all at the event's arrival time)."""
        hour_ms, bucket = s.partition
        at, wts = s.arrived_at_ms, s.arrived_at_ms * 1000
        statements: list[Statement] = [(self._insert_snapshot, (
            hour_ms, bucket, at, s.event_id, s.tenant_id, dict(s.endpoints), s.degraded, wts))]
        for k in s.skipped:
            statements.append((self._insert_skipped, (
                k.delivery_id, s.event_id, s.tenant_id, k.endpoint_id, k.endpoint_config_version, k.event_type,
                at, k.reason, at, wts)))
            statements.append((self._insert_skipped_by_endpoint, (
                s.tenant_id, k.endpoint_id, _day(at), bucket_of(k.delivery_id), at, k.delivery_id, s.event_id,
                k.event_type, at, wts)))
        if self.facts is not None and s.skipped:
            self.facts.extend(archive_facts.skipped_facts(s, wts))
        return self._batcher.add(statements)

    def report_backlog(self, r: EndpointReport) -> Completion:
        """What this job holds of the endpoint, and its breaker (see endpoint_backlogs)."""
        return self._batcher.add([(self._report_backlog, (
            r.endpoint_id, r.tenant_id, r.pending, r.reported_at_ms, r.breaker.value if r.breaker else None,
            r.open_until_ms, r.oldest_new_ms, r.oldest_retry_ms, r.throttled, r.reported_at_ms * 1000))])

    def refuse_replay(self, r: ReplayRequest, reason: str, at_ms: int) -> Completion:
        """The job's refusal of a replay request, in the delivery's request audit: its own row
        (request id + ``/refused``), so the request's row -- who asked and why -- stays as the
        control plane wrote it. Redone after a restore, it rewrites the same row."""
        return self._batcher.add([(self._insert_refusal, (
            r.delivery_id, f"{r.request_id or 'rpl'}/refused", r.tenant_id, r.requested_by, at_ms, reason,
            at_ms * 1000))])

    def reserve(self, d: NewDelivery, intent: Intent, at_ms: int) -> Completion:
        """The attempt row of the next request, durable before that request leaves."""
        return self._batcher.add([self._reserved(d, intent, at_ms)])

    def _reserved(self, d: NewDelivery, intent: Intent, at_ms: int) -> Statement:
        return (self._reserve_attempt, (d.delivery_id, intent.number, intent.attempt_id,
                                        d.endpoint_config_version, at_ms, at_ms * 1000, self._hot_ttl_s))

    def record(self, d: NewDelivery, r: AttemptRecord, attempt_count: int,
               next_intent: Intent | None, key_row: KeyRowChange | None = None) -> Completion:
        """One write for a finished try (or a decision that none will happen): its attempt row,
        the delivery's new status when it has one, the next request's reserved row when
        another is owed, and, for an ordering key's head, its key's row in blocked_ordering_keys."""
        now = r.finished_at_ms
        statements: list[Statement] = []
        facts = self.facts
        if r.intent is not None:
            attempt_wts = r.finished_at_ms * 1000 + BAND_US
            # A record that sent nothing knows no URL or config version: keep the reservation's
            # (the delivery's). Every cell the reservation wrote is written again, so none of
            # them outlives the attempt's hot TTL.
            statements.append((self._insert_attempt, (
                d.delivery_id, r.intent.number, r.intent.attempt_id,
                r.endpoint_config_version or d.endpoint_config_version, r.url or UNSET_VALUE, r.started_at_ms, now,
                r.http_status, r.latency_ms, r.outcome, r.error_class, r.response_sha256, r.response_prefix,
                list(r.signing_key_versions), r.manual, r.requested_by, r.request_id,
                attempt_wts, self._hot_ttl_s)))
            # On the delivery's row, which outlives the attempt rows (022_last_attempt_number.cql).
            statements.append((self._update_last_number, (attempt_wts, r.intent.number, d.delivery_id)))
            if facts is not None:
                facts.append(archive_facts.attempt_fact(d, r, attempt_wts))
            # The hour index is of requests that did not succeed ("this endpoint's failures in
            # the last hour"); a success is found by its delivery, and a row not sent only there.
            if r.sent and r.outcome != "succeeded":
                statements.append((self._insert_attempt_by_endpoint, (
                    d.endpoint_id, _hour(r.started_at_ms), bucket_of(d.delivery_id), r.started_at_ms, d.delivery_id,
                    r.intent.number, d.tenant_id, r.outcome, r.http_status, r.error_class, r.latency_ms,
                    r.manual)))
        if r.delivery_status is not None:
            wts = status_write_ts(r.delivery_status, r.finished_at_ms)
            statements.append((self._update_delivery, (
                wts, r.delivery_status, attempt_count, r.next_attempt_at_ms, r.http_status,
                r.error_class, r.auto_retry_active, now, d.delivery_id)))
            statements.append((self._update_by_endpoint, (
                wts, r.delivery_status, attempt_count, r.http_status, now, d.tenant_id, d.endpoint_id,
                _day(d.created_at_ms), bucket_of(d.delivery_id), d.created_at_ms, d.delivery_id)))
            if facts is not None:
                facts.append(archive_facts.status_fact(d, r, attempt_count, wts))
        if next_intent is not None:
            statements.append(self._reserved(d, next_intent, r.finished_at_ms))
        if key_row is not None:
            statements.append(self._key_row(d, r, attempt_count, key_row))
        return self._batcher.add(statements)

    def _key_row(self, d: NewDelivery, r: AttemptRecord, attempt_count: int, k: KeyRowChange) -> Statement:
        """A head failed (its key is blocked: upsert) or is final (free: delete). Written at the
        record's finish time, so a later head's failure outranks an earlier head's delete."""
        where = (d.tenant_id, d.endpoint_id, bucket_of(k.key), k.key)
        wts = r.finished_at_ms * 1000
        if not k.blocked:
            return (self._free_key, (wts, *where))
        return (self._block_key, (
            wts, d.delivery_id, d.event.event_id, d.event.object_version, attempt_count, r.http_status,
            r.error_class, r.next_attempt_at_ms, k.waiting, r.finished_at_ms,
            r.started_at_ms if k.first_failure else UNSET_VALUE, *where))

    def catching_up(self, behind: bool) -> None:
        """Batches wait longer while the dispatcher catches up (core/catch_up.py)."""
        c = self._settings
        if behind:
            interval = c.history_batch_catch_up_interval_ms
            self._batcher.pace(linger_s=max(c.history_batch_linger_ms, interval) / 1000, min_interval_s=interval / 1000)
        else:  # as built
            self._batcher.pace(linger_s=c.history_batch_linger_ms / 1000,
                               min_interval_s=c.history_batch_min_interval_ms / 1000)

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
            batch.is_idempotent = True  # of idempotent statements (_prepare)
            for stmt, params in statements:
                batch.add(stmt, params)
            rf = self._session.execute_async(batch)
        rf.add_callbacks(completion.succeed, completion.fail)

    async def _read(self, delivery_id: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The delivery and its attempts from both schemas (core/history_rows.py)."""
        delivery, attempts = history_rows.split(await self._run(self._select_new, (delivery_id,)))
        if history_rows.needs_old(delivery):
            old, old_attempts = await asyncio.gather(self._run(self._select_old_delivery, (delivery_id,)),
                                                     self._run(self._select_old_attempts, (delivery_id,)))
            delivery, attempts = history_rows.merge(delivery, attempts, next(iter(old), None), old_attempts)
        return delivery, attempts

    async def check(self, delivery_id: str) -> DurableRecord:
        """The delivery as Cassandra has it: status None when no delivery row exists. Its row (the
        creation and status cells) lives the whole history window, also once its attempt rows
        expired with the hot TTL (the archive holds them): a delivery fan-out creates again (the
        events topic read again, an old savepoint) finds it final and does not send it twice."""
        delivery, attempts = await self._read(delivery_id)
        return _durable(delivery, attempts)

    async def load_payload(self, event_id: str) -> bytes:
        """The immutable payload bytes of an event; raises PayloadUnavailable if the row is gone."""
        rows = await self._run(self._select_payload, (event_id,))
        row = rows[0] if rows else None
        if row is None or row.payload is None:
            raise PayloadUnavailable(f"no stored payload for event {event_id}")
        return bytes(row.payload)

    async def load_for_replay(self, delivery_id: str) -> tuple[NewDelivery, DurableRecord] | None:
        """The stored delivery (with its immutable payload) and its durable record; None when the
        delivery is unknown or outside the history window."""
        row, attempts = await self._read(delivery_id)
        if row is None or row["event_id"] is None:
            return None
        ev_rows = await self._run(self._select_event, (row["event_id"],))
        ev = ev_rows[0] if ev_rows else None
        if ev is None:
            return None
        event = EventRecord(
            event_id=ev.event_id, tenant_id=ev.tenant_id, event_type=ev.event_type,
            schema_version=ev.schema_version or "", object_id=ev.object_id or "",
            object_version=ev.object_version or 0, occurred_at_ms=_ms(ev.occurred_at), payload=ev.payload or b"",
        )
        d = NewDelivery(
            delivery_id=delivery_id, event=event, endpoint_id=row["endpoint_id"], tenant_id=row["tenant_id"],
            endpoint_config_version=row["endpoint_config_version"] or 0, created_at_ms=_ms(row["created_at"]),
            expires_at_ms=_ms(row["expires_at"]),
        )
        return d, _durable(row, attempts)

    def close(self) -> None:
        self.flush()
        self.shutdown()

    def shutdown(self) -> None:
        """Close the session without sending the open batch (its owner's task has ended: what
        it did not write is redone, as after a crash)."""
        self._cluster.shutdown()


class PayloadUnavailable(Exception):
    """The event row holding a payload could not be read (missing, or Cassandra failed)."""


def _durable(row: dict[str, Any] | None, attempts: list[dict[str, Any]]) -> DurableRecord:
    """A delivery (or None) and its attempt rows (reserved ones count: their numbers are taken
    even if no request followed)."""
    max_number = history_rows.top_attempt_number(attempts)
    if row is None:
        return DurableRecord(status=None, max_attempt_number=max_number)
    status = row["status"] or "pending"
    return DurableRecord(
        status=status, attempt_count=row["attempt_count"] or 0,
        next_attempt_at_ms=None if row["next_attempt_at"] is None else _ms(row["next_attempt_at"]),
        auto_retry_active=row["auto_retry_active"] is not False and status not in FINAL_STATUSES,
        # Attempt rows expire before the delivery's row (the hot TTL), which keeps the highest
        # number used and the count of automatic attempts: no number is used twice.
        max_attempt_number=max(max_number, row.get("last_attempt_number") or 0, row["attempt_count"] or 0))


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

