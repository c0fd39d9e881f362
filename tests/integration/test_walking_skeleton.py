"""The thin slice, end to end on the real stack: gRPC CreateEndpoint -> Cassandra + the
endpoints topic -> an event on the CDC topic -> Flink fan-out and dispatch -> a signed HTTPS POST
of the exact bytes to the receiver -> delivery and attempt in Cassandra -> gRPC ListDeliveries."""

from __future__ import annotations

import hashlib

import pytest

from control_plane.api import pb, rpc
from tests.integration.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import verify_signature

pytestmark = pytest.mark.integration


def test_one_event_is_delivered_signed_and_recorded(settings, grpc_channel, receiver, delivery_job,
                                                    cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    path = f"/ep/{tenant_id}"
    created = cp.CreateEndpoint(
        pb.CreateEndpointRequest(url=receiver.base_url + path, description="skeleton",
                                 event_types=["invoice.*"]),
        metadata=auth(api_key))
    secret = created.signing_secret
    assert secret.startswith("whsec_")
    endpoint_id = created.endpoint.endpoint_id

    body = b'{"id":"inv_9","amount":4200,  "note":"exact bytes, odd spacing kept"}'
    ev = event(tenant_id, "invoice.paid", body)
    ignored = event(tenant_id, "order.shipped", b'{"not":"subscribed"}')
    produce(settings, [ev.to_json(), ignored.to_json()], keys=[ev.event_id, ignored.event_id])

    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.body == body, "the receiver must get the exact payload bytes"
    assert verify_signature(rec, [secret]) == [secret]
    assert rec.headers["webhook-event-type"] == "invoice.paid"
    assert rec.headers["webhook-event-id"] == ev.event_id
    # Ordering metadata: the object and its version, and which attempt this is.
    assert (rec.headers["webhook-object-id"], rec.headers["webhook-object-version"]) == (
        ev.object_id, str(ev.object_version))
    assert rec.headers["webhook-attempt"] == "1" and rec.headers["webhook-signature-version"] == "v1"

    def listed():
        r = cp.ListDeliveries(pb.ListDeliveriesRequest(endpoint_id=endpoint_id), metadata=auth(api_key))
        done = [d for d in r.deliveries if d.status == pb.DELIVERY_STATUS_SUCCEEDED]
        return done or None

    (summary,) = eventually(listed, timeout=60, what="delivery listed as succeeded")
    assert summary.event_id == ev.event_id
    assert summary.delivery_id == rec.headers["webhook-id"]
    assert summary.attempt_count == 1

    detail = cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=summary.delivery_id), metadata=auth(api_key))
    assert [(a.attempt_number, a.http_status, a.outcome) for a in detail.attempts] == [(1, 200, "succeeded")]
    assert detail.auto_retry_active is False

    row = cassandra_session.execute("SELECT payload, payload_sha256 FROM events WHERE event_id=%s",
                                    (ev.event_id,)).one()
    assert row.payload == body and row.payload_sha256 == hashlib.sha256(body).hexdigest()
    # Only the subscribed type was fanned out.
    rows = list(cassandra_session.execute("SELECT endpoint_id FROM deliveries_by_event WHERE event_id=%s",
                                          (ignored.event_id,)))
    assert rows == []
