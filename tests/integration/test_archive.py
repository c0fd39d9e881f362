"""The archive tier on the real Cassandra and Kafka: an hour of history written by the job's own
history store (retries, a manual replay with its audit row) with a hot TTL of seconds, its facts
sent to a facts topic of this module's own as the dispatcher sends them, archived by the archive
writer, audited, read across tiers before and after the hot rows expired; faults: the writer
SIGKILLed mid-run, the S3 server stopped during a run, a file removed by hand. A keyspace and
topic of this module's own; no Flink job (the end-to-end test has one: test_archive_e2e.py)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cassandra.cluster import Session
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from control_plane.archive.audit import AUDITED, FAILED, Auditor
from control_plane.archive.store import ArchiveStore
from control_plane.archive.writer import run_repair
from control_plane.history.query import run_query
from core import archive_facts
from core import archive_layout as layout
from core.dispatch import AttemptRecord, Intent
from core.fanout import FanoutSnapshot, NewDelivery
from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, ArchiveSettings, Settings
from operators.history_store import CassandraHistory
from stack.isolation import isolated_env, settings_with
from tests.support.archive_support import S3Server, WriterThread, committed, end_offsets
from tests.support.helpers import durable

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
HOT_TTL_S = 10  # the job's is days; seconds here, so the hot rows expire within the test
TENANTS = ("t-arch-a", "t-arch-b", "t-arch-d")  # tenant buckets 5, 13 and 10


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return {**isolated_env(f"arch-{uuid.uuid4().hex[:8]}", own_keyspace=True), "WEBHOOKS_KAFKA__PARTITIONS": "2"}


@pytest.fixture(scope="module")
def own_settings(env: dict[str, str]) -> Iterator[Settings]:
    s = settings_with(env)
    k = s.kafka
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    for f in admin.create_topics([NewTopic(k.archive_facts_topic, num_partitions=2, replication_factor=1)]).values():
        f.result()
    yield s
    admin.delete_topics([k.archive_facts_topic])


class Facts:
    """The dispatcher's side of the facts: the history store appends them, ``ship`` sends them as
    one record per call (the dispatcher's _facts_out), to a partition chosen round-robin."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.kafka.archive_facts_topic
        self.pending: list[archive_facts.Fact] = []
        self._p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "acks": "all"})
        self._n = 0

    def ship(self) -> None:
        if self.pending:
            self._p.produce(self.topic, archive_facts.encode(self.pending), partition=self._n % 2)
            self._n += 1
            self.pending.clear()
        self._p.flush(10)


@pytest.fixture(scope="module")
def facts(own_settings: Settings) -> Facts:
    return Facts(own_settings)


@pytest.fixture(scope="module")
def history(own_settings: Settings, session: Session, facts: Facts) -> Iterator[CassandraHistory]:
    h = CassandraHistory(own_settings.cassandra, HOT_TTL_S, facts.pending)
    yield h
    h.close()


def attempt(i: Intent, at_ms: int, outcome: str, status: str | None, http: int, manual: bool = False,
            **kw: Any) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=True, started_at_ms=at_ms - 40, finished_at_ms=at_ms, http_status=http, outcome=outcome,
        error_class=None if http == 200 else "http_5xx", detail="", manual=manual, delivery_status=status,
        next_attempt_at_ms=at_ms + 5000 if status == "pending" else None, auto_retry_active=status == "pending",
        url="https://hooks.example.com/in", endpoint_config_version=2, latency_ms=40, signing_key_versions=(1,),
        response_prefix="ok" if http == 200 else "busy", **kw)


def delivery(hour_ms: int, tag: str, n: int, k: int) -> NewDelivery:
    tenant = TENANTS[n % len(TENANTS)]
    arrived = hour_ms + 1000 + n * 37
    e = EventRecord(event_id=f"evt_{tag}_{n:04d}", tenant_id=tenant, event_type="invoice.paid",
                    schema_version="1", object_id=f"inv_{n}", object_version=n, occurred_at_ms=arrived - 5,
                    payload=b'{"id": "inv_%d", "amount": %d, "pad": "%s"}' % (n, n * 100, b"x" * 1400))
    ep = f"ep-{tenant}-{k + 1}"
    return NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep, tenant_id=tenant,
                       endpoint_config_version=2, created_at_ms=arrived, expires_at_ms=arrived + 86_400_000)


