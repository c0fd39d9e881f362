"""The archive writer: the delivery job's history facts, from Kafka to Parquet, written once.

    python -m control_plane.archive.writer               # the service: consume, roll, commit
    python -m control_plane.archive.writer --from 2026-11-29T18:00Z   # recovery (see below)

It consumes the archive facts topic (core/archive_facts.py; one record per dispatcher call) in
the consumer group ``archive.writer_group`` and buffers the facts by (arrival hour, tenant
bucket, kind). When ``archive.roll_facts`` facts are buffered or the oldest waited
``archive.roll_s``, it *rolls*: one Parquet file per (hour, bucket, kind) of the buffer, each
written under a temporary name and moved into place, then per (hour, bucket) the segment's commit
record (core/archive_layout.py), and only then the consumer's offsets. Nothing reads Cassandra.

**What a crash or an outage does.** Offsets are committed after the files and their records are
durable, so a writer killed anywhere reads the uncommitted range again and writes it again (the
same segment names when the range is the same; the same facts twice otherwise, which readers
reduce by key). An object store that fails a roll is retried, with backoff, forever: the writer
stops consuming (its partitions paused, still in the group) and Kafka keeps the facts --
``kafka.archive_facts_retention_ms``, at least the hot TTL -- while deliveries go on, untouched.
Its lag (the age of the oldest fact not yet committed) is pushed to the Pushgateway with the time
of its last commit: alerts ArchiveLagHigh and ArchiveWriterDown (docs/archive.md).

**Recovery**, one-off runs with no consumer group, while the facts topic still holds the facts
(what the audit, control_plane/archive/audit.py, finds missing):

* ``--repair HOUR``: every committed segment of the hour whose files are missing or changed is
  read again from its own offsets and written again -- the same names, the same files;
* ``--from TIME``: every partition from the offsets of TIME to the end as it is when the run
  starts, written as segments of its own (for facts no segment holds).
"""

from __future__ import annotations

import argparse
import functools
import io
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow.parquet as pq  # type: ignore[import-untyped]

from control_plane.archive.rows import table
from control_plane.archive.store import ArchiveStore, ArchiveUnavailable
from core import archive_facts
from core import archive_layout as layout
from core.settings import ArchiveSettings, Settings

log = logging.getLogger(__name__)

Group = tuple[int, int, str]  # (hour, tenant bucket, kind)
Row = tuple[Any, ...]  # a fact's values in column order (core/archive_facts.py COLUMNS)
_SIGNING = archive_facts.COLUMNS["attempts"].index("signing_key_versions")


@dataclass
class Buffer:
    """Decoded facts by (hour, bucket, kind) and, per topic partition, the offsets they came from.

    Each fact is held as a tuple of immutable values (its one list, an attempt's signing key
    versions, made a tuple too): the garbage collector stops tracking such a tuple the first time
    it meets it, so a roll's worth of buffered facts is not walked again by every collection while
    it waits, and Arrow converts the tuples to a table in one pass (control_plane/archive/rows.py)."""

    facts: int = 0
    oldest_ms: int | None = None  # the Kafka timestamp of the oldest record held
    first_at_s: float | None = None  # when the first record was added (the writer's clock)
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    groups: dict[Group, list[Row]] = field(default_factory=dict)
    undecodable: int = 0
    # (kind, hour, tenant id) as facts carry them -> their group's rows: one dict look-up per
    # fact, the group's key (an hour, a tenant's bucket) made once per buffer.
    _rows_of: dict[tuple[str, Any, Any], list[Row]] = field(default_factory=dict, repr=False)

    def add(self, partition: int, offset: int, timestamp_ms: int, value: bytes, now_s: float) -> None:
        held = self.ranges.get(partition)
        self.ranges[partition] = (offset if held is None else held[0], offset)
        if self.first_at_s is None:
            self.first_at_s = now_s
        if self.oldest_ms is None or timestamp_ms < self.oldest_ms:
            self.oldest_ms = timestamp_ms
        try:
            facts = archive_facts.decode_values(value)
        except ValueError:
            self.undecodable += 1  # not the job's: kept in Kafka, skipped here, counted in the log
            log.error("archive facts: partition %d offset %d is not a facts record; skipped", partition, offset)
            return
        hour_at, tenant_at, rows_of = archive_facts.HOUR_AT, archive_facts.TENANT_AT, self._rows_of
        for kind, values in facts:
            if kind == "attempts" and type(values[_SIGNING]) is list:
                values[_SIGNING] = tuple(values[_SIGNING])
            where = (kind, values[hour_at[kind]], values[tenant_at[kind]])
            rows = rows_of.get(where)
            if rows is None:
                rows = rows_of[where] = self.groups.setdefault(
                    (layout.hour_start(where[1]), _bucket(where[2]), kind), [])
            rows.append(tuple(values))
        self.facts += len(facts)

    def due(self, now_s: float, roll_facts: int, roll_s: float) -> bool:
        return bool(self.ranges) and (self.facts >= roll_facts or now_s - (self.first_at_s or now_s) >= roll_s)


