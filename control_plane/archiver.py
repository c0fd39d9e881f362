"""The archiver: closed hours of delivery history from Cassandra to Parquet, verified, then let go.

A batch job (``python -m control_plane.archiver``; run it hourly from cron, a Kubernetes CronJob
or a systemd timer). It holds no state of its own: Cassandra's ``archive_hours`` and the archive's
manifests say where every hour stands, so a run killed anywhere is completed by the next one.

Per hour (an arrival hour: core/archive_layout.py), each step only after the previous succeeded:

1. **archive** -- page through the hour's fan-out snapshots (16 partitions of ``fanout_snapshots``;
   they name every event of the hour and, by derivation, every delivery), read each page's event
   rows, delivery partitions and replay audit rows concurrently, and stream them into one Parquet
   file per (tenant bucket, kind), a row group every ``row_group_rows``: memory is bounded by the
   page and the row groups, not by the hour. Files are written under temporary names, moved into
   place, read back for their checksums, and the manifest is published last. An hour whose
   manifest already exists is not written again (its hot rows may be gone by now).
2. **verify** -- read the manifest back, re-hash every file it lists and read its row count, and
   count the hour in Cassandra again; any disagreement (core/archive_layout.disagreements) marks
   the hour ``failed``: it stays hot and the pushed gauge raises ArchiveVerificationFailed.
3. **release** -- write each delivery's pointer row (``archived_deliveries``), then rewrite the
   hour's hot rows (events, delivery_history, replay_requests) with a TTL of ``release_ttl_s``.

Why a TTL rewrite rather than DELETE: the job writes history cells with timestamps up to two
bands (two years) in the future (operators/history_store.py), so a tombstone would need a
timestamp above every band and would then shadow a later replay's writes to the same delivery
for as long as it lives. A cell rewritten with its own write time + 1 us and a short TTL keeps
every ordering rule the job relies on, and when it expires it shadows only the original cell.
The tombstones it leaves are the ones the 30-day TTL would have left anyway, ~27 days earlier.
The endpoint and attempt indexes and fan-out snapshots are not rewritten: they are TWCS tables,
whose files are dropped whole when their window's rows have all expired, so an early expiry
there frees nothing before day 30 and would only add a second copy; they stay hot 30 days
(ListDeliveries and reconciliation keep reading them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from control_plane.archive_rows import SCHEMAS, shape
from control_plane.archive_store import ArchiveStore, ArchiveUnavailable
from core import archive_layout as layout
from core import history_rows
from core.fanout import SNAPSHOT_BUCKETS
from core.records import delivery_id_for
from core.settings import ArchiveSettings, Settings

log = logging.getLogger(__name__)

ARCHIVED, VERIFIED, RELEASED, FAILED = "archived", "verified", "released", "failed"

_EVENT_COLUMNS = ("tenant_id", "event_type", "schema_version", "object_id", "object_version", "occurred_at",
                  "payload", "payload_sha256", "ingested_at")
_STATIC_COLUMNS = tuple(c for c in history_rows.DELIVERY_COLUMNS if c != "delivery_id")
_ATTEMPT_COLUMNS = ("attempt_id", "config_version", "url", "started_at", "finished_at", "http_status",
                    "latency_ms", "outcome", "error_class", "response_sha256", "response_prefix",
                    "signing_key_versions", "manual", "requested_by", "request_id")
_REPLAY_COLUMNS = ("tenant_id", "requested_by", "requested_at", "reason", "action")
_CONCURRENCY = 64


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _pages(session: Session, stmt: PreparedStatement, params: tuple[Any, ...], size: int) -> Iterator[list[Any]]:
    """A partition a page at a time, each page a query of its own (by paging state): no result
    stays open while the caller runs its own queries for the page."""
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


def _with_writetimes(table: str, keys: str, columns: Sequence[str], where: str) -> str:
    cols = ", ".join(f"{c}, WRITETIME({c}) AS wt_{c}" for c in columns)
    return f"SELECT {keys}, {cols} FROM {table} WHERE {where}"


class HourReader:
    """Every archived row of one hour, in an order that depends on the rows alone (snapshot
    partitions in bucket order, each in clustering order; a snapshot's endpoints sorted)."""

    def __init__(self, session: Session, page_size: int) -> None:
        self._s = session
        self._page = page_size
        p = session.prepare
        self._q_snapshots = p("SELECT arrived_at, event_id, tenant_id, endpoints FROM fanout_snapshots"
                              " WHERE hour=? AND bucket=?")
        self._q_event = p("SELECT event_id, " + ", ".join(_EVENT_COLUMNS) + " FROM events WHERE event_id=?")
        self._q_history = p(history_rows.SELECT_NEW)
        self._q_old_delivery = p(history_rows.SELECT_OLD_DELIVERY)
        self._q_old_attempts = p(history_rows.SELECT_OLD_ATTEMPTS)
        self._q_replays = p("SELECT * FROM replay_requests WHERE delivery_id=?")

    def _many(self, stmt: PreparedStatement, keys: list[str]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {}
        results = execute_concurrent_with_args(self._s, stmt, [(k,) for k in keys], concurrency=_CONCURRENCY)
        for key, (ok, rows) in zip(keys, results, strict=True):
            if not ok:
                raise rows
            out[key] = [history_rows.as_dict(r) for r in rows]
        return out

    def rows(self, hour_ms: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind, row) for every row of the hour, rows shaped as archive rows."""
        hour = _ts(hour_ms)
        for bucket in range(SNAPSHOT_BUCKETS):
            for page in _pages(self._s, self._q_snapshots, (hour, bucket), self._page):
                yield from self._page_rows(page, hour)

    def _page_rows(self, snaps: list[Any], hour: datetime) -> Iterator[tuple[str, dict[str, Any]]]:
        with_endpoints = [s for s in snaps if s.endpoints]
        dids = [delivery_id_for(s.event_id, ep) for s in with_endpoints for ep in sorted(s.endpoints)]
        events = self._many(self._q_event, [s.event_id for s in with_endpoints])
        parts = self._many(self._q_history, dids)
        histories = {did: history_rows.split(rows) for did, rows in parts.items()}
        older = [did for did, (row, _) in histories.items() if history_rows.needs_old(row)]
        if older:
            old_rows, old_attempts = self._many(self._q_old_delivery, older), self._many(self._q_old_attempts, older)
            for did in older:
                histories[did] = history_rows.merge(*histories[did], next(iter(old_rows[did]), None),
                                                    old_attempts[did])
        replays = self._many(self._q_replays, dids)
        for s in with_endpoints:
            for ev in events[s.event_id]:
                yield "events", shape("events", {**ev, "arrived_at": s.arrived_at, "endpoints": s.endpoints}, hour)
            for ep in sorted(s.endpoints):
                did = delivery_id_for(s.event_id, ep)
                row, attempts = histories[did]
                if row is None or row.get("event_id") is None:
                    continue  # no delivery row: reconciliation's gap, nothing to archive
                yield "deliveries", shape("deliveries", row, hour)
                for a in attempts:
                    yield "attempts", shape("attempts", {**a, "tenant_id": row["tenant_id"]}, hour)
                for r in sorted(replays[did], key=lambda r: r["request_id"]):
                    yield "replays", shape("replays", r, hour)


def count(rows: Iterator[tuple[str, dict[str, Any]]]) -> layout.HourCounts:
    c = layout.HourCounts()
    for kind, row in rows:
        c.add(kind, row[layout.ID_COLUMN[kind]])
    return c


class HourWriter:
    """Streams one hour's rows into a Parquet file per (tenant bucket, kind); :meth:`finish`
    publishes them, then the manifest."""

    def __init__(self, store: ArchiveStore, hour_ms: int, row_group_rows: int) -> None:
        self._store = store
        self._hour = hour_ms
        self._rows_per_group = row_group_rows
        self._run = store.new_run_id()
        self._buffers: dict[tuple[int, str], list[dict[str, Any]]] = {}
        self._writers: dict[tuple[int, str], Any] = {}
        self._seen: dict[tuple[int, str], layout.HourCounts] = {}

    def add(self, kind: str, row: dict[str, Any]) -> None:
        key = (layout.tenant_bucket(row["tenant_id"] or ""), kind)
        buf = self._buffers.setdefault(key, [])
        buf.append(row)
        self._seen.setdefault(key, layout.HourCounts()).add(kind, row[layout.ID_COLUMN[kind]])
        if len(buf) >= self._rows_per_group:
            self._flush(key)

    def _flush(self, key: tuple[int, str]) -> None:
        buf = self._buffers.get(key)
        if not buf:
            return
        bucket, kind = key
        writer = self._writers.get(key)
        if writer is None:
            tmp = layout.tmp_path(layout.data_path(self._hour, bucket, kind), self._run)
            writer = self._writers[key] = self._store.parquet_writer(tmp, SCHEMAS[kind])
        try:
            writer.write_table(pa.Table.from_pylist(buf, schema=SCHEMAS[kind]))
        except OSError as exc:
            raise ArchiveUnavailable(f"archive store: writing {kind} of bucket {bucket}: {exc}") from exc
        buf.clear()

    def finish(self) -> layout.Manifest:
        files = []
        for key in sorted(self._seen):
            self._flush(key)
            try:
                self._writers[key].close()
            except OSError as exc:
                raise ArchiveUnavailable(f"archive store: closing {key}: {exc}") from exc
            bucket, kind = key
            final = layout.data_path(self._hour, bucket, kind)
            self._store.publish(layout.tmp_path(final, self._run), final)
            back = self._store.facts(final)  # the checksum of the bytes as stored
            seen = self._seen[key]
            files.append(layout.FileEntry(
                path=final, kind=kind, bucket=bucket, rows=seen.counts[kind], bytes=self._store.size(final),
                sha256=back.sha256 or "", min_id=seen.min_ids[kind], max_id=seen.max_ids[kind]))
        manifest = layout.Manifest(self._hour, tuple(files))
        final = layout.manifest_path(self._hour)
        tmp = layout.tmp_path(final, self._run)
        self._store.put_bytes(tmp, manifest.to_json())
        self._store.publish(tmp, final)  # last: the one mark of a complete hour
        return manifest

    def abandon(self) -> None:
        for w in self._writers.values():
            with contextlib.suppress(OSError):  # the store is failing; the next run removes what is left
                w.close()


class Releaser:
    """Rewrites an hour's hot rows to expire ``ttl_s`` from now (see the module's docstring)."""

    def __init__(self, session: Session, page_size: int) -> None:
        self._s = session
        self._page = page_size
        self._stmts: dict[str, PreparedStatement] = {}
        p = session.prepare
        self._q_snapshots = p("SELECT event_id, tenant_id, endpoints FROM fanout_snapshots WHERE hour=? AND bucket=?")
        self._q_event = p(_with_writetimes("events", "event_id", _EVENT_COLUMNS, "event_id=?"))
        self._q_history = p(_with_writetimes("delivery_history", "delivery_id, attempt_number",
                                             _STATIC_COLUMNS + _ATTEMPT_COLUMNS, "delivery_id=?"))
        self._q_replays = p(_with_writetimes("replay_requests", "delivery_id, request_id", _REPLAY_COLUMNS,
                                             "delivery_id=?"))
        self._w_pointer = p("INSERT INTO archived_deliveries (delivery_id, tenant_id, hour) VALUES (?,?,?) USING TTL ?")

    def release(self, hour_ms: int, ttl_s: int, history_ttl_s: int, now_ms: int) -> int:
        """Rewrite the hour; how many deliveries. Pointers live as long as the archive answers."""
        hour = _ts(hour_ms)
        pointer_ttl = max(1, history_ttl_s - (now_ms - hour_ms) // 1000)
        released = 0
        for bucket in range(SNAPSHOT_BUCKETS):
            for page in _pages(self._s, self._q_snapshots, (hour, bucket), self._page):
                snaps = [s for s in page if s.endpoints]
                pairs = [(delivery_id_for(s.event_id, ep), s.tenant_id) for s in snaps for ep in sorted(s.endpoints)]
                self._run_all([(self._w_pointer, (did, tenant, hour, pointer_ttl)) for did, tenant in pairs])
                writes: list[tuple[PreparedStatement, tuple[Any, ...]]] = []
                for rows in self._read(self._q_event, [s.event_id for s in snaps]):
                    for r in rows:
                        writes += self._rewrites("events", ("event_id",), _EVENT_COLUMNS, r, ttl_s)
                for rows in self._read(self._q_history, [did for did, _ in pairs]):
                    for i, r in enumerate(rows):
                        if i == 0:  # static cells: the same in every row of the partition
                            writes += self._rewrites("delivery_history", ("delivery_id",), _STATIC_COLUMNS, r,
                                                     ttl_s, static=True)
                        if r["attempt_number"] is not None:
                            writes += self._rewrites("delivery_history", ("delivery_id", "attempt_number"),
                                                     _ATTEMPT_COLUMNS, r, ttl_s)
                for rows in self._read(self._q_replays, [did for did, _ in pairs]):
                    for r in rows:
                        writes += self._rewrites("replay_requests", ("delivery_id", "request_id"), _REPLAY_COLUMNS,
                                                 r, ttl_s)
                self._run_all(writes)
                released += len(pairs)
        return released

    def _read(self, stmt: PreparedStatement, keys: list[str]) -> Iterator[list[dict[str, Any]]]:
        for ok, rows in execute_concurrent_with_args(self._s, stmt, [(k,) for k in keys], concurrency=_CONCURRENCY):
            if not ok:
                raise rows
            yield [history_rows.as_dict(r) for r in rows]

    def _rewrites(self, table: str, keys: tuple[str, ...], columns: Sequence[str], row: dict[str, Any], ttl_s: int,
                  static: bool = False) -> list[tuple[PreparedStatement, tuple[Any, ...]]]:
        """One statement per group of cells sharing a write time: the same values, that time +
        1 us and the short TTL. A non-static row is rewritten by INSERT so that its row marker
        (written at or below the newest of its cells' times) expires with it."""
        groups: dict[int, list[str]] = {}
        for c in columns:
            if row[c] is not None and row[f"wt_{c}"] is not None:
                groups.setdefault(row[f"wt_{c}"], []).append(c)
        out = []
        for wt, cols in sorted(groups.items()):
            if static:
                text = (f"UPDATE {table} USING TTL ? AND TIMESTAMP ? SET " + ", ".join(f"{c}=?" for c in cols)
                        + " WHERE " + " AND ".join(f"{k}=?" for k in keys))
                params: tuple[Any, ...] = (ttl_s, wt + 1, *(row[c] for c in cols), *(row[k] for k in keys))
            else:
                names = (*keys, *cols)
                text = (f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
                        " USING TTL ? AND TIMESTAMP ?")
                params = (*(row[c] for c in names), ttl_s, wt + 1)
            stmt = self._stmts.get(text)
            if stmt is None:
                stmt = self._stmts[text] = self._s.prepare(text)
            out.append((stmt, params))
        return out

    def _run_all(self, writes: list[tuple[PreparedStatement, tuple[Any, ...]]]) -> None:
        for i in range(0, len(writes), _CONCURRENCY):
            futures = [self._s.execute_async(stmt, params) for stmt, params in writes[i:i + _CONCURRENCY]]
            for f in futures:
                f.result()


@dataclass(frozen=True)
class HourOutcome:
    hour_ms: int
    state: str
    counts: dict[str, int]
    detail: str = ""


class Archiver:
    def __init__(self, settings: ArchiveSettings, history_ttl_s: int, session: Session, store: ArchiveStore) -> None:
        self._settings = settings
        self._history_ttl_s = history_ttl_s
        self._s = session
        self._store = store
        self._reader = HourReader(session, settings.page_size)
        self._releaser = Releaser(session, settings.page_size)
        self._q_state = session.prepare("SELECT state FROM archive_hours WHERE hour=?")
        self._w_state = session.prepare(
            "INSERT INTO archive_hours (hour, state, counts, detail, updated_at) VALUES (?,?,?,?,?)")
        self._q_failed = session.prepare("SELECT hour, state FROM archive_hours")

    def state(self, hour_ms: int) -> str | None:
        row = self._s.execute(self._q_state, (_ts(hour_ms),)).one()
        return None if row is None else row.state

    def _set(self, hour_ms: int, state: str, counts: dict[str, int], detail: str, now_ms: int) -> None:
        self._s.execute(self._w_state, (_ts(hour_ms), state, json.dumps(counts, sort_keys=True), detail or None,
                                        _ts(now_ms)))

    def archive(self, hour_ms: int) -> layout.Manifest:
        """Step 1: the hour's files and manifest, unless its manifest exists already."""
        existing = self._store.manifest(hour_ms)
        if existing is not None:
            return existing
        self._store.remove_leftovers(layout.hour_prefix(hour_ms))  # a killed run's temporary files
        writer = HourWriter(self._store, hour_ms, self._settings.row_group_rows)
        try:
            for kind, row in self._reader.rows(hour_ms):
                writer.add(kind, row)
            return writer.finish()
        except BaseException:
            writer.abandon()
            raise

    def verify(self, hour_ms: int) -> list[str]:
        """Step 2: every disagreement between the manifest read back, its files and Cassandra."""
        manifest = self._store.manifest(hour_ms)
        if manifest is None:
            return ["no manifest"]
        back = [self._store.facts(f.path) for f in manifest.files]
        return layout.disagreements(manifest, back, count(self._reader.rows(hour_ms)))

    def run_hour(self, hour_ms: int, now_ms: int) -> HourOutcome:
        if self.state(hour_ms) == RELEASED:
            return HourOutcome(hour_ms, RELEASED, {}, "released earlier")
        manifest = self.archive(hour_ms)
        counts = manifest.counts()
        self._set(hour_ms, ARCHIVED, counts, "", now_ms)
        problems = self.verify(hour_ms)
        if problems:
            detail = "; ".join(problems)
            self._set(hour_ms, FAILED, counts, detail, now_ms)
            log.error("archive hour %s failed verification, its rows stay hot: %s", _ts(hour_ms), detail)
            return HourOutcome(hour_ms, FAILED, counts, detail)
        self._set(hour_ms, VERIFIED, counts, "", now_ms)
        n = self._releaser.release(hour_ms, self._settings.release_ttl_s, self._history_ttl_s, now_ms)
        self._set(hour_ms, RELEASED, counts, "", now_ms)
        log.info("archive hour %s: %s, %d deliveries released", _ts(hour_ms), counts, n)
        return HourOutcome(hour_ms, RELEASED, counts)

    def run(self, now_ms: int) -> list[HourOutcome]:
        """Every closed hour not yet released, oldest first. A store failure ends the run (loudly:
        the exception propagates) with nothing of the failing hour released."""
        hours = layout.closed_hours(now_ms, self._settings.archive_after_s * 1000, self._history_ttl_s * 1000)
        return [self.run_hour(h, now_ms) for h in hours if self.state(h) != RELEASED]

    def failed_hours(self) -> int:
        """Hours whose latest verification failed (a small table: one row per hour)."""
        return sum(1 for r in self._s.execute(self._q_failed) if r.state == FAILED)


def push_metrics(gateway: str, failed_hours: int, outcomes: list[HourOutcome], ok: bool) -> None:
    """The batch job's outcome for Prometheus (alert ArchiveVerificationFailed, ArchiverFailing)."""
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    Gauge("webhooks_archive_failed_hours", "Hours whose archive failed verification (they stay hot)",
          registry=reg).set(failed_hours)
    Gauge("webhooks_archive_last_run_ok", "1 if the last archiver run completed", registry=reg).set(int(ok))
    Gauge("webhooks_archive_last_run_timestamp_seconds", "When the archiver last ran", registry=reg).set(time.time())
    rows = Gauge("webhooks_archive_rows_released", "Rows released by the last run", ["kind"], registry=reg)
    for kind in layout.KINDS:
        rows.labels(kind).set(sum(o.counts.get(kind, 0) for o in outcomes if o.state == RELEASED))
    push_to_gateway(gateway, job="webhooks_archiver", registry=reg)


def main(argv: list[str] | None = None) -> int:
    from stack.isolation import harness_cluster

    parser = argparse.ArgumentParser(prog="python -m control_plane.archiver", description=__doc__.split("\n")[0])
    parser.add_argument("--hour", help="one hour (ISO, e.g. 2026-11-29T19:00Z) instead of every closed hour")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    cluster = harness_cluster(settings)
    session = cluster.connect(settings.cassandra.keyspace)
    archiver = Archiver(settings.archive, settings.cassandra.history_ttl_s, session,
                        ArchiveStore.from_settings(settings.archive))
    now = int(time.time() * 1000)
    outcomes: list[HourOutcome] = []
    ok = False
    try:
        if args.hour:
            hour = layout.hour_start(int(datetime.fromisoformat(args.hour.replace("Z", "+00:00")).timestamp() * 1000))
            outcomes = [archiver.run_hour(hour, now)]
        else:
            outcomes = archiver.run(now)
        ok = True
    finally:
        if settings.archive.pushgateway:
            try:
                push_metrics(settings.archive.pushgateway, archiver.failed_hours(), outcomes, ok)
            except Exception:  # noqa: BLE001 -- the run's own outcome matters more than its report
                log.exception("could not push the archiver's metrics")
        cluster.shutdown()
    for o in outcomes:
        print(f"{_ts(o.hour_ms):%Y-%m-%dT%H:00Z} {o.state} {json.dumps(o.counts, sort_keys=True)} {o.detail}".rstrip())
    return 1 if any(o.state == FAILED for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
