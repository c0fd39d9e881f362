"""The thin slice, end to end on the real stack: gRPC CreateEndpoint -> Cassandra + the
endpoints topic -> an event on the CDC topic -> Flink fan-out and dispatch -> a signed HTTPS POST
of the exact bytes to the receiver -> delivery and attempt in Cassandra -> gRPC ListDeliveries."""

from __future__ import annotations

import hashlib
import time

import pytest

from control_plane.rpc.api import pb, rpc
from tests.support.helpers import auth, deliveries_of, event, eventually, new_tenant, produce
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
    assert deliveries_of(cassandra_session, ignored.event_id, [endpoint_id]) == []


def test_an_ed25519_endpoint_gets_v1a_signatures_its_public_key_verifies(settings, grpc_channel, receiver,
                                                                         delivery_job):
    """End to end: the job signs with the private key only the platform holds;
    the receiver verifies with the whpk_ public key, using libsodium (PyNaCl), an ed25519
    implementation independent of ours. A rotation back to HMAC overlaps: both sign."""
    import base64

    import nacl.signing

    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    path = f"/ep/{tenant_id}/ed25519"
    created = cp.CreateEndpoint(pb.CreateEndpointRequest(
        url=receiver.base_url + path, event_types=["invoice.*"], signature_scheme="ed25519"), metadata=auth(api_key))
    assert created.signing_secret == "" and created.public_key.startswith("whpk_")
    verify_key = nacl.signing.VerifyKey(base64.b64decode(created.public_key[5:]))

    def verified(rec, version: str = "v1a") -> bool:  # type: ignore[no-untyped-def]
        signed = f"{rec.headers['webhook-id']}.{rec.headers['webhook-timestamp']}.".encode() + rec.body
        sigs = [s.split(",", 1)[1] for s in rec.headers["webhook-signature"].split() if s.startswith(version + ",")]
        assert sigs, rec.headers["webhook-signature"]
        verify_key.verify(signed, base64.b64decode(sigs[0]))  # raises BadSignatureError if not
        return True

    body = b'{"id":"inv_ed","amount":1}'
    ev = event(tenant_id, "invoice.paid", body)
    produce(settings, [ev.to_json()], keys=[ev.event_id])
    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.body == body and verified(rec)
    assert rec.headers["webhook-signature-version"] == "v1a"

    rotated = cp.RotateSecret(pb.RotateSecretRequest(endpoint_id=created.endpoint.endpoint_id, overlap_seconds=600,
                                                     signature_scheme="hmac-sha256"), metadata=auth(api_key))
    assert rotated.signing_secret.startswith("whsec_")

    def both_signed():  # type: ignore[no-untyped-def]
        ev2 = event(tenant_id, "invoice.paid", b'{"id":"inv_ed2"}')
        produce(settings, [ev2.to_json()], keys=[ev2.event_id])
        got = receiver.wait_for(path, len(receiver.requests(path)) + 1, timeout=60)[-1]
        return got if "v1 " in got.headers["webhook-signature-version"] + " " else None

    rec2 = eventually(both_signed, timeout=120, interval=0, what="a request signed by both keys")
    assert verified(rec2) and verify_signature(rec2, [rotated.signing_secret]) == [rotated.signing_secret]
    assert rec2.headers["webhook-signature-version"] == "v1 v1a"


