"""The archiver: closed hours of delivery history from Cassandra to Parquet, verified, then let go.

``python -m control_plane.archiver`` runs once (cron, a Kubernetes CronJob, a systemd timer);
``--every 3600`` keeps running and does the same each hour (core/archive_schedule.py; ``make run``
starts it so: stack/archiver.sh); ``--shard i/N`` is one of N processes sharing the work by
(hour, tenant bucket). It holds no state of its own: Cassandra's ``archive_hours`` and the
archive's parts and manifests say where every hour stands, so a run killed anywhere is completed
by the next one.

Per hour (an arrival hour: core/archive_layout.py), each step only after the previous succeeded:

1. **archive** -- page through the hour's fan-out snapshots (16 partitions of ``fanout_snapshots``;
   they name every event of the hour and the deliveries fan-out chose), keep those of this
   shard's tenant buckets, read each page's event rows, delivery partitions and replay audit rows
   concurrently; then the endpoint index of the hour for the deliveries no snapshot names (a pair
   fan-out skipped: HourReader says why); and stream them into one Parquet file per (tenant
   bucket, kind), a row group every ``row_group_rows``: memory is bounded by the page and the
   row groups, not by the hour.
   Files are written under temporary names, moved into place, read back for their checksums, then
   each bucket's part (its manifest) is published; once all 16 parts exist, the hour's manifest.
   A bucket whose part exists is not written again, nor an hour whose manifest does (its hot rows
   may be gone by now).
2. **verify** -- read the manifest back, re-hash every file of this shard's buckets and read its
   row count, and count those buckets in Cassandra again from the endpoint index, not with the
   writer's enumeration (HourCensus); any disagreement
   (core/archive_layout.disagreements) marks the hour ``failed``: it stays hot and the pushed
   gauge raises ArchiveVerificationFailed.
3. **release** -- write each delivery's pointer row (``archived_deliveries``), then rewrite its
   hot rows with a TTL of ``release_ttl_s`` -- only a delivery whose hot rows are still exactly
   the archived ones (control_plane/archive_release.py says why and how).
"""

from __future__ import annotations

import argparse
import contextlib
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
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from control_plane.archive_release import EVENT_COLUMNS, Releaser
from control_plane.archive_rows import SCHEMAS, shape
from control_plane.archive_store import ArchiveStore, ArchiveUnavailable
from core import archive_layout as layout
from core import archive_schedule, history_rows
from core.fanout import SNAPSHOT_BUCKETS, snapshot_partition
from core.history_buckets import HISTORY_BUCKETS
from core.records import delivery_id_for
from core.settings import ArchiveSettings, Settings

log = logging.getLogger(__name__)

ARCHIVED, VERIFIED, RELEASED, FAILED = "archived", "verified", "released", "failed"

_CONCURRENCY = 64

# One delivery as archive rows: (delivery row or None, its attempts, its replay audit rows).
ArchivedDelivery = tuple[dict[str, Any] | None, list[dict[str, Any]], list[dict[str, Any]]]


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _ms(value: datetime) -> int:
    """A driver timestamp (naive UTC) as milliseconds."""
    return int(value.replace(tzinfo=UTC).timestamp() * 1000) if value.tzinfo is None else int(value.timestamp() * 1000)


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


def _shard_snapshots(session: Session, stmt: PreparedStatement, hour: datetime, wanted: set[int],
                     size: int) -> Iterator[list[Any]]:
    """The hour's fan-out snapshots of these tenant buckets, a non-empty page at a time. Every
    shard pages through all the hour's snapshots (small rows) and reads only its tenants' events
    and deliveries: the expensive reads are split, not repeated."""
    for bucket in range(SNAPSHOT_BUCKETS):
        for page in _pages(session, stmt, (hour, bucket), size):
            mine = [s for s in page if layout.tenant_bucket(s.tenant_id or "") in wanted]
            if mine:
                yield mine


def registered_endpoints(session: Session, page_size: int, wanted: set[int]) -> set[tuple[str, str]]:
    """(tenant, endpoint) of every endpoint the control plane has registered (a deleted one keeps
    its row) whose tenant is in these tenant buckets: the endpoint history's partitions to read."""
    stmt = session.prepare("SELECT tenant_id, endpoint_id FROM endpoints")
    return {(r.tenant_id, r.endpoint_id) for page in _pages(session, stmt, (), page_size) for r in page
            if layout.tenant_bucket(r.tenant_id or "") in wanted}


