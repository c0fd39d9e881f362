"""The archive audit: is every closed hour whole in the archive while its rows are still hot?

    python -m control_plane.archive.audit                    # every hour due, once
    python -m control_plane.archive.audit --every 3600       # the same at each UTC hour + 5 min
    python -m control_plane.archive.audit --hour 2026-11-29T19:00Z
    python -m control_plane.archive.audit --hour 2026-11-29T19:00Z --by-id   # every endpoint id by id

The archive writer (control_plane/archive/writer.py) writes the archive from the job's facts and
never reads Cassandra; nothing gates the hot rows' expiry, which their TTL decides. The audit is
what makes a gap *detectable while it is recoverable*: once an hour ended ``archive.audit_after_s``
ago (its deliveries are final: the retry deadline is shorter) and before its hot rows expire
(``archive.hot_ttl_s``), it

* lists the hour's committed segments (core/archive_layout.py) and checks every file they name
  is in the store with the size written;
* reads the archive's keys only (delivery ids with their endpoint and latest attempt_count, event
  ids, attempt numbers), reduced in Arrow, and compares them with what Cassandra's indexes already
  list for the hour -- the endpoint history index (endpoint_deliveries: every delivery row the job
  writes) and the fan-out snapshots (every event with a delivery) -- the same sources
  reconciliation reads; no delivery partition is read. Deliveries are compared by count per
  endpoint (Cassandra counts its index partitions), and id by id only for an endpoint whose counts
  differ (core/archive_layout.uneven says why equal counts are equal sets; ``--by-id`` lists all);
* records the hour in ``archive_hours`` (audited, or failed with the reason) and pushes the count
  of failed hours: alert ArchiveAuditFailed. A failed hour is audited again at every run; the
  repair is the writer's recovery run over the facts topic (docs/archive.md), which holds the
  facts at least as long as the hot rows live; for deliveries whose facts never reached the
  topic (a row written by something other than the job: reconciliation's repair writes delivery
  rows itself), ``--repair HOUR`` here writes them from their hot rows (:func:`repair_from_hot`).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from control_plane.archive.rows import SCHEMAS
from control_plane.archive.store import ArchiveStore
from core import archive_facts, archive_schedule, history_rows
from core import archive_layout as layout
from core.fanout import SNAPSHOT_BUCKETS
from core.history_buckets import HISTORY_BUCKETS
from core.settings import ArchiveSettings, Settings

log = logging.getLogger(__name__)

AUDITED, FAILED = "audited", "failed"


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _pages(session: Session, stmt: PreparedStatement, params: tuple[Any, ...], size: int) -> Iterator[list[Any]]:
    state = None
    while True:
        bound = stmt.bind(params)
        bound.fetch_size = size
        result = session.execute(bound, paging_state=state, timeout=60)
        page = list(result.current_rows)
        if page:
            yield page
        state = result.paging_state
        if state is None:
            return


class HotIndex:
    """What Cassandra's indexes list for an hour: how many deliveries each endpoint has
    (endpoint_deliveries, counted by Cassandra; of every registered endpoint and every endpoint a
    snapshot names), their ids for the endpoints asked, and the events with a delivery
    (fanout_snapshots)."""

    def __init__(self, session: Session, page_size: int) -> None:
        self._s = session
        self._page = page_size
        p = session.prepare
        self._q_endpoints = p("SELECT tenant_id, endpoint_id FROM endpoints")
        self._q_snapshots = p("SELECT event_id, tenant_id, endpoints FROM fanout_snapshots WHERE hour=? AND bucket=?")
        where = " WHERE tenant_id=? AND endpoint_id=? AND day=? AND bucket=? AND created_at>=? AND created_at<?"
        # Counted where the rows are: one number per partition crosses the wire, not a row per delivery.
        self._q_count = p("SELECT COUNT(*) FROM endpoint_deliveries" + where)
        self._q_listed = p("SELECT delivery_id, event_id FROM endpoint_deliveries" + where)
        self._q_listed.fetch_size = page_size

    def read(self, hour_ms: int) -> tuple[dict[layout.Pair, int], set[str]]:
        """Deliveries per endpoint, and events, for the hour."""
        hour = _ts(hour_ms)
        pairs = {(r.tenant_id, r.endpoint_id) for page in _pages(self._s, self._q_endpoints, (), self._page)
                 for r in page}
        events: set[str] = set()
        for bucket in range(SNAPSHOT_BUCKETS):
            for page in _pages(self._s, self._q_snapshots, (hour, bucket), self._page):
                for snap in page:
                    if snap.endpoints:
                        events.add(snap.event_id)
                        pairs |= {(snap.tenant_id, ep) for ep in snap.endpoints}
        params = self._params(hour_ms, sorted(pairs))
        counts: dict[layout.Pair, int] = {}
        for (pair, _), (ok, rows) in zip(params, execute_concurrent_with_args(
                self._s, self._q_count, [p for _, p in params], concurrency=SNAPSHOT_BUCKETS), strict=True):
            if not ok:
                raise rows
            counts[pair] = counts.get(pair, 0) + rows.one()[0]
        return {p: n for p, n in counts.items() if n}, events

    def listed(self, hour_ms: int, pairs: Sequence[layout.Pair]) -> set[str]:
        """The delivery ids these endpoints have for the hour."""
        deliveries: set[str] = set()
        for ok, rows in execute_concurrent_with_args(self._s, self._q_listed, [p for _, p in self._params(
                hour_ms, pairs)], concurrency=SNAPSHOT_BUCKETS, results_generator=True):
            if not ok:
                raise rows
            # No event id: a status mirrored for a delivery created before that table.
            deliveries.update(r.delivery_id for r in rows if r.event_id is not None)
        return deliveries

    @staticmethod
    def _params(hour_ms: int, pairs: Sequence[layout.Pair]) -> list[tuple[layout.Pair, tuple[Any, ...]]]:
        hour, end = _ts(hour_ms), _ts(hour_ms + layout.HOUR_MS)
        return [((t, e), (t, e, hour.date(), b, hour, end)) for t, e in pairs for b in range(HISTORY_BUCKETS)]


@dataclass(frozen=True)
class ArchivedHour:
    """An hour of the archive as the audit reads it: its commits, its files as stored, and its
    keys reduced in Arrow -- one row per delivery with its endpoint, the events, the deliveries
    with fewer automatic attempts archived than their attempt_count -- so no Python object is
    made per delivery."""

    commits: list[layout.Commit]
    stored: list[layout.Stored]
    deliveries: pa.Table  # tenant_id, endpoint_id, delivery_id, attempt_count_max: one row per delivery
    events: set[str]
    attempts: int  # automatic attempts archived, each (delivery, number) once
    short: list[str]

    def counts(self) -> dict[layout.Pair, int]:
        per = self.deliveries.group_by(["tenant_id", "endpoint_id"]).aggregate([("delivery_id", "count")])
        return {(t, e): n for t, e, n in zip(per["tenant_id"].to_pylist(), per["endpoint_id"].to_pylist(),
                                             per["delivery_id_count"].to_pylist(), strict=True)}

    def ids(self, pairs: Sequence[layout.Pair] | None = None) -> set[str]:
        """The archived delivery ids of these endpoints (all, without ``pairs``)."""
        table = self.deliveries
        if pairs is not None:
            wanted = pa.table({"tenant_id": pa.array([t for t, _ in pairs], pa.string()),
                               "endpoint_id": pa.array([e for _, e in pairs], pa.string())})
            table = table.join(wanted, ["tenant_id", "endpoint_id"], join_type="inner")
        return set(table["delivery_id"].to_pylist())


def archived_hour(store: ArchiveStore, hour_ms: int) -> ArchivedHour:
    """The hour's commits, its files as stored, and the archive's keys (key columns only),
    reduced by key: each delivery's attempt_count (it only grows, so the highest is the latest's),
    its automatic attempts counted by number, the event ids."""
    commits = [c for b in layout.ALL_BUCKETS for c in store.commits(hour_ms, b)]
    sizes: dict[str, int] = {}
    for b in layout.ALL_BUCKETS:
        sizes.update(store.sizes(layout.bucket_prefix(hour_ms, b)))
    stored = [layout.Stored(f.path, sizes.get(f.path)) for c in commits for f in c.files]
    present = {s.path for s in stored if s.bytes is not None}

    def rows(kind: str, columns: list[str]) -> pa.Table:
        tables = [store.read_table(f.path, columns=columns) for c in commits for f in c.files_of(kind)
                  if f.path in present]
        return pa.concat_tables(tables) if tables else SCHEMAS[kind].empty_table().select(columns)

    deliveries = rows("deliveries", ["tenant_id", "endpoint_id", "delivery_id", "attempt_count"]).group_by(
        ["tenant_id", "endpoint_id", "delivery_id"]).aggregate([("attempt_count", "max")])
    events = set(pc.unique(rows("events", ["event_id"])["event_id"]).to_pylist())
    auto = rows("attempts", ["delivery_id", "attempt_number", "manual"])
    auto = auto.filter(pc.invert(pc.fill_null(auto["manual"], False)))
    numbered = auto.group_by(["delivery_id", "attempt_number"]).aggregate([]).group_by("delivery_id").aggregate(
        [("attempt_number", "count")])
    joined = deliveries.select(["delivery_id", "attempt_count_max"]).join(numbered, "delivery_id",
                                                                          join_type="left outer")
    short = joined.filter(pc.less(pc.fill_null(joined["attempt_number_count"], 0),
                                  pc.fill_null(joined["attempt_count_max"], 0)))
    return ArchivedHour(commits, stored, deliveries, events, sum(numbered["attempt_number_count"].to_pylist()),
                        short["delivery_id"].to_pylist())


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        v = value if value.tzinfo else value.replace(tzinfo=UTC)
        return int(v.timestamp() * 1000)
    return int(value)


def _hot_facts(session: Session, delivery_ids: Sequence[str]) -> list[tuple[str, list[Any]]]:
    """The archive's rows of these deliveries, from their hot rows (and their events'), as facts
    with write_ts 0: any fact the stream archives of them later outranks these. Read concurrently:
    an hour of deliveries whose facts never reached the topic is read in seconds, not minutes."""
    q_history = session.prepare(history_rows.SELECT_NEW)
    q_event = session.prepare("SELECT * FROM events WHERE event_id=?")
    out: list[tuple[str, list[Any]]] = []
    rows: dict[str, dict[str, Any]] = {}
    for did, (ok, result) in zip(delivery_ids, execute_concurrent_with_args(
            session, q_history, [(d,) for d in delivery_ids], concurrency=64), strict=True):
        if not ok:
            raise result
        row, attempts = history_rows.split(result)
        if row is None or row.get("created_at") is None:
            continue
        rows[did] = row
        created = _ms(row["created_at"]) or 0
        hour = layout.hour_start(created)
        cells = {**row, **{c: _ms(row[c]) for c in ("created_at", "expires_at", "next_attempt_at", "updated_at")},
                 "hour": hour, "write_ts": 0}
        out.append(("deliveries", [cells.get(c) for c in archive_facts.COLUMNS["deliveries"]]))
        for a in attempts:
            if a.get("outcome") in (None, "reserved"):
                continue
            cells = {**a, "tenant_id": row["tenant_id"], "endpoint_id": row["endpoint_id"], "hour": hour, "write_ts": 0,
                     "started_at": _ms(a["started_at"]), "finished_at": _ms(a["finished_at"]),
                     "signing_key_versions": list(a["signing_key_versions"] or [])}
            out.append(("attempts", [cells.get(c) for c in archive_facts.COLUMNS["attempts"]]))
    # Each event once, with its first delivery's creation as its arrival.
    first: dict[str, dict[str, Any]] = {}
    for row in rows.values():
        first.setdefault(row["event_id"], row)
    event_ids = sorted(first)
    for eid, (ok, result) in zip(event_ids, execute_concurrent_with_args(
            session, q_event, [(e,) for e in event_ids], concurrency=64), strict=True):
        if not ok:
            raise result
        ev = result.one()
        if ev is not None:
            created = _ms(first[eid]["created_at"]) or 0
            cells = {**history_rows.as_dict(ev), "occurred_at": _ms(ev.occurred_at), "arrived_at": created,
                     "payload": bytes(ev.payload), "hour": layout.hour_start(created)}
            out.append(("events", [cells.get(c) for c in archive_facts.COLUMNS["events"]]))
    return out


def repair_from_hot(session: Session, store: ArchiveStore, hour_ms: int, delivery_ids: Sequence[str]) -> int:
    """Write these deliveries of the hour (with their attempts and events) from Cassandra as a
    segment of their own; how many were found hot."""
    from control_plane.archive.writer import Buffer, write_segment

    ids = sorted(delivery_ids)
    facts = _hot_facts(session, ids)
    if not facts:
        return 0
    buffer = Buffer()
    # A name no topic range has (partition -1) and no other repair of the hour shares.
    buffer.ranges[-1] = (hour_ms // 1000, int(layout.sha256_of(d.encode() for d in ids)[:12], 16))
    for kind, values in facts:
        buffer.groups.setdefault((hour_ms, layout.tenant_bucket(values[archive_facts.TENANT_AT[kind]]), kind),
                                 []).append(tuple(values))
    write_segment(store, buffer)
    return sum(1 for kind, _ in facts if kind == "deliveries")


@dataclass(frozen=True)
class HourOutcome:
    hour_ms: int
    state: str
    counts: dict[str, int]
    detail: str = ""


class Auditor:
    def __init__(self, settings: ArchiveSettings, session: Session, store: ArchiveStore) -> None:
        self._settings = settings
        self._s = session
        self._store = store
        self._hot = HotIndex(session, settings.page_size)
        self._q_state = session.prepare("SELECT state FROM archive_hours WHERE hour=?")
        self._w_state = session.prepare(
            "INSERT INTO archive_hours (hour, state, counts, detail, updated_at) VALUES (?,?,?,?,?)")
        self._q_all = session.prepare("SELECT hour, state FROM archive_hours")

    def state(self, hour_ms: int) -> str | None:
        row = self._s.execute(self._q_state, (_ts(hour_ms),)).one()
        return None if row is None else row.state

    def _compare(self, hour_ms: int, by_id: bool = False) -> tuple[ArchivedHour, layout.HourAudit]:
        """The hour's archive against Cassandra's indexes. Equal counts per endpoint are equal sets
        (core/archive_layout.uneven): only the others are listed id by id, on both sides (every
        endpoint with ``by_id``)."""
        archived = archived_hour(self._store, hour_ms)
        hot_counts, hot_events = self._hot.read(hour_ms)
        archived_counts = archived.counts()
        uneven = sorted(hot_counts) if by_id else layout.uneven(hot_counts, archived_counts)
        hot_listed = self._hot.listed(hour_ms, uneven) if uneven else set()
        archived_listed = archived.ids(uneven) if uneven else set()
        return archived, layout.HourAudit(hot_counts, archived_counts, hot_listed, archived_listed, hot_events,
                                          archived.events, archived.short)

    def audit(self, hour_ms: int, now_ms: int, by_id: bool = False) -> HourOutcome:
        """One hour's audit, recorded. ``by_id`` lists every endpoint id by id, counts equal or not."""
        archived, compared = self._compare(hour_ms, by_id)
        found = layout.problems(archived.commits, archived.stored, compared)
        counts = {"deliveries": archived.deliveries.num_rows, "listed": sum(compared.hot_counts.values()),
                  "listed_by_id": len(compared.hot_listed), "events": len(archived.events),
                  "attempts": archived.attempts, "segments": len(archived.commits)}
        state, detail = (FAILED, "; ".join(found)) if found else (AUDITED, "")
        self._s.execute(self._w_state, (_ts(hour_ms), state, json.dumps(counts, sort_keys=True), detail or None,
                                        _ts(now_ms)))
        if found:
            log.error("archive hour %s failed its audit (recover with the writer's --from): %s", _ts(hour_ms), detail)
        return HourOutcome(hour_ms, state, counts, detail)

    def repair(self, hour_ms: int) -> int:
        """Deliveries Cassandra lists for the hour that the archive lacks, written from their hot
        rows; how many."""
        _, compared = self._compare(hour_ms)
        missing = sorted(compared.hot_listed - compared.archived_listed)
        return repair_from_hot(self._s, self._store, hour_ms, missing) if missing else 0

    def due(self, now_ms: int) -> list[int]:
        """Hours old enough to audit and young enough to repair, not audited clean yet."""
        hours = layout.closed_hours(now_ms, self._settings.audit_after_s * 1000, self._settings.hot_ttl_s * 1000)
        return [h for h in hours if self.state(h) != AUDITED]

    def run(self, now_ms: int, stop: Callable[[], bool] = lambda: False, by_id: bool = False) -> list[HourOutcome]:
        out = []
        for h in self.due(now_ms):
            if stop():
                break
            out.append(self.audit(h, now_ms, by_id))
        return out

    def failed_hours(self) -> int:
        return sum(1 for r in self._s.execute(self._q_all) if r.state == FAILED)


