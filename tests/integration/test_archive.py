"""The archive tier on the real Cassandra: an hour of history written by the job's own history
store (retries, a manual replay with its audit row), archived to Parquet in a local directory,
verified, released; faults: the archiver SIGKILLed mid-hour, a manifest that disagrees with
Cassandra. A keyspace of this module's own; no job, no Kafka."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from cassandra.cluster import Session

from control_plane.archive_store import ArchiveStore, ArchiveUnavailable
from control_plane.archiver import FAILED, RELEASED, Archiver
from core import archive_layout as layout
from core.dispatch import AttemptRecord, Intent
from core.fanout import FanoutSnapshot, NewDelivery
from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, ArchiveSettings, Settings
from operators.history_store import CassandraHistory
from stack.isolation import isolated_env, settings_with
from tests.integration.helpers import durable

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
# An hour five days ago: closed, older than archive_after (3 days), inside the 30-day window.
HOUR = (int(time.time() * 1000) - 5 * 86_400_000) // HOUR_MS * HOUR_MS
TENANTS = ("t-arch-a", "t-arch-b", "t-arch-d")  # tenant buckets 5, 13 and 10: odd and even


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return isolated_env(f"arch-{uuid.uuid4().hex[:8]}", own_keyspace=True)


@pytest.fixture(scope="module")
def own_settings(env: dict[str, str]) -> Settings:
    return settings_with(env)





def attempt(i: Intent, at_ms: int, outcome: str, status: str | None, http: int, manual: bool = False,
            **kw: Any) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=True, started_at_ms=at_ms - 40, finished_at_ms=at_ms, http_status=http, outcome=outcome,
        error_class=None if http == 200 else "http_5xx", detail="", manual=manual, delivery_status=status,
        next_attempt_at_ms=at_ms + 5000 if status == "pending" else None, auto_retry_active=status == "pending",
        url="https://hooks.example.com/in", endpoint_config_version=2, latency_ms=40, signing_key_versions=(1,),
        response_prefix="ok" if http == 200 else "busy", **kw)


def delivery(hour_ms: int, tag: str, n: int, k: int) -> NewDelivery:
    """The delivery of the hour's event ``n`` to its tenant's endpoint ``k`` (write_hour's)."""
    tenant = TENANTS[n % len(TENANTS)]
    arrived = hour_ms + 1000 + n * 37
    e = EventRecord(event_id=f"evt_{tag}_{n:04d}", tenant_id=tenant, event_type="invoice.paid",
                    schema_version="1", object_id=f"inv_{n}", object_version=n, occurred_at_ms=arrived - 5,
                    payload=b'{"id": "inv_%d", "amount": %d, "pad": "%s"}' % (n, n * 100, b"x" * 1400))
    ep = f"ep-{tenant}-{k + 1}"
    return NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep, tenant_id=tenant,
                       endpoint_config_version=2, created_at_ms=arrived, expires_at_ms=arrived + 86_400_000)


def write_hour(history: CassandraHistory, session: Session, hour_ms: int, events: int, tag: str) -> list[str]:
    """``events`` events of the hour, each to two endpoints of its tenant: every third delivery
    retried once before succeeding, the first one also replayed by hand (with its audit row)."""
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
            if n == 0 and k == 0:  # a manual replay a day later, audited first as the control plane does
                later = arrived + 86_400_000
                session.execute(
                    "INSERT INTO replay_requests (delivery_id, request_id, tenant_id, requested_by, requested_at,"
                    " reason, action) VALUES (%s, 'rpl_1', %s, 'key_ops', %s, 'customer asked', 'replay')",
                    (d.delivery_id, tenant, later))
                i3 = Intent(3, f"att_{uuid.uuid4().hex}")
                waits.append(history.reserve(d, i3, later))
                waits.append(history.record(d, attempt(i3, later + 50, "succeeded", None, 200, manual=True,
                                                       requested_by="key_ops", request_id="rpl_1"), 3, None))
        durable(history, *waits)
    return dids


def archiver(session: Session, root: Path | None, **kw: Any) -> Archiver:
    s = ArchiveSettings(**({"uri": str(root)} if root is not None else {}), pushgateway="", **kw)
    return Archiver(s, 30 * 86_400, session, ArchiveStore.from_settings(s))


