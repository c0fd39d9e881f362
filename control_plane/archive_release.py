"""Letting a verified hour's hot rows go (control_plane/archiver.py, step 3): only rows the
archive holds, never a row written after it.

**Why a release compares every delivery with the archive.** Verification compares counts at one
moment; the job and the control plane keep writing. A manual replay (its audit row, a new
attempt, the delivery's new status) of a delivery of the hour can land after verification read
it, and a release that rewrote "whatever the partition holds now" with the short TTL would
expire those rows though the archive never got them: history lost inside the 30-day window,
silently. Write times cannot tell such rows apart (the job writes them in bands up to two years
ahead: operators/history_store.py), the rows themselves can. So the release walks the bucket's
archived deliveries in file order (attempts and replays of a delivery follow it in the same
order: a bounded merge of the files, memory grows with the page, not the hour), reads each
delivery again and

1. releases it only if its hot rows, shaped as archive rows, are exactly the archived ones; a
   delivery that changed since is **left hot whole**, with its own TTLs (it expires with its
   window like any row never archived; reads answer from Cassandra, which has all of it, and so
   does reconciliation). Its event stays hot with it (a further replay reads the payload there),
   as does an event one of whose deliveries had no row at archive time (its redrive reads the
   payload there): an event goes only once every delivery its snapshot names has its pointer;
2. after rewriting, reads the released deliveries once more: a write that landed between that
   read and the rewrite makes the delivery differ, and its rewritten cells are **restored** (the
   same values at write time + 2 us, above the short-TTL copy at + 1 us and below any newer
   write, each with the TTL it had before the release), so it too stays hot whole.

A write after that second read meets a delivery already released: the control plane brings a
delivery the archive holds back to the hot tier before queuing its replay, and reads merge a
partial hot partition with the archive (control_plane/tiered_history.py), so the delivery reads
whole whichever tier each of its rows ends in.

Why a TTL rewrite rather than DELETE: the job writes history cells with timestamps up to two
bands (two years) in the future, so a tombstone would need a timestamp above every band and
would then shadow a later replay's writes to the same delivery for as long as it lives. A cell
rewritten with its own write time + 1 us and a short TTL keeps every ordering rule the job relies
on, and when it expires it shadows only the original cell. The endpoint and attempt indexes and
fan-out snapshots are not rewritten: they are TWCS tables, whose files are dropped whole when
their window's rows have all expired, so an early expiry there frees nothing before day 30; they
stay hot 30 days (ListDeliveries and reconciliation keep reading them).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement

from control_plane.archive_store import ArchiveStore, ArchiveUnavailable
from core import archive_layout as layout
from core import history_rows
from core.records import delivery_id_for

if TYPE_CHECKING:
    from control_plane.archiver import ArchivedDelivery, HourReader

EVENT_COLUMNS = ("tenant_id", "event_type", "schema_version", "object_id", "object_version", "occurred_at",
                 "payload", "payload_sha256", "ingested_at")
_STATIC_COLUMNS = tuple(c for c in history_rows.DELIVERY_COLUMNS if c != "delivery_id")
_ATTEMPT_COLUMNS = ("attempt_id", "config_version", "url", "started_at", "finished_at", "http_status",
                    "latency_ms", "outcome", "error_class", "response_sha256", "response_prefix",
                    "signing_key_versions", "manual", "requested_by", "request_id")
_REPLAY_COLUMNS = ("tenant_id", "requested_by", "requested_at", "reason", "action")
_CONCURRENCY = 64
# Write-time offsets above a cell's own: the released (short-TTL) copy, and a restored one.
_RELEASED_US, _RESTORED_US = 1, 2

Write = tuple[PreparedStatement, tuple[Any, ...]]


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _with_write_facts(table: str, keys: str, columns: Sequence[str], where: str) -> str:
    cols = ", ".join(f"{c}, WRITETIME({c}) AS wt_{c}, TTL({c}) AS ttl_{c}" for c in columns)
    return f"SELECT {keys}, {cols} FROM {table} WHERE {where}"


def _cell_times(history: list[dict[str, Any]], replays: list[dict[str, Any]],
                offset_us: int = 0) -> dict[tuple[Any, str], int]:
    """(row, column) -> write time (+ ``offset_us``) of every cell of a delivery read by the
    release's queries."""
    out: dict[tuple[Any, str], int] = {}
    for rows, key, columns in ((history, "attempt_number", _STATIC_COLUMNS + _ATTEMPT_COLUMNS),
                               (replays, "request_id", _REPLAY_COLUMNS)):
        for r in rows:
            for c in columns:
                if r[f"wt_{c}"] is not None:
                    row_key = None if c in _STATIC_COLUMNS else (key, r[key])
                    out[(row_key, c)] = r[f"wt_{c}"] + offset_us
    return out