def push_metrics(gateway: str, failed_hours: int, outcomes: Sequence[HourOutcome], ok: bool) -> None:
    """The audit's outcome for Prometheus (alerts ArchiveAuditFailed, ArchiveAuditFailing,
    ArchiveAuditStale on the timestamp)."""
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    Gauge("webhooks_archive_failed_hours", "Hours whose archive failed its audit (recover from the facts topic)",
          registry=reg).set(failed_hours)
    Gauge("webhooks_archive_last_audit_ok", "1 if the last audit run completed", registry=reg).set(int(ok))
    Gauge("webhooks_archive_last_audit_timestamp_seconds", "When the audit last ran", registry=reg).set(time.time())
    Gauge("webhooks_archive_audited_deliveries", "Deliveries the last run found archived", registry=reg).set(
        sum(o.counts.get("deliveries", 0) for o in outcomes))
    push_to_gateway(gateway, job="webhooks_archive_audit", registry=reg)


def run_repair(settings: Settings, hour: int) -> int:
    from stack.isolation import harness_cluster

    cluster = harness_cluster(settings)
    try:
        session = cluster.connect(settings.cassandra.keyspace)
        auditor = Auditor(settings.archive, session, ArchiveStore.from_settings(settings.archive))
        n = auditor.repair(hour)
        print(f"archive repair from Cassandra: {n} deliveries of {_ts(hour):%Y-%m-%dT%H:00Z} written", flush=True)
        return 0
    finally:
        cluster.shutdown()