@functools.lru_cache(maxsize=65536)
def _bucket(tenant_id: str) -> int:
    return layout.tenant_bucket(tenant_id)


def _parquet(kind: str, rows: list[Row]) -> bytes:
    sink = io.BytesIO()
    # Settings that make the bytes a function of the rows alone: same facts -> same file.
    pq.write_table(table(kind, rows), sink, compression="zstd", use_dictionary=True, write_statistics=True,
                   store_schema=True)
    return sink.getvalue()


def write_segment(store: ArchiveStore, buffer: Buffer) -> list[layout.Commit]:
    """Every file of the buffer, then each (hour, bucket)'s commit record: the segment is durable
    (and readable) once this returns. ArchiveUnavailable if the store fails; what was published
    before is overwritten with the same names by the retry."""
    segment = layout.segment_id(buffer.ranges)
    ranges = tuple((p, a, b) for p, (a, b) in sorted(buffer.ranges.items()))
    files: dict[tuple[int, int], list[layout.FileEntry]] = {}
    for (hour, bucket, kind), rows in sorted(buffer.groups.items()):
        data = _parquet(kind, rows)
        final = layout.data_path(hour, bucket, kind, segment)
        store.put(final, data)
        files.setdefault((hour, bucket), []).append(
            layout.FileEntry(path=final, kind=kind, rows=len(rows), bytes=len(data), sha256=layout.sha256_of([data])))
    commits = []
    for (hour, bucket), entries in sorted(files.items()):
        c = layout.Commit(hour, bucket, segment, ranges, tuple(entries))
        # Last: the mark of the segment's files in this (hour, bucket).
        store.put(layout.commit_path(hour, bucket, segment), c.to_json())
        commits.append(c)
    return commits


class Lag:
    """What the writer reports: the oldest fact not yet archived, the last commit."""

    def __init__(self) -> None:
        self.oldest_ms: int | None = None
        self.last_commit_s = time.time()
        self.store_failures = 0

    def seconds(self, now_s: float) -> float:
        return 0.0 if self.oldest_ms is None else max(0.0, now_s - self.oldest_ms / 1000)


def push_lag(gateway: str, lag: Lag) -> None:
    from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

    reg = CollectorRegistry()
    Gauge("webhooks_archive_writer_lag_seconds", "Age of the oldest history fact not yet in the archive",
          registry=reg).set(lag.seconds(time.time()))
    Gauge("webhooks_archive_writer_last_commit_timestamp_seconds", "When the writer last committed a segment",
          registry=reg).set(lag.last_commit_s)
    Gauge("webhooks_archive_writer_store_failures", "Rolls the object store failed since the writer started",
          registry=reg).set(lag.store_failures)
    push_to_gateway(gateway, job="webhooks_archive_writer", registry=reg)


