"""Delivery history over both tiers: Cassandra first, then the archive for a released delivery.

A delivery whose hour the archiver released (control_plane/archiver.py) has no hot rows once
their short TTL ends, but a pointer row (``archived_deliveries``: its hour and tenant) for the
rest of the 30-day window. :class:`TieredHistory` reads the hot partition as before; finding it
missing or partial (:func:`whole`), it follows the pointer to one hour's tenant bucket of the
archive -- only the files that hour's manifest lists -- and builds the same
:class:`DeliveryDetail` from the archived rows merged under the hot ones, with
``tier="archive"``. Lists are answered by the endpoint index, which stays hot all 30 days.

**Why reads merge a partial hot partition with the archive.** A write to a released delivery
made while its released rows are still live (a replay within the release TTL; a replay the
control plane let through before the release reached the delivery, landing after the release's
last read) is written hot with the full TTL, beside rows that expire within a day. Once they
expire, the partition holds only that write: the creation cells and the archived attempts are in
the archive alone. No check made when the replay is *requested* can rule this out (the job
writes later, and the release may run in between), so the read is where history is made whole:
a hot cell wins over the archived one, as it does for the job's own ordering (a later write
outranks the released copy only if it would have outranked the original, whose tombstone
otherwise hides it; the archive then answers with the original), attempts and replay audit rows
are joined by key. Reconciliation reads the same way (control_plane/reconcile.py).

**Replaying a delivery the archive holds** brings it back to the hot tier first
(:meth:`rehydrate`), whether its hot rows expired or are still live: the job's replay path reads
the delivery and its payload from Cassandra, and released rows may expire between the request and
the job's read (the job would then skip the replay, or count attempts from a partition missing
some). So the archived rows (the payload bytes exactly as archived) are written back with the
full TTL before the request is queued. Each cell is written with the write time the job gave
the original (operators/history_store.py: creation time, status band, attempt band) + 2 us:
above the released copy's cell (+1 us, live or expired), and below any later write the job
makes, so the job's ordering rules hold as if nothing had moved; rehydrating twice writes the
same cells again. Reads alone would not do: the job reads Cassandra, not the archive.
Rehydrated rows expire with the delivery's 30-day window.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from cassandra import InvalidRequest
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args

from control_plane.archive_rows import naive
from control_plane.archive_store import ArchiveStore
from control_plane.domain import DeliveryDetail, DeliverySummary, ReplayAudit
from control_plane.errors import FailedPrecondition
from control_plane.store import CassandraStore, HistoryPosition, delivery_detail
from core import archive_layout as layout
from core import history_rows
from operators.history_store import BAND_US, status_write_ts

ARCHIVE = "archive"
_STATUS_CELLS = ("status", "attempt_count", "next_attempt_at", "last_http_status", "last_error_class",
                 "auto_retry_active", "updated_at")
_CREATION_CELLS = ("event_id", "tenant_id", "endpoint_id", "endpoint_config_version", "event_type", "created_at",
                   "expires_at")
_ATTEMPT_CELLS = ("attempt_id", "config_version", "url", "started_at", "finished_at", "http_status", "latency_ms",
                  "outcome", "error_class", "response_sha256", "response_prefix", "signing_key_versions", "manual",
                  "requested_by", "request_id")
_SELECT_REPLAYS = "SELECT * FROM replay_requests WHERE delivery_id=?"
_EVENT_CELLS = ("tenant_id", "event_type", "schema_version", "object_id", "object_version", "occurred_at", "payload",
                "payload_sha256", "ingested_at")


def whole(created: bool, attempt_numbers: Iterable[int]) -> bool:
    """Whether a hot partition can be read without the archive: it has its creation cells and
    attempts 1..n without a gap. A released partition whose rows expired beside a later write
    fails this (see above); so does one read while its released copies expire (they are written
    by several statements, a few ms apart)."""
    numbers = sorted(attempt_numbers)
    return created and numbers == list(range(1, len(numbers) + 1))


def merge_replays(hot: Iterable[dict[str, Any]], archived: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Replay audit rows of both tiers, joined by request id (a hot row wins: the same row)."""
    by_id = {r["request_id"]: r for r in archived}
    by_id.update((r["request_id"], r) for r in hot)
    return list(by_id.values())