def _chunks(results: Iterator[tuple[bool, Any]], size: int) -> Iterator[list[Any]]:
    """Rows of concurrently started range queries (each read on, page after page, as it is
    iterated) in chunks of ``size``, in the order of the queries."""
    chunk: list[Any] = []
    for ok, rows in results:
        if not ok:
            raise rows
        for r in rows:
            chunk.append(r)
            if len(chunk) >= size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _index_params(hour_ms: int, pairs: Sequence[tuple[str, str]]) -> list[tuple[Any, ...]]:
    """endpoint_deliveries' partitions of these endpoints holding the hour, its range in each."""
    hour = _ts(hour_ms)
    return [(tenant, endpoint, hour.date(), b, hour, _ts(hour_ms + layout.HOUR_MS))
            for tenant, endpoint in pairs for b in range(HISTORY_BUCKETS)]


class HourReader:
    """Every archived row of one hour, in an order that depends on the rows alone.

    An hour's rows are found in two passes. The fan-out snapshots (their partitions in bucket
    order, each in clustering order) name its events and the deliveries fan-out chose (a
    snapshot's endpoints sorted). They do not name every delivery row: a pair fan-out skipped
    (an endpoint pinned to other schema majors) has a delivery row, listed in its endpoint's
    history, and no place in the snapshot. So the second pass reads the endpoint history's index
    (endpoint_deliveries: every delivery row the job writes has its row there, created_at = the
    arrival) of the hour's endpoints, and takes the deliveries their event's snapshot does not
    name. Verification counts from that index alone (:class:`HourCensus`), so a kind of row this
    reader missed fails the hour instead of passing it."""

    def __init__(self, session: Session, page_size: int) -> None:
        self._s = session
        self._page = page_size
        p = session.prepare
        self._q_snapshots = p("SELECT arrived_at, event_id, tenant_id, endpoints FROM fanout_snapshots"
                              " WHERE hour=? AND bucket=?")
        self._q_snapshot = p("SELECT endpoints FROM fanout_snapshots WHERE hour=? AND bucket=? AND arrived_at=?"
                             " AND event_id=?")
        self._q_listed = p("SELECT created_at, delivery_id, event_id, endpoint_id FROM endpoint_deliveries"
                           " WHERE tenant_id=? AND endpoint_id=? AND day=? AND bucket=? AND created_at>=?"
                           " AND created_at<?")
        self._q_listed.fetch_size = page_size
        self._q_event = p("SELECT event_id, " + ", ".join(EVENT_COLUMNS) + " FROM events WHERE event_id=?")
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

    def rows(self, hour_ms: int, buckets: Sequence[int] = layout.ALL_BUCKETS) -> Iterator[tuple[str, dict[str, Any]]]:
        """(kind, row) for every row of the hour in these tenant buckets, shaped as archive rows."""
        hour = _ts(hour_ms)
        wanted = set(buckets)
        endpoints = registered_endpoints(self._s, self._page, wanted)
        for mine in _shard_snapshots(self._s, self._q_snapshots, hour, wanted, self._page):
            endpoints |= {(s.tenant_id, ep) for s in mine for ep in s.endpoints or {}}
            yield from self._page_rows(mine, hour)
        for listed in self._unnamed(hour_ms, sorted(endpoints)):
            yield from self._delivery_rows(listed, hour)

    def deliveries(self, dids: list[str], hour: datetime) -> dict[str, ArchivedDelivery]:
        """Each delivery as the archive holds it: (delivery row or None, attempts in number
        order, replay rows by request id), all shaped as archive rows."""
        return self.held(self._many(self._q_history, dids), self._many(self._q_replays, dids), hour)

    def held(self, parts: dict[str, list[dict[str, Any]]], replays: dict[str, list[dict[str, Any]]],
             hour: datetime) -> dict[str, ArchivedDelivery]:
        """:meth:`deliveries` from rows already read (each delivery's delivery_history and
        replay_requests rows, any extra columns ignored); the old tables are read here."""
        dids = list(parts)
        histories = {did: history_rows.split(rows) for did, rows in parts.items()}
        older = [did for did, (row, _) in histories.items() if history_rows.needs_old(row)]
        if older:
            old_rows, old_attempts = self._many(self._q_old_delivery, older), self._many(self._q_old_attempts, older)
            for did in older:
                histories[did] = history_rows.merge(*histories[did], next(iter(old_rows[did]), None),
                                                    old_attempts[did])
        out: dict[str, ArchivedDelivery] = {}
        for did in dids:
            row, attempts = histories[did]
            if row is None or row.get("event_id") is None:
                out[did] = (None, [], [])  # no delivery row: reconciliation's gap, nothing to archive
                continue
            out[did] = (shape("deliveries", row, hour),
                        [shape("attempts", {**a, "tenant_id": row["tenant_id"]}, hour) for a in attempts],
                        [shape("replays", r, hour) for r in sorted(replays[did], key=lambda r: r["request_id"])])
        return out

    def _page_rows(self, snaps: list[Any], hour: datetime) -> Iterator[tuple[str, dict[str, Any]]]:
        with_endpoints = [s for s in snaps if s.endpoints]
        events = self._many(self._q_event, [s.event_id for s in with_endpoints])
        for s in with_endpoints:
            for ev in events[s.event_id]:
                yield "events", shape("events", {**ev, "arrived_at": s.arrived_at, "endpoints": s.endpoints}, hour)
        yield from self._delivery_rows([delivery_id_for(s.event_id, ep) for s in with_endpoints
                                        for ep in sorted(s.endpoints)], hour)

    def _delivery_rows(self, dids: list[str], hour: datetime) -> Iterator[tuple[str, dict[str, Any]]]:
        """Each delivery with its attempts and replays right after it (the release's merge of the
        files relies on that order)."""
        held = self.deliveries(dids, hour)
        for did in dids:
            row, attempts, replays = held[did]
            if row is None:
                continue
            yield "deliveries", row
            for a in attempts:
                yield "attempts", a
            for r in replays:
                yield "replays", r

    def _unnamed(self, hour_ms: int, pairs: list[tuple[str, str]]) -> Iterator[list[str]]:
        """Pages of the delivery ids the endpoint index lists for the hour whose event's snapshot
        does not name them (or that have no snapshot): the first pass did not take them."""
        results = execute_concurrent_with_args(self._s, self._q_listed, _index_params(hour_ms, pairs),
                                               concurrency=SNAPSHOT_BUCKETS, results_generator=True)
        for chunk in _chunks(results, self._page):
            listed = [r for r in chunk if r.event_id is not None]  # no event id: a status-only row
            keys = sorted({(r.event_id, r.created_at) for r in listed})
            params = [(_ts(hour_ms), snapshot_partition(eid, _ms(at))[1], at, eid) for eid, at in keys]
            named: dict[tuple[str, datetime], dict[str, int]] = {}
            for key, (ok, rows) in zip(keys, execute_concurrent_with_args(self._s, self._q_snapshot, params,
                                                                          concurrency=_CONCURRENCY), strict=True):
                if not ok:
                    raise rows
                row = rows.one()
                named[key] = dict(row.endpoints or {}) if row is not None else {}
            dids = [r.delivery_id for r in listed if r.endpoint_id not in named[(r.event_id, r.created_at)]]
            if dids:
                yield dids