class S3Server:
    """A real S3-compatible server (S3Proxy) of this module's own, started and stopped by the
    project's script (stack/s3proxy.sh) in a run directory of its own."""

    def __init__(self, run_dir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.run_dir = run_dir
        self.data = run_dir / "s3proxy" / "data"

    def script(self, action: str) -> None:
        env = {**os.environ, "WEBHOOKS_RUN_DIR": str(self.run_dir), "WEBHOOKS_S3PROXY_PORT": str(self.port)}
        subprocess.run([str(REPO_ROOT / "stack/s3proxy.sh"), action], env=env, check=True, capture_output=True,
                       timeout=120)

    def settings(self, prefix: str) -> dict[str, Any]:
        return {"uri": f"s3://archive/{prefix}", "s3_endpoint": f"127.0.0.1:{self.port}", "s3_scheme": "http",
                "s3_access_key": "local-identity", "s3_secret_key": "local-credential"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3run"))
    server.script("start")
    server.script("ready")
    yield server
    server.script("stop")


def table(root: Path, kind: str) -> list[dict[str, Any]]:
    files = sorted(root.glob(f"date=*/hour=*/tenant_bucket=*/{kind}.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def hot_delivery(session: Session, did: str) -> list[Any]:
    return list(session.execute("SELECT * FROM delivery_history WHERE delivery_id=%s", (did,)))


def test_an_hour_is_archived_verified_and_released_and_its_hot_rows_expire(history, session, tmp_path):
    dids = write_hour(history, session, HOUR, 24, "a")
    expected = {"events": 24, "deliveries": 48, "attempts": 48 + 16 + 1, "replays": 1}
    a = archiver(session, tmp_path / "one", release_ttl_s=2)

    manifest = a.archive(HOUR)
    assert manifest.counts() == expected
    assert a.verify(HOUR) == []
    # Idempotent: the same hour archived again elsewhere is the same bytes, file by file.
    again = archiver(session, tmp_path / "two").archive(HOUR)
    assert again.to_json() == manifest.to_json()
    for f in manifest.files:
        assert (tmp_path / "one" / f.path).read_bytes() == (tmp_path / "two" / f.path).read_bytes()

    # The payload bytes are archived exactly as stored, and every row sits in its tenant's bucket.
    stored = {r.event_id: bytes(r.payload) for r in session.execute("SELECT event_id, payload FROM events")}
    events = table(tmp_path / "one", "events")
    assert {r["event_id"]: r["payload"] for r in events} == stored
    for f in manifest.files:
        rows = pq.read_table(tmp_path / "one" / f.path).to_pylist()
        assert {layout.tenant_bucket(r["tenant_id"]) for r in rows} == {f.bucket}
        assert hashlib.sha256((tmp_path / "one" / f.path).read_bytes()).hexdigest() == f.sha256
    manual = [r for r in table(tmp_path / "one", "attempts") if r["manual"]]
    assert [(r["delivery_id"], r["attempt_number"], r["request_id"]) for r in manual] == [(dids[0], 3, "rpl_1")]

    outcome = a.run_hour(HOUR, int(time.time() * 1000))
    assert (outcome.state, outcome.counts) == (RELEASED, expected)
    assert a.state(HOUR) == RELEASED
    pointer = session.execute("SELECT tenant_id, hour FROM archived_deliveries WHERE delivery_id=%s",
                              (dids[0],)).one()
    assert pointer.tenant_id == TENANTS[0]
    time.sleep(3)
    assert hot_delivery(session, dids[0]) == [] and hot_delivery(session, dids[-1]) == []
    assert list(session.execute("SELECT * FROM events WHERE event_id='evt_a_0000'")) == []
    assert list(session.execute("SELECT * FROM replay_requests WHERE delivery_id=%s", (dids[0],))) == []
    # The endpoint index stays hot (see control_plane/archiver.py): lists still find the rows.
    assert session.execute("SELECT count(*) FROM endpoint_deliveries").one()[0] == 48
    # A released hour is never archived again (its hot rows are gone: it would look empty).
    assert a.run_hour(HOUR, int(time.time() * 1000)).state == RELEASED
    assert a.archive(HOUR).to_json() == manifest.to_json()


def test_a_manifest_disagreeing_with_cassandra_keeps_the_hour_hot_and_the_next_run_archives_it_again(
        history, session, tmp_path):
    hour = HOUR - HOUR_MS
    dids = write_hour(history, session, hour, 6, "b")
    a = archiver(session, tmp_path, release_ttl_s=1)
    a.archive(hour)
    # A write the archive does not have (a replay's attempt landing between archive and verify).
    session.execute("INSERT INTO delivery_history (delivery_id, attempt_number, outcome) VALUES (%s, 9, 'reserved')",
                    (dids[1],))
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == FAILED and "attempts: archive" in outcome.detail
    assert a.state(hour) == FAILED and a.failed_hours() >= 1
    time.sleep(2)
    ttl = session.execute("SELECT TTL(event_id) FROM delivery_history WHERE delivery_id=%s LIMIT 1",
                          (dids[0],)).one()[0]
    assert ttl > 86_400  # untouched: the 30-day TTL
    assert session.execute("SELECT * FROM archived_deliveries WHERE delivery_id=%s", (dids[0],)).one() is None
    # The next run archives the failed hour again (none of it was let go): the late row is in, and the hour goes.
    again = a.run_hour(hour, int(time.time() * 1000))
    assert again.state == RELEASED and again.counts["attempts"] == outcome.counts["attempts"] + 1
    assert a.state(hour) == RELEASED and a.failed_hours() == 0
    assert (dids[1], 9) in {(r["delivery_id"], r["attempt_number"]) for r in table(tmp_path, "attempts")}


def test_an_archiver_killed_mid_hour_is_completed_by_the_next_run(history, session, env, tmp_path):
    hour = HOUR - 2 * HOUR_MS
    write_hour(history, session, hour, 300, "c")
    run_env = {**os.environ, **env, "WEBHOOKS_ARCHIVE__URI": str(tmp_path), "WEBHOOKS_ARCHIVE__PUSHGATEWAY": "",
               "WEBHOOKS_ARCHIVE__PAGE_SIZE": "5", "WEBHOOKS_ARCHIVE__ROW_GROUP_ROWS": "10"}
    hour_arg = time.strftime("%Y-%m-%dT%H:00Z", time.gmtime(hour / 1000))
    cmd = [sys.executable, "-m", "control_plane.archiver", "--hour", hour_arg]
    proc = subprocess.Popen(cmd, env=run_env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not list(tmp_path.rglob("*.tmp-*")):  # it is writing its first files
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / layout.manifest_path(hour)).exists()  # nothing looks complete

    done = subprocess.run(cmd, env=run_env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " released " in done.stdout
    assert not list(tmp_path.rglob("*.tmp-*"))
    delivery_ids = [r["delivery_id"] for r in table(tmp_path, "deliveries")]
    assert len(delivery_ids) == len(set(delivery_ids)) == 600
    attempts = [(r["delivery_id"], r["attempt_number"]) for r in table(tmp_path, "attempts")]
    assert len(attempts) == len(set(attempts)) == 600 + 200 + 1


def hot_ttl(session: Session, did: str) -> int:
    return session.execute("SELECT TTL(event_id) FROM delivery_history WHERE delivery_id=%s LIMIT 1", (did,)).one()[0]


def test_the_s3_path_writes_the_same_archive_and_releases_the_hour(history, session, s3, tmp_path):
    hour = HOUR - 3 * HOUR_MS
    dids = write_hour(history, session, hour, 12, "d")
    local = archiver(session, tmp_path).archive(hour)
    remote = archiver(session, None, **s3.settings("same"), release_ttl_s=1)
    assert remote.archive(hour).to_json() == local.to_json()
    for f in local.files:  # the objects are the very bytes written locally
        assert (s3.data / "archive" / "same" / f.path).read_bytes() == (tmp_path / f.path).read_bytes()
    assert remote.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(2)
    assert hot_delivery(session, dids[0]) == []


def test_an_s3_server_stopped_during_a_run_fails_it_loudly_and_nothing_expires(history, session, s3):
    hour = HOUR - 4 * HOUR_MS
    dids = write_hour(history, session, hour, 300, "e")
    a = archiver(session, None, **s3.settings("outage"), page_size=5, row_group_rows=10, release_ttl_s=1)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            a.run_hour(hour, int(time.time() * 1000))
        except BaseException as exc:  # noqa: BLE001 -- the test inspects it
            failure.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while not list((s3.data / "archive").rglob("*.tmp-*")):  # it is writing the hour's first objects
        assert worker.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    s3.script("stop")
    worker.join(timeout=180)
    assert not worker.is_alive()
    assert failure and isinstance(failure[0], ArchiveUnavailable), failure
    assert a.state(hour) != RELEASED
    assert not (s3.data / "archive" / "outage" / layout.manifest_path(hour)).exists()
    assert hot_ttl(session, dids[0]) > 86_400 and hot_ttl(session, dids[-1]) > 86_400  # nothing expires

    s3.script("start")
    s3.script("ready")
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == RELEASED and outcome.counts["deliveries"] == 600
    assert not list((s3.data / "archive" / "outage").rglob("*.tmp-*"))


def test_get_and_list_answer_the_same_from_the_archive_and_a_rehydrated_delivery_reads_as_before(
        history, session, tmp_path):
    from dataclasses import replace

    from control_plane.store import CassandraStore
    from control_plane.tiered_history import TieredHistory

    hour = HOUR - 5 * HOUR_MS
    dids = write_hour(history, session, hour, 9, "f")
    hot = CassandraStore(session)
    a = archiver(session, tmp_path, release_ttl_s=1)
    tiers = TieredHistory(hot, session, ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path))), 30 * 86_400)
    before = {did: hot.get_delivery(did) for did in dids}
    d0 = before[dids[0]]
    assert d0 is not None and d0.tier == "hot" and [a.manual for a in d0.attempts] == [False, False, True]

    def listed() -> list[Any]:
        return list(tiers.iter_endpoint_deliveries(d0.summary.tenant_id, d0.summary.endpoint_id, hour, hour + HOUR_MS,
                                                   None))

    list_before = listed()
    assert a.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(2)
    assert all(hot.get_delivery(did) is None for did in dids)  # the hot rows are gone
    for did in dids:
        after = tiers.get_delivery(did)
        assert after is not None and after.tier == "archive"
        assert replace(after, tier="hot") == before[did]  # the whole delivery, attempts and audit included
    assert listed() == list_before
    assert tiers.get_delivery("dlv_unknown") is None

    tiers.rehydrate(dids[0], int(time.time() * 1000))
    back = hot.get_delivery(dids[0])
    assert back == before[dids[0]]
    payload = session.execute("SELECT payload FROM events WHERE event_id='evt_f_0000'").one().payload
    assert payload.startswith(b'{"id": "inv_0"')


def replay_by_hand(history: CassandraHistory, session: Session, d: NewDelivery, number: int, at_ms: int,
                   request_id: str) -> None:
    """A manual replay as the platform writes it: the control plane's audit row, then the job's
    reservation and outcome of the new attempt (and the delivery's new status)."""
    from control_plane.domain import ReplayAudit
    from control_plane.store import CassandraStore

    CassandraStore(session).record_replay(ReplayAudit(d.delivery_id, request_id, d.tenant_id, "key_ops", at_ms,
                                                      "late replay"), if_new=True)
    i = Intent(number, f"att_{uuid.uuid4().hex}")
    durable(history, history.reserve(d, i, at_ms))
    durable(history, history.record(d, attempt(i, at_ms + 50, "succeeded", "succeeded", 200, manual=True,
                                               requested_by="key_ops", request_id=request_id), number, None))


def test_a_replay_landing_between_verification_and_release_keeps_its_delivery_whole(
        history, session, own_settings, tmp_path, monkeypatch):
    from control_plane.reconcile import Reconciler
    from control_plane.store import CassandraStore
    from control_plane.tiered_history import TieredHistory

    hour = HOUR - 6 * HOUR_MS
    dids = write_hour(history, session, hour, 4, "g")
    late = delivery(hour, "g", 0, 1)  # dids[1]: one attempt so far
    hot = CassandraStore(session)
    a = archiver(session, tmp_path, release_ttl_s=2)
    verify = a.verify

    def verify_then_replay(*args: Any) -> list[str]:
        problems = verify(*args)
        replay_by_hand(history, session, late, 2, int(time.time() * 1000), "rpl_late")  # after verification
        return problems

    monkeypatch.setattr(a, "verify", verify_then_replay)
    assert a.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    before = hot.get_delivery(late.delivery_id)
    assert before is not None and [(x.attempt_number, x.manual) for x in before.attempts] == [(1, False), (2, True)]
    time.sleep(3)  # past the release TTL

    tiers = TieredHistory(hot, session, ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path))), 30 * 86_400)
    assert tiers.get_delivery(late.delivery_id) == before  # nothing of it expired: the replay is still there
    assert [r.request_id for r in before.replays] == ["rpl_late"]
    # Its event's payload stays hot too (a further replay reads it there).
    assert session.execute("SELECT payload FROM events WHERE event_id='evt_g_0000'").one() is not None
    # The rest of the hour was released as usual.
    assert hot.get_delivery(dids[2]) is None and tiers.get_delivery(dids[2]).tier == "archive"
    # Reconciliation's read of the hour finds every delivery, each whole, in one tier or the other.
    rec = Reconciler(own_settings.model_copy(update={"archive": ArchiveSettings(uri=str(tmp_path))}), session,
                     None, None, lambda: 0)
    seen = rec._histories(dids)
    assert all(row is not None and row["event_id"] is not None for row, _ in seen.values())
    assert [x["attempt_number"] for x in seen[late.delivery_id][1]] == [1, 2]


