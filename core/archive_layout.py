"""The archive tier's layout: where an hour's Parquet files live, what its manifest says, and
whether a manifest agrees with what was read back and with Cassandra.

An *hour* is a UTC hour of events' arrival on the events topic -- the hour of their fan-out
snapshot (core/fanout.py), which is also their deliveries' created_at. Its files are partitioned
Hive-style by date, hour and tenant-hash bucket, one file per kind of row:

    date=2026-11-29/hour=19/tenant_bucket=07/{events,deliveries,attempts,replays}.parquet
    date=2026-11-29/hour=19/tenant_bucket=07/part.json       (the bucket's own manifest)
    date=2026-11-29/hour=19/tenant_bucket=07/releasing.json  (letting its hot rows go began)
    date=2026-11-29/hour=19/tenant_bucket=07/released.json   (its hot rows were let go)
    date=2026-11-29/hour=19/manifest.json

The hour's manifest is assembled from its 16 bucket parts once all exist, and is the only mark
of a complete hour: a reader trusts no file the manifest does not list with its checksum, so a
run killed half way leaves nothing that looks complete. Parts let several archiver processes
share an hour (:func:`shard_buckets`: each writes, verifies and releases its own buckets) and let
a rerun skip the buckets already written. Everything in a manifest is derived from the rows (no wall-clock
time, keys sorted), so archiving the same rows twice yields the same bytes.

Pure: no I/O; tested table-driven in tests/unit/test_archive_layout.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

HOUR_MS = 3_600_000
# Buckets of tenants: a tenant's rows of an hour are in one bucket's files, so a tenant-scoped
# query reads 1/16 of an hour. Changing it changes every path: it is part of the format.
TENANT_BUCKETS = 16
FORMAT_VERSION = 1
KINDS = ("events", "deliveries", "attempts", "replays")
# The column naming each kind's row (a manifest keeps its smallest and largest value per file).
ID_COLUMN = {"events": "event_id", "deliveries": "delivery_id", "attempts": "delivery_id", "replays": "delivery_id"}
MANIFEST_NAME = "manifest.json"
PART_NAME = "part.json"
RELEASED_NAME = "released.json"
RELEASING_NAME = "releasing.json"
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


def data_path(hour_ms: int, bucket: int, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown archive kind {kind!r}")
    return f"{bucket_prefix(hour_ms, bucket)}/{kind}.parquet"


def manifest_path(hour_ms: int) -> str:
    return f"{hour_prefix(hour_ms)}/{MANIFEST_NAME}"


def part_path(hour_ms: int, bucket: int) -> str:
    return f"{bucket_prefix(hour_ms, bucket)}/{PART_NAME}"


def released_path(hour_ms: int, bucket: int) -> str:
    return f"{bucket_prefix(hour_ms, bucket)}/{RELEASED_NAME}"


def releasing_path(hour_ms: int, bucket: int) -> str:
    """Marks a bucket whose release began: from then on its files are never written again (its
    hot rows may be expiring)."""
    return f"{bucket_prefix(hour_ms, bucket)}/{RELEASING_NAME}"


MAX_SHARDS = 4096


def shard_buckets(index: int, count: int, hour_ms: int) -> tuple[int, ...]:
    """The tenant buckets of an hour that archiver ``index`` of ``count`` works on.

    The unit of work is an (hour, bucket): numbered hour by hour (hour number x 16 + bucket),
    dealt round-robin to the shards. Up to 16 shards that divide 16 always get the same buckets
    (4 shards: 0, 4, 8, 12 for shard 0); more shards than buckets take turns by hour (128 shards:
    each gets one bucket every 8 hours), so the work of the brief's peak can be spread over more
    processes than an hour has buckets, each hour still written, verified and released bucket by
    bucket by exactly one of them. Every (hour, bucket) belongs to exactly one shard."""
    if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
        raise ValueError(f"shard {index}/{count}: need 0 <= index < count <= {MAX_SHARDS}")
    first = hour_ms // HOUR_MS * TENANT_BUCKETS
    return tuple(b for b in ALL_BUCKETS if (first + b) % count == index)


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` (e.g. ``"0/4"``) -> (i, N), checked as :func:`shard_buckets` checks it."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: expected i/N, e.g. 0/4") from None
    shard_buckets(index, count, 0)
    return index, count


def tmp_path(final: str, run_id: str) -> str:
    """Where a file is written before it is published under ``final``."""
    return f"{final}{TMP_MARK}{run_id}"


def is_tmp(path: str) -> bool:
    return TMP_MARK in path.rsplit("/", 1)[-1]


def closed_hours(now_ms: int, archive_after_ms: int, window_ms: int) -> list[int]:
    """Hours old enough to archive (ended at least ``archive_after`` ago) and young enough to
    still hold rows (started within ``window``, the hot tier's TTL), oldest first."""
    last = hour_start(now_ms - archive_after_ms) - HOUR_MS  # ends at or before now - archive_after
    first = -(-(now_ms - window_ms) // HOUR_MS) * HOUR_MS  # its rows all still live
    return list(range(first, last + 1, HOUR_MS))


@dataclass(frozen=True)
class FileEntry:
    path: str
    kind: str
    bucket: int
    rows: int
    bytes: int
    sha256: str
    min_id: str
    max_id: str


@dataclass(frozen=True)
class Manifest:
    hour_ms: int
    files: tuple[FileEntry, ...]
    format: int = FORMAT_VERSION

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for f in self.files:
            out[f.kind] += f.rows
        return out

    def files_of(self, bucket: int, kind: str) -> list[FileEntry]:
        return [f for f in self.files if f.bucket == bucket and f.kind == kind]

    def of_buckets(self, buckets: Iterable[int]) -> Manifest:
        """The part of the hour in these buckets (what one shard verifies and releases)."""
        keep = set(buckets)
        return Manifest(self.hour_ms, tuple(f for f in self.files if f.bucket in keep), self.format)

    @staticmethod
    def assemble(hour_ms: int, parts: Iterable[Manifest]) -> Manifest:
        """The hour's manifest from its buckets' parts: the same bytes whichever shards wrote
        them, and as one process writing the whole hour (to_json orders the files)."""
        parts = tuple(parts)
        files = tuple(f for p in parts for f in p.files)
        if any(p.hour_ms != hour_ms for p in parts):
            raise ValueError("a part of another hour")
        return Manifest(hour_ms, files)

    def to_json(self) -> bytes:
        files = sorted(self.files, key=lambda f: (f.bucket, KINDS.index(f.kind), f.path))
        body = {
            "format": self.format,
            "hour": datetime.fromtimestamp(self.hour_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "hour_ms": self.hour_ms,
            "counts": self.counts(),
            "files": [f.__dict__ for f in files],
        }
        return json.dumps(body, sort_keys=True, indent=1).encode() + b"\n"

    @staticmethod
    def from_json(raw: bytes) -> Manifest:
        d = json.loads(raw)
        if d.get("format") != FORMAT_VERSION:
            raise ValueError(f"manifest format {d.get('format')!r} is not {FORMAT_VERSION}")
        m = Manifest(int(d["hour_ms"]), tuple(FileEntry(**f) for f in d["files"]))
        if m.counts() != d["counts"]:
            raise ValueError("manifest counts disagree with its files")
        return m


@dataclass
class HourCounts:
    """Rows of one hour by kind, and per kind the smallest and largest id: what Cassandra holds
    (counted by the verifier) or what the archive holds (from a manifest)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    min_ids: dict[str, str] = field(default_factory=dict)
    max_ids: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, row_id: str, n: int = 1) -> None:
        self.counts[kind] += n
        if kind not in self.min_ids or row_id < self.min_ids[kind]:
            self.min_ids[kind] = row_id
        if kind not in self.max_ids or row_id > self.max_ids[kind]:
            self.max_ids[kind] = row_id

    @staticmethod
    def of(manifest: Manifest) -> HourCounts:
        c = HourCounts()
        for f in manifest.files:
            c.counts[f.kind] += f.rows
            for row_id in (f.min_id, f.max_id):
                if f.kind not in c.min_ids or row_id < c.min_ids[f.kind]:
                    c.min_ids[f.kind] = row_id
                if f.kind not in c.max_ids or row_id > c.max_ids[f.kind]:
                    c.max_ids[f.kind] = row_id
        return c


@dataclass(frozen=True)
class ReadBack:
    """What a verifier found for one file of a manifest: its bytes' checksum and Parquet row
    count as stored (None: the file is missing)."""

    path: str
    sha256: str | None
    rows: int | None


def disagreements(manifest: Manifest, read_back: Iterable[ReadBack], hot: HourCounts) -> list[str]:
    """Every reason the hour may not leave the hot tier; empty means verified. The manifest must
    describe the files as stored (checksum, rows) and match Cassandra's counts and id ranges."""
    problems: list[str] = []
    found = {r.path: r for r in read_back}
    for f in manifest.files:
        r = found.get(f.path)
        if r is None or r.sha256 is None:
            problems.append(f"{f.path}: missing")
            continue
        if r.sha256 != f.sha256:
            problems.append(f"{f.path}: checksum {r.sha256[:12]} != manifest {f.sha256[:12]}")
        if r.rows != f.rows:
            problems.append(f"{f.path}: {r.rows} rows != manifest {f.rows}")
    archived = HourCounts.of(manifest)
    for kind in KINDS:
        if archived.counts[kind] != hot.counts[kind]:
            problems.append(f"{kind}: archive {archived.counts[kind]} rows, Cassandra {hot.counts[kind]}")
        elif (archived.min_ids.get(kind), archived.max_ids.get(kind)) != (hot.min_ids.get(kind), hot.max_ids.get(kind)):
            problems.append(f"{kind}: id range differs from Cassandra's")
    return problems


def sha256_of(chunks: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()