def write_hour(history: CassandraHistory, session: Session, facts: Facts, hour_ms: int, events: int,
               tag: str) -> list[str]:
    """``events`` events of the hour, each to two endpoints of its tenant: every third delivery
    retried once before succeeding, the first one also replayed by hand (with its audit row).
    Each event's writes are one dispatcher call: one facts record."""
    dids = []
    for n in range(events):
        tenant = TENANTS[n % len(TENANTS)]
        arrived = hour_ms + 1000 + n * 37
        pair = [delivery(hour_ms, tag, n, k) for k in range(2)]
        e = pair[0].event
        waits = [history.write_snapshot(FanoutSnapshot(e.event_id, tenant, arrived,
                                                       tuple((d.endpoint_id, 2) for d in pair)))]
        for k, d in enumerate(pair):
            dids.append(d.delivery_id)
            i1 = Intent(1, f"att_{uuid.uuid4().hex}")
            waits.append(history.persist(d, i1, write_event=k == 0))
            if (n + k) % 3 == 0:
                i2 = Intent(2, f"att_{uuid.uuid4().hex}")
                waits.append(history.record(d, attempt(i1, arrived + 100, "retry", "pending", 503), 1, i2))
                waits.append(history.record(d, attempt(i2, arrived + 5200, "succeeded", "succeeded", 200), 2, None))
            else:
                waits.append(history.record(d, attempt(i1, arrived + 100, "succeeded", "succeeded", 200), 1, None))
            if n == 0 and k == 0:  # a manual replay, audited first as the control plane does
                later = arrived + 600_000
                session.execute(
                    "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, requested_at,"
                    " reason, action) VALUES (%s, 'rpl_1', %s, 'key_ops', %s, 'customer asked', 'replay')",
                    (d.delivery_id, tenant, later))
                i3 = Intent(3, f"att_{uuid.uuid4().hex}")
                waits.append(history.reserve(d, i3, later))
                waits.append(history.record(d, attempt(i3, later + 50, "succeeded", None, 200, manual=True,
                                                       requested_by="key_ops", request_id="rpl_1"), 3, None))
        durable(history, *waits)
        facts.ship()
    return dids


def archive_settings(root: Path | None, **kw: Any) -> ArchiveSettings:
    return ArchiveSettings(**({"uri": str(root)} if root is not None else {}), pushgateway="", roll_s=0.5, **kw)


def archived(store: ArchiveStore, hour: int, kind: str) -> list[dict[str, Any]]:
    return list(archive_facts.latest(kind, [r for b in layout.ALL_BUCKETS
                                            for r in store.read_kind(hour, b, kind).to_pylist()]))


def tiered(session: Session, root: Path) -> Any:
    from control_plane.history.tiered import TieredHistory
    from control_plane.store import CassandraStore

    return TieredHistory(CassandraStore(session), session, ArchiveStore.from_settings(archive_settings(root)),
                         HOT_TTL_S)


class ActiveEndpoints:
    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Any:
        from types import SimpleNamespace

        from core.records import EndpointStatus

        return SimpleNamespace(status=EndpointStatus.ACTIVE)


class Queued:
    def __init__(self) -> None:
        self.replays: list[Any] = []

    def publish_replay(self, request: Any) -> None:
        self.replays.append(request)


@functools.cache
def hour_now() -> int:
    """A closed hour, rows written now; read once for the module. Each test archives its own hour
    (this one minus k) and reads that whole hour back. Read per test, a run crossing a clock hour
    would hand a test the hour an earlier test wrote, and the writer (which reads the facts topic
    from its start) would archive both tests' deliveries into it."""
    return layout.hour_start(int(time.time() * 1000)) - 2 * HOUR_MS