def test_two_shards_share_an_hour_into_the_same_archive_as_one_process(history, session, tmp_path):
    hour = HOUR - 7 * HOUR_MS
    dids = write_hour(history, session, hour, 30, "h")  # 30 events, of tenants in odd and even buckets
    one = archiver(session, tmp_path / "one").archive(hour)
    assert one is not None
    first, second = (Archiver(ArchiveSettings(uri=str(tmp_path / "two"), pushgateway="", release_ttl_s=2), 30 * 86_400,
                              session, ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path / "two"))),
                              (i, 2)) for i in range(2))
    assert first.archive(hour) is None  # its buckets written; the hour is not complete without the others
    assert not (tmp_path / "two" / layout.manifest_path(hour)).exists()
    assert first.run_hour(hour, int(time.time() * 1000)).state == "archived"  # nothing released meanwhile
    assert all(hot_ttl(session, did) > 86_400 for did in dids)

    second_out = second.run_hour(hour, int(time.time() * 1000))  # completes the hour, releases its buckets
    assert second_out.state == RELEASED and second.state(hour) != RELEASED  # the first shard's are still hot
    first_out = first.run_hour(hour, int(time.time() * 1000))
    assert first_out.state == RELEASED and first.state(hour) == RELEASED
    # Together the shards wrote what one process writes: the same manifest and the same bytes.
    shared = ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path / "two"))).manifest(hour)
    assert shared is not None and shared.to_json() == one.to_json()
    for f in one.files:
        assert (tmp_path / "one" / f.path).read_bytes() == (tmp_path / "two" / f.path).read_bytes()
    assert {k: first_out.counts[k] + second_out.counts[k] for k in layout.KINDS} == one.counts()
    assert first_out.counts["deliveries"] == 20 and second_out.counts["deliveries"] == 40  # bucket 10 | 5, 13
    attempts = [(r["delivery_id"], r["attempt_number"]) for r in table(tmp_path / "two", "attempts")]
    assert len(attempts) == len(set(attempts)) == 60 + 20 + 1
    assert len({r["delivery_id"] for r in table(tmp_path / "two", "deliveries")}) == 60
    time.sleep(3)
    assert all(hot_delivery(session, did) == [] for did in dids)  # every bucket released, by its own shard