def test_minimised_payloads_are_what_is_signed_and_sent_and_history_keeps_the_original(
        settings, grpc_channel, receiver, delivery_job, cassandra_session):
    """End to end: an endpoint on a JSON Pointer allow-list gets only those
    members, a thin endpoint no business data; each signature verifies over the bytes received;
    the event row keeps the full payload."""
    import json

    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    made = {}
    for name, mode, fields in (("fields", "fields", ["/id", "/customer/id"]), ("thin", "thin", []),
                               ("full", "", [])):
        r = cp.CreateEndpoint(pb.CreateEndpointRequest(
            url=f"{receiver.base_url}/ep/{tenant_id}/{name}", event_types=["invoice.*"], payload_mode=mode,
            payload_fields=fields), metadata=auth(api_key))
        made[name] = r.signing_secret
    body = b'{"id":"inv_1","amount":4200,"customer":{"id":"cus_1","email":"a@b.example","card":"4242"}}'
    ev = event(tenant_id, "invoice.paid", body)
    produce(settings, [ev.to_json()], keys=[ev.event_id])

    got = {name: receiver.wait_for(f"/ep/{tenant_id}/{name}", 1, timeout=90)[0] for name in made}
    for name, rec in got.items():
        assert verify_signature(rec, [made[name]]) == [made[name]], name
    assert json.loads(got["fields"].body) == {"id": "inv_1", "customer": {"id": "cus_1"}}
    thin = json.loads(got["thin"].body)
    assert thin["type"] == "invoice.paid" and thin["event_id"] == ev.event_id and thin["thin"] is True
    assert b"4242" not in got["thin"].body and b"4242" not in got["fields"].body
    assert got["full"].body == body
    row = cassandra_session.execute("SELECT payload FROM events WHERE event_id=%s", (ev.event_id,)).one()
    assert bytes(row.payload) == body


def test_an_endpoint_answers_its_ownership_challenge_before_it_receives_events(
        settings, grpc_channel, receiver, delivery_job):
    """End to end: a verifying tenant's new endpoint is PENDING_VERIFICATION; the
    job sends it the signed `webhook.challenge` and nothing else while pending; VerifyEndpoint
    refuses an endpoint that did not echo the token and activates one that did; events then flow."""
    import json

    import grpc

    from tests.support.helpers import eventually

    tenant_id, api_key = new_tenant(grpc_channel, settings, verify_endpoints=True)
    cp = rpc.ControlPlaneStub(grpc_channel)
    echo, silent = f"/ep/{tenant_id}/echo", f"/ep/{tenant_id}/silent"
    receiver.set_behaviour(echo, "echo_challenge")
    made = {}
    for path in (echo, silent):
        r = cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["invoice.*"]),
                              metadata=auth(api_key))
        assert r.endpoint.status == pb.ENDPOINT_STATUS_PENDING_VERIFICATION and r.endpoint.challenge_event_id
        made[path] = (r.endpoint.endpoint_id, r.signing_secret)
    early = event(tenant_id, "invoice.paid", b'{"id":"before verification"}')
    produce(settings, [early.to_json()], keys=[early.event_id])

    for path, (endpoint_id, secret) in made.items():
        (challenge,) = receiver.wait_for(path, 1, timeout=90)
        assert challenge.headers["webhook-event-type"] == "webhook.challenge"
        assert verify_signature(challenge, [secret]) == [secret]
        assert json.loads(challenge.body)["endpoint_id"] == endpoint_id

    silent_id = made[silent][0]
    with pytest.raises(grpc.RpcError) as refused:
        cp.VerifyEndpoint(pb.GetEndpointRequest(endpoint_id=silent_id), metadata=auth(api_key))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has not answered its challenge" in refused.value.details()

    echo_id = made[echo][0]
    # Nothing but the challenge reached either URL while pending.
    assert [r.headers["webhook-event-type"] for r in receiver.requests(echo)] == ["webhook.challenge"]
    made_challenge_id = receiver.requests(echo)[0].headers["webhook-event-id"]

    def verified():  # type: ignore[no-untyped-def]
        try:  # the answer reaches history in the dispatcher's next batch
            return cp.VerifyEndpoint(pb.GetEndpointRequest(endpoint_id=echo_id), metadata=auth(api_key))
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err
            return None

    assert eventually(verified, timeout=60, what="verified").status == pb.ENDPOINT_STATUS_ACTIVE
    later = event(tenant_id, "invoice.paid", b'{"id":"after verification"}')
    produce(settings, [later.to_json()], keys=[later.event_id])
    # Fan-out matches an event against the configs it has read, which may be newer than the event:
    # the early one may follow once the endpoint is active -- never before.
    eventually(lambda: later.event_id in {r.headers["webhook-event-id"] for r in receiver.requests(echo)},
               timeout=90, what="an event after verification")
    assert {r.headers["webhook-event-id"] for r in receiver.requests(echo)} <= {
        made_challenge_id, early.event_id, later.event_id}
    time.sleep(1)
    assert [r.headers["webhook-event-type"] for r in receiver.requests(silent)] == ["webhook.challenge"]
