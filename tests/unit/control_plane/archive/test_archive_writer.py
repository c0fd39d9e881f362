"""The archive writer's roll (control_plane/archive/writer.py) over a fake consumer and a local
directory: offsets are committed only after the files and their commit records are durable, a
failing store is retried with consumption paused, a range written again after a crash yields
the same files, every value reads back as the job built it, and the buffer's facts are out of the
garbage collector's way."""

from __future__ import annotations

import gc
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from control_plane.archive.rows import SCHEMAS
from control_plane.archive.store import ArchiveStore, ArchiveUnavailable
from control_plane.archive.writer import ArchiveWriter, Buffer, consumer_config
from core import archive_facts
from core import archive_layout as layout
from core.fanout import FanoutSnapshot, SkippedDelivery
from core.settings import ArchiveSettings, Settings
from tests.support.archive_facts import FakeConsumer, Message, delivery, history

ARRIVED = int(datetime(2026, 11, 29, 19, 42, tzinfo=UTC).timestamp() * 1000)
HOUR = layout.hour_start(ARRIVED)
TENANTS = ("t-acme", "t-other")


def records() -> list[Message]:
    """Two partitions; each record is one call's facts (a delivery's whole history here)."""
    out = []
    for n in range(6):
        d = delivery(TENANTS[n % 2], n, ARRIVED + n)
        out.append(Message(n % 2, n // 2, archive_facts.encode(history(d, [(503, "pending"), (200, "succeeded")])),
                           ARRIVED + n))
    return out


def writer(store: ArchiveStore, consumer: FakeConsumer, roll_facts: int = 1000) -> ArchiveWriter:
    s = ArchiveSettings(uri=str(store.root), roll_facts=roll_facts, roll_s=3600, pushgateway="")
    return ArchiveWriter(consumer, store, s, "facts", clock=lambda: 0.0, wait=lambda s: False)


@pytest.fixture()
def store(tmp_path: Path) -> ArchiveStore:
    return ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path)))


def archived(store: ArchiveStore, kind: str) -> list[dict]:
    return [r for b in layout.ALL_BUCKETS for r in store.read_kind(HOUR, b, kind).to_pylist()]


def test_a_roll_writes_every_fact_then_commits_the_offsets_after_them(store):
    consumer = FakeConsumer(records())
    w = writer(store, consumer, roll_facts=36)  # 6 facts a record: due after all six
    while consumer.queue:
        w.step()
    assert consumer.commits == [[(0, 3), (1, 3)]]  # the next offset to read, per partition
    assert len(archived(store, "events")) == 6
    deliveries = archive_facts.latest("deliveries", archived(store, "deliveries"))
    assert sorted(r["status"] for r in deliveries) == ["succeeded"] * 6
    assert len(archived(store, "attempts")) == 12
    buckets = {layout.tenant_bucket(t) for t in TENANTS}
    assert {c.bucket for b in layout.ALL_BUCKETS for c in store.commits(HOUR, b)} == buckets


def test_a_store_failing_a_roll_is_retried_with_consumption_paused_and_nothing_committed_meanwhile(store,
                                                                                                   monkeypatch):
    consumer = FakeConsumer(records())
    w = writer(store, consumer, roll_facts=1)
    real = store.publish
    failures = []

    def flaky(tmp: str, final: str) -> None:
        if len(failures) < 3:
            failures.append(final)
            assert consumer.paused or len(failures) == 1  # paused from the first failure on
            assert consumer.commits == []
            raise ArchiveUnavailable("store down")
        real(tmp, final)

    monkeypatch.setattr(store, "publish", flaky)
    w.poll_once(max_records=1)
    assert w.roll()
    assert len(failures) == 3 and not consumer.paused and w.lag.store_failures == 3
    assert consumer.commits == [[(0, 1)]]
    assert len(archived(store, "events")) == 1