def test_a_replay_landing_between_the_releases_read_and_its_rewrite_is_restored(history, session, tmp_path):
    from control_plane.store import CassandraStore

    hour = HOUR - 8 * HOUR_MS
    write_hour(history, session, hour, 2, "i")
    late = delivery(hour, "i", 1, 0)
    a = archiver(session, tmp_path, release_ttl_s=2)
    reader = a._releaser._reader

    class RacingReader:  # the releaser's reader only: archive and verify read as usual
        def held(self, parts: dict[str, Any], *args: Any) -> Any:
            out = reader.held(parts, *args)  # the release has read the rows it will rewrite, and compared them
            if late.delivery_id in parts:
                replay_by_hand(history, session, late, 2, int(time.time() * 1000), "rpl_racing")
            return out

    a._releaser._reader = RacingReader()
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == RELEASED and outcome.detail == "1 deliveries changed after verification stay hot"
    time.sleep(3)  # past the release TTL
    d = CassandraStore(session).get_delivery(late.delivery_id)
    assert d is not None and d.tier == "hot" and d.summary.event_id == "evt_i_0001"
    assert [(x.attempt_number, x.manual) for x in d.attempts] == [(1, False), (2, True)]
    assert [r.request_id for r in d.replays] == ["rpl_racing"]
    assert session.execute("SELECT payload FROM events WHERE event_id='evt_i_0001'").one() is not None
    assert hot_ttl(session, late.delivery_id) > 86_400  # restored with the TTL it had, not the release's