class HourCensus:
    """What Cassandra holds of an hour's tenant buckets, counted for verification from a source
    the writer's enumeration does not decide: the endpoint history's index.

    Why the index: a delivery row's only time-ordered listing is its endpoint's history
    (endpoint_deliveries; deliveries_by_endpoint for rows written before that table), which the
    job writes in the same batch as every delivery row of every kind -- sent, skipped, restored by
    reconciliation -- and which the control plane answers endpoint histories from for 30 days.
    The writer finds deliveries through the fan-out snapshots first; a verifier that recounted
    with the writer's reader would agree with whatever it left out (it did: skipped pairs were
    never archived, and verified). So deliveries are counted here from every index row of the
    hour whatever its status, each one read by its key for its attempts and replays, and events
    from the snapshots that name endpoints (whose event rows the job writes with their first
    delivery). A row with no delivery row behind it is not counted: there is nothing to archive.
    """

    def __init__(self, session: Session, reader: HourReader, page_size: int) -> None:
        self._s = session
        self._reader = reader
        self._page = page_size
        p = session.prepare
        self._q_snapshots = p("SELECT tenant_id, event_id, endpoints FROM fanout_snapshots WHERE hour=? AND bucket=?")
        self._q_event = p("SELECT event_id FROM events WHERE event_id=?")
        self._q_listed = p("SELECT delivery_id, event_id FROM endpoint_deliveries WHERE tenant_id=? AND endpoint_id=?"
                           " AND day=? AND bucket=? AND created_at>=? AND created_at<?")
        self._q_listed_old = p("SELECT delivery_id, event_id FROM deliveries_by_endpoint WHERE tenant_id=?"
                               " AND endpoint_id=? AND day=? AND created_at>=? AND created_at<?")
        for q in (self._q_listed, self._q_listed_old):
            q.fetch_size = page_size

    def counts(self, hour_ms: int, buckets: Sequence[int]) -> layout.HourCounts:
        c = layout.HourCounts()
        hour = _ts(hour_ms)
        wanted = set(buckets)
        endpoints = registered_endpoints(self._s, self._page, wanted)
        for mine in _shard_snapshots(self._s, self._q_snapshots, hour, wanted, self._page):
            endpoints |= {(s.tenant_id, ep) for s in mine for ep in s.endpoints or {}}
            named = [s.event_id for s in mine if s.endpoints]
            results = execute_concurrent_with_args(self._s, self._q_event, [(e,) for e in named],
                                                   concurrency=_CONCURRENCY)
            for event_id, (ok, rows) in zip(named, results, strict=True):
                if not ok:
                    raise rows
                if rows.one() is not None:
                    c.add("events", event_id)
        pairs = sorted(endpoints)
        new = execute_concurrent_with_args(self._s, self._q_listed, _index_params(hour_ms, pairs),
                                           concurrency=SNAPSHOT_BUCKETS, results_generator=True)
        old = execute_concurrent_with_args(self._s, self._q_listed_old,
                                           [(t, e, hour.date(), hour, _ts(hour_ms + layout.HOUR_MS)) for t, e in pairs],
                                           concurrency=SNAPSHOT_BUCKETS, results_generator=True)
        for results in (new, old):
            for chunk in _chunks(results, self._page):
                # A row of endpoint_deliveries without an event id is a status mirrored there for a
                # delivery created before that table: it is listed in deliveries_by_endpoint.
                dids = [r.delivery_id for r in chunk if r.event_id is not None]
                for did, (row, attempts, replays) in self._reader.deliveries(dids, hour).items():
                    if row is None:
                        continue
                    c.add("deliveries", did)
                    if attempts:
                        c.add("attempts", did, len(attempts))
                    if replays:
                        c.add("replays", did, len(replays))
        return c