def test_a_range_written_again_after_a_crash_before_its_commit_is_the_same_files(store):
    msgs = records()
    first = writer(store, FakeConsumer(msgs))
    first.poll_once()
    first.roll()
    files = sorted(p for p in store.files("") if not layout.is_tmp(p))
    again = writer(store, FakeConsumer(msgs))  # the same uncommitted range, read again
    again.poll_once()
    again.roll()
    assert sorted(p for p in store.files("") if not layout.is_tmp(p)) == files
    assert len(archived(store, "events")) == 6


def test_a_stop_asked_while_the_store_is_down_leaves_the_offsets_uncommitted(store, monkeypatch):
    consumer = FakeConsumer(records())
    w = writer(store, consumer)
    w._wait = lambda s: True  # SIGTERM arrives during the backoff

    def down(tmp: str, final: str) -> None:
        raise ArchiveUnavailable("store down")

    monkeypatch.setattr(store, "publish", down)
    w.poll_once()
    assert not w.roll()
    assert consumer.commits == [] and not consumer.paused


def test_a_record_that_is_not_facts_is_skipped_and_its_offset_still_committed(store):
    consumer = FakeConsumer([Message(0, 0, b"garbage"), *records()[:1]])
    w = writer(store, consumer)
    w.poll_once()
    w.roll()
    assert w.buffer.facts == 0 and consumer.commits == [[(0, 1)]]
    assert len(archived(store, "events")) == 1


def test_every_value_of_every_column_reads_back_as_the_job_built_it(store):
    """Nulls, lists, payload bytes and timestamps (UTC ms -> UTC datetimes) of every kind, and a
    second file of one kind in the same (hour, bucket) read together with the first."""
    facts = [f for n in range(3) for f in history(delivery("t-acme", n, ARRIVED + n),
                                                   [(503, "pending"), (200, "succeeded")])]
    snapshot = FanoutSnapshot(event_id="evt_s", tenant_id="t-acme", arrived_at_ms=ARRIVED, endpoints=(),
                              skipped=(SkippedDelivery("dlv_s", "ep-9", 4, "invoice.paid", "schema_pinned"),))
    facts += archive_facts.skipped_facts(snapshot, ARRIVED * 1000)
    half = len(facts) // 2
    msgs = [Message(0, 0, archive_facts.encode(facts[:half])), Message(0, 1, archive_facts.encode(facts[half:]))]
    w = writer(store, FakeConsumer(msgs))
    w.poll_once(max_records=1)
    w.roll()
    w.poll_once(max_records=1)
    w.roll()
    timestamps = {f.name for s in SCHEMAS.values() for f in s if pa.types.is_timestamp(f.type)}

    def as_stored(row: dict) -> dict:
        return {c: datetime.fromtimestamp(v / 1000, tz=UTC) if c in timestamps and v is not None else v
                for c, v in row.items()}

    for kind in layout.KINDS:
        expected = [as_stored(row) for k, row in archive_facts.decode(archive_facts.encode(facts)) if k == kind]
        assert sorted(archived(store, kind), key=repr) == sorted(expected, key=repr)
    assert {f.name: f.type for f in store.read_kind(HOUR, layout.tenant_bucket("t-acme"), "attempts").schema} == {
        f.name: f.type for f in SCHEMAS["attempts"]}


def test_buffered_facts_are_tuples_the_garbage_collector_stops_walking():
    buffer = Buffer()
    for m in records():
        buffer.add(m.partition(), m.offset(), m.timestamp()[1], m.value(), 0.0)
    gc.collect()
    gc.collect()  # an attempt's row is let go once its signing key versions' tuple was
    rows = [r for group in buffer.groups.values() for r in group]
    assert len(rows) == 36 and all(type(r) is tuple for r in rows)
    assert not any(gc.is_tracked(r) for r in rows)


def test_a_killed_writer_s_partitions_go_to_its_replacement_within_seconds():
    """Kafka hands a dead member's partitions on only when its session times out (librdkafka's
    default is 45 s): the restarted writer would wait that long before it reads a fact."""
    cfg = consumer_config(Settings(), "g")
    assert cfg["session.timeout.ms"] <= 10_000
    assert cfg["heartbeat.interval.ms"] * 3 <= cfg["session.timeout.ms"]  # Kafka's rule of thumb
