"""Reconciliation for the control plane: read each boundary for a window, let :mod:`core.reconcile`
name the gaps, and (with ``repair``) close them.

Reads, for events that *arrived* on the events topic in ``[since, until)`` (broker LogAppendTime):
the topic itself (offsets by time, every partition, parsed like the job parses), the fan-out
snapshots (hour x bucket range queries), and per expected delivery its ``delivery_history``
partition (the delivery and its attempts; the old ``deliveries`` / ``attempts`` rows for one
written before that table: core/history_rows.py; the archive for attempts that expired from the
hot tier: control_plane/history/tiered.py), plus the dispatcher's endpoint backlog reports.
Cost grows with the window (about one point read per delivery, run concurrently): it is a
tool for a window of minutes to hours, run by an operator or every few minutes over the last
hour; a day of the brief's peak belongs in a batch job over the same tables.

Repairs are idempotent and each is logged and returned:
* ``event_not_fanned_out``: match the event against the tenant's *current* configs (the only
  ones left: there is no snapshot to use), write that snapshot (source ``repair``) and redrive
  its deliveries.
* ``delivery_missing``: if an attempt row says it succeeded, write its rows back as succeeded
  (nothing is re-sent); otherwise redrive it from the snapshot.
* ``pending_orphaned`` (the sweeper): redrive from the delivery row.
A redrive goes through the replays topic to the dispatcher, which reads the delivery's durable
record before sending: a delivery already final is not sent again, one it already holds is left
alone (:class:`core.records.RedriveRequest`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from control_plane.archive.store import ArchiveStore
from control_plane.errors import InvalidArgument
from control_plane.history import topic_window
from control_plane.history.tiered import ArchivedAttempts, whole
from control_plane.publishing.publisher import Publisher
from control_plane.store import EndpointStore
from core import fanout, history_rows
from core import reconcile as rc
from core.history_buckets import bucket_of
from core.ingest import IngestError, parse_event
from core.records import EventRecord, RedriveRequest, delivery_id_for
from core.settings import Settings
from operators.history_store import status_write_ts

log = logging.getLogger(__name__)

# The longest window one call reconciles: the history window. Longer asks are refused, not cut.
MAX_WINDOW_MS = 30 * 24 * 3_600_000



def check_window(since_ms: int | None, until_ms: int | None, max_ms: int = MAX_WINDOW_MS,
                 too_long: str = "the window is longer than the 30-day history: reconcile it in parts",
                 ) -> tuple[int, int]:
    """Both ends given, in order, and at most ``max_ms`` apart (else ``too_long``)."""
    if since_ms is None or until_ms is None:
        raise InvalidArgument("start_time and end_time are required")
    if not since_ms < until_ms:
        raise InvalidArgument("start_time must be before end_time")
    if until_ms - since_ms > max_ms:
        raise InvalidArgument(too_long)
    return since_ms, until_ms


@dataclass(frozen=True)
class Repair:
    kind: str
    id: str
    action: str  # redriven | snapshot_written | restored_succeeded | unrepairable
    detail: str


@dataclass
class Outcome:
    report: rc.Report
    repairs: list[Repair] = field(default_factory=list)


@dataclass
class _Window:
    """What the readers found, with the rows repairs need beside the pure inputs."""

    inputs: rc.Inputs
    events: dict[str, tuple[EventRecord, int]]  # from the topic: event_id -> (event, arrival)
    rows: dict[str, dict[str, Any]]  # delivery_id -> the delivery's columns (core/history_rows.py)


def _ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _ms(value: dt.datetime | None) -> int | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return int(value.timestamp() * 1000)


class Reconciler:
    def __init__(self, settings: Settings, session: Session, store: EndpointStore, publisher: Publisher,
                 now_ms: Callable[[], int]) -> None:
        self._settings = settings
        self._session = session
        self._store = store
        self._publisher = publisher
        self._now_ms = now_ms
        self.last_report: rc.Report | None = None  # the periodic reconciler's latest
        p = session.prepare
        self._q_snapshots = p(
            "SELECT event_id, tenant_id, arrived_at, endpoints, degraded FROM fanout_snapshots"
            " WHERE hour=? AND bucket=? AND arrived_at>=? AND arrived_at<?")
        self._q_history = p(history_rows.SELECT_NEW)
        self._q_old_delivery = p(history_rows.SELECT_OLD_DELIVERY)
        self._q_old_attempts = p(history_rows.SELECT_OLD_ATTEMPTS)
        self._q_pins: PreparedStatement | None = None
        self._q_backlog = p("SELECT endpoint_id, pending, reported_at FROM endpoint_backlogs WHERE endpoint_id=?")
        # Attempts that expired from the hot tier are read from the archive (control_plane/history/tiered.py).
        self._archived = ArchivedAttempts(ArchiveStore.from_settings(settings.archive))
        self._q_event = p(
            "SELECT event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at,"
            " payload FROM events WHERE event_id=?")
        self._w_snapshot = p(
            "INSERT INTO fanout_snapshots (hour, bucket, arrived_at, event_id, tenant_id, endpoints, degraded,"
            " source) VALUES (?,?,?,?,?,?,false,'repair')")
        self._w_delivery = p(
            "UPDATE delivery_history USING TIMESTAMP ? SET event_id=?, tenant_id=?, endpoint_id=?,"
            " endpoint_config_version=?, event_type=?, created_at=?, expires_at=? WHERE delivery_id=?")
        self._w_status = p(
            "UPDATE delivery_history USING TIMESTAMP ? SET status='succeeded', attempt_count=?,"
            " auto_retry_active=false, updated_at=? WHERE delivery_id=?")
        self._w_by_endpoint = p(
            "INSERT INTO endpoint_deliveries (tenant_id, endpoint_id, day, bucket, created_at, delivery_id,"
            " event_id, event_type, status, attempt_count, updated_at) VALUES (?,?,?,?,?,?,?,?,'succeeded',?,?)"
            " USING TIMESTAMP ?")

    # -- the whole run -----------------------------------------------------------------------------
    def run(self, since_ms: int | None, until_ms: int | None, tenant_id: str | None, repair: bool, requested_by: str,
            overdue_after_s: int = 0) -> Outcome:
        since_ms, until_ms = check_window(since_ms, until_ms)
        if overdue_after_s < 0:
            raise InvalidArgument("overdue_after_seconds must not be negative")
        overdue_ms = (overdue_after_s or self._settings.control_plane.reconcile_overdue_after_s) * 1000
        window = self._read(since_ms, until_ms, tenant_id)
        report = rc.reconcile(window.inputs, since_ms, until_ms, tenant_id, self._now_ms(), overdue_ms,
                              given_up_after_ms=int(self._settings.dispatch.storage_give_up_s * 1000))
        outcome = Outcome(report)
        log.info("reconcile %s..%s tenant=%s: %d gaps %s", since_ms, until_ms, tenant_id or "*",
                 len(report.gaps), {k: v for k, v in report.gap_counts().items() if v})
        if repair:
            for gap in report.gaps:
                if gap.kind in rc.REPAIRABLE:
                    outcome.repairs.extend(self._repair(gap, window, requested_by))
            for r in outcome.repairs:
                log.info("reconcile repair %s %s: %s (%s)", r.kind, r.id, r.action, r.detail)
        return outcome

    def tenant_window(self, since_ms: int, until_ms: int,
                      tenant_id: str) -> tuple[rc.Inputs, rc.Report, dict[str, str]]:
        """What a tenant's account is built from (control_plane.history.account): the window's inputs
        and report for that tenant only, and the type of each event it names (report only)."""
        since_ms, until_ms = check_window(since_ms, until_ms)
        window = self._read(since_ms, until_ms, tenant_id)
        report = rc.reconcile(window.inputs, since_ms, until_ms, tenant_id, self._now_ms(),
                              self._settings.control_plane.reconcile_overdue_after_s * 1000,
                              given_up_after_ms=int(self._settings.dispatch.storage_give_up_s * 1000))
        types = {r["event_id"]: r["event_type"] for r in window.rows.values() if r.get("event_type")}
        types.update({event_id: e.event_type for event_id, (e, _) in window.events.items()})
        return window.inputs, report, types

    def periodic(self) -> None:
        """One pass of the periodic reconciler (a control-plane loop): report only, never repair."""
        cp = self._settings.control_plane
        until = self._now_ms() - cp.reconcile_settle_s * 1000
        out = self.run(until - cp.reconcile_window_s * 1000, until, None, repair=False, requested_by="periodic")
        self.last_report = out.report
        if out.report.gaps:
            log.warning("periodic reconciliation found %d gap(s) in the last %d s: %s; run "
                        "`webhookctl reconcile --repair` over the window", len(out.report.gaps),
                        cp.reconcile_window_s, {k: v for k, v in out.report.gap_counts().items() if v})

    # -- reading -------------------------------------------------------------------------------------
    def _read(self, since_ms: int, until_ms: int, tenant_id: str | None) -> _Window:
        topic_events, dead = self._topic(since_ms, until_ms, tenant_id)
        snapshots = [s for s in self._snapshots(since_ms, until_ms) if tenant_id in (None, s.tenant_id)]
        expected = rc.expected_deliveries(snapshots)
        history = self._histories(list(expected))
        rows = {did: row for did, (row, _) in history.items()
                if row is not None and row["event_id"] is not None}  # a status-only row is no delivery
        attempts = {did: [rc.AttemptRow(a["attempt_number"], a["outcome"] or "", bool(a["manual"])) for a in rs]
                    for did, (_, rs) in history.items() if did in rows}
        endpoints = sorted({r["endpoint_id"] for r in rows.values()})
        reported = {eid: _ms(row.reported_at) or 0 for eid, row in self._by_key(self._q_backlog, endpoints).items()
                    if row is not None and row.reported_at is not None and (row.pending or 0) > 0}
        deliveries = {
            did: rc.DeliveryRow(did, r["event_id"], r["tenant_id"], r["endpoint_id"], r["status"] or "pending",
                                r["attempt_count"] or 0, _ms(r["next_attempt_at"]), _ms(r["expires_at"]))
            for did, r in rows.items()}
        inputs = rc.Inputs(
            topic_events=[rc.TopicEvent(e.event_id, e.tenant_id, at) for e, at in topic_events.values()],
            dead_lettered=dead, snapshots=snapshots, deliveries=deliveries,
            attempts=attempts, backlog_reported_at=reported)
        return _Window(inputs, topic_events, rows)

    def _topic(self, since_ms: int, until_ms: int,
               tenant_id: str | None) -> tuple[dict[str, tuple[EventRecord, int]], int]:
        """Events that arrived in the window, by id (a re-published event counts once, at its
        first arrival), and how many records there the job cannot parse."""
        topic = self._settings.kafka.events_topic
        events: dict[str, tuple[EventRecord, int]] = {}
        dead = 0
        limit = self._settings.ingest.max_payload_bytes
        for msg in topic_window.records(self._settings.kafka.bootstrap_servers, topic, since_ms, until_ms,
                                        "webhooks-reconcile"):
            at = msg.timestamp()[1]
            if not since_ms <= at < until_ms:
                continue
            try:
                event = parse_event(msg.value() or b"", limit)
            except IngestError:
                dead += 1
                continue
            if tenant_id in (None, event.tenant_id) and event.event_id not in events:
                events[event.event_id] = (event, at)
        return events, dead

    def _snapshots(self, since_ms: int, until_ms: int) -> list[fanout.FanoutSnapshot]:
        hour = since_ms // fanout.HOUR_MS * fanout.HOUR_MS
        args = []
        while hour < until_ms:
            args += [(_ts(hour), b, _ts(since_ms), _ts(until_ms)) for b in range(fanout.SNAPSHOT_BUCKETS)]
            hour += fanout.HOUR_MS
        out = []
        for ok, rows in execute_concurrent_with_args(self._session, self._q_snapshots, args, concurrency=32):
            if not ok:
                raise rows
            for r in rows:
                out.append(fanout.FanoutSnapshot(
                    r.event_id, r.tenant_id, _ms(r.arrived_at) or 0,
                    tuple(sorted((r.endpoints or {}).items())), bool(r.degraded)))
        return out

    def _many(self, stmt: Any, keys: list[str]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        results = execute_concurrent_with_args(self._session, stmt, [(k,) for k in keys], concurrency=64)
        for key, (ok, rows) in zip(keys, results, strict=True):
            if not ok:
                raise rows
            out[key] = list(rows)
        return out

    def _by_key(self, stmt: Any, keys: list[str]) -> dict[str, Any]:
        return {k: (rows[0] if rows else None) for k, rows in self._many(stmt, keys).items()}

    def _histories(self, delivery_ids: list[str]) -> dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]]:
        """Each delivery and its attempts, from delivery_history and, for those it has no
        creation cells for, the old tables; then the archive under those still missing or partial."""
        out = {did: history_rows.split(rs) for did, rs in self._many(self._q_history, delivery_ids).items()}
        older = [did for did, (row, _) in out.items() if history_rows.needs_old(row)]
        old_rows = self._by_key(self._q_old_delivery, older)
        old_attempts = self._many(self._q_old_attempts, older)
        for did in older:
            out[did] = history_rows.merge(*out[did], old_rows[did], old_attempts[did])
        # Partial (attempts expired with the hot TTL): the archive's under the hot ones, as
        # TieredHistory reads them.
        partial = {did: row for did, (row, attempts) in out.items()
                   if row is not None and not whole(row["event_id"] is not None,
                                                    (a["attempt_number"] for a in attempts), row["attempt_count"] or 0)}
        for did, attempts in self._archived.find(partial).items():
            out[did] = history_rows.merge(*out[did], None, attempts)
        return out

    # -- repairing -----------------------------------------------------------------------------------
    def _repair(self, gap: rc.Gap, w: _Window, requested_by: str) -> list[Repair]:
        try:
            if gap.kind == rc.EVENT_NOT_FANNED_OUT:
                return self._fan_out_again(gap, w, requested_by)
            if gap.kind == rc.DELIVERY_MISSING:
                return [self._restore_delivery(gap, w, requested_by)]
            return [self._sweep(gap, w, requested_by)]
        except Exception as exc:  # noqa: BLE001 -- one failed repair is reported, the rest go on
            log.exception("repair of %s %s failed", gap.kind, gap.id)
            return [Repair(gap.kind, gap.id, "unrepairable", f"{type(exc).__name__}: {exc}")]

    def _fan_out_again(self, gap: rc.Gap, w: _Window, requested_by: str) -> list[Repair]:
        event, arrived = w.events[gap.id]
        configs = [e.to_config(self._now_ms()) for e in self._tenant_endpoints(event.tenant_id)]
        matched = fanout.select_endpoints(event, configs)
        # Fan-out's rule, not only its match: an endpoint pinned to other schema majors is left out
        # (its history lists the pair as skipped; fan-out wrote that row if it ran at all).
        pins = self._schema_pins(event.tenant_id, [c.endpoint_id for c in matched])
        sent, _ = fanout.leave_out_pinned(event, matched, lambda endpoint_id: pins.get(endpoint_id, ()))
        chosen = {c.endpoint_id: c.config_version for c in sent}
        snap = fanout.FanoutSnapshot(event.event_id, event.tenant_id, arrived, tuple(sorted(chosen.items())))
        hour, bucket = snap.partition
        self._session.execute(self._w_snapshot, (_ts(hour), bucket, _ts(arrived), snap.event_id, snap.tenant_id,
                                                 dict(snap.endpoints)))
        done = [Repair(gap.kind, gap.id, "snapshot_written",
                       f"matched with current configs: {sorted(chosen) or 'no subscriber'}")]
        for did, endpoint_id in snap.delivery_ids().items():
            done.append(self._redrive(gap.kind, did, event, endpoint_id, chosen[endpoint_id], arrived,
                                      requested_by, "event had no fan-out snapshot"))
        return done

    def _restore_delivery(self, gap: rc.Gap, w: _Window, requested_by: str) -> Repair:
        snap, endpoint_id = rc.expected_deliveries(w.inputs.snapshots)[gap.id]
        event = self._event(snap.event_id, w)
        if event is None:
            return Repair(gap.kind, gap.id, "unrepairable", f"event {snap.event_id}: payload neither on the topic "
                          "nor in the events table")
        version = dict(snap.endpoints)[endpoint_id]
        attempts = [rc.AttemptRow(a["attempt_number"], a["outcome"] or "", bool(a["manual"]))
                    for a in self._histories([gap.id])[gap.id][1]]
        auto = sum(1 for a in attempts if not a.manual and a.outcome in rc.SENT_OUTCOMES)
        if any(a.outcome == "succeeded" for a in attempts):
            self._write_succeeded(gap.id, event, snap, endpoint_id, version, auto)
            return Repair(gap.kind, gap.id, "restored_succeeded",
                          "an attempt row records its success: rows written back, nothing re-sent")
        return self._redrive(gap.kind, gap.id, event, endpoint_id, version, snap.arrived_at_ms, requested_by,
                             "no delivery row")

    def _sweep(self, gap: rc.Gap, w: _Window, requested_by: str) -> Repair:
        r = w.rows[gap.id]
        event = self._event(r["event_id"], w)
        if event is None:
            return Repair(gap.kind, gap.id, "unrepairable", f"event {r['event_id']}: no stored payload")
        return self._redrive(gap.kind, gap.id, event, r["endpoint_id"], r["endpoint_config_version"] or 0,
                             _ms(r["created_at"]) or 0, requested_by, "orphaned pending delivery",
                             expires_at_ms=_ms(r["expires_at"]))

    def _redrive(self, kind: str, delivery_id: str, event: EventRecord, endpoint_id: str, version: int,
                 created_ms: int, requested_by: str, reason: str, expires_at_ms: int | None = None) -> Repair:
        assert delivery_id == delivery_id_for(event.event_id, endpoint_id)
        deadline_ms = int(self._settings.dispatch.retry_deadline_s * 1000)
        self._publisher.publish_redrive(RedriveRequest(
            delivery_id=delivery_id, tenant_id=event.tenant_id, endpoint_id=endpoint_id,
            endpoint_config_version=version, created_at_ms=created_ms,
            expires_at_ms=expires_at_ms or created_ms + deadline_ms, event=event,
            reason=f"reconcile: {reason}", requested_by=requested_by))
        return Repair(kind, delivery_id, "redriven", f"{reason}: to endpoint {endpoint_id} (checked before sending)")

    def _write_succeeded(self, delivery_id: str, event: EventRecord, snap: fanout.FanoutSnapshot, endpoint_id: str,
                         version: int, attempt_count: int) -> None:
        # Restored rows are written at the repair's time, not at the creation time the job uses: a
        # missing row may have been deleted, and its tombstone would shadow creation-time cells.
        # The status carries the job's band for a success, so nothing non-final overrides it.
        created = snap.arrived_at_ms
        deadline_ms = int(self._settings.dispatch.retry_deadline_s * 1000)
        now = self._now_ms()
        status_ts = status_write_ts("succeeded", now)
        s = self._session
        s.execute(self._w_delivery, (now * 1000, event.event_id, event.tenant_id, endpoint_id, version,
                                     event.event_type, _ts(created), _ts(created + deadline_ms), delivery_id))
        s.execute(self._w_status, (status_ts, attempt_count, _ts(now), delivery_id))
        s.execute(self._w_by_endpoint, (event.tenant_id, endpoint_id, _ts(created).date(), bucket_of(delivery_id),
                                        _ts(created), delivery_id,
                                        event.event_id, event.event_type, attempt_count, _ts(now), status_ts))

    def _event(self, event_id: str, w: _Window) -> EventRecord | None:
        if event_id in w.events:
            return w.events[event_id][0]
        row = self._by_key(self._q_event, [event_id])[event_id]
        if row is None or row.payload is None:
            return None
        return EventRecord(event_id=row.event_id, tenant_id=row.tenant_id, event_type=row.event_type,
                           schema_version=row.schema_version or "", object_id=row.object_id or "",
                           object_version=row.object_version or 0, occurred_at_ms=_ms(row.occurred_at) or 0,
                           payload=bytes(row.payload))

    def _schema_pins(self, tenant_id: str, endpoint_ids: list[str]) -> dict[str, tuple[int, ...]]:
        if not endpoint_ids:
            return {}
        if self._q_pins is None:  # prepared on first use: only a fan-out repair needs it
            self._q_pins = self._session.prepare(
                "SELECT endpoint_id, schema_majors FROM endpoint_schema_pins WHERE tenant_id=? AND endpoint_id IN ?")
        return {r.endpoint_id: tuple(r.schema_majors or ())
                for r in self._session.execute(self._q_pins, (tenant_id, endpoint_ids))}

    def _tenant_endpoints(self, tenant_id: str) -> Iterable[Any]:
        after = ""
        while True:
            page = self._store.list_endpoints(tenant_id, after, 500)
            yield from page
            if len(page) < 500:
                return
            after = page[-1].endpoint_id