def publish_manifest(store: ArchiveStore, hour_ms: int) -> layout.Manifest | None:
    """The hour's manifest from its 16 parts, published, if every part exists (else None). Two
    shards finishing at once publish the same bytes."""
    parts = [store.read_bytes(layout.part_path(hour_ms, b)) for b in layout.ALL_BUCKETS]
    if any(p is None for p in parts):
        return None
    manifest = layout.Manifest.assemble(hour_ms, [layout.Manifest.from_json(p) for p in parts if p is not None])
    final = layout.manifest_path(hour_ms)
    tmp = layout.tmp_path(final, store.new_run_id())
    store.put_bytes(tmp, manifest.to_json())
    store.publish(tmp, final)  # last: the one mark of a complete hour
    return manifest


class HourWriter:
    """Streams one hour's rows of some tenant buckets into a Parquet file per (bucket, kind);
    :meth:`finish` publishes each bucket's files, then that bucket's part (its manifest)."""

    def __init__(self, store: ArchiveStore, hour_ms: int, row_group_rows: int,
                 buckets: Sequence[int] = layout.ALL_BUCKETS) -> None:
        self._store = store
        self._hour = hour_ms
        self._rows_per_group = row_group_rows
        self._bucket_set = tuple(sorted(buckets))
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

    def _publish(self, key: tuple[int, str]) -> layout.FileEntry:
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
        return layout.FileEntry(path=final, kind=kind, bucket=bucket, rows=seen.counts[kind],
                                bytes=self._store.size(final), sha256=back.sha256 or "", min_id=seen.min_ids[kind],
                                max_id=seen.max_ids[kind])

    def finish(self) -> layout.Manifest | None:
        """Publish; the hour's manifest if the hour is complete now (None: other shards' parts
        are missing)."""
        for bucket in self._bucket_set:  # an empty bucket gets its (empty) part too: it is done
            files = tuple(self._publish(key) for key in sorted(self._seen) if key[0] == bucket)
            final = layout.part_path(self._hour, bucket)
            tmp = layout.tmp_path(final, self._run)
            self._store.put_bytes(tmp, layout.Manifest(self._hour, files).to_json())
            self._store.publish(tmp, final)  # last: the mark of a complete bucket
        return publish_manifest(self._store, self._hour)

    def abandon(self) -> None:
        for w in self._writers.values():
            with contextlib.suppress(OSError):  # the store is failing; the next run removes what is left
                w.close()