def _ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


Archived = tuple[int, str, dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]


class ArchivedDeliveries:
    """Released deliveries out of the archive: each one's pointer row names its hour and tenant,
    and each (hour, tenant bucket) is read once for all the deliveries asked for that are in it
    (only files the hour's manifest lists)."""

    def __init__(self, session: Session, store: ArchiveStore) -> None:
        self._s = session
        self._store = store
        self._q_pointer: Any = None

    def rows(self, hour_ms: int, bucket: int, kind: str, column: str, values: list[str]) -> list[dict[str, Any]]:
        manifest = self._store.manifest(hour_ms)
        if manifest is None:
            return []
        out: list[dict[str, Any]] = []
        for f in manifest.files_of(bucket, kind):
            out += [naive(r) for r in self._store.read_table(f.path, filters=[(column, "in", values)]).to_pylist()]
        return out

    def find(self, delivery_ids: list[str]) -> dict[str, Archived]:
        """(hour, tenant, delivery row, attempts by number, replay rows) of each delivery found."""
        if not delivery_ids:
            return {}
        if self._q_pointer is None:
            try:
                self._q_pointer = self._s.prepare("SELECT tenant_id, hour FROM archived_deliveries WHERE delivery_id=?")
            except InvalidRequest:
                # A keyspace from before the archive tier (its schema not re-applied yet): the
                # archiver cannot have released anything there.
                return {}
        where: dict[tuple[int, int], dict[str, str]] = {}
        results = execute_concurrent_with_args(self._s, self._q_pointer, [(d,) for d in delivery_ids], concurrency=64)
        for did, (ok, rows) in zip(delivery_ids, results, strict=True):
            if not ok:
                raise rows
            for p in rows:
                where.setdefault((_ms(p.hour) or 0, layout.tenant_bucket(p.tenant_id)), {})[did] = p.tenant_id
        found: dict[str, Archived] = {}
        for (hour, bucket), tenants in where.items():
            ids = sorted(tenants)
            attempts: dict[str, list[dict[str, Any]]] = {}
            for a in self.rows(hour, bucket, "attempts", "delivery_id", ids):
                attempts.setdefault(a["delivery_id"], []).append(a)
            replays: dict[str, list[dict[str, Any]]] = {}
            for r in self.rows(hour, bucket, "replays", "delivery_id", ids):
                replays.setdefault(r["delivery_id"], []).append(r)
            for row in self.rows(hour, bucket, "deliveries", "delivery_id", ids):
                did = row["delivery_id"]
                if row["tenant_id"] == tenants[did]:
                    found[did] = (hour, tenants[did], row,
                                  sorted(attempts.get(did, []), key=lambda a: a["attempt_number"]),
                                  replays.get(did, []))
        return found