def tiered(session: Session, root: Path) -> Any:
    from control_plane.store import CassandraStore
    from control_plane.tiered_history import TieredHistory

    return TieredHistory(CassandraStore(session), session, ArchiveStore.from_settings(ArchiveSettings(uri=str(root))),
                         30 * 86_400)


class ActiveEndpoints:
    """The control plane's endpoint store as a replay sees it: every endpoint active."""

    def get_endpoint(self, tenant_id: str, endpoint_id: str) -> Any:
        from types import SimpleNamespace

        from core.records import EndpointStatus

        return SimpleNamespace(status=EndpointStatus.ACTIVE)


class Queued:
    def __init__(self) -> None:
        self.replays: list[Any] = []

    def publish_replay(self, request: Any) -> None:
        self.replays.append(request)


def replays_of(tiers: Any) -> tuple[Any, Queued]:
    """The control plane's replay (DeliveryService over ``tiers``, rehydrating as the server wires
    it); what it queues for the job is kept, the job's writes are replay_by_hand's."""
    from control_plane.deliveries import DeliveryDeps, DeliveryService

    queued = Queued()
    return DeliveryService(DeliveryDeps(endpoints=ActiveEndpoints(), history=tiers, publisher=queued,
                                        now_ms=lambda: int(time.time() * 1000), random_bytes=os.urandom,
                                        cursors=None, rehydrate=tiers.rehydrate)), queued


def test_a_replay_after_release_keeps_the_delivery_readable_whole(history, session, own_settings, tmp_path):
    from control_plane.reconcile import Reconciler
    from control_plane.store import CassandraStore

    hour = HOUR - 9 * HOUR_MS
    write_hour(history, session, hour, 2, "j")
    late = delivery(hour, "j", 1, 0)
    a = archiver(session, tmp_path, release_ttl_s=2)
    assert a.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    # The job's writes of a replay within the release TTL, not gated by the control plane (one it let
    # through before the release reached the delivery, landing after the release's last read).
    replay_by_hand(history, session, late, 2, int(time.time() * 1000), "rpl_after")
    time.sleep(3)
    partial = CassandraStore(session).get_delivery(late.delivery_id)
    assert partial is not None and partial.summary.tenant_id == ""  # the hot partition alone: no creation cells
    assert [x.attempt_number for x in partial.attempts] == [2]
    d = tiered(session, tmp_path).get_delivery(late.delivery_id)
    assert d is not None and d.summary.tenant_id == late.tenant_id and d.summary.event_id == "evt_j_0001"
    assert d.tier == "archive" and d.summary.status.value == "succeeded" and d.summary.attempt_count == 2
    assert [(x.attempt_number, x.manual) for x in d.attempts] == [(1, False), (2, True)]
    assert [r.request_id for r in d.replays] == ["rpl_after"]
    # Reconciliation's read merges the same way: the delivery is whole, not a status-only row.
    rec = Reconciler(own_settings.model_copy(update={"archive": ArchiveSettings(uri=str(tmp_path))}), session,
                     None, None, lambda: 0)
    row, attempts = rec._histories([late.delivery_id])[late.delivery_id]
    assert row is not None and row["event_id"] == "evt_j_0001" and row["attempt_count"] == 2
    assert [x["attempt_number"] for x in attempts] == [1, 2]