def run_once(settings: Settings, hour: int | None, stop: Callable[[], bool], by_id: bool = False) -> int:
    """One run (every due hour, or ``hour``), pushed and printed; the exit code. Connects anew each
    time: a loop outlives Cassandra restarts between its runs."""
    from stack.isolation import harness_cluster

    cluster = harness_cluster(settings)
    outcomes: list[HourOutcome] = []
    ok = False
    auditor: Auditor | None = None
    try:
        session = cluster.connect(settings.cassandra.keyspace)
        auditor = Auditor(settings.archive, session, ArchiveStore.from_settings(settings.archive))
        now = int(time.time() * 1000)
        outcomes = [auditor.audit(hour, now, by_id)] if hour is not None else auditor.run(now, stop, by_id)
        ok = True
    finally:
        if settings.archive.pushgateway:
            try:
                failed = auditor.failed_hours() if auditor is not None else 0
                push_metrics(settings.archive.pushgateway, failed, outcomes, ok)
            except Exception:  # noqa: BLE001 -- the run's own outcome matters more than its report
                log.exception("could not push the audit's metrics")
        cluster.shutdown()
    for o in outcomes:
        print(f"{_ts(o.hour_ms):%Y-%m-%dT%H:00Z} {o.state} {json.dumps(o.counts, sort_keys=True)} {o.detail}".rstrip(),
              flush=True)
    return 1 if any(o.state == FAILED for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m control_plane.archive.audit", description=__doc__.split("\n")[0])
    parser.add_argument("--hour", help="one hour (ISO, e.g. 2026-11-29T19:00Z) instead of every hour due")
    parser.add_argument("--repair", metavar="HOUR", help="write the deliveries Cassandra lists for the hour and the"
                        " archive lacks from their hot rows (facts that never reached the topic), then exit")
    parser.add_argument("--by-id", action="store_true", help="compare every endpoint's deliveries id by id, not"
                        " only those whose counts differ (slower: a row per delivery from Cassandra)")
    parser.add_argument("--every", type=int, metavar="SECONDS",
                        help="keep running: a run at each multiple of SECONDS (3600: each UTC hour) + --margin")
    parser.add_argument("--margin", type=int, default=300, metavar="SECONDS",
                        help="with --every: how long after the boundary (default 300)")
    args = parser.parse_args(argv)
    try:
        if args.every is not None:
            archive_schedule.next_run_ms(0, args.every * 1000, args.margin * 1000)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    if args.repair:
        t = datetime.fromisoformat(args.repair.replace("Z", "+00:00"))
        return run_repair(settings, layout.hour_start(int(t.timestamp() * 1000)))
    hour = None
    if args.hour:
        hour = layout.hour_start(int(datetime.fromisoformat(args.hour.replace("Z", "+00:00")).timestamp() * 1000))
    if args.every is None:
        return run_once(settings, hour, lambda: False, args.by_id)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    log.info("archive audit: a run every %d s, %d s after each boundary", args.every, args.margin)
    schedule = archive_schedule.Schedule(args.every, args.margin, lambda: int(time.time() * 1000), stopping.wait,
                                         lambda: run_once(settings, hour, stopping.is_set, args.by_id))
    schedule.loop()
    log.info("archive audit stopped after %d runs (%d failed)", schedule.runs, schedule.failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
