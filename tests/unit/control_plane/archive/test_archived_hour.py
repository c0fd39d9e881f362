"""The audit's reading of an hour of the archive (control_plane/archive/audit.py ``archived_hour``),
over the writer's own files in a local directory: deliveries counted once per endpoint however
many status facts they have, ids of the endpoints asked only, and a delivery whose automatic
attempts are fewer in the archive than its attempt_count named."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from control_plane.archive.audit import archived_hour
from control_plane.archive.store import ArchiveStore
from control_plane.archive.writer import ArchiveWriter
from core import archive_facts
from core import archive_layout as layout
from core.settings import ArchiveSettings
from tests.support.archive_facts import FakeConsumer, Message, delivery, history

ARRIVED = int(datetime(2026, 11, 29, 19, 42, tzinfo=UTC).timestamp() * 1000)
HOUR = layout.hour_start(ARRIVED)


@pytest.fixture()
def store(tmp_path: Path) -> ArchiveStore:
    return ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path)))


def write(store: ArchiveStore, facts: list[list[archive_facts.Fact]]) -> None:
    consumer = FakeConsumer([Message(0, n, archive_facts.encode(f), ARRIVED) for n, f in enumerate(facts)])
    w = ArchiveWriter(consumer, store, ArchiveSettings(uri=str(store.root), roll_facts=1000, roll_s=3600,
                                                       pushgateway=""), "facts", clock=lambda: 0.0,
                      wait=lambda s: False)
    while consumer.queue:
        w.step()
    w.roll()


def test_deliveries_are_counted_once_per_endpoint_and_a_short_one_is_named(store):
    whole = [delivery("t-a", n, ARRIVED + n, endpoint=f"ep-{n % 2}") for n in range(5)]
    other = delivery("t-b", 9, ARRIVED + 9)
    short = delivery("t-b", 10, ARRIVED + 10)
    facts = [history(d, [(503, "pending"), (200, "succeeded")]) for d in [*whole, other]]
    # Its status says two attempts; the first attempt's fact is not in the archive.
    two = history(short, [(503, "pending"), (200, "succeeded")])
    facts.append([f for f in two if not (f[0] == "attempts" and f[1][1] == 1)])
    write(store, facts)

    hour = archived_hour(store, HOUR)
    assert hour.counts() == {("t-a", "ep-0-t-a"): 3, ("t-a", "ep-1-t-a"): 2, ("t-b", "ep-1-t-b"): 2}
    assert hour.ids([("t-a", "ep-1-t-a")]) == {whole[1].delivery_id, whole[3].delivery_id}
    assert hour.ids() == {d.delivery_id for d in [*whole, other, short]}
    assert hour.short == [short.delivery_id]
    assert hour.attempts == 2 * 6 + 1
    assert hour.events == {d.event.event_id for d in [*whole, other, short]}


def test_an_empty_hour_reads_as_nothing_archived(store):
    hour = archived_hour(store, HOUR)
    assert (hour.counts(), hour.ids(), hour.short, hour.attempts, hour.events) == ({}, set(), [], 0, set())
