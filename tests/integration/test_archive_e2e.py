"""The archive tier end to end on the real stack (the session's job, control plane and receiver):
deliveries with a retry and a manual replay are archived and released; afterwards GetDelivery and
ListDeliveries answer the same (whole responses), reconciliation of the window is clean, and a
replay of an archived delivery reaches the receiver signed anew over the archived bytes, verified
by the official Standard Webhooks library."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from control_plane.api import pb, rpc
from control_plane.archive_store import ArchiveStore
from control_plane.archiver import RELEASED, Archiver
from core import archive_layout as layout
from core.records import delivery_id_for
from tests.integration.helpers import (
    assert_reconciled,
    auth,
    delivery_row,
    event,
    eventually,
    eventually_tolerant,
    new_tenant,
    produce,
)
from tests.support.receiver import verify_signature

pytestmark = pytest.mark.integration

EVENTS = 6


def test_an_archived_hour_reads_replays_and_reconciles_like_a_fresh_one(settings, grpc_channel, receiver,
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
    assert [a.manual for a in before[manual].attempts][-1] and before[manual].replays[0].reason == "customer asked"

    # The hours of the window, released to expire in 2 s (the archiver's own steps, run now
    # instead of 3 days later).
    now = int(time.time() * 1000)
    archive = settings.archive.model_copy(update={"release_ttl_s": 2, "pushgateway": ""})
    store = ArchiveStore.from_settings(archive)
    archiver = Archiver(archive, settings.cassandra.history_ttl_s, cassandra_session, store)
    for hour in range(layout.hour_start(since), now, layout.HOUR_MS):
        outcome = archiver.run_hour(hour, now)
        assert outcome.state == RELEASED, outcome.detail  # the manifest agreed with Cassandra's counts
        manifest = store.manifest(hour)
        assert manifest is not None and manifest.counts() == outcome.counts
    time.sleep(3)
    assert all(delivery_row(cassandra_session, d) is None for d in dids)  # the hot rows expired

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

    def replay_recorded() -> Any:
        g = get(target)
        return g if len(g.attempts) == 2 and g.attempts[1].manual and g.attempts[1].outcome == "succeeded" else None

    replayed = eventually(replay_recorded, timeout=60, what="the replay recorded")
    assert replayed.tier == "hot" and [a.attempt_number for a in replayed.attempts] == [1, 2]