class ArchiveWriter:
    """The consume -> roll -> commit loop over a confluent-kafka consumer (or a fake of it)."""

    def __init__(self, consumer: Any, store: ArchiveStore, settings: ArchiveSettings, topic: str,
                 commit: bool = True, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], bool] = lambda s: False) -> None:
        self._c = consumer
        self._store = store
        self._s = settings
        self._topic = topic
        self._commit = commit
        self._clock = clock
        self._wait = wait  # sleeps; True when asked to stop
        self.buffer = Buffer()
        self.lag = Lag()
        self.segments = 0
        self._revoked = False
        self._next_push = 0.0

    def on_revoke(self, consumer: Any, partitions: Any) -> None:
        """Partitions taken away: what is buffered is not committed here (their next owner reads it
        again), and a roll under way does not commit for them."""
        self.buffer = Buffer()
        self._revoked = True

    def poll_once(self, max_records: int = 1000, timeout_s: float = 0.5) -> int:
        n = 0
        for m in self._c.consume(num_messages=max_records, timeout=timeout_s):
            if m.error():
                continue  # partition EOF and the like: confluent-kafka retries transient errors itself
            self.buffer.add(m.partition(), m.offset(), m.timestamp()[1], m.value(), self._clock())
            n += 1
        self.lag.oldest_ms = self.buffer.oldest_ms
        return n

    def roll(self) -> bool:
        """Write the buffer as a segment and commit its offsets; the store is retried until it
        answers (consumption paused meanwhile, group membership kept). False: asked to stop."""
        buffer, self._revoked = self.buffer, False
        backoff = 1.0
        paused = False
        try:
            while True:
                try:
                    write_segment(self._store, buffer)
                    break
                except ArchiveUnavailable as exc:
                    self.lag.store_failures += 1
                    log.warning("archive store unavailable, retrying in %.0f s (facts stay in Kafka): %s",
                                backoff, exc)
                    if not paused:
                        self._c.pause(self._c.assignment())
                        paused = True
                    self._report(force=True)
                    if self._wait(backoff):
                        return False
                    # Keeps the group membership and runs rebalance callbacks; a partition assigned
                    # meanwhile is not paused, and what it returns is kept, not dropped.
                    m = self._c.poll(0)
                    if m is not None and not m.error():
                        self.buffer.add(m.partition(), m.offset(), m.timestamp()[1], m.value(), self._clock())
                    backoff = min(backoff * 2, 30.0)
        finally:
            if paused:
                self._c.resume(self._c.assignment())
        if self._commit and not self._revoked:
            from confluent_kafka import TopicPartition

            self._c.commit(offsets=[TopicPartition(self._topic, p, b + 1) for p, (_, b) in buffer.ranges.items()],
                           asynchronous=False)
        self.segments += 1
        self.lag.last_commit_s = time.time()
        if self.buffer is buffer:
            self.buffer = Buffer()
        self.lag.oldest_ms = self.buffer.oldest_ms
        log.info("archive segment %s: %d facts, partitions %s", layout.segment_id(buffer.ranges), buffer.facts,
                 ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(buffer.ranges.items())))
        return True

    def _report(self, force: bool = False) -> None:
        now = self._clock()
        if not self._s.pushgateway or (now < self._next_push and not force):
            return
        self._next_push = now + 15
        try:
            push_lag(self._s.pushgateway, self.lag)
        except Exception:  # noqa: BLE001 -- archiving matters more than its report
            log.warning("could not push the archive writer's lag", exc_info=True)

    def step(self) -> bool:
        """One poll and, when due, a roll. False: asked to stop."""
        self.poll_once()
        self._report()
        if self.buffer.due(self._clock(), self._s.roll_facts, self._s.roll_s):
            return self.roll()
        return True


def consumer_config(settings: Settings, group: str | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "enable.partition.eof": False,
                           # Few large fetches: the writer rolls every roll_s, a second's wait costs nothing.
                           "fetch.min.bytes": 1 << 20, "fetch.wait.max.ms": 1000,
                           # A killed writer's partitions go to its replacement once its session
                           # times out (librdkafka's default: 45 s). Heartbeats come from
                           # librdkafka's own thread, so a long roll does not end a session.
                           "session.timeout.ms": 10_000, "heartbeat.interval.ms": 3_000}
    cfg["group.id"] = group or f"{settings.archive.writer_group}-recovery-{int(time.time())}"
    return cfg


def run_service(settings: Settings, stop: threading.Event) -> int:
    from confluent_kafka import Consumer

    topic = settings.kafka.archive_facts_topic
    consumer = Consumer(consumer_config(settings, settings.archive.writer_group))
    writer = ArchiveWriter(consumer, ArchiveStore.from_settings(settings.archive), settings.archive, topic,
                           wait=stop.wait)
    consumer.subscribe([topic], on_revoke=writer.on_revoke)
    log.info("archive writer: %s -> %s (group %s; a segment every %d facts or %.0f s)", topic,
             settings.archive.uri, settings.archive.writer_group, settings.archive.roll_facts, settings.archive.roll_s)
    try:
        while not stop.is_set():
            if not writer.step():
                break
        if writer.buffer.ranges:
            writer.roll()  # what is buffered, so a stopped writer leaves nothing to redo (if the store answers)
    finally:
        consumer.close()
    log.info("archive writer stopped after %d segments", writer.segments)
    return 0