@dataclass(frozen=True)
class HourOutcome:
    hour_ms: int
    state: str
    counts: dict[str, int]
    detail: str = ""


class Archiver:
    """Archives, verifies and releases hours -- of every tenant bucket, or of one shard's
    (core/archive_layout.shard_buckets, per hour): shards write disjoint files and parts; whichever finds
    every part written assembles the hour's manifest; each then verifies and releases its own
    buckets, which are marked released one by one. The hour is ``released`` in archive_hours once
    every bucket is, ``failed`` as soon as one shard's verification fails (the alert). A failed
    hour's buckets are archived again by the next run, unless their release began (marked before
    it begins): rewriting those could drop rows already expiring."""

    def __init__(self, settings: ArchiveSettings, history_ttl_s: int, session: Session, store: ArchiveStore,
                 shard: tuple[int, int] = (0, 1)) -> None:
        self._settings = settings
        self._history_ttl_s = history_ttl_s
        self._s = session
        self._store = store
        self._shard = shard
        self._reader = HourReader(session, settings.page_size)
        self._census = HourCensus(session, self._reader, settings.page_size)
        self._releaser = Releaser(session, store, self._reader, settings.page_size)
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

    def _progress(self, hour_ms: int, state: str, counts: dict[str, int], now_ms: int) -> None:
        """An intermediate state, unless a shard's failure is on record: that one stands (and
        keeps the alert up) until every bucket is released."""
        if self.state(hour_ms) != FAILED:
            self._set(hour_ms, state, counts, "", now_ms)

    def _exists(self, path: str) -> bool:
        return self._store.read_bytes(path) is not None

    def archive(self, hour_ms: int, buckets: Sequence[int] | None = None,
                again: bool = False) -> layout.Manifest | None:
        """Step 1: this shard's buckets' files and parts, each bucket unless its part exists;
        then the hour's manifest, if every bucket's part exists (None: other shards' are missing).
        An hour whose manifest exists is not written again, except, ``again``, its buckets whose
        release never began (an hour that failed verification: its hot rows are all there, and a
        fresh copy takes in what was written after the first -- e.g. a replay landing between
        archive and verification, which would otherwise fail the hour at every run)."""
        existing = self._store.manifest(hour_ms)
        if existing is not None and not again:
            return existing
        mine = layout.shard_buckets(*self._shard, hour_ms) if buckets is None else buckets
        if again:
            todo = [b for b in mine if not self._exists(layout.releasing_path(hour_ms, b))]
        else:
            todo = [b for b in mine if not self._exists(layout.part_path(hour_ms, b))]
        if todo:
            for b in todo:  # a killed run's temporary files (only this shard's: others may be writing)
                self._store.remove_leftovers(layout.bucket_prefix(hour_ms, b))
            writer = HourWriter(self._store, hour_ms, self._settings.row_group_rows, todo)
            try:
                for kind, row in self._reader.rows(hour_ms, todo):
                    writer.add(kind, row)
                return writer.finish()
            except BaseException:
                writer.abandon()
                raise
        return publish_manifest(self._store, hour_ms)  # another shard may have finished the hour meanwhile

    def verify(self, hour_ms: int, buckets: Sequence[int] | None = None) -> list[str]:
        """Step 2: every disagreement, in these buckets, between the manifest read back, its files
        and Cassandra."""
        manifest = self._store.manifest(hour_ms)
        if manifest is None:
            return ["no manifest"]
        buckets = layout.shard_buckets(*self._shard, hour_ms) if buckets is None else buckets
        mine = manifest.of_buckets(buckets)
        back = [self._store.facts(f.path) for f in mine.files]
        return layout.disagreements(mine, back, self._census.counts(hour_ms, buckets))

    def run_hour(self, hour_ms: int, now_ms: int) -> HourOutcome:
        state = self.state(hour_ms)
        if state == RELEASED:
            return HourOutcome(hour_ms, RELEASED, {}, "released earlier")
        todo = [b for b in layout.shard_buckets(*self._shard, hour_ms)
                if not self._exists(layout.released_path(hour_ms, b))]
        if not todo:
            return HourOutcome(hour_ms, RELEASED, {}, "this shard's buckets of the hour are released (or it has none)")
        manifest = self.archive(hour_ms, todo, again=state == FAILED)
        if manifest is None:
            self._progress(hour_ms, ARCHIVED, {}, now_ms)
            return HourOutcome(hour_ms, ARCHIVED, {}, "waiting for the other shards' buckets")
        mine = manifest.of_buckets(todo)
        counts = mine.counts()
        self._progress(hour_ms, ARCHIVED, counts, now_ms)
        # A bucket whose release began (and did not finish: a run stopped or failed in it) was
        # verified before; its hot rows may have expired since, so recounting them now would fail
        # it at every run, for good. Its release is resumed instead (it skips what already went).
        resumed = [b for b in todo if self._exists(layout.releasing_path(hour_ms, b))]
        fresh = [b for b in todo if b not in resumed]
        problems = self.verify(hour_ms, fresh) if fresh else []
        if problems:
            detail = "; ".join(problems)
            self._set(hour_ms, FAILED, counts, detail, now_ms)
            log.error("archive hour %s failed verification, its rows stay hot: %s", _ts(hour_ms), detail)
            return HourOutcome(hour_ms, FAILED, counts, detail)
        self._progress(hour_ms, VERIFIED, counts, now_ms)
        for b in fresh:
            self._store.put_bytes(layout.releasing_path(hour_ms, b), b"{}\n")
        released = self._releaser.release(mine, self._settings.release_ttl_s, self._history_ttl_s, now_ms)
        for b in todo:
            self._store.put_bytes(layout.released_path(hour_ms, b), b"{}\n")
        detail = f"{released.kept_hot} deliveries changed after verification stay hot" if released.kept_hot else ""
        if all(self._exists(layout.released_path(hour_ms, b)) for b in layout.ALL_BUCKETS):
            self._set(hour_ms, RELEASED, manifest.counts(), detail, now_ms)
        log.info("archive hour %s buckets %s: %s, %d deliveries released, %d kept hot", _ts(hour_ms),
                 ",".join(map(str, todo)), counts, released.deliveries, released.kept_hot)
        return HourOutcome(hour_ms, RELEASED, counts, detail)

    def run(self, now_ms: int, stop: Callable[[], bool] = lambda: False) -> list[HourOutcome]:
        """Every closed hour not yet released, oldest first, until ``stop()`` (checked between
        hours: a stopped run is resumed by the next). A store failure ends the run (loudly: the
        exception propagates) with nothing of the failing hour released."""
        hours = layout.closed_hours(now_ms, self._settings.archive_after_s * 1000, self._history_ttl_s * 1000)
        out = []
        for h in hours:
            if stop():
                break
            if self.state(h) != RELEASED:
                out.append(self.run_hour(h, now_ms))
        return out

    def failed_hours(self) -> int:
        """Hours whose latest verification failed (a small table: one row per hour)."""
        return sum(1 for r in self._s.execute(self._q_failed) if r.state == FAILED)