class TieredHistory:
    """The control plane's HistoryStore (control_plane/store.py) over both tiers."""

    def __init__(self, hot: CassandraStore, session: Session, archive: ArchiveStore, history_ttl_s: int) -> None:
        self._hot = hot
        self._s = session
        self._archive = ArchivedDeliveries(session, archive)
        self._history_ttl_s = history_ttl_s
        self._stmts: dict[str, Any] = {}

    def _archived(self, delivery_id: str) -> Archived | None:
        return self._archive.find([delivery_id]).get(delivery_id)

    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        detail = self._hot.get_delivery(delivery_id)
        if detail is not None and whole(bool(detail.summary.tenant_id), (a.attempt_number for a in detail.attempts)):
            return detail
        archived = self._archived(delivery_id)
        if archived is None:
            return detail
        _, _, row, attempts, replays = archived
        if detail is None:
            return delivery_detail(row, attempts, replays, tier=ARCHIVE)
        hot_row, hot_attempts = history_rows.split(self._s.execute(self._prepared(history_rows.SELECT_NEW),
                                                                   (delivery_id,)))
        hot_replays = [history_rows.as_dict(r) for r in self._s.execute(self._prepared(_SELECT_REPLAYS),
                                                                        (delivery_id,))]
        merged, merged_attempts = history_rows.merge(hot_row, hot_attempts, row, attempts)
        assert merged is not None  # the archived row is under it
        return delivery_detail(merged, merged_attempts, merge_replays(hot_replays, replays), tier=ARCHIVE)

    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        return self._hot.record_replay(audit, if_new)

    def iter_endpoint_deliveries(self, tenant_id: str, endpoint_id: str, start_ms: int, end_ms: int,
                                 after: HistoryPosition | None) -> Iterator[DeliverySummary]:
        return self._hot.iter_endpoint_deliveries(tenant_id, endpoint_id, start_ms, end_ms, after)

    def rehydrate(self, delivery_id: str, now_ms: int) -> bool:
        """Write an archived delivery (with its event's payload) back to Cassandra; False when the
        archive does not hold it (nothing written). See above."""
        archived = self._archived(delivery_id)
        if archived is None:
            return False
        hour, tenant, row, attempts, replays = archived
        events = [e for e in self._archive.rows(hour, layout.tenant_bucket(tenant), "events", "event_id",
                                                [row["event_id"]]) if e["tenant_id"] == tenant]
        if not events:
            raise FailedPrecondition(f"the archive has no payload for event {row['event_id']}")
        created = _ms(row["created_at"]) or hour
        ttl = max(3600, self._history_ttl_s - (now_ms - created) // 1000)
        ev = events[0]
        writes = [self._insert("events", {"event_id": ev["event_id"], **{c: ev[c] for c in _EVENT_CELLS}},
                               (_ms(ev["ingested_at"]) or created) * 1000 + 2, ttl)]
        writes.append(self._update({c: row[c] for c in _CREATION_CELLS}, delivery_id, created * 1000 + 2, ttl))
        updated = _ms(row["updated_at"])
        status_ts = created * 1000 if updated is None else status_write_ts(row["status"] or "pending", updated)
        writes.append(self._update({c: row[c] for c in _STATUS_CELLS}, delivery_id, status_ts + 2, ttl))
        for a in attempts:
            cells = {c: a["endpoint_config_version" if c == "config_version" else c] for c in _ATTEMPT_CELLS}
            if a["outcome"] == "reserved":
                ts = (_ms(a["started_at"]) or created) * 1000
            else:
                ts = (_ms(a["finished_at"]) or created) * 1000 + BAND_US
            writes.append(self._insert("delivery_history", {"delivery_id": delivery_id,
                                                            "attempt_number": a["attempt_number"], **cells},
                                       ts + 2, ttl))
        for r in replays:
            writes.append(self._insert("replay_requests", {c: r[c] for c in (
                "delivery_id", "request_id", "tenant_id", "requested_by", "requested_at", "reason", "action")},
                now_ms * 1000, ttl))
        for stmt, params in writes:
            self._s.execute(stmt, params)
        return True

    def _prepared(self, text: str) -> Any:
        if text not in self._stmts:
            self._stmts[text] = self._s.prepare(text)
        return self._stmts[text]

    def _insert(self, table: str, cells: dict[str, Any], ts: int, ttl: int) -> tuple[Any, tuple[Any, ...]]:
        cols = [c for c, v in cells.items() if v is not None]
        text = (f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"
                " USING TIMESTAMP ? AND TTL ?")
        return self._prepared(text), (*(cells[c] for c in cols), ts, ttl)

    def _update(self, cells: dict[str, Any], delivery_id: str, ts: int, ttl: int) -> tuple[Any, tuple[Any, ...]]:
        cols = [c for c, v in cells.items() if v is not None]
        text = ("UPDATE delivery_history USING TIMESTAMP ? AND TTL ? SET " + ", ".join(f"{c}=?" for c in cols)
                + " WHERE delivery_id=?")
        return self._prepared(text), (ts, ttl, *(cells[c] for c in cols), delivery_id)