def test_a_replay_within_the_release_ttl_rehydrates_the_delivery_for_its_whole_window(history, session, tmp_path):
    from control_plane.domain import Principal
    from control_plane.store import CassandraStore

    hour = HOUR - 10 * HOUR_MS
    write_hour(history, session, hour, 2, "k")
    d = delivery(hour, "k", 1, 0)
    hot = CassandraStore(session)
    assert archiver(session, tmp_path, release_ttl_s=2).run_hour(hour, int(time.time() * 1000)).state == RELEASED
    service, queued = replays_of(tiered(session, tmp_path))
    ops = Principal(d.tenant_id, "key_ops", read_only=False)
    assert service.get(ops, d.delivery_id).tier == "hot"  # the released rows still answer
    service.replay(ops, d.delivery_id, "rpl_k1")
    replay_by_hand(history, session, d, 2, int(time.time() * 1000), "rpl_k1")  # the job, as the request asks
    time.sleep(3)  # past the release TTL
    first = hot.get_delivery(d.delivery_id)  # Cassandra alone: brought back whole, with the full TTL
    assert first is not None and first.summary.tenant_id == d.tenant_id and first.summary.attempt_count == 2
    assert [(x.attempt_number, x.manual) for x in first.attempts] == [(1, False), (2, True)]
    assert hot_ttl(session, d.delivery_id) > 86_400
    assert session.execute("SELECT payload FROM events WHERE event_id='evt_k_0001'").one() is not None
    # Replayed again (the archive still holds it: rehydrated again, idempotent): nothing older wins.
    service.replay(ops, d.delivery_id, "rpl_k2")
    replay_by_hand(history, session, d, 3, int(time.time() * 1000), "rpl_k2")
    again = hot.get_delivery(d.delivery_id)
    assert again is not None and again.summary.attempt_count == 3 and again.summary.updated_at_ms is not None
    assert again.summary.updated_at_ms > first.summary.updated_at_ms  # the job's newer status, not the archived one
    assert [x.attempt_number for x in again.attempts] == [1, 2, 3]
    assert [r.request_id for r in again.replays] == ["rpl_k1", "rpl_k2"]
    assert [r.request_id for r in queued.replays] == ["rpl_k1", "rpl_k2"]


def test_a_replay_after_the_released_rows_expired_rehydrates_a_partial_or_gone_delivery(
        history, session, tmp_path):
    from control_plane.domain import Principal
    from control_plane.store import CassandraStore

    hour = HOUR - 11 * HOUR_MS
    write_hour(history, session, hour, 2, "l")
    partial, gone = delivery(hour, "l", 1, 0), delivery(hour, "l", 1, 1)
    hot = CassandraStore(session)
    assert archiver(session, tmp_path, release_ttl_s=2).run_hour(hour, int(time.time() * 1000)).state == RELEASED
    replay_by_hand(history, session, partial, 2, int(time.time() * 1000), "rpl_l1")  # hot rows of its own
    time.sleep(3)
    service, queued = replays_of(tiered(session, tmp_path))
    for d, number in ((partial, 3), (gone, 2)):
        ops = Principal(d.tenant_id, "key_ops", read_only=False)
        before = service.get(ops, d.delivery_id)
        assert before.tier == "archive"
        service.replay(ops, d.delivery_id, f"rpl_l{number}")
        back = hot.get_delivery(d.delivery_id)  # before the job reads it: whole in Cassandra
        assert back is not None and back.summary == before.summary and back.attempts == before.attempts
        replay_by_hand(history, session, d, number, int(time.time() * 1000), f"rpl_l{number}")
        after = hot.get_delivery(d.delivery_id)
        assert after is not None and [x.attempt_number for x in after.attempts] == list(range(1, number + 1))
    assert [r.delivery_id for r in queued.replays] == [partial.delivery_id, gone.delivery_id]


def test_a_replay_requested_between_the_releases_pointer_and_its_rewrite_keeps_the_delivery_hot(
        history, session, tmp_path):
    """The pointer exists, so the replay rehydrates (+2 us, full TTL) before the rewrite (+1 us,
    short TTL) lands under it; the release's second read sees the delivery changed (its audit row
    alone would) and restores the rest: whole and hot, whichever of the two writes came first."""
    from control_plane.domain import Principal
    from control_plane.store import CassandraStore

    hour = HOUR - 12 * HOUR_MS
    write_hour(history, session, hour, 2, "m")
    d = delivery(hour, "m", 1, 0)
    a = archiver(session, tmp_path, release_ttl_s=2)
    service, _ = replays_of(tiered(session, tmp_path))
    run_all = a._releaser._run_all

    def pointers_then_replay(writes: list[Any]) -> None:
        run_all(writes)
        if writes and "archived_deliveries" in writes[0][0].query_string:  # the pointers, before the rewrite
            service.replay(Principal(d.tenant_id, "key_ops", read_only=False), d.delivery_id, "rpl_m1")

    a._releaser._run_all = pointers_then_replay
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == RELEASED and outcome.detail == "1 deliveries changed after verification stay hot"
    replay_by_hand(history, session, d, 2, int(time.time() * 1000), "rpl_m1")
    time.sleep(3)  # past the release TTL
    after = CassandraStore(session).get_delivery(d.delivery_id)
    assert after is not None and after.summary.tenant_id == d.tenant_id and after.tier == "hot"
    assert [(x.attempt_number, x.manual) for x in after.attempts] == [(1, False), (2, True)]
    assert hot_ttl(session, d.delivery_id) > 86_400


