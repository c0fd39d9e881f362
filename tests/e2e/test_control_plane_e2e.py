"""Control-plane features that only the running job can prove: replay creates a new manual
attempt on the same delivery, a ping reaches only its endpoint, and secret rotation is observed at
the receiver (two signatures during the overlap, one after an immediate revocation)."""

from __future__ import annotations

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import verify_signature

pytestmark = pytest.mark.integration


def _endpoint(grpc_channel, settings, receiver, name: str, types: list[str]):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    path = f"/ep/{name}-{tenant_id}"
    created = cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=types),
                                metadata=auth(api_key))
    return tenant_id, api_key, cp, path, created


def test_replay_is_a_new_manual_attempt_on_the_same_delivery(settings, grpc_channel, receiver, delivery_job):
    tenant_id, api_key, cp, path, created = _endpoint(grpc_channel, settings, receiver, "replay", ["invoice.paid"])
    ev = event(tenant_id, "invoice.paid", b'{"replay":"me"}')
    produce(settings, [ev.to_json()], keys=[ev.event_id])
    (first,) = receiver.wait_for(path, 1, timeout=90)
    delivery_id = delivery_id_for(ev.event_id, created.endpoint.endpoint_id)

    def detail():
        d = cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=delivery_id), metadata=auth(api_key))
        return d if d.delivery.status == pb.DELIVERY_STATUS_SUCCEEDED else None

    eventually(detail, timeout=60, what="first attempt recorded")
    cp.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=delivery_id), metadata=auth(api_key))
    second = receiver.wait_for(path, 2, timeout=90)[1]
    assert second.headers["webhook-id"] == first.headers["webhook-id"] == delivery_id
    assert second.body == first.body

    def two_attempts():
        d = cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=delivery_id), metadata=auth(api_key))
        # the manual attempt's row is reserved before its request and completed after it
        return d if len(d.attempts) == 2 and d.attempts[1].outcome != "reserved" else None

    d = eventually(two_attempts, timeout=60, what="manual attempt recorded")
    assert [(a.attempt_number, a.manual, a.http_status) for a in d.attempts] == [(1, False, 200), (2, True, 200)]
    assert d.auto_retry_active is False  # a replay never restarts the automatic schedule


def test_ping_reaches_only_its_endpoint(settings, grpc_channel, receiver, delivery_job):
    tenant_id, api_key, cp, path, created = _endpoint(grpc_channel, settings, receiver, "ping", ["order.created"])
    other = cp.CreateEndpoint(pb.CreateEndpointRequest(url=f"{receiver.base_url}/ep/ping-other-{tenant_id}",
                                                       event_types=["*"]), metadata=auth(api_key))
    ping = cp.SendTestEvent(pb.GetEndpointRequest(endpoint_id=created.endpoint.endpoint_id), metadata=auth(api_key))
    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.headers["webhook-event-type"] == "webhook.ping"
    assert rec.headers["webhook-id"] == ping.delivery_id
    assert verify_signature(rec, [created.signing_secret]) == [created.signing_secret]
    assert other.endpoint.endpoint_id != created.endpoint.endpoint_id
    assert receiver.requests(f"/ep/ping-other-{tenant_id}") == []


def test_rotation_overlap_signs_twice_then_revocation_signs_once(settings, grpc_channel, receiver, delivery_job):
    tenant_id, api_key, cp, path, created = _endpoint(grpc_channel, settings, receiver, "rotate", ["user.*"])
    old = created.signing_secret
    rotated = cp.RotateSecret(pb.RotateSecretRequest(endpoint_id=created.endpoint.endpoint_id,
                                                     mode=pb.RotateSecretRequest.MODE_OVERLAP, overlap_seconds=600),
                              metadata=auth(api_key))
    new = rotated.signing_secret
    assert len(rotated.live_keys) == 2

    e1 = event(tenant_id, "user.disabled", b'{"u":1}')
    produce(settings, [e1.to_json()], keys=[e1.event_id])
    (r1,) = receiver.wait_for(path, 1, timeout=90)
    assert len(r1.headers["webhook-signature"].split(" ")) == 2
    assert sorted(verify_signature(r1, [old, new])) == sorted([old, new])

    revoked = cp.RotateSecret(pb.RotateSecretRequest(endpoint_id=created.endpoint.endpoint_id,
                                                     mode=pb.RotateSecretRequest.MODE_REVOKE_IMMEDIATELY),
                              metadata=auth(api_key))
    newest = revoked.signing_secret
    assert len(revoked.live_keys) == 1
    e2 = event(tenant_id, "user.enabled", b'{"u":2}')
    produce(settings, [e2.to_json()], keys=[e2.event_id])
    r2 = receiver.wait_for(path, 2, timeout=90)[1]
    assert len(r2.headers["webhook-signature"].split(" ")) == 1
    assert verify_signature(r2, [old, new, newest]) == [newest]
