"""The dispatcher's history store against a real Cassandra: attempt rows written before the
requests they stand for, with numbers never reused, and a delivery status that never moves back
from final. A keyspace of this module's own; no job, no Kafka."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from cassandra.cluster import Session

from core.breaker import CircuitState
from core.dispatch import AttemptRecord, DurableRecord, Intent
from core.endpoint_health import EndpointReport
from core.fanout import NewDelivery
from core.history_buckets import bucket_of
from core.ordering import KeyRowChange
from core.records import EventRecord, delivery_id_for
from core.settings import Settings
from operators.history_store import CassandraHistory
from stack.isolation import isolated_env, settings_with
from tests.support.helpers import durable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_settings() -> Settings:
    return settings_with(isolated_env(f"hist-{uuid.uuid4().hex[:8]}", own_keyspace=True))





def delivery(created_at_ms: int | None = None) -> NewDelivery:
    created = created_at_ms if created_at_ms is not None else int(time.time() * 1000) - 60_000
    e = EventRecord(event_id=f"evt_{uuid.uuid4().hex}", tenant_id="t-hist", event_type="order.paid",
                    schema_version="1", object_id="o1", object_version=1, occurred_at_ms=created,
                    payload=b'{"n":1}')
    return NewDelivery(delivery_id=delivery_id_for(e.event_id, "ep-hist"), event=e, endpoint_id="ep-hist",
                       tenant_id="t-hist", endpoint_config_version=3, created_at_ms=created,
                       expires_at_ms=created + 86_400_000)


def intent(n: int) -> Intent:
    return Intent(n, str(uuid.uuid1()))


def sent(i: Intent, at_ms: int, outcome: str, status: str | None, http: int | None = 503,
         manual: bool = False, **kw: Any) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=True, started_at_ms=at_ms - 50, finished_at_ms=at_ms, http_status=http,
        outcome=outcome, error_class=None if http == 200 else "http_5xx", detail="", manual=manual,
        delivery_status=status, next_attempt_at_ms=at_ms + 1000 if status == "pending" else None,
        auto_retry_active=status == "pending", url="https://hooks.example.com/in",
        endpoint_config_version=3, latency_ms=50, **kw)


def not_sent(i: Intent | None, at_ms: int, outcome: str, status: str | None, manual: bool = False,
             **kw: Any) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=False, started_at_ms=at_ms, finished_at_ms=at_ms, http_status=None, outcome=outcome,
        error_class=None, detail="no request", manual=manual, delivery_status=status,
        next_attempt_at_ms=None, auto_retry_active=False, **kw)


def check(h: CassandraHistory, delivery_id: str) -> DurableRecord:
    return asyncio.run(h.check(delivery_id))


def by_endpoint_status(session: Session, d: NewDelivery) -> str | None:
    rows = list(session.execute(
        "SELECT status FROM endpoint_deliveries WHERE tenant_id=%s AND endpoint_id=%s AND day=%s AND bucket=%s"
        " AND created_at=%s AND delivery_id=%s",
        (d.tenant_id, d.endpoint_id, _day(d.created_at_ms), bucket_of(d.delivery_id), _utc(d.created_at_ms),
         d.delivery_id)))
    return rows[0].status if rows else None


def _utc(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def _day(ms: int) -> dt.date:
    return _utc(ms).date()


def indexed_numbers(session: Session, d: NewDelivery, started_ms: list[int]) -> list[int]:
    """The delivery's attempt numbers in endpoint_attempts, over the hours of these starts."""
    hours = {_utc(ms // 3_600_000 * 3_600_000) for ms in started_ms}
    return sorted(r.attempt_number for hour in hours for r in session.execute(
        "SELECT delivery_id, attempt_number FROM endpoint_attempts WHERE endpoint_id=%s AND hour=%s AND bucket=%s",
        (d.endpoint_id, hour, bucket_of(d.delivery_id))) if r.delivery_id == d.delivery_id)


def attempts(session: Session, delivery_id: str) -> list[Any]:
    return list(session.execute("SELECT * FROM delivery_history WHERE delivery_id=%s AND attempt_number > 0"
                                " ORDER BY attempt_number ASC", (delivery_id,)))


def test_a_final_status_survives_a_stale_final_record_and_a_re_creation(history, session):
    d = delivery()
    t0 = d.created_at_ms
    i1, i2 = intent(1), intent(2)
    durable(history, history.persist(d, i1))
    durable(history, history.record(d, sent(i1, t0 + 1000, "retry", "pending"), 1, i2))
    durable(history, history.record(d, sent(i2, t0 + 3000, "succeeded", "succeeded", http=200), 2, None))

    # A stale writer (an incarnation from before a restore) closes the delivery as expired, later
    # on its own clock; then the delivery is re-created from a re-read topic with a later
    # created_at. Neither may move the status back (defect 7).
    durable(history, history.record(d, not_sent(None, t0 + 10_000, "expired", "expired"), 0, None))
    again = replace(d, created_at_ms=t0 + 20_000, expires_at_ms=t0 + 20_000 + 86_400_000)
    durable(history, history.persist(again, intent(3)))

    got = check(history, d.delivery_id)
    assert (got.status, got.attempt_count, got.auto_retry_active) == ("succeeded", 2, False)
    assert got.final and got.max_attempt_number == 3
    assert by_endpoint_status(session, d) == "succeeded"


def test_every_intent_has_its_own_attempt_row_and_only_requests_are_indexed(history, session):
    d = delivery()
    t0 = d.created_at_ms
    i1, i2, i3 = intent(1), intent(2), intent(3)
    durable(history, history.persist(d, i1))
    # The same request outcome recorded twice (a retried write) still leaves one row per number.
    for _ in range(2):
        durable(history, history.record(d, sent(i1, t0 + 1000, "retry", "pending"), 1, i2))
    durable(history, history.record(d, sent(i2, t0 + 2000, "retry", "pending"), 2, i3))
    durable(history, history.record(d, not_sent(i3, t0 + 3000, "not_sent", "expired"), 2, None))

    rows = {r.attempt_number: r for r in attempts(session, d.delivery_id)}
    assert sorted(rows) == [1, 2, 3]
    assert [rows[n].attempt_id for n in (1, 2, 3)] == [i1.attempt_id, i2.attempt_id, i3.attempt_id]
    assert len({r.attempt_id for r in rows.values()}) == 3
    assert [rows[n].outcome for n in (1, 2, 3)] == ["retry", "retry", "not_sent"]
    assert rows[1].http_status == 503 and rows[1].url == "https://hooks.example.com/in"
    assert rows[3].http_status is None and rows[3].config_version == 3
    assert indexed_numbers(session, d, [t0 + 950, t0 + 1950, t0 + 3000]) == [1, 2]


def test_check_reads_the_durable_record_and_counts_reserved_rows(history, session):
    assert check(history, f"dlv_{uuid.uuid4().hex}") == DurableRecord(status=None)

    d = delivery()
    i1 = intent(1)
    durable(history, history.persist(d, i1))
    got = check(history, d.delivery_id)
    assert (got.status, got.attempt_count, got.max_attempt_number, got.final) == ("pending", 0, 1, False)
    assert got.auto_retry_active and got.next_attempt_at_ms == d.created_at_ms
    [row] = attempts(session, d.delivery_id)
    assert (row.outcome, row.attempt_id, row.http_status, row.finished_at) == ("reserved", i1.attempt_id, None, None)

    # A reservation alone (RESERVE after a restore) counts; numbering continues after it.
    durable(history, history.reserve(d, intent(2), d.created_at_ms + 5000))
    assert check(history, d.delivery_id).max_attempt_number == 2

    # Attempt rows without a delivery row (a partly applied first batch): no status, but the
    # numbers are still taken. A delivery row without a status counts as pending.
    lone = delivery()
    durable(history, history.reserve(lone, intent(1), lone.created_at_ms))
    assert check(history, lone.delivery_id) == DurableRecord(status=None, max_attempt_number=1)
    session.execute("UPDATE delivery_history SET attempt_count=1 WHERE delivery_id=%s", (lone.delivery_id,))
    assert check(history, lone.delivery_id).status == "pending"


def test_a_record_without_a_delivery_status_leaves_the_status_alone(history, session):
    d = delivery()
    t0 = d.created_at_ms
    i1, i2, i3 = intent(1), intent(2), intent(3)
    durable(history, history.persist(d, i1))
    durable(history, history.record(d, sent(i1, t0 + 1000, "retry", "pending"), 1, i2))
    # A manual request that could not be sent in its wait: its row says so and who asked.
    manual = not_sent(i2, t0 + 2000, "not_sent", None, manual=True, requested_by="key_a", request_id="rpl_1")
    durable(history, history.record(d, manual, 1, i3))

    got = check(history, d.delivery_id)
    assert (got.status, got.attempt_count, got.max_attempt_number) == ("pending", 1, 3)
    assert got.next_attempt_at_ms == t0 + 2000  # the retry's, not moved by the manual record
    rows = {r.attempt_number: r for r in attempts(session, d.delivery_id)}
    assert (rows[2].outcome, rows[2].manual, rows[2].requested_by, rows[2].request_id) == (
        "not_sent", True, "key_a", "rpl_1")
    assert rows[3].outcome == "reserved"
    assert by_endpoint_status(session, d) == "pending"


def test_succeeded_outranks_failed_in_either_order(history, session):
    # failed, then a manual replay succeeds later: succeeded.
    d = delivery()
    t0 = d.created_at_ms
    i1, i2 = intent(1), intent(2)
    durable(history, history.persist(d, i1))
    durable(history, history.record(d, sent(i1, t0 + 1000, "failed", "failed", http=400), 1, None))
    assert check(history, d.delivery_id).status == "failed"
    durable(history, history.reserve(d, i2, t0 + 50_000))
    replay = sent(i2, t0 + 60_000, "succeeded", "succeeded", http=200, manual=True, requested_by="key_a",
                  request_id="rpl_2")
    durable(history, history.record(d, replay, 1, None))
    assert check(history, d.delivery_id).status == "succeeded"
    assert by_endpoint_status(session, d) == "succeeded"

    # succeeded, then a later record says failed (a manual replay that failed): still succeeded.
    e = delivery()
    t0 = e.created_at_ms
    j1, j2 = intent(1), intent(2)
    durable(history, history.persist(e, j1))
    durable(history, history.record(e, sent(j1, t0 + 1000, "succeeded", "succeeded", http=200), 1, None))
    durable(history, history.reserve(e, j2, t0 + 50_000))
    durable(history, history.record(e, sent(j2, t0 + 60_000, "failed", "failed", http=400, manual=True), 1, None))
    got = check(history, e.delivery_id)
    assert (got.status, got.max_attempt_number) == ("succeeded", 2)
    assert by_endpoint_status(session, e) == "succeeded"
    assert [r.outcome for r in attempts(session, e.delivery_id)] == ["succeeded", "failed"]


def test_load_for_replay_returns_the_delivery_and_its_durable_record(history):
    d = delivery()
    i1 = intent(1)
    durable(history, history.persist(d, i1))
    durable(history, history.record(d, sent(i1, d.created_at_ms + 1000, "failed", "failed", http=400), 1, None))
    loaded = asyncio.run(history.load_for_replay(d.delivery_id))
    assert loaded is not None
    got, record = loaded
    assert got == d
    assert (record.status, record.attempt_count, record.auto_retry_active, record.max_attempt_number) == (
        "failed", 1, False, 1)
    assert asyncio.run(history.load_for_replay(f"dlv_{uuid.uuid4().hex}")) is None


def test_the_control_plane_shows_a_request_whose_outcome_was_never_recorded(history, session):
    from control_plane.cli.deliveries import delivery_detail
    from control_plane.domain import NO_OUTCOME
    from control_plane.rpc.servicer import detail_pb
    from control_plane.store import CassandraStore

    d = delivery()
    t0 = d.created_at_ms
    i1, i2, i3 = intent(1), intent(2), intent(3)
    durable(history, history.persist(d, i1))
    durable(history, history.record(d, sent(i1, t0 + 1000, "retry", "pending"), 1, i2))
    store = CassandraStore(session)
    detail = store.get_delivery(d.delivery_id)
    assert detail is not None
    assert [a.outcome for a in detail.attempts] == ["retry", "reserved"]  # the next request
    # The worker dies with request 2 in flight; the restored one reserves 3, which succeeds.
    durable(history, history.reserve(d, i3, t0 + 5000))
    durable(history, history.record(d, sent(i3, t0 + 6000, "succeeded", "succeeded", http=200), 2, None))
    detail = store.get_delivery(d.delivery_id)
    assert detail is not None
    assert [a.outcome for a in detail.attempts] == ["retry", NO_OUTCOME, "succeeded"]
    unknown = detail.attempts[1]
    assert (unknown.attempt_id, unknown.http_status, unknown.finished_at_ms) == (i2.attempt_id, None, None)
    text = delivery_detail(detail_pb(detail))  # what `webhookctl deliveries get` prints
    assert NO_OUTCOME in text


def test_a_later_backlog_report_wins_even_when_it_reaches_cassandra_first(history: CassandraHistory,
                                                                          session: Session) -> None:
    """Reports are fire and forget: "holding 2" (an earlier pass) may be written after "holding 0"
    (the later pass that found the endpoint drained). The later pass must win, or reconciliation
    takes a drained endpoint for one holding deliveries and never calls its lost delivery orphaned."""
    now = int(time.time() * 1000)
    ep = f"ep-backlog-{uuid.uuid4().hex[:8]}"
    drained = EndpointReport(ep, "t-hist", 0, now, CircuitState.CLOSED)
    holding = EndpointReport(ep, "t-hist", 2, now - 30, CircuitState.OPEN, open_until_ms=now + 30_000,
                             oldest_new_ms=now - 5_000, oldest_retry_ms=now - 9_000, throttled=True)
    durable(history, history.report_backlog(drained))  # the later pass, written first
    durable(history, history.report_backlog(holding))  # the earlier pass, written last
    row = session.execute("SELECT pending, breaker, breaker_open_until, oldest_new_at, throttled"
                          " FROM endpoint_backlogs WHERE endpoint_id=%s", (ep,)).one()
    assert (row.pending, row.breaker, row.breaker_open_until, row.oldest_new_at, row.throttled) == (
        0, "closed", None, None, False)  # every cell of the later report, the nulls included


def test_a_backlog_report_carries_the_breaker_and_ages_the_console_reads(history: CassandraHistory,
                                                                          session: Session) -> None:
    from control_plane.endpoints.health import CassandraEndpointHealth

    now = int(time.time() * 1000)
    ep = f"ep-health-{uuid.uuid4().hex[:8]}"
    written = EndpointReport(ep, "t-hist", 3, now, CircuitState.OPEN, open_until_ms=now + 30_000,
                             oldest_new_ms=now - 5_000, oldest_retry_ms=now - 9_000, throttled=True)
    durable(history, history.report_backlog(written))
    assert CassandraEndpointHealth(session).for_endpoints([ep, "ep-never-reported"]) == [written]


def _nodelay(cluster: Any) -> list[int]:
    """TCP_NODELAY of every open connection of a driver Cluster (control and pooled)."""
    import socket

    conns = [cluster.control_connection._connection]
    for pool in cluster.get_connection_holders():
        conns.extend(pool.get_connections())
    return [c._socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) for c in conns if c is not None]


def test_history_and_control_plane_connections_do_not_wait_on_nagle(history: CassandraHistory,
                                                                    own_settings: Settings) -> None:
    """Measured: without TCP_NODELAY, any request the driver writes in more than one piece (a
    creation batch of a few deliveries with their payloads) waited ~40 ms for the kernel's
    delayed ACK -- 2 ms batches took 47 ms, which was most of the first-attempt latency at light
    load. Every connection on the delivery path must set it."""
    from control_plane.server import connect_cassandra

    history_flags = _nodelay(history._cluster)
    cluster, _ = connect_cassandra(own_settings)
    try:
        cp_flags = _nodelay(cluster)
    finally:
        cluster.shutdown()
    assert history_flags and all(history_flags), history_flags
    assert cp_flags and all(cp_flags), cp_flags


def test_writes_and_decision_reads_use_the_configured_consistency(own_settings: Settings, session: Session) -> None:
    """Cassandra.consistency reaches Cassandra on the dispatcher's writes and
    reads and on the control plane's. Shown by asking this one-node cluster (RF 1) for a level it
    cannot give: TWO fails as Unavailable on every path; the default (LOCAL_QUORUM) works."""
    from control_plane.errors import Unavailable
    from control_plane.store import CassandraStore

    assert own_settings.cassandra.consistency == "LOCAL_QUORUM"
    two = own_settings.cassandra.model_copy(update={"consistency": "TWO"})
    h = CassandraHistory(two)
    try:
        d = delivery()
        c = h.persist(d, intent(1))
        h.flush()
        deadline = time.monotonic() + 10
        while not c.done():
            assert time.monotonic() < deadline
            time.sleep(0.005)
        # (the driver wraps the server's Unavailable in NoHostAvailable after trying the next host)
        with pytest.raises(Exception, match="Cannot achieve consistency level TWO"):
            c.result()
        with pytest.raises(Exception, match="Cannot achieve consistency level TWO"):
            check(h, d.delivery_id)
    finally:
        h.close()
    with pytest.raises(Unavailable):
        CassandraStore(session, consistency="TWO").get_delivery("dlv_none")
    assert CassandraStore(session).get_delivery("dlv_none") is None  # LOCAL_QUORUM: served


def key_rows(session: Session, d: NewDelivery, key: str) -> list[Any]:
    return list(session.execute(
        "SELECT * FROM blocked_ordering_keys WHERE tenant_id=%s AND endpoint_id=%s AND bucket=%s AND ordering_key=%s",
        (d.tenant_id, d.endpoint_id, bucket_of(key), key)))


def test_a_heads_records_block_and_free_its_ordering_key(history, session):
    """A failing head writes its key's row with what blocks it; its final record
    deletes it; the next head's failure is written after and survives the earlier delete
    landing late (write timestamps are the records' finish times)."""
    key = f"inv_{uuid.uuid4().hex[:8]}"
    d1, d2 = replace(delivery(), ordering_key=key), replace(delivery(), ordering_key=key)
    t0 = int(time.time() * 1000) - 30_000
    i1, i2 = intent(1), intent(2)
    durable(history, history.persist(d1, i1))
    durable(history, history.record(d1, sent(i1, t0 + 1000, "retry", "pending"), 1, i2,
                                    KeyRowChange(key, blocked=True, waiting=1, first_failure=True)))
    [row] = key_rows(session, d1, key)
    assert (row.head_delivery_id, row.head_event_id, row.attempts, row.last_http_status, row.waiting) == (
        d1.delivery_id, d1.event.event_id, 1, 503, 1)
    assert row.blocked_since == _utc(t0 + 950).replace(tzinfo=None, microsecond=(t0 + 950) % 1000 * 1000)
    assert row.next_attempt_at is not None
    durable(history, history.record(d1, sent(i2, t0 + 3000, "retry", "pending"), 2, intent(3),
                                    KeyRowChange(key, blocked=True, waiting=3)))
    [row] = key_rows(session, d1, key)
    assert row.attempts == 2 and row.waiting == 3 and row.blocked_since is not None  # kept from the first
    free = not_sent(None, t0 + 5000, "skipped", "failed")
    durable(history, history.record(d1, free, 2, None, KeyRowChange(key, blocked=False)))
    assert key_rows(session, d1, key) == []
    j1 = intent(1)
    durable(history, history.persist(d2, j1))
    durable(history, history.record(d2, sent(j1, t0 + 6000, "retry", "pending"), 1, intent(2),
                                    KeyRowChange(key, blocked=True, waiting=0, first_failure=True)))
    durable(history, history.record(d1, free, 2, None, KeyRowChange(key, blocked=False)))  # d1's, again, late
    [row] = key_rows(session, d2, key)
    assert row.head_delivery_id == d2.delivery_id


def _partition_writes(session: Session, keyspace: str) -> dict[str, int]:
    """Cassandra's own count of local writes per table of the keyspace (one per partition update:
    a batch's statements on one partition of one table are one write)."""
    rows = session.execute("SELECT table_name, count FROM system_views.local_write_latency WHERE keyspace_name=%s",
                           (keyspace,))
    return {r.table_name: r.count for r in rows}


def test_a_first_attempt_success_costs_four_partition_writes_by_cassandras_count(history, session, own_settings):
    """The creation (the delivery with its reserved attempt, its endpoint index row) and the
    outcome (the attempt row with the new status, the endpoint index row): four writes as
    Cassandra counts them, plus the event row each event shares between its deliveries. A success
    is not indexed by hour; a retry is."""
    ks = own_settings.cassandra.keyspace
    n = 20
    ds = [delivery() for _ in range(n)]
    before = _partition_writes(session, ks)
    for d in ds:
        i1 = intent(1)
        durable(history, history.persist(d, i1))
        durable(history, history.record(d, sent(i1, d.created_at_ms + 1000, "succeeded", "succeeded", http=200),
                                        1, None))
    after = _partition_writes(session, ks)
    delta = {t: after.get(t, 0) - before.get(t, 0) for t in after if after.get(t, 0) != before.get(t, 0)}
    assert delta == {"delivery_history": 2 * n, "endpoint_deliveries": 2 * n, "events": n}, delta

    d = delivery()
    i1, i2 = intent(1), intent(2)
    durable(history, history.persist(d, i1, write_event=False))
    before = _partition_writes(session, ks)
    durable(history, history.record(d, sent(i1, d.created_at_ms + 1000, "retry", "pending"), 1, i2))
    after = _partition_writes(session, ks)
    delta = {t: after.get(t, 0) - before.get(t, 0) for t in after if after.get(t, 0) != before.get(t, 0)}
    # The attempt row, the status and the next reservation: one partition update.
    assert delta == {"delivery_history": 1, "endpoint_deliveries": 1, "endpoint_attempts": 1}, delta


def _write_old_schema(session: Session, d: NewDelivery, attempt_rows: list[tuple[int, str]]) -> None:
    """A delivery as the dispatcher wrote it before delivery_history existed (deliveries + attempts)."""
    created = _utc(d.created_at_ms)
    session.execute(
        "INSERT INTO deliveries (delivery_id, event_id, tenant_id, endpoint_id, endpoint_config_version, event_type,"
        " created_at, expires_at, status, attempt_count, auto_retry_active, next_attempt_at)"
        " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,'pending',%s,true,%s)",
        (d.delivery_id, d.event.event_id, d.tenant_id, d.endpoint_id, d.endpoint_config_version, d.event.event_type,
         created, _utc(d.expires_at_ms), sum(1 for _, o in attempt_rows if o != "reserved"), created))
    for number, outcome in attempt_rows:
        session.execute(
            "INSERT INTO attempts (delivery_id, attempt_number, attempt_id, endpoint_id, endpoint_config_version,"
            " started_at, outcome, manual) VALUES (%s,%s,%s,%s,%s,%s,%s,false)",
            (d.delivery_id, number, f"old-{number}", d.endpoint_id, d.endpoint_config_version, created, outcome))
    session.execute(
        "INSERT INTO events (event_id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at,"
        " payload) VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
        (d.event.event_id, d.tenant_id, d.event.event_type, d.event.schema_version, d.event.object_id,
         d.event.object_version, _utc(d.event.occurred_at_ms), d.event.payload))


def test_a_delivery_written_by_the_old_schema_stays_readable_and_finishes_in_the_new_one(history, session):
    """A delivery still retrying across the upgrade: created in deliveries + attempts, its next
    outcome lands in delivery_history. The dispatcher's CHECK and replay load, and the control
    plane's GetDelivery, see one delivery: the newer status, every attempt once."""
    from control_plane.store import CassandraStore

    d = delivery()
    _write_old_schema(session, d, [(1, "retry"), (2, "reserved")])
    got = check(history, d.delivery_id)
    assert (got.status, got.attempt_count, got.max_attempt_number) == ("pending", 1, 2)
    loaded = asyncio.run(history.load_for_replay(d.delivery_id))
    assert loaded is not None and loaded[0] == d

    i2 = Intent(2, "old-2")
    durable(history, history.record(d, sent(i2, d.created_at_ms + 5000, "succeeded", "succeeded", http=200),
                                    2, None))
    got = check(history, d.delivery_id)
    assert (got.status, got.attempt_count, got.max_attempt_number, got.final) == ("succeeded", 2, 2, True)
    detail = CassandraStore(session).get_delivery(d.delivery_id)
    assert detail is not None
    assert detail.summary.event_id == d.event.event_id and detail.summary.status.value == "succeeded"
    assert [(a.attempt_number, a.outcome) for a in detail.attempts] == [(1, "retry"), (2, "succeeded")]