def test_a_bulk_recovery_rehydrates_the_archived_deliveries_it_replays(history, session, tmp_path):
    from control_plane.domain import Principal
    from control_plane.store import CassandraStore

    hour = HOUR - 13 * HOUR_MS
    pair = [delivery(hour, "n", 0, k) for k in range(2)]  # one event to both endpoints of its tenant
    e = pair[0].event
    waits = [history.write_snapshot(FanoutSnapshot(e.event_id, e.tenant_id, pair[0].created_at_ms,
                                                   tuple((d.endpoint_id, 2) for d in pair)))]
    for k, d in enumerate(pair):  # the first failed for good, the second succeeded
        i = Intent(1, f"att_{uuid.uuid4().hex}")
        waits.append(history.persist(d, i, write_event=k == 0))
        waits.append(history.record(d, attempt(i, d.created_at_ms + 100, *(("failed", "failed", 500) if k == 0 else
                                                                         ("succeeded", "succeeded", 200))), 1, None))
    durable(history, *waits)
    assert archiver(session, tmp_path, release_ttl_s=2).run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(3)  # the released rows expired: the job could not load them
    hot = CassandraStore(session)
    assert hot.get_delivery(pair[0].delivery_id) is None
    service, queued = replays_of(tiered(session, tmp_path))
    progress = list(service.recover(Principal(e.tenant_id, "key_ops", read_only=False), pair[0].endpoint_id, hour,
                                    hour + HOUR_MS))
    assert (progress[-1].total, progress[-1].replayed, progress[-1].done) == (1, 1, True)
    assert [r.delivery_id for r in queued.replays] == [pair[0].delivery_id]
    back = hot.get_delivery(pair[0].delivery_id)  # whole in Cassandra before the job reads it
    assert back is not None and back.summary.status.value == "failed" and back.summary.tenant_id == e.tenant_id
    assert session.execute("SELECT payload FROM events WHERE event_id=%s", (e.event_id,)).one() is not None
    assert hot.get_delivery(pair[1].delivery_id) is None  # not replayed, not brought back


def endpoint_row(session: Session, tenant: str, endpoint_id: str) -> None:
    """The control plane's row of an endpoint (the registry every endpoint of the platform is in)."""
    session.execute("INSERT INTO endpoints (tenant_id, endpoint_id, status, config_version) VALUES (%s, %s, 'active',"
                    " 2)", (tenant, endpoint_id))


def write_skips(history: CassandraHistory, session: Session, hour_ms: int, tag: str) -> tuple[list[str], list[str]]:
    """Three events of one tenant to its two endpoints, the second pinned to another schema major:
    events 0 and 1 go to the first (succeeded) and are skipped by the second; event 2 is skipped
    by both (no delivery is sent, no event row is written). 6 delivery rows: 2 succeeded, 4
    skipped. (sent ids, skipped ids)"""
    from core.fanout import SkippedDelivery

    tenant = TENANTS[0]
    eps = (f"ep-{tag}-open", f"ep-{tag}-pinned")
    for ep in eps:
        endpoint_row(session, tenant, ep)
    sent, skipped, waits = [], [], []
    for n in range(3):
        arrived = hour_ms + 1000 + n * 37
        e = EventRecord(event_id=f"evt_{tag}_{n:04d}", tenant_id=tenant, event_type="invoice.paid",
                        schema_version="1", object_id=f"inv_{n}", object_version=n, occurred_at_ms=arrived - 5,
                        payload=b'{"id": "inv_%d"}' % n)
        chosen = eps[:1] if n < 2 else ()
        skips = tuple(SkippedDelivery(delivery_id_for(e.event_id, ep), ep, 2, e.event_type,
                                      "schema major 1 not accepted (pinned: 2)") for ep in eps if ep not in chosen)
        skipped += [k.delivery_id for k in skips]
        waits.append(history.write_snapshot(FanoutSnapshot(e.event_id, tenant, arrived,
                                                           tuple((ep, 2) for ep in chosen), skipped=skips)))
        for ep in chosen:
            d = NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep, tenant_id=tenant,
                            endpoint_config_version=2, created_at_ms=arrived, expires_at_ms=arrived + 86_400_000)
            i = Intent(1, f"att_{uuid.uuid4().hex}")
            waits.append(history.persist(d, i))
            waits.append(history.record(d, attempt(i, arrived + 100, "succeeded", "succeeded", 200), 1, None))
            sent.append(d.delivery_id)
    durable(history, *waits)
    return sent, skipped


def test_skipped_deliveries_are_archived_verified_and_read_from_the_archive_after_release(
        history, session, tmp_path):
    hour = HOUR - 14 * HOUR_MS
    sent, skipped = write_skips(history, session, hour, "p")
    a = archiver(session, tmp_path, release_ttl_s=1)
    manifest = a.archive(hour)
    assert manifest is not None and manifest.counts() == {"events": 2, "deliveries": 6, "attempts": 2, "replays": 0}
    archived = {r["delivery_id"]: r["status"] for r in table(tmp_path, "deliveries")}
    assert archived == {**dict.fromkeys(sent, "succeeded"), **dict.fromkeys(skipped, "skipped")}
    assert a.verify(hour) == []
    assert a.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(2)  # past the release TTL: the skipped rows are in the archive alone
    tiers = tiered(session, tmp_path)
    for did in skipped:
        d = tiers.get_delivery(did)
        assert d is not None and d.tier == "archive" and d.summary.status.value == "skipped", did
        assert d.last_error_class == "schema major 1 not accepted (pinned: 2)"