def push_metrics(gateway: str, failed_hours: int, outcomes: list[HourOutcome], ok: bool, shard: str = "0-of-1") -> None:
    """The batch job's outcome for Prometheus (alerts ArchiveVerificationFailed, ArchiverFailing,
    ArchiverStale on the timestamp), one group per shard: shards sharing a gateway must not
    overwrite each other's last run."""
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    Gauge("webhooks_archive_failed_hours", "Hours whose archive failed verification (they stay hot)",
          registry=reg).set(failed_hours)
    Gauge("webhooks_archive_last_run_ok", "1 if the last archiver run completed", registry=reg).set(int(ok))
    Gauge("webhooks_archive_last_run_timestamp_seconds", "When the archiver last ran", registry=reg).set(time.time())
    rows = Gauge("webhooks_archive_rows_released", "Rows released by the last run", ["kind"], registry=reg)
    for kind in layout.KINDS:
        rows.labels(kind).set(sum(o.counts.get(kind, 0) for o in outcomes if o.state == RELEASED))
    push_to_gateway(gateway, job="webhooks_archiver", registry=reg, grouping_key={"shard": shard})


def run_once(settings: Settings, shard: tuple[int, int], hour: int | None, stop: Callable[[], bool]) -> int:
    """One run (every closed hour, or ``hour``), its outcome pushed and printed; the exit code.
    Connects anew each time: a loop outlives Cassandra restarts between its runs."""
    from stack.isolation import harness_cluster

    cluster = harness_cluster(settings)
    outcomes: list[HourOutcome] = []
    ok = False
    archiver: Archiver | None = None
    try:
        session = cluster.connect(settings.cassandra.keyspace)
        archiver = Archiver(settings.archive, settings.cassandra.history_ttl_s, session,
                            ArchiveStore.from_settings(settings.archive), shard)
        now = int(time.time() * 1000)
        outcomes = [archiver.run_hour(hour, now)] if hour is not None else archiver.run(now, stop)
        ok = True
    finally:
        if settings.archive.pushgateway:
            try:
                failed = archiver.failed_hours() if archiver is not None else 0
                push_metrics(settings.archive.pushgateway, failed, outcomes, ok, "{}-of-{}".format(*shard))
            except Exception:  # noqa: BLE001 -- the run's own outcome matters more than its report
                log.exception("could not push the archiver's metrics")
        cluster.shutdown()
    for o in outcomes:
        print(f"{_ts(o.hour_ms):%Y-%m-%dT%H:00Z} {o.state} {json.dumps(o.counts, sort_keys=True)} {o.detail}".rstrip(),
              flush=True)
    return 1 if any(o.state == FAILED for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m control_plane.archiver", description=__doc__.split("\n")[0])
    parser.add_argument("--hour", help="one hour (ISO, e.g. 2026-11-29T19:00Z) instead of every closed hour")
    parser.add_argument("--shard", default="0/1", help="i/N: this process takes its turn of the (hour, tenant"
                        " bucket) units: N processes started with 0/N .. N-1/N share the work, N up to 4096 (more"
                        " than 16 take turns by hour); default 0/1")
    parser.add_argument("--every", type=int, metavar="SECONDS",
                        help="keep running: a run at each multiple of SECONDS (3600: each UTC hour) + --margin")
    parser.add_argument("--margin", type=int, default=300, metavar="SECONDS",
                        help="with --every: how long after the boundary (default 300)")
    args = parser.parse_args(argv)
    try:
        shard = layout.parse_shard(args.shard)
        if args.every is not None:
            archive_schedule.next_run_ms(0, args.every * 1000, args.margin * 1000)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    hour = None
    if args.hour:
        hour = layout.hour_start(int(datetime.fromisoformat(args.hour.replace("Z", "+00:00")).timestamp() * 1000))
    if args.every is None:
        return run_once(settings, shard, hour, lambda: False)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    log.info("archiver shard %s: a run every %d s, %d s after each boundary", args.shard, args.every, args.margin)
    schedule = archive_schedule.Schedule(args.every, args.margin, lambda: int(time.time() * 1000), stopping.wait,
                                         lambda: run_once(settings, shard, hour, stopping.is_set))
    schedule.loop()
    log.info("archiver stopped after %d runs (%d failed)", schedule.runs, schedule.failures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