def test_an_hour_is_archived_from_its_facts_audited_and_reads_the_same_after_its_hot_rows_expired(
        history, session, facts, own_settings, tmp_path):
    from control_plane.domain import Principal
    from control_plane.history.deliveries import DeliveryDeps, DeliveryService
    from control_plane.history.reconcile import Reconciler
    from control_plane.store import CassandraStore

    hour = hour_now()
    written = time.monotonic()
    dids = write_hour(history, session, facts, hour, 12, "a")
    hot = CassandraStore(session)
    tiers = tiered(session, tmp_path)
    before = {did: hot.get_delivery(did) for did in dids}
    listed = list(tiers.iter_endpoint_deliveries(TENANTS[0], f"ep-{TENANTS[0]}-1", hour, hour + HOUR_MS, None))
    assert time.monotonic() - written < HOT_TTL_S, "the machine is too slow for this test's hot TTL"
    d0 = before[dids[0]]
    assert d0 is not None and d0.tier == "hot" and [a.manual for a in d0.attempts] == [False, False, True]

    with WriterThread(own_settings, archive_settings(tmp_path)) as w:
        w.caught_up()
    store = ArchiveStore.from_settings(archive_settings(tmp_path))
    # The payload bytes as the job stored them; the manual attempt with its request; the statuses.
    events = archived(store, hour, "events")
    assert {e["event_id"]: e["payload"] for e in events} == {
        f"evt_a_{n:04d}": delivery(hour, "a", n, 0).event.payload for n in range(12)}
    attempts = archived(store, hour, "attempts")
    assert len(attempts) == 24 + 8 + 1
    assert [(a["delivery_id"], a["attempt_number"], a["request_id"]) for a in attempts if a["manual"]] == [
        (dids[0], 3, "rpl_1")]
    assert {d["delivery_id"]: d["status"] for d in archived(store, hour, "deliveries")} == dict.fromkeys(
        dids, "succeeded")
    # Every row in its tenant's bucket; tenant-scoped SQL over the same files.
    for b in layout.ALL_BUCKETS:
        assert {layout.tenant_bucket(r["tenant_id"]) for r in store.read_kind(hour, b, "deliveries").to_pylist()
                } <= {b}
    assert run_query(store, TENANTS[0], hour, hour + HOUR_MS, "SELECT count(*) FROM deliveries")[1] == [(8,)]

    auditor = Auditor(archive_settings(tmp_path), session, store)
    outcome = auditor.audit(hour, int(time.time() * 1000))
    assert (outcome.state, outcome.detail) == (AUDITED, "")
    assert outcome.counts["deliveries"] == 24 and outcome.counts["events"] == 12

    # The hot TTL ends: attempts and events expire by themselves; delivery rows and lists stay.
    time.sleep(max(0.0, HOT_TTL_S + 1 - (time.monotonic() - written)))
    assert session.execute("SELECT count(*) FROM events").one()[0] == 0
    gone = hot.get_delivery(dids[0])
    assert gone is not None and gone.attempts == () and gone.summary.attempt_count == 2
    for did in dids:
        after = tiers.get_delivery(did)
        assert after is not None and after.tier == "archive"
        assert replace(after, tier="hot") == before[did]  # the whole delivery, attempts and audit included
    assert list(tiers.iter_endpoint_deliveries(TENANTS[0], f"ep-{TENANTS[0]}-1", hour, hour + HOUR_MS,
                                               None)) == listed
    rec = Reconciler(own_settings.model_copy(update={"archive": archive_settings(tmp_path)}), session, None, None,
                     lambda: 0)
    row, rec_attempts = rec._histories([dids[0]])[dids[0]]
    assert row is not None and [x["attempt_number"] for x in rec_attempts] == [1, 2, 3]

    # A replay of the delivery: its event is written back from the archive first, then queued.
    queued = Queued()
    service = DeliveryService(DeliveryDeps(endpoints=ActiveEndpoints(), history=tiers, publisher=queued,
                                           now_ms=lambda: int(time.time() * 1000), random_bytes=os.urandom,
                                           cursors=None, rehydrate=tiers.rehydrate))
    principal = Principal(tenant_id=TENANTS[1], key_id="key_ops", read_only=False)
    service.replay(principal, dids[2], "", "from the archive")
    assert [r.delivery_id for r in queued.replays] == [dids[2]]
    payload = session.execute("SELECT payload FROM events WHERE event_id='evt_a_0001'").one().payload
    assert payload == delivery(hour, "a", 1, 0).event.payload


def test_a_writer_killed_mid_run_writes_its_uncommitted_range_again_and_nothing_is_lost(
        history, session, facts, own_settings, env, tmp_path):
    hour = hour_now() - HOUR_MS
    dids = write_hour(history, session, facts, hour, 60, "k")
    group = f"arch-kill-{uuid.uuid4().hex[:6]}"
    run_env = {**os.environ, **env, "WEBHOOKS_ARCHIVE__URI": str(tmp_path), "WEBHOOKS_ARCHIVE__PUSHGATEWAY": "",
               "WEBHOOKS_ARCHIVE__WRITER_GROUP": group, "WEBHOOKS_ARCHIVE__ROLL_FACTS": "40"}

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "control_plane.archive.writer"], env=run_env, cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    proc = start()
    deadline = time.monotonic() + 60
    while not list(tmp_path.rglob("*.parquet")):  # a roll is publishing its files
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert committed(own_settings, group) != end_offsets(own_settings)  # killed before its offsets
    proc = start()
    try:
        deadline = time.monotonic() + 90
        while committed(own_settings, group) != end_offsets(own_settings):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "archive writer stopped after" in out
    store = ArchiveStore.from_settings(archive_settings(tmp_path))
    assert {d["delivery_id"] for d in archived(store, hour, "deliveries")} == set(dids)
    assert Auditor(archive_settings(tmp_path), session, store).audit(hour, int(time.time() * 1000)).state == AUDITED


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3run"))
    server.script("start")
    server.script("ready")
    yield server
    server.script("stop")


