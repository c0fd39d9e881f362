"""The archive tier's layout: where the archive writer's Parquet files live, what a segment's
commit record says, and the audit's verdict on an hour (docs/archive.md).

An *hour* is a UTC hour of events' arrival on the events topic: a delivery's created_at, so all
facts of a delivery (core/archive_facts.py) are in its hour whenever they happen. Files are
partitioned Hive-style by date, hour and tenant-hash bucket; each *segment* (what the writer
rolled at once from a range of the facts topic) adds one file per kind it holds and, last, its
commit record:

    date=2026-11-29/hour=19/tenant_bucket=07/{events,deliveries,attempts}-<segment>.parquet
    date=2026-11-29/hour=19/tenant_bucket=07/_segments/<segment>.json

A segment's name is derived from the topic offsets it holds (:func:`segment_id`), so writing the
same range again after a crash writes the same names: a reader trusts only files a commit record
lists, and the record is published last, so a segment torn by a crash is never read. A range
written twice under different boundaries (a crash between a commit record and the consumer's
offset commit) holds the same facts twice: readers reduce by key (archive_facts.latest).

Pure: no I/O; tested table-driven in tests/unit/core/test_archive_layout.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

HOUR_MS = 3_600_000
# Buckets of tenants: a tenant's rows of an hour are in one bucket's files, so a tenant-scoped
# query reads 1/16 of an hour. Changing it changes every path: it is part of the format.
TENANT_BUCKETS = 16
FORMAT_VERSION = 2
KINDS = ("events", "deliveries", "attempts")
SEGMENTS_DIR = "_segments"
TMP_MARK = ".tmp-"
ALL_BUCKETS = tuple(range(TENANT_BUCKETS))


def tenant_bucket(tenant_id: str) -> int:
    """Stable across processes and versions (not Python's salted hash())."""
    return int(hashlib.sha256(tenant_id.encode()).hexdigest()[:8], 16) % TENANT_BUCKETS


def hour_start(ms: int) -> int:
    return ms // HOUR_MS * HOUR_MS


def hour_prefix(hour_ms: int) -> str:
    t = datetime.fromtimestamp(hour_ms / 1000, tz=UTC)
    return f"date={t:%Y-%m-%d}/hour={t:%H}"


def bucket_prefix(hour_ms: int, bucket: int) -> str:
    return f"{hour_prefix(hour_ms)}/tenant_bucket={bucket:02d}"


def segment_id(ranges: Mapping[int, tuple[int, int]]) -> str:
    """The name of a segment holding, per topic partition, offsets first..last (inclusive)."""
    text = ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(ranges.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def data_path(hour_ms: int, bucket: int, kind: str, segment: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown archive kind {kind!r}")
    return f"{bucket_prefix(hour_ms, bucket)}/{kind}-{segment}.parquet"


def segments_prefix(hour_ms: int, bucket: int) -> str:
    return f"{bucket_prefix(hour_ms, bucket)}/{SEGMENTS_DIR}"


def commit_path(hour_ms: int, bucket: int, segment: str) -> str:
    return f"{segments_prefix(hour_ms, bucket)}/{segment}.json"


def tmp_path(final: str, run_id: str) -> str:
    """Where a file is written before it is published under ``final``."""
    return f"{final}{TMP_MARK}{run_id}"


def is_tmp(path: str) -> bool:
    return TMP_MARK in path.rsplit("/", 1)[-1]


def closed_hours(now_ms: int, after_ms: int, window_ms: int) -> list[int]:
    """Hours that ended at least ``after`` ago and started within ``window``, oldest first."""
    last = hour_start(now_ms - after_ms) - HOUR_MS  # ends at or before now - after
    first = -(-(now_ms - window_ms) // HOUR_MS) * HOUR_MS
    return list(range(first, last + 1, HOUR_MS))


@dataclass(frozen=True)
class FileEntry:
    path: str
    kind: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Commit:
    """A segment's files in one (hour, bucket), and the topic range they came from."""

    hour_ms: int
    bucket: int
    segment: str
    ranges: tuple[tuple[int, int, int], ...]  # (partition, first offset, last offset)
    files: tuple[FileEntry, ...]
    format: int = FORMAT_VERSION

    def files_of(self, kind: str) -> list[FileEntry]:
        return [f for f in self.files if f.kind == kind]

    def to_json(self) -> bytes:
        body = {"format": self.format, "hour_ms": self.hour_ms, "bucket": self.bucket, "segment": self.segment,
                "ranges": [list(r) for r in self.ranges],
                "files": [f.__dict__ for f in sorted(self.files, key=lambda f: (KINDS.index(f.kind), f.path))]}
        return json.dumps(body, sort_keys=True, indent=1).encode() + b"\n"

    @staticmethod
    def from_json(raw: bytes) -> Commit:
        d = json.loads(raw)
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"segment commit format {d.get('format')!r} is not {FORMAT_VERSION}")
        return Commit(int(d["hour_ms"]), int(d["bucket"]), d["segment"], tuple(tuple(r) for r in d["ranges"]),
                      tuple(FileEntry(**f) for f in d["files"]))


@dataclass(frozen=True)
class Stored:
    """A listed file as the store has it (None: missing)."""

    path: str
    bytes: int | None


Pair = tuple[str, str]  # (tenant_id, endpoint_id)


@dataclass(frozen=True)
class HourAudit:
    """What the audit found of one hour: the archive against what Cassandra's indexes list, by
    count per endpoint and, for the endpoints whose counts differ (:func:`uneven`), by id; and
    every listed file against the store."""

    hot_counts: Mapping[Pair, int]  # deliveries the endpoint index lists for the hour, per endpoint
    archived_counts: Mapping[Pair, int]  # distinct deliveries archived for the hour, per endpoint
    hot_listed: set[str]  # the uneven endpoints' delivery ids, as the index lists them
    archived_listed: set[str]  # the uneven endpoints' delivery ids, as archived
    hot_events: set[str]  # event ids the fan-out snapshots name with at least one endpoint
    archived_events: set[str]
    short: Sequence[str]  # archived deliveries with fewer automatic attempts archived than their attempt_count


def uneven(hot: Mapping[Pair, int], archived: Mapping[Pair, int]) -> list[Pair]:
    """The endpoints Cassandra lists deliveries of for the hour that the archive holds a different
    number of: only these are compared id by id. Equal counts are equal sets because a delivery's
    endpoint and hour are fixed (its id is its event's and endpoint's; its hour is its event's
    arrival on the topic), so an archived delivery is one of its endpoint-hour's index rows --
    unless the hot tier lost that row, which makes the archive hold *more* and is itself the gap
    reconciliation reports. A count that differs either way is listed: nothing hides behind a sum."""
    return sorted(p for p, n in hot.items() if archived.get(p, 0) != n)


def problems(commits: Iterable[Commit], stored: Iterable[Stored], audit: HourAudit) -> list[str]:
    """Every reason the hour's archive is not whole; empty: audited. Files a commit lists must be
    in the store as written; every delivery and event Cassandra lists for the hour archived; each
    archived delivery's automatic attempts (its attempt_count) archived."""
    out: list[str] = []
    found = {s.path: s for s in stored}
    for c in commits:
        for f in c.files:
            s = found.get(f.path)
            if s is None or s.bytes is None:
                out.append(f"{f.path}: missing")
            elif s.bytes != f.bytes:
                out.append(f"{f.path}: {s.bytes} bytes != committed {f.bytes}")
    missing = sorted(audit.hot_listed - audit.archived_listed)
    if missing:
        out.append(f"deliveries: {len(missing)} of {sum(audit.hot_counts.values())} not archived (e.g. {missing[0]})")
    missing_events = sorted(audit.hot_events - audit.archived_events)
    if missing_events:
        out.append(f"events: {len(missing_events)} of {len(audit.hot_events)} not archived"
                   f" (e.g. {missing_events[0]})")
    if audit.short:
        short = sorted(audit.short)
        out.append(f"attempts: {len(short)} deliveries with fewer attempts archived than counted (e.g. {short[0]})")
    return out


def sha256_of(chunks: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()