def _facts(row: dict[str, Any] | None, attempts: list[dict[str, Any]], _: Any) -> tuple[Any, ...]:
    """An archived delivery's pointer columns after its id and before its hour: tenant, status,
    attempt count, next attempt, automatic retry, highest attempt number."""
    assert row is not None  # the archive holds no delivery without its row
    return (row["tenant_id"], row["status"], row["attempt_count"], row["next_attempt_at"], row["auto_retry_active"],
            history_rows.top_attempt_number(attempts))


class _Grouped:
    """Rows of a file in order, taken a key's run at a time."""

    def __init__(self, rows: Iterator[dict[str, Any]], key: str) -> None:
        self._rows = rows
        self._key = key
        self._head = next(rows, None)

    def take(self, value: str) -> list[dict[str, Any]]:
        out = []
        while self._head is not None and self._head[self._key] == value:
            out.append(self._head)
            self._head = next(self._rows, None)
        return out

    def exhausted(self) -> bool:
        return self._head is None


@dataclass
class Released:
    deliveries: int = 0
    kept_hot: int = 0  # changed after verification: left hot whole (before or after the rewrite)


class Releaser:
    """Rewrites an hour's archived hot rows to expire ``ttl_s`` from now (see the module's docstring)."""

    def __init__(self, session: Session, store: ArchiveStore, reader: HourReader, page_size: int) -> None:
        self._s = session
        self._store = store
        self._reader = reader
        self._page = page_size
        self._stmts: dict[str, PreparedStatement] = {}
        p = session.prepare
        self._q_event = p(_with_write_facts("events", "event_id", EVENT_COLUMNS, "event_id=?"))
        self._q_history = p(_with_write_facts("delivery_history", "delivery_id, attempt_number",
                                              _STATIC_COLUMNS + _ATTEMPT_COLUMNS, "delivery_id=?"))
        self._q_replays = p(_with_write_facts("replay_requests", "delivery_id, request_id", _REPLAY_COLUMNS,
                                              "delivery_id=?"))
        self._q_pointer = p("SELECT delivery_id FROM archived_deliveries WHERE delivery_id=?")
        # With the delivery's facts as archived: the job's check of a delivery created again
        # after its hot rows expired reads them (operators/history_store.py).
        self._w_pointer = p("INSERT INTO archived_deliveries (delivery_id, tenant_id, status, attempt_count,"
                            " next_attempt_at, auto_retry_active, last_attempt_number, hour) VALUES (?,?,?,?,?,?,?,?)"
                            " USING TTL ?")

    def release(self, manifest: layout.Manifest, ttl_s: int, history_ttl_s: int, now_ms: int) -> Released:
        """Release what ``manifest`` (an hour, or some of its buckets) lists. Pointers live as
        long as the archive answers for the delivery."""
        hour = manifest.hour_ms
        pointer_ttl = max(1, history_ttl_s - (now_ms - hour) // 1000)
        out = Released()
        for bucket in sorted({f.bucket for f in manifest.files}):
            attempts = _Grouped(self._file_rows(manifest.files_of(bucket, "attempts")), "delivery_id")
            replays = _Grouped(self._file_rows(manifest.files_of(bucket, "replays")), "delivery_id")
            kept_events: set[str] = set()
            for page in self._pages(manifest.files_of(bucket, "deliveries")):
                archived: dict[str, ArchivedDelivery] = {
                    d["delivery_id"]: (d, attempts.take(d["delivery_id"]), replays.take(d["delivery_id"]))
                    for d in page}
                kept = self._release_deliveries(hour, archived, ttl_s, pointer_ttl)
                kept_events |= {d["event_id"] for d in page if d["delivery_id"] in kept}
                out.deliveries += len(archived) - len(kept)
                out.kept_hot += len(kept)
            if not (attempts.exhausted() and replays.exhausted()):
                # The writer puts a delivery's attempts and replays right after it: anything left
                # over means the files are not what this merge assumes. Stop before the events.
                raise ArchiveUnavailable(f"archive bucket {bucket} of {_ts(hour)}: attempts or replays out of order")
            for page in self._pages(manifest.files_of(bucket, "events")):
                ids = self._answered([e for e in page if e["event_id"] not in kept_events])
                writes: list[Write] = []
                for rows in self._read(self._q_event, ids):
                    for r in rows:
                        writes += self._rewrites("events", ("event_id",), EVENT_COLUMNS, r, ttl_s, _RELEASED_US)
                self._run_all(writes)
        return out

    def _answered(self, events: list[dict[str, Any]]) -> list[str]:
        """The events the archive answers for every delivery of (each delivery their snapshot
        names has its pointer): only those may go. A delivery with no row at archive time (the
        job had not written it, or lost it: reconciliation's gap) is not in the archive, and its
        redrive will read the event's payload from Cassandra; a delivery kept hot has no pointer
        either."""
        named = {e["event_id"]: [delivery_id_for(e["event_id"], ep) for ep, _ in e["endpoints"] or ()]
                 for e in events}
        dids = [did for ds in named.values() for did in ds]
        pointed = {did for did, rows in zip(dids, self._read(self._q_pointer, dids), strict=True) if rows}
        return [eid for eid, ds in named.items() if all(did in pointed for did in ds)]

    def _release_deliveries(self, hour_ms: int, archived: dict[str, ArchivedDelivery], ttl_s: int,
                            pointer_ttl: int) -> set[str]:
        """Release the page's deliveries that are as archived; the ids left hot."""
        hour = _ts(hour_ms)
        dids = list(archived)
        # One read decides and is rewritten: what is compared with the archive is exactly what
        # gets the short TTL.
        read = dict(zip(dids, zip(self._read(self._q_history, dids), self._read(self._q_replays, dids), strict=True),
                        strict=True))
        now = self._reader.held({d: h for d, (h, _) in read.items()}, {d: r for d, (_, r) in read.items()}, hour)
        same = [did for did in dids if now[did] == archived[did]]
        # No hot row left: released by an earlier run whose mark was lost, expired since. Its
        # pointer is written again (the archive answers for it); there is nothing to rewrite.
        gone = [did for did in dids if now[did][0] is None]
        kept = set(dids) - set(same) - set(gone)
        self._run_all([(self._w_pointer, (did, *_facts(*archived[did]), hour, pointer_ttl)) for did in same + gone])
        self._run_all([w for did in same for w in self._delivery_rewrites(*read[did], ttl_s, _RELEASED_US)])
        # Written since that read: a cell whose write time is not the one just given it (a newer
        # write) or a cell not read then. A cell that already expired (a short release TTL) is
        # simply absent: that is no change.
        after = zip(same, self._read(self._q_history, same), self._read(self._q_replays, same), strict=True)
        changed = [did for did, history, replays in after
                   if not _cell_times(history, replays).items() <= _cell_times(*read[did], _RELEASED_US).items()]
        self._run_all([w for did in changed for w in self._delivery_rewrites(*read[did], None, _RESTORED_US)])
        return kept | set(changed)

    def _delivery_rewrites(self, history: list[dict[str, Any]], replays: list[dict[str, Any]], ttl_s: int | None,
                           offset_us: int) -> list[Write]:
        writes: list[Write] = []
        for i, r in enumerate(history):
            if i == 0:  # static cells: the same in every row of the partition
                writes += self._rewrites("delivery_history", ("delivery_id",), _STATIC_COLUMNS, r, ttl_s, offset_us,
                                         static=True)
            if r["attempt_number"] is not None:
                writes += self._rewrites("delivery_history", ("delivery_id", "attempt_number"), _ATTEMPT_COLUMNS, r,
                                         ttl_s, offset_us)
        for r in replays:
            writes += self._rewrites("replay_requests", ("delivery_id", "request_id"), _REPLAY_COLUMNS, r, ttl_s,
                                     offset_us)
        return writes

    def _file_rows(self, entries: Iterable[layout.FileEntry]) -> Iterator[dict[str, Any]]:
        for page in self._pages(entries):
            yield from page

    def _pages(self, entries: Iterable[layout.FileEntry]) -> Iterator[list[dict[str, Any]]]:
        """A manifest's files a page of rows at a time (memory: one page and one row group)."""
        for f in entries:
            try:
                with self._store.fs.open_input_file(f"{self._store.root}/{f.path}") as raw:
                    for batch in pq.ParquetFile(raw).iter_batches(batch_size=self._page):
                        yield batch.to_pylist()
            except OSError as exc:
                raise ArchiveUnavailable(f"archive store: cannot read {f.path}: {exc}") from exc

    def _read(self, stmt: PreparedStatement, keys: list[str]) -> Iterator[list[dict[str, Any]]]:
        for ok, rows in execute_concurrent_with_args(self._s, stmt, [(k,) for k in keys], concurrency=_CONCURRENCY):
            if not ok:
                raise rows
            yield [history_rows.as_dict(r) for r in rows]

    def _rewrites(self, table: str, keys: tuple[str, ...], columns: Sequence[str], row: dict[str, Any],
                  ttl_s: int | None, offset_us: int, static: bool = False) -> list[Write]:
        """One statement per group of cells sharing a write time: the same values at that time +
        ``offset_us``, with ``ttl_s`` (None: the TTL each group had when read, for a restore). A
        non-static row is rewritten by INSERT so that its row marker (written at or below the
        newest of its cells' times) expires with it."""
        groups: dict[int, list[str]] = {}
        for c in columns:
            if row[c] is not None and row[f"wt_{c}"] is not None:
                groups.setdefault(row[f"wt_{c}"], []).append(c)
        out = []
        for wt, cols in sorted(groups.items()):
            if ttl_s is None:  # a restore: the shortest TTL the group had left (0: none, as read)
                left = [row[f"ttl_{c}"] for c in cols if row[f"ttl_{c}"]]
                ttl = min(left) if left else 0
            else:
                ttl = ttl_s
            if static:
                text = (f"UPDATE {table} USING TTL ? AND TIMESTAMP ? SET " + ", ".join(f"{c}=?" for c in cols)
                        + " WHERE " + " AND ".join(f"{k}=?" for k in keys))
                params: tuple[Any, ...] = (ttl, wt + offset_us, *(row[c] for c in cols), *(row[k] for k in keys))
            else:
                names = (*keys, *cols)
                text = (f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})"
                        " USING TTL ? AND TIMESTAMP ?")
                params = (*(row[c] for c in names), ttl, wt + offset_us)
            stmt = self._stmts.get(text)
            if stmt is None:
                stmt = self._stmts[text] = self._s.prepare(text)
            out.append((stmt, params))
        return out

    def _run_all(self, writes: list[Write]) -> None:
        for i in range(0, len(writes), _CONCURRENCY):
            futures = [self._s.execute_async(stmt, params) for stmt, params in writes[i:i + _CONCURRENCY]]
            for f in futures:
                f.result()