def test_an_s3_server_stopped_during_a_run_holds_the_offsets_back_and_the_writer_catches_up_after(
        history, session, facts, own_settings, s3):
    hour = hour_now() - 2 * HOUR_MS
    first = write_hour(history, session, facts, hour, 6, "s")
    archive = archive_settings(None, **s3.settings("outage"))
    with WriterThread(own_settings, archive) as w:
        w.caught_up()
        s3.script("stop")
        held = committed(own_settings, w.settings.archive.writer_group)
        more = write_hour(history, session, facts, hour, 30, "t")  # the job goes on writing
        deadline = time.monotonic() + 60
        while w.writer.lag.store_failures < 2:  # it tried, failed, waits and tries again
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert committed(own_settings, w.settings.archive.writer_group) == held  # nothing committed meanwhile
        assert w.writer.lag.seconds(time.time()) > 0
        s3.script("start")
        s3.script("ready")
        w.caught_up(timeout=180)
        assert w.writer.lag.seconds(time.time()) == 0
    store = ArchiveStore.from_settings(archive)
    assert {d["delivery_id"] for d in archived(store, hour, "deliveries")} == set(first + more)


def test_a_file_removed_by_hand_fails_the_audit_and_the_repair_writes_it_again(
        history, session, facts, own_settings, tmp_path):
    hour = hour_now() - 3 * HOUR_MS
    write_hour(history, session, facts, hour, 9, "r")
    archive = archive_settings(tmp_path)
    with WriterThread(own_settings, archive) as w:
        w.caught_up()
    store = ArchiveStore.from_settings(archive)
    auditor = Auditor(archive, session, store)
    assert auditor.audit(hour, int(time.time() * 1000)).state == AUDITED
    victim = sorted(tmp_path.rglob("attempts-*.parquet"))[0]
    victim.unlink()
    outcome = auditor.audit(hour, int(time.time() * 1000))
    assert outcome.state == FAILED and f"{victim.relative_to(tmp_path)}: missing" in outcome.detail
    assert auditor.failed_hours() >= 1  # what the audit pushes: ArchiveAuditFailed

    assert run_repair(own_settings.model_copy(update={"archive": archive}), hour) == 0
    assert victim.exists()
    assert auditor.audit(hour, int(time.time() * 1000)).state == AUDITED
    assert auditor.failed_hours() == 0


def test_a_delivery_created_again_after_its_hot_rows_expired_is_known_final_and_numbers_go_on(
        history, session, facts):
    """The re-fan-out guard with nothing written to let a delivery go: its row outlives its
    attempts (the history window vs the hot TTL), so the job's check of a delivery fan-out
    creates again (an old savepoint, the events topic read again) finds it final, and a later
    attempt takes a number none of the archived ones has (manual ones included)."""
    import asyncio

    hour = hour_now() - 4 * HOUR_MS
    written = time.monotonic()
    dids = write_hour(history, session, facts, hour, 1, "g")  # dids[0]: 503, 200, then a manual 3
    time.sleep(max(0.0, HOT_TTL_S + 1 - (time.monotonic() - written)))
    rows = session.execute("SELECT attempt_number FROM delivery_history WHERE delivery_id=%s", (dids[0],))
    assert [r.attempt_number for r in rows] == [None]  # the delivery's row alone: every attempt row expired
    first = asyncio.run(history.check(dids[0]))
    assert (first.status, first.auto_retry_active, first.max_attempt_number) == ("succeeded", False, 3)
    other = asyncio.run(history.check(dids[1]))  # one automatic attempt, no manual one
    assert (other.status, other.max_attempt_number) == ("succeeded", 1)


def test_deliveries_whose_facts_never_reached_the_topic_fail_the_audit_and_are_written_from_their_hot_rows(
        history, session, facts, own_settings, tmp_path):
    from control_plane.store import CassandraStore

    hour = hour_now() - 5 * HOUR_MS
    dids = write_hour(history, session, facts, hour, 3, "m")
    dropping = CassandraHistory(own_settings.cassandra, 300, [])  # a writer whose facts go nowhere
    try:
        lost = write_hour(dropping, session, facts, hour, 1, "n")
    finally:
        dropping.close()
    archive = archive_settings(tmp_path)
    with WriterThread(own_settings, archive) as w:
        w.caught_up()
    store = ArchiveStore.from_settings(archive)
    auditor = Auditor(archive, session, store)
    outcome = auditor.audit(hour, int(time.time() * 1000))
    assert outcome.state == FAILED and "deliveries: 2 of 8 not archived" in outcome.detail
    assert auditor.repair(hour) == 2
    assert auditor.audit(hour, int(time.time() * 1000)).state == AUDITED
    # What the repair archived reads as the hot tier had it.
    hot = CassandraStore(session)
    for did in lost:
        archived_attempts = [a for a in archived(store, hour, "attempts") if a["delivery_id"] == did]
        assert sorted(a["attempt_number"] for a in archived_attempts) == [
            a.attempt_number for a in hot.get_delivery(did).attempts]
    assert {d["delivery_id"] for d in archived(store, hour, "deliveries")} == set(dids + lost)
    assert {e["event_id"] for e in archived(store, hour, "events")} >= {"evt_n_0000"}