@pytest.mark.parametrize("drop", ["skipped rows", "one delivery row"])
def test_verification_fails_an_hour_whose_reader_left_rows_out(history, session, tmp_path, monkeypatch, drop):
    """Verification counts the hour from the endpoint index, not from the writer's enumeration: a
    kind of row (or a row) the reader leaves out fails the hour instead of passing it."""
    hour = HOUR - (15 if drop == "skipped rows" else 16) * HOUR_MS
    sent, skipped = write_skips(history, session, hour, "q" if drop == "skipped rows" else "r")
    a = archiver(session, tmp_path, release_ttl_s=1)
    rows = a._reader.rows

    def leaving_out(*args: Any, **kw: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        for kind, row in rows(*args, **kw):
            if kind == "deliveries" and (row["status"] == "skipped" if drop == "skipped rows"
                                         else row["delivery_id"] == sent[0]):
                continue
            if kind == "attempts" and drop != "skipped rows" and row["delivery_id"] == sent[0]:
                continue
            yield kind, row

    monkeypatch.setattr(a._reader, "rows", leaving_out)
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == FAILED and "deliveries: archive" in outcome.detail, outcome
    assert hot_ttl(session, sent[0]) > 86_400  # nothing released


def test_a_release_that_failed_part_way_is_resumed_after_its_released_rows_expired(history, session, tmp_path):
    hour = HOUR - 17 * HOUR_MS
    dids = write_hour(history, session, hour, 9, "s")
    a = archiver(session, tmp_path, release_ttl_s=1, page_size=2)
    run_all = a._releaser._run_all
    calls = []

    def failing_part_way(writes: list[Any]) -> None:
        calls.append(len(writes))
        if len(calls) == 5:  # the first page's pointers, rewrites and check are done; the second page's pointers too
            raise RuntimeError("Cassandra went away mid-release")
        run_all(writes)

    a._releaser._run_all = failing_part_way
    with pytest.raises(RuntimeError):
        a.run_hour(hour, int(time.time() * 1000))
    a._releaser._run_all = run_all
    time.sleep(2)  # the next run comes after the release TTL: some hot rows are gone
    assert any(hot_delivery(session, did) == [] for did in dids)
    outcome = a.run_hour(hour, int(time.time() * 1000))
    assert outcome.state == RELEASED, outcome
    assert a.state(hour) == RELEASED  # not failed: no alert
    time.sleep(2)
    tiers = tiered(session, tmp_path)
    assert all((d := tiers.get_delivery(did)) is not None and d.summary.tenant_id for did in dids)


def test_an_event_whose_delivery_had_no_row_at_archive_time_keeps_its_payload_hot(history, session, tmp_path):
    import asyncio

    hour = HOUR - 18 * HOUR_MS
    pair = [delivery(hour, "u", 0, k) for k in range(2)]
    e = pair[0].event
    waits = [history.write_snapshot(FanoutSnapshot(e.event_id, e.tenant_id, pair[0].created_at_ms,
                                                   tuple((d.endpoint_id, 2) for d in pair)))]
    i = Intent(1, f"att_{uuid.uuid4().hex}")  # only the first delivery's rows were written (a gap)
    waits += [history.persist(pair[0], i),
              history.record(pair[0], attempt(i, pair[0].created_at_ms + 100, "succeeded", "succeeded", 200), 1,
                             None)]
    durable(history, *waits)
    a = archiver(session, tmp_path, release_ttl_s=1)
    assert a.run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(2)
    # The missing delivery's redrive (reconciliation) reads the payload: it is still there.
    assert asyncio.run(history.load_payload(e.event_id)).startswith(b'{"id": "inv_0"')
    assert hot_delivery(session, pair[0].delivery_id) == []  # the archived delivery was released


def test_a_delivery_recreated_after_its_hour_was_released_is_known_final(history, session, tmp_path):
    import asyncio

    hour = HOUR - 19 * HOUR_MS
    dids = write_hour(history, session, hour, 3, "v")
    assert archiver(session, tmp_path, release_ttl_s=1).run_hour(hour, int(time.time() * 1000)).state == RELEASED
    time.sleep(2)
    assert hot_delivery(session, dids[0]) == []
    # The events topic read again (an old savepoint): fan-out creates the delivery anew and the
    # dispatcher checks Cassandra before persisting and sending it.
    first = asyncio.run(history.check(dids[0]))
    assert first.final and first.status == "succeeded" and first.max_attempt_number == 3, first
    retried = asyncio.run(history.check(dids[5]))  # retried once, then succeeded
    assert retried.final and retried.max_attempt_number == 2 and retried.attempt_count == 2, retried