def run_recovery(settings: Settings, from_ms: int, stop: threading.Event) -> int:
    """Every partition from the offsets of ``from_ms`` to the end as it is now, as segments."""
    from confluent_kafka import Consumer, TopicPartition

    topic = settings.kafka.archive_facts_topic
    consumer = Consumer(consumer_config(settings, None))
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        starts = consumer.offsets_for_times([TopicPartition(topic, p, from_ms) for p in parts], timeout=10)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        todo = [tp for tp in starts if tp.offset >= 0 and tp.offset < ends[tp.partition]]
        consumer.assign(todo)
        writer = ArchiveWriter(consumer, ArchiveStore.from_settings(settings.archive), settings.archive, topic,
                               commit=False, wait=stop.wait)
        position = {tp.partition: tp.offset for tp in todo}
        while any(position[p] < ends[p] for p in position) and not stop.is_set():
            for m in consumer.consume(num_messages=1000, timeout=1.0):
                if m.error() or m.offset() >= ends[m.partition()]:
                    continue
                writer.buffer.add(m.partition(), m.offset(), m.timestamp()[1], m.value(), time.monotonic())
                position[m.partition()] = m.offset() + 1
            if writer.buffer.facts >= settings.archive.roll_facts and not writer.roll():
                return 1
        if writer.buffer.ranges and not writer.roll():
            return 1
        print(f"archive recovery: {writer.segments} segments from {len(todo)} partitions", flush=True)
        return 0
    finally:
        consumer.close()


def damaged_segments(store: ArchiveStore, hour_ms: int) -> dict[str, tuple[tuple[int, int, int], ...]]:
    """Segments committed to the hour with a file missing or not as written: name -> ranges."""
    out = {}
    for b in layout.ALL_BUCKETS:
        sizes = store.sizes(layout.bucket_prefix(hour_ms, b))
        for c in store.commits(hour_ms, b):
            if any(sizes.get(f.path) != f.bytes for f in c.files):
                out[c.segment] = c.ranges
    return out


def read_ranges(consumer: Any, topic: str, ranges: tuple[tuple[int, int, int], ...]) -> Buffer:
    """Exactly these offsets (partition, first, last), as the buffer a roll wrote them from."""
    from confluent_kafka import TopicPartition

    consumer.assign([TopicPartition(topic, p, first) for p, first, _ in ranges])
    last = {p: b for p, _, b in ranges}
    buffer = Buffer()
    done: set[int] = set()
    deadline = time.monotonic() + 300
    while len(done) < len(last):
        if time.monotonic() > deadline:
            raise RuntimeError(f"archive repair: offsets {ranges} not readable (expired from the facts topic?)")
        for m in consumer.consume(num_messages=1000, timeout=1.0):
            p = m.partition()
            if m.error() or p in done or m.offset() > last[p]:
                continue
            buffer.add(p, m.offset(), m.timestamp()[1], m.value(), time.monotonic())
            if m.offset() == last[p]:
                done.add(p)
    return buffer


def run_repair(settings: Settings, hour_ms: int) -> int:
    from confluent_kafka import Consumer

    store = ArchiveStore.from_settings(settings.archive)
    damaged = damaged_segments(store, hour_ms)
    consumer = Consumer(consumer_config(settings, None))
    try:
        for segment, ranges in sorted(damaged.items()):
            buffer = read_ranges(consumer, settings.kafka.archive_facts_topic, ranges)
            if layout.segment_id(buffer.ranges) != segment:
                raise RuntimeError(f"archive repair: segment {segment} read back under another name")
            write_segment(store, buffer)
            log.info("archive segment %s written again (%d facts)", segment, buffer.facts)
    finally:
        consumer.close()
    print(f"archive repair: {len(damaged)} segments written again", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m control_plane.archive.writer",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="from_", metavar="TIME",
                        help="recovery: write the facts topic from TIME (ISO, UTC) to its current end, then exit")
    parser.add_argument("--repair", metavar="HOUR",
                        help="recovery: write the hour's damaged segments again from their own offsets, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    if args.repair:
        t = datetime.fromisoformat(args.repair.replace("Z", "+00:00"))
        return run_repair(settings, layout.hour_start(int(t.timestamp() * 1000)))
    if args.from_:
        t = datetime.fromisoformat(args.from_.replace("Z", "+00:00"))
        return run_recovery(settings, int(t.timestamp() * 1000), stop)
    return run_service(settings, stop)


if __name__ == "__main__":
    sys.exit(main())
