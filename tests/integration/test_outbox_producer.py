"""The producer library and housekeeping on the real PostgreSQL of the session's outbox: the row
commits with the caller's transaction or not at all, event_id is unique, the table refuses what
would stop the connector, the migration is idempotent, and housekeeping deletes only rows the
replication slot has confirmed -- without a change event on the topic."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import psycopg
import pytest

from outbox.housekeeping import purge_published
from outbox.migrate import migrate
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.integration.topic_watch import TopicWatch

pytestmark = pytest.mark.integration


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


def test_housekeeping_deletes_only_rows_the_slot_confirmed_and_emits_nothing(relay: OutboxRelay) -> None:
    slot = relay.settings.outbox.slot_name
    watch = TopicWatch(relay.settings)
    try:
        with relay.connect() as conn:
            ids = [write_event(conn, "acme", "order.created", {"i": i}) for i in range(3)]
        watch.wait_for(set(ids))
        with relay.connect() as conn:
            # The session's worker flushes offsets every 10 minutes: the slot has not confirmed
            # these inserts yet, so nothing may go, whatever the retention.
            assert purge_published(conn, slot, timedelta(0)) == 0
        assert _rows(relay, ids) == 3
        time.sleep(0.1)
        # A clean stop commits the connector's offsets, and with them the slot's position.
        relay.script("connect.sh", "stop", "start", "ready")
        with relay.connect() as conn:
            deleted = purge_published(conn, slot, timedelta(0))
        assert deleted >= 3 and _rows(relay, ids) == 0
        with relay.connect() as conn:
            later = write_event(conn, "acme", "order.created", {"after": "purge"})
        watch.wait_for({later})
        assert all(watch.counts[e] == 1 for e in ids), "a housekeeping delete reached the events topic"
    finally:
        watch.close()
