"""The producer library and housekeeping on the real PostgreSQL of the session's outbox: the row
commits with the caller's transaction or not at all, event_id is unique, the table refuses what
would stop the connector, the migration is idempotent, and housekeeping deletes only rows the
replication slot has confirmed -- without a change event on the topic."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox.housekeeping import purge_published
from outbox.migrate import migrate
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.support.helpers import eventually
from tests.support.stack_fixtures import RUN, RUN_ID
from tests.support.topic_watch import TopicWatch

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def relay_fast_flush(job_env: dict[str, str], kafka_bootstrap: str) -> Iterator[OutboxRelay]:
    """An outbox whose Connect worker flushes its offsets (and so confirms the slot) every second,
    like a production one (the stack's: 10 s), unlike the session relay's 10 minutes."""
    r = OutboxRelay(job_env, RUN / f"test-outbox-fast-{RUN_ID}", flush_ms=1000)
    r.start()
    yield r
    r.stop()


def _rows(relay: OutboxRelay, event_ids: list[str]) -> int:
    with relay.connect() as conn:
        row = conn.execute("SELECT count(*) FROM webhook_outbox WHERE event_id = ANY(%s)", (event_ids,)).fetchone()
    assert row is not None
    return int(row[0])


def test_the_row_commits_with_the_business_change_or_not_at_all(relay: OutboxRelay) -> None:
    table = f"orders_{uuid.uuid4().hex[:8]}"
    with relay.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id text PRIMARY KEY)")
        conn.commit()
        conn.execute(f"INSERT INTO {table} VALUES ('o1')")
        kept = write_event(conn, "acme", "order.created", {"id": "o1"})
        conn.commit()
        conn.execute(f"INSERT INTO {table} VALUES ('o2')")
        dropped = write_event(conn, "acme", "order.created", {"id": "o2"})
        conn.rollback()
        # A failing business statement after write_event aborts the event with it.
        aborted = write_event(conn, "acme", "order.created", {"id": "o1"})
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(f"INSERT INTO {table} VALUES ('o1')")
        conn.rollback()
    assert (_rows(relay, [kept]), _rows(relay, [dropped]), _rows(relay, [aborted])) == (1, 0, 0)


def test_an_event_id_is_written_once(relay: OutboxRelay) -> None:
    event_id = f"evt_once_{uuid.uuid4().hex}"
    with relay.connect() as conn:
        write_event(conn, "acme", "order.created", {}, event_id=event_id)
    with relay.connect() as conn, pytest.raises(psycopg.errors.UniqueViolation):
        write_event(conn, "acme", "order.created", {"again": True}, event_id=event_id)
    assert _rows(relay, [event_id]) == 1


def test_the_table_refuses_a_row_the_connector_could_not_publish(relay: OutboxRelay) -> None:
    with relay.connect() as conn, pytest.raises(psycopg.errors.CheckViolation):
        write_event(conn, "acme", "order.created", "[" + "1," * 400_000 + "1]", max_payload_bytes=10**7)


def test_the_migration_is_idempotent(relay: OutboxRelay) -> None:
    assert migrate(relay.settings.outbox) == []


def test_housekeeping_deletes_only_rows_the_slot_confirmed_and_emits_nothing(relay_fast_flush: OutboxRelay) -> None:
    relay = relay_fast_flush
    slot = relay.settings.outbox.slot_name
    watch = TopicWatch(relay.settings)
    try:
        with relay.connect() as conn:
            ids = [write_event(conn, "acme", "order.created", {"i": i}) for i in range(3)]
        watch.wait_for(set(ids))
        with relay.connect() as conn:
            # Published, but not yet confirmed past this run's mark (the slot confirms the commit
            # of the transaction before the newest one it streamed): nothing may go.
            assert purge_published(conn, slot, timedelta(0)) == 0
        assert _rows(relay, ids) == 3
        later = []
        for i in range(2):  # later writes move the slot's confirmed position past the mark
            with relay.connect() as conn:
                later.append(write_event(conn, "acme", "order.created", {"later": i}))
        watch.wait_for(set(later))

        def purged() -> bool | None:
            with relay.connect() as conn:
                purge_published(conn, slot, timedelta(0))
            return _rows(relay, ids) == 0 or None

        eventually(purged, timeout=60, interval=1, what="housekeeping to delete the confirmed rows")
        with relay.connect() as conn:
            last = write_event(conn, "acme", "order.created", {"after": "purge"})
        watch.wait_for({last})
        watch.poll(2)
        assert all(watch.counts[e] == 1 for e in ids + later), "a housekeeping delete reached the events topic"
    finally:
        watch.close()
