"""The archive tier end to end on the real stack (the session's job, control plane and receiver):
the job sends its history facts to Kafka, the archive writer archives them.

* Deliveries with a retry and a manual replay are archived from the job's facts; once their
  attempts and events left the hot tier, GetDelivery and ListDeliveries answer the same (whole
  responses, tier "archive"), reconciliation of the window is clean, and a replay of an archived
  delivery reaches the receiver signed anew over the archived bytes (verified by the official
  Standard Webhooks library) under a number never used before.
* The object store (S3Proxy) down for longer than several checkpoint intervals while the job
  delivers: every delivery goes out meanwhile, the writer holds its offsets back, and once the
  store is back the archive catches up with all of them.

The hot TTL is days, so expiry is played by deleting the expiring rows at their own write time
(what an expired cell amounts to for later writes: a newer write wins, an older one does not)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from control_plane.archive.store import ArchiveStore
from control_plane.rpc.api import pb, rpc
from core import archive_facts
from core import archive_layout as layout
from core.records import delivery_id_for
from core.settings import ArchiveSettings, Settings
from tests.support.archive_support import S3Server, WriterThread
from tests.support.helpers import (
    assert_reconciled,
    auth,
    event,
    eventually,
    eventually_tolerant,
    new_tenant,
    produce,
)
from tests.support.receiver import verify_signature

pytestmark = pytest.mark.integration

EVENTS = 6


def archived_deliveries(store: ArchiveStore, hour_ms: int, tenant_id: str) -> dict[str, Any]:
    b = layout.tenant_bucket(tenant_id)
    return {r["delivery_id"]: r for r in archive_facts.latest("deliveries", store.read_kind(hour_ms, b, "deliveries")
                                                             .to_pylist()) if r["tenant_id"] == tenant_id}


def archived_attempts(store: ArchiveStore, hour_ms: int, tenant_id: str) -> list[dict[str, Any]]:
    b = layout.tenant_bucket(tenant_id)
    return [r for r in archive_facts.latest("attempts", store.read_kind(hour_ms, b, "attempts").to_pylist())
            if r["tenant_id"] == tenant_id]


def expire_hot(session: Any, delivery_id: str) -> None:
    """What the hot TTL does to a delivery: its attempt rows and its event row go; its row stays."""
    for a in list(session.execute("SELECT attempt_number, writetime(outcome) AS wt, writetime(attempt_id) AS wr"
                                  " FROM delivery_history WHERE delivery_id=%s", (delivery_id,))):
        session.execute("DELETE FROM delivery_history USING TIMESTAMP %s WHERE delivery_id=%s AND attempt_number=%s",
                        (max(a.wt or 0, a.wr or 0), delivery_id, a.attempt_number))
    event_id = session.execute("SELECT event_id FROM delivery_history WHERE delivery_id=%s LIMIT 1",
                               (delivery_id,)).one().event_id
    row = session.execute("SELECT writetime(payload) AS wt FROM events WHERE event_id=%s", (event_id,)).one()
    if row is not None:
        session.execute("DELETE FROM events USING TIMESTAMP %s WHERE event_id=%s", (row.wt, event_id))


def hours(since_ms: int) -> range:
    return range(layout.hour_start(since_ms), int(time.time() * 1000) + 1, layout.HOUR_MS)


def test_an_archived_delivery_reads_replays_and_reconciles_like_a_fresh_one(settings, grpc_channel, receiver,
                                                                              delivery_job, cassandra_session):
    since = int(time.time() * 1000)
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    md = auth(api_key)
    endpoints = []
    for name in ("retried", "plain"):
        path = f"/ep/archive-{name}-{tenant_id}"
        created = cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path,
                                                             event_types=["invoice.paid"]), metadata=md)
        endpoints.append((path, created.endpoint.endpoint_id, created.signing_secret))
    receiver.set_behaviour(endpoints[0][0], "503 then 200")  # its first delivery is retried

    evs = [event(tenant_id, "invoice.paid", b'{"invoice": %d, "amount": 4200}' % i) for i in range(EVENTS)]
    produce(settings, [e.to_json() for e in evs], keys=[e.event_id for e in evs])
    dids = [delivery_id_for(e.event_id, ep) for e in evs for _, ep, _ in endpoints]

    def get(did: str) -> Any:
        return cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=did), metadata=md)

    def all_final() -> bool:
        return all(get(d).delivery.status == pb.DELIVERY_STATUS_SUCCEEDED for d in dids)

    eventually_tolerant(all_final, timeout=120, what="every delivery succeeded",  # NOT_FOUND until fan-out
                        errors=(grpc.RpcError,))
    manual = dids[0]
    cp.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=manual, reason="customer asked"), metadata=md)
    eventually(lambda: [a for a in get(manual).attempts if a.manual and a.outcome == "succeeded"], timeout=90,
               what="the manual attempt recorded")

    def lists() -> list[Any]:
        return [cp.ListDeliveries(pb.ListDeliveriesRequest(endpoint_id=ep, page_size=100), metadata=md)
                for _, ep, _ in endpoints]

    before = {d: get(d) for d in dids}
    lists_before = lists()
    assert {b.tier for b in before.values()} == {"hot"}
    assert sorted(len([a for a in b.attempts if not a.manual]) for b in before.values())[-1] == 2  # the 503, retried
    numbers = [a.attempt_number for a in before[manual].attempts]
    assert before[manual].attempts[-1].manual and before[manual].replays[0].reason == "customer asked"

    # The writer archives the job's facts into the store the session's control plane reads.
    store = ArchiveStore.from_settings(settings.archive)
    hot_attempts = sum(len(b.attempts) for b in before.values())
    with WriterThread(settings, settings.archive.model_copy(update={"pushgateway": "", "roll_s": 0.5})):
        eventually(lambda: sum(len(archived_attempts(store, h, tenant_id)) for h in hours(since)) == hot_attempts,
                   timeout=90, what="every attempt archived")
    for did in dids:
        expire_hot(cassandra_session, did)

    for d in dids:
        after = get(d)
        assert after.tier == "archive"
        after.tier = "hot"
        assert after == before[d]
    assert lists() == lists_before
    assert_reconciled(grpc_channel, settings, tenant_id, since, expected_deliveries=len(dids))

    # A replay of an archived delivery: the archived payload, signed anew, verified at the receiver.
    path, endpoint_id, secret = endpoints[1]
    target = delivery_id_for(evs[2].event_id, endpoint_id)
    first = [r for r in receiver.requests(path) if r.headers["webhook-id"] == target]
    cp.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=target, reason="from the archive"), metadata=md)
    again = eventually(lambda: [r for r in receiver.requests(path) if r.headers["webhook-id"] == target][1:],
                       timeout=90, what="the archived delivery's replay")
    assert again[0].body == first[0].body == evs[2].payload
    assert verify_signature(again[0], [secret]) == [secret]
    assert again[0].headers["webhook-timestamp"] != first[0].headers["webhook-timestamp"]  # signed anew

    def replay_recorded(did: str, n: int) -> Any:
        g = get(did)
        return g if len(g.attempts) == n and g.attempts[-1].manual and g.attempts[-1].outcome == "succeeded" else None

    replayed = eventually(lambda: replay_recorded(target, 2), timeout=60, what="the replay recorded")
    assert replayed.tier == "archive" and [a.attempt_number for a in replayed.attempts] == [1, 2]
    # The delivery replayed by hand before: its next attempt takes a number none of the archived ones has.
    cp.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=manual, reason="again"), metadata=md)
    replayed = eventually(lambda: replay_recorded(manual, len(numbers) + 1), timeout=90, what="the second replay")
    assert [a.attempt_number for a in replayed.attempts] == [*numbers, max(numbers) + 1]


def test_the_object_store_down_for_many_checkpoints_stops_no_delivery_and_the_archive_catches_up(
        settings: Settings, grpc_channel, receiver, delivery_job, tmp_path: Path):
    s3 = S3Server(tmp_path)
    s3.script("start")
    s3.script("ready")
    since = int(time.time() * 1000)
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    md = auth(api_key)
    path = f"/ep/archive-outage-{tenant_id}"
    request = pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["invoice.paid"])
    endpoint_id = cp.CreateEndpoint(request, metadata=md).endpoint.endpoint_id
    archive = ArchiveSettings(**s3.settings("e2e"), pushgateway="", roll_s=0.5)
    store = ArchiveStore.from_settings(archive)
    try:
        with WriterThread(settings, archive) as w:
            s3.script("stop")
            outage = time.monotonic()
            evs = [event(tenant_id, "invoice.paid", b'{"n": %d}' % i) for i in range(30)]
            produce(settings, [e.to_json() for e in evs], keys=[e.event_id for e in evs])
            dids = {delivery_id_for(e.event_id, endpoint_id) for e in evs}
            # Every delivery goes out with the store down: the job never touches it.
            eventually(lambda: {r.headers["webhook-id"] for r in receiver.requests(path)} >= dids, timeout=120,
                       what="every delivery sent during the outage")
            down_for = time.monotonic() - outage
            checkpoint_s = settings.flink.checkpoint_interval_ms / 1000
            while time.monotonic() - outage < max(5 * checkpoint_s, 10):  # many checkpoints with the store down
                time.sleep(0.5)
            assert w.writer.lag.store_failures >= 1 and w.writer.lag.seconds(time.time()) > 0
            s3.script("start")
            s3.script("ready")

            def caught_up() -> bool:
                archived = {k: v for h in hours(since) for k, v in archived_deliveries(store, h, tenant_id).items()}
                return all(archived.get(d, {}).get("status") == "succeeded" for d in dids)

            eventually(caught_up, timeout=180, what="the archive caught up with every delivery")
            assert down_for < 120
    finally:
        s3.script("stop")
