"""Delivery history over both tiers: Cassandra first, then the archive for attempts that expired.

The job writes a delivery's row (its creation and status cells) for the whole 30-day window and
its attempts and event (the payload) with the hot TTL (``archive.hot_ttl_s``, core/archive_facts.py
says why); the archive holds every attempt and event from the stream (docs/archive.md).
:class:`TieredHistory` reads the hot partition as before; finding it partial (:func:`whole`: an
attempt the delivery counts is not there), it reads the attempts of that delivery from one
(hour, tenant bucket) of the archive -- its hour and tenant are on the hot delivery row, only
files a committed segment lists -- merges them under the hot ones and answers with
``tier="archive"``. Lists are answered by the endpoint index, which stays hot all 30 days, and
replay audit rows (replay_requests) stay hot all 30 days too.

**Replaying a delivery whose event expired from the hot tier** (:meth:`rehydrate`): the job's
replay path reads the delivery (hot for the window) and the payload from Cassandra, so the
event's row is written back from the archive first -- the bytes exactly as archived, with the
write time the job gave the original + 2 us (above the expired copy, below any later write) and
the hot TTL. Attempt rows are not written back: the job numbers a new attempt after the
delivery's attempt_count and the highest number it finds (operators/history_store.py).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from cassandra.cluster import Session

from control_plane.archive.rows import naive
from control_plane.archive.store import ArchiveStore
from control_plane.domain import DeliveryDetail, DeliverySummary, ReplayAudit
from control_plane.store import HistoryPosition, HistoryStore, delivery_detail
from core import archive_facts, history_rows
from core import archive_layout as layout

ARCHIVE = "archive"
_SELECT_REPLAYS = "SELECT * FROM replay_requests WHERE delivery_id=?"
_EVENT_CELLS = ("tenant_id", "event_type", "schema_version", "object_id", "object_version", "occurred_at", "payload",
                "payload_sha256")


def whole(created: bool, attempt_numbers: Iterable[int], attempt_count: int) -> bool:
    """Whether a hot partition can be read without the archive: it has its creation cells and
    attempts 1..n without a gap, at least as many as the delivery counts (automatic ones; manual
    attempts take numbers too). Attempts that expired with the hot TTL fail this, as does a
    partition read while they expire one by one."""
    numbers = sorted(attempt_numbers)
    return created and numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= attempt_count


def _ms(value: datetime | None) -> int | None:
    if value is None:
        return None
    return calendar.timegm(value.utctimetuple()) * 1000 + value.microsecond // 1000


class ArchivedAttempts:
    """Archived attempts (and events) of deliveries whose hot row names their hour and tenant:
    each (hour, tenant bucket) is read once for all the deliveries asked for that are in it."""

    def __init__(self, store: ArchiveStore) -> None:
        self._store = store

    def rows(self, hour_ms: int, bucket: int, kind: str, column: str, values: list[str]) -> list[dict[str, Any]]:
        """Committed rows of one kind, reduced by key (a fact archived twice is one row)."""
        table = self._store.read_kind(hour_ms, bucket, kind, filters=[(column, "in", values)])
        return [naive(r) for r in archive_facts.latest(kind, table.to_pylist())]

    def find(self, deliveries: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """delivery id -> its archived attempts by number, for deliveries given by their hot rows."""
        where: dict[tuple[int, int], dict[str, str]] = {}
        for did, row in deliveries.items():
            created = _ms(row.get("created_at"))
            if created is None or not row.get("tenant_id"):
                continue
            key = (layout.hour_start(created), layout.tenant_bucket(row["tenant_id"]))
            where.setdefault(key, {})[did] = row["tenant_id"]
        found: dict[str, list[dict[str, Any]]] = {}
        for (hour, bucket), tenants in where.items():
            for a in self.rows(hour, bucket, "attempts", "delivery_id", sorted(tenants)):
                if a["tenant_id"] == tenants[a["delivery_id"]]:
                    a.pop("write_ts", None)
                    found.setdefault(a["delivery_id"], []).append(a)
        return {did: sorted(rows, key=lambda a: a["attempt_number"]) for did, rows in found.items()}


class TieredHistory:
    """The control plane's HistoryStore (control_plane/store/protocols.py) over both tiers."""

    def __init__(self, hot: HistoryStore, session: Session, archive: ArchiveStore, hot_ttl_s: int) -> None:
        self._hot = hot
        self._s = session
        self._archive = ArchivedAttempts(archive)
        self._hot_ttl_s = hot_ttl_s
        self._stmts: dict[str, Any] = {}

    def get_delivery(self, delivery_id: str) -> DeliveryDetail | None:
        detail = self._hot.get_delivery(delivery_id)
        if detail is None or whole(bool(detail.summary.tenant_id), (a.attempt_number for a in detail.attempts),
                                   detail.summary.attempt_count):
            return detail
        hot_row, hot_attempts = history_rows.split(self._s.execute(self._prepared(history_rows.SELECT_NEW),
                                                                   (delivery_id,)))
        if hot_row is None:
            return detail
        archived = self._archive.find({delivery_id: hot_row}).get(delivery_id)
        if not archived:
            return detail
        merged, merged_attempts = history_rows.merge(hot_row, hot_attempts, None, archived)
        assert merged is not None
        replays = [history_rows.as_dict(r) for r in self._s.execute(self._prepared(_SELECT_REPLAYS), (delivery_id,))]
        return delivery_detail(merged, merged_attempts, replays, tier=ARCHIVE)

    def record_replay(self, audit: ReplayAudit, if_new: bool) -> bool:
        return self._hot.record_replay(audit, if_new)

    def iter_endpoint_deliveries(self, tenant_id: str, endpoint_id: str, start_ms: int, end_ms: int,
                                 after: HistoryPosition | None) -> Iterator[DeliverySummary]:
        return self._hot.iter_endpoint_deliveries(tenant_id, endpoint_id, start_ms, end_ms, after)

    def rehydrate(self, delivery_id: str, now_ms: int) -> bool:
        """Write the delivery's event back to Cassandra from the archive when its hot row expired;
        False when neither tier holds it (nothing written). See above."""
        row, _ = history_rows.split(self._s.execute(self._prepared(history_rows.SELECT_NEW), (delivery_id,)))
        if row is None or row.get("event_id") is None or row.get("created_at") is None:
            return False
        event_id = row["event_id"]
        if self._s.execute(self._prepared("SELECT event_id FROM events WHERE event_id=?"), (event_id,)).one():
            return True
        created = _ms(row["created_at"]) or 0
        events = [e for e in self._archive.rows(layout.hour_start(created), layout.tenant_bucket(row["tenant_id"]),
                                                "events", "event_id", [event_id]) if e["tenant_id"] == row["tenant_id"]]
        if not events:
            return False
        ev = events[0]
        stmt, params = self._insert("events", {"event_id": event_id, **{c: ev[c] for c in _EVENT_CELLS},
                                               "ingested_at": ev["arrived_at"]}, created * 1000 + 2, self._hot_ttl_s)
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
