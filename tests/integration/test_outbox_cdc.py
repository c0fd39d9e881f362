"""The transactional outbox on the real stack: PostgreSQL -> WAL -> Debezium (Kafka Connect) ->
Kafka -> the delivery job -> the receiver, and the relay's faults: the Connect worker
SIGKILLed after publishing but before committing its offsets, PostgreSQL restarted under writers,
Kafka down while rows commit, and bad rows. Each fault ends in a verdict of durable counts
(tests/support/faults.py): lost = 0, duplicates at the receivers within the stated bound.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest

from core.records import delivery_id_for
from outbox.producer import write_event
from stack.outbox_relay import OutboxRelay
from tests.support.faults import endpoints, stack_part, verdict, wait_all_reached
from tests.support.helpers import eventually, produce, read_dead_letters
from tests.support.stack_fixtures import RUN_ID
from tests.support.topic_watch import TopicWatch

pytestmark = pytest.mark.integration


def _since_ms() -> int:
    return int(time.time() * 1000) - 1000


def _write(relay: OutboxRelay, tenant_id: str, n: int, tag: str) -> list[str]:
    """n events in one producer transaction; returns their event ids."""
    with relay.connect() as conn:
        return [write_event(conn, tenant_id, "order.shipped", {"tag": tag, "i": i}, object_id=f"o{i}",
                            object_version=1) for i in range(n)]


def _produced(event_ids: list[str], endpoint_ids: list[str], at: float) -> dict[str, float]:
    return {delivery_id_for(e, ep): at for e in event_ids for ep in endpoint_ids}


def test_an_outbox_row_reaches_the_receiver_with_its_exact_bytes(relay, grpc_channel, settings, receiver):
    tenant_id, (ep,) = endpoints(grpc_channel, settings, receiver, 1, "ob-e2e")
    body = '{"id": "inv_9",  "note": "kept byte for byte ☕"}'
    with relay.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS invoices (id text PRIMARY KEY, status text)")
        conn.execute("INSERT INTO invoices VALUES ('inv_9', 'paid')")  # the business change ...
        event_id = write_event(conn, tenant_id, "order.paid", body, object_id="inv_9", object_version=2)
        committed = time.time()                                          # ... and its event, together
    delivery_id = delivery_id_for(event_id, ep)
    wait_all_reached(receiver, {delivery_id}, timeout=60)
    req = next(r for r in receiver.requests() if r.webhook_id == delivery_id)
    assert req.body == body.encode()
    print(f"\noutbox commit -> first attempt: {(req.received_at - committed) * 1000:.0f} ms")


def test_a_rolled_back_transaction_emits_nothing(relay, grpc_channel, settings, receiver):
    tenant_id, (ep,) = endpoints(grpc_channel, settings, receiver, 1, "ob-rb")
    watch = TopicWatch(settings)
    try:
        with relay.connect() as conn:
            rolled_back = write_event(conn, tenant_id, "order.shipped", {"n": 1})
            conn.rollback()
            committed = write_event(conn, tenant_id, "order.shipped", {"n": 2})
        watch.wait_for({committed})
        assert watch.counts[rolled_back] == 0
        wait_all_reached(receiver, {delivery_id_for(committed, ep)}, timeout=60)
        assert not [r for r in receiver.requests() if r.webhook_id == delivery_id_for(rolled_back, ep)]
    finally:
        watch.close()


def test_connect_sigkilled_after_publishing_before_committing_offsets(relay, grpc_channel, settings, receiver,
                                                                       cassandra_session):
    """The relay publishes a batch, dies before its offsets (and the slot's confirmed position) are
    flushed, and publishes the batch again on restart. Fan-out dedupes by event_id: every event
    delivered once, no duplicate at the receivers (bound 0: the job itself did not crash)."""
    since = _since_ms()
    tenant_id, eps = endpoints(grpc_channel, settings, receiver, 2, "ob-kill")
    watch = TopicWatch(settings)
    try:
        ids = _write(relay, tenant_id, 30, "kill")
        at = time.time()
        watch.wait_for(set(ids))
        relay.script("connect.sh", "kill")  # SIGKILL: no offset flush, no clean shutdown
        assert not relay.connect_pid_alive()
        relay.script("connect.sh", "start", "ready")
        watch.wait_for(set(ids), copies=2, timeout=120)  # the fault really happened: all re-published
        republished = sum(watch.counts[e] - 1 for e in ids)
    finally:
        watch.close()
    result = verdict("outbox-connect-sigkill", grpc_channel, settings, receiver, cassandra_session, [tenant_id],
                     since, _produced(ids, eps, at), bound=0,
                     note=f"Connect SIGKILLed after publishing 30 events, before its offset flush; "
                          f"{republished} records re-published")
    assert republished == len(ids)
    assert result.passed, result.line()


def test_postgres_restarted_while_producers_write(relay, grpc_channel, settings, receiver, cassandra_session):
    """Writers keep committing (and every fifth transaction rolls back) while PostgreSQL is
    stopped and started. Every committed event is delivered; no rolled-back one appears; a commit
    whose answer was lost may go either way, and if its event appears it is delivered too."""
    since = _since_ms()
    tenant_id, eps = endpoints(grpc_channel, settings, receiver, 2, "ob-pg")
    committed: list[str] = []
    rolled_back: list[str] = []
    uncertain: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set() or len(committed) < 40:
            try:
                with relay.connect() as conn:
                    while not stop.is_set() or len(committed) < 40:
                        i += 1
                        eid = f"evt_pg_{uuid.uuid4().hex}"
                        write_event(conn, tenant_id, "order.shipped", {"i": i}, event_id=eid)
                        if i % 5 == 0:
                            conn.rollback()
                            rolled_back.append(eid)
                            continue
                        try:
                            conn.commit()
                        except psycopg.OperationalError:
                            uncertain.append(eid)  # the server went away during COMMIT
                            raise
                        committed.append(eid)
                        time.sleep(0.05)
            except psycopg.OperationalError:
                time.sleep(0.5)  # PostgreSQL is restarting: reconnect, as an application would

    t = threading.Thread(target=writer, daemon=True)
    watch = TopicWatch(settings)
    try:
        t.start()
        eventually(lambda: len(committed) >= 20 or None, timeout=60, what="writers under way")
        relay.script("postgres.sh", "stop", "start", "ready")
        after_restart = len(committed)
        eventually(lambda: len(committed) >= after_restart + 20 or None, timeout=90, what="writes after restart")
        stop.set()
        t.join(timeout=60)
        assert not t.is_alive()
        watch.wait_for(set(committed), timeout=180)
        watch.poll(3)  # anything else of this tenant's would have arrived by now, in commit order
        appeared_uncertain = [e for e in uncertain if watch.counts[e]]
        assert not [e for e in rolled_back if watch.counts[e]], "a rolled-back event was published"
    finally:
        stop.set()
        watch.close()
    delivered = committed + appeared_uncertain
    result = verdict("outbox-postgres-restart", grpc_channel, settings, receiver, cassandra_session, [tenant_id],
                     since, _produced(delivered, eps, time.time()), bound=0, timeout=180,
                     note=f"PostgreSQL stopped (fast) and restarted under writers: {len(committed)} committed, "
                          f"{len(rolled_back)} rolled back, {len(uncertain)} commits unanswered")
    assert result.passed, result.line()


def test_kafka_down_while_rows_are_committed(relay, grpc_channel, settings, receiver, cassandra_session):
    """The broker is stopped; producers keep committing to the outbox (they never talk to Kafka).
    When it returns, the connector catches up from the slot: nothing lost."""
    since = _since_ms()
    tenant_id, eps = endpoints(grpc_channel, settings, receiver, 2, "ob-kafka")
    stack_part("kafka.sh", "stop")
    try:
        ids = _write(relay, tenant_id, 15, "kafka-down-1") + _write(relay, tenant_id, 15, "kafka-down-2")
        at = time.time()
        time.sleep(5)
    finally:
        stack_part("kafka.sh", "start", "ready")
    result = verdict("outbox-kafka-down", grpc_channel, settings, receiver, cassandra_session, [tenant_id],
                     since, _produced(ids, eps, at), bound=0, timeout=240,
                     note="the broker stopped while 30 events committed to the outbox; restarted 5 s later")
    assert relay.connect_pid_alive()
    assert result.passed, result.line()


def _dead_letters(settings, event_ids: set[str], timeout: float = 90) -> dict[str, str]:
    """event_id -> reason for every dead letter whose original record names one of the ids."""
    def key_of(original: bytes) -> str | None:
        return next((eid for eid in event_ids if eid.encode() in original), None)

    return {eid: letter["reason"]
            for eid, letter in read_dead_letters(settings, key_of, len(event_ids), timeout).items()}


def test_bad_rows_reach_the_dead_letter_topic_and_nothing_stops(relay, grpc_channel, settings, receiver):
    """Rows the producer library would refuse, written with raw SQL: the job dead-letters each with
    its reason, the connector keeps running, and a good event written after them is delivered. A
    row past the table's hard cap never commits at all."""
    tenant_id, (ep,) = endpoints(grpc_channel, settings, receiver, 1, "ob-bad")
    insert = ("INSERT INTO webhook_outbox (event_id, tenant_id, event_type, schema_version, occurred_at, payload)"
              " VALUES (%s, %s, 'order.shipped', '1', now(), %s)")
    bad = {
        f"evt_bad_json_{RUN_ID}": (tenant_id, b"{not json"),
        f"evt_bad_tenant_{RUN_ID}": ("", b"{}"),
        f"evt_bad_size_{RUN_ID}": (tenant_id, b'"' + b"x" * (300 * 1024) + b'"'),
    }
    with relay.connect() as conn:
        for eid, (tenant, body) in bad.items():
            conn.execute(insert, (eid, tenant, body))
    with relay.connect() as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(insert, (f"evt_too_big_{RUN_ID}", tenant_id, b"0" * (700 * 1024)))
    good = _write(relay, tenant_id, 1, "after-bad")[0]
    letters = _dead_letters(settings, set(bad))
    assert letters == {f"evt_bad_json_{RUN_ID}": "payload_not_json", f"evt_bad_tenant_{RUN_ID}": "wrong_type",
                       f"evt_bad_size_{RUN_ID}": "payload_too_large"}
    wait_all_reached(receiver, {delivery_id_for(good, ep)}, timeout=90)
    relay.script("connect.sh", "ready")  # the connector and its task still RUNNING


def test_a_snapshot_read_of_a_published_row_sends_nothing_again(relay, grpc_channel, settings, receiver):
    """A Debezium snapshot (op r) re-reads rows already streamed. The stack never snapshots
    (snapshot.mode=no_data), but if one ran, its records must not re-send final deliveries: the
    row's exact record, replayed as a snapshot read, reaches the topic and the receiver sees
    nothing new."""
    tenant_id, (ep,) = endpoints(grpc_channel, settings, receiver, 1, "ob-snap")
    watch = TopicWatch(settings)
    try:
        (event_id,) = _write(relay, tenant_id, 1, "snap")
        watch.wait_for({event_id})
        delivery_id = delivery_id_for(event_id, ep)
        wait_all_reached(receiver, {delivery_id}, timeout=60)
        envelope = json.loads(watch.values[event_id])
        assert envelope["op"] == "c"
        envelope["op"] = "r"
        envelope["source"]["snapshot"] = "true"
        produce(settings, [json.dumps(envelope).encode()], keys=[event_id])
        watch.wait_for({event_id}, copies=2)
        marker = _write(relay, tenant_id, 1, "after-snap")[0]  # arrives after the snapshot read
        wait_all_reached(receiver, {delivery_id_for(marker, ep)}, timeout=60)
        time.sleep(2)
        assert len([r for r in receiver.requests() if r.webhook_id == delivery_id]) == 1
    finally:
        watch.close()


def test_the_stack_outbox_streams_what_webhookctl_publishes():
    """The `make run` path of the README tour: `webhookctl events publish` writes to the stack's
    outbox (PostgreSQL on 55432), and the stack's Debezium connector puts it on webhooks.events,
    keyed by its event_id, as an envelope the job parses."""
    import subprocess

    from core.ingest import parse_event
    from core.settings import REPO_ROOT, load_settings

    stack = load_settings()
    watch = TopicWatch(stack)
    try:
        out = subprocess.run([str(REPO_ROOT / ".venv/bin/webhookctl"), "events", "publish", "--tenant", "tour",
                              "--type", "invoice.paid", "--data", '{"id": "inv_tour"}'],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        event_id = out.stdout.strip()
        watch.wait_for({event_id}, timeout=60)
        record = parse_event(watch.values[event_id], stack.ingest.max_payload_bytes)
        assert (record.event_id, record.tenant_id, record.event_type, record.payload) == (
            event_id, "tour", "invoice.paid", b'{"id": "inv_tour"}')  # text is kept byte for byte
    finally:
        watch.close()
