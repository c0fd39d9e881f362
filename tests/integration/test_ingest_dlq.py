"""Ingest on the real stack: every kind of unreadable record on the CDC topic lands on the DLQ
topic as a ``webhooks.dlq/v1`` letter with the right reason and the exact original bytes, the job
keeps running (a valid event produced after them is delivered), and a Debezium outbox envelope is
accepted as an event."""

from __future__ import annotations

import base64
import json
import time
import uuid

import pytest

from control_plane.rpc.api import pb, rpc
from core.ingest import parse_event
from tests.support.helpers import auth, event, eventually, new_tenant, produce, read_dead_letters

pytestmark = pytest.mark.integration


def _dlq_letters(settings, wanted: dict[bytes, str], timeout: float = 90) -> dict[bytes, dict]:
    """Read the DLQ topic from the start until a letter for every original in ``wanted`` is seen."""
    found = read_dead_letters(settings, lambda original: original if original in wanted else None,
                              len(wanted), timeout)
    missing = [wanted[k] for k in wanted if k not in found]
    assert not missing, f"no dead letter within {timeout}s for: {missing}"
    return found


def _endpoint(grpc_channel, api_key: str, url: str, event_types: list[str]) -> str:
    cp = rpc.ControlPlaneStub(grpc_channel)
    created = cp.CreateEndpoint(pb.CreateEndpointRequest(url=url, event_types=event_types), metadata=auth(api_key))
    return created.endpoint.endpoint_id


def _valid_fields(tenant_id: str) -> dict:
    return {"schema": "webhooks.event/v1", "event_id": f"evt_{uuid.uuid4().hex}", "tenant_id": tenant_id,
            "event_type": "invoice.paid", "schema_version": "2026-01-01", "object_id": "inv_1",
            "object_version": 1, "occurred_at": "2026-01-01T00:00:00Z", "payload": '{"id":"inv_1"}'}


def _enc(d: dict) -> bytes:
    return json.dumps(d, separators=(",", ":")).encode()


def test_bad_records_are_dead_lettered_and_the_job_keeps_delivering(settings, grpc_channel, receiver,
                                                                  delivery_job):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/{tenant_id}/dlq"
    _endpoint(grpc_channel, api_key, receiver.base_url + path, ["invoice.*"])

    marker = uuid.uuid4().hex  # makes every bad record unique to this run
    missing = _valid_fields(tenant_id)
    del missing["event_type"]
    wrong_type = _valid_fields(tenant_id)
    wrong_type["object_version"] = "seven"
    too_big = _valid_fields(tenant_id)
    too_big["payload"] = "x" * (settings.ingest.max_payload_bytes + 1)
    future = _valid_fields(tenant_id)
    future["schema"] = "webhooks.event/v2"
    past_bigint = _valid_fields(tenant_id)
    past_bigint["object_version"] = 2**63  # the history's bigint cannot hold it
    cases: dict[bytes, str] = {
        b"\x80\x81\xfe garbage \xc3\x28 " + marker.encode() + b" \xff": "not_utf8",
        _enc(_valid_fields(tenant_id))[:-25] + marker.encode(): "malformed_json",
        _enc({**missing, "marker": marker}): "missing_field",
        _enc({**wrong_type, "marker": marker}): "wrong_type",
        _enc({**too_big, "marker": marker}): "payload_too_large",
        _enc({**future, "marker": marker}): "unknown_schema",
        _enc({**past_bigint, "marker": marker}): "out_of_range",
    }
    assert len(cases) == 7
    produce(settings, list(cases))

    # A valid event produced after every bad one is still delivered: the job did not stop.
    body = b'{"after":"the bad ones"}'
    good = event(tenant_id, "invoice.paid", body)
    produce(settings, [good.to_json()], keys=[good.event_id])

    letters = _dlq_letters(settings, {raw: reason for raw, reason in cases.items()})
    for raw, reason in cases.items():
        letter = letters[raw]
        assert letter["schema"] == "webhooks.dlq/v1"
        assert letter["reason"] == reason, (reason, letter["detail"])
        assert base64.b64decode(letter["original_base64"]) == raw  # exact bytes, garbage included
        assert letter["source_topic"] == settings.kafka.events_topic
        assert letter["detail"]
    assert "object_version" in letters[_enc({**past_bigint, "marker": marker})]["detail"]

    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.body == body
    assert rec.headers["webhook-event-id"] == good.event_id


def test_payloads_that_are_not_strict_json_are_dead_lettered(settings, grpc_channel, receiver, delivery_job):
    """Every delivery is sent as application/json and the catalog judges the parsed payload, so a
    payload that is not one strict JSON document in UTF-8 (core/strict_json.py) is dead-lettered as
    payload_not_json in every form; a lone surrogate in the record itself is malformed_json (it
    used to reach fan-out, where encoding the event id fails). A valid event after them is sent."""
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/{tenant_id}/strict"
    _endpoint(grpc_channel, api_key, receiver.base_url + path, ["invoice.*"])

    marker = uuid.uuid4().hex

    def plain(**fields: object) -> bytes:
        return _enc({**_valid_fields(tenant_id), "marker": marker, **fields})

    def outbox_v2(body: bytes) -> bytes:
        after = {k: v for k, v in _valid_fields(tenant_id).items() if k != "schema"}
        after.update(envelope_version=2, payload=base64.b64encode(body).decode(), marker=marker)
        return _enc({"op": "c", "before": None, "after": after})

    cases: dict[bytes, str] = {
        plain(payload='{"amount":NaN}'): "payload_not_json",
        plain(payload='{"amount":Infinity}'): "payload_not_json",
        plain(payload='{"note":"\\ud800"}'): "payload_not_json",  # a lone surrogate escape in the payload
        plain(payload_base64=base64.b64encode('{"a":1}'.encode("utf-16")).decode()): "payload_not_json",
        outbox_v2(b'{"amount":-5,"amount":5}'): "payload_not_json",
        outbox_v2(b'{"amount":NaN}'): "payload_not_json",
        plain(event_id=f"evt_\ud800_{marker}"): "malformed_json",  # json.dumps writes a \\ud800 escape
    }
    produce(settings, list(cases))

    body = b'{"after":"the not strict ones"}'
    good = event(tenant_id, "invoice.paid", body)
    produce(settings, [good.to_json()], keys=[good.event_id])

    letters = _dlq_letters(settings, cases)
    for raw, reason in cases.items():
        assert letters[raw]["reason"] == reason, (reason, letters[raw]["detail"])
        assert base64.b64decode(letters[raw]["original_base64"]) == raw
    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.body == body  # only the valid one reached the receiver
    time.sleep(2)
    assert len(receiver.requests(path)) == 1


def test_debezium_outbox_envelope_is_delivered(settings, grpc_channel, receiver, delivery_job,
                                               cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/{tenant_id}/debezium"
    _endpoint(grpc_channel, api_key, receiver.base_url + path, ["order.created"])

    event_id = f"evt_{uuid.uuid4().hex}"
    body = '{"id":"ord_7",  "total": 12}'
    envelope = {
        "schema": {"type": "struct", "name": "outbox.Envelope", "optional": False, "fields": []},
        "payload": {
            "op": "c", "before": None, "ts_ms": int(time.time() * 1000),
            "source": {"connector": "postgresql", "table": "outbox", "db": "shop"},
            "after": {"event_id": event_id, "tenant_id": tenant_id, "event_type": "order.created",
                      "schema_version": "2026-01-01", "object_id": "ord_7", "object_version": 2,
                      "occurred_at": int(time.time() * 1000), "payload": body},
        },
    }
    produce(settings, [json.dumps(envelope).encode()], keys=[event_id])

    (rec,) = receiver.wait_for(path, 1, timeout=90)
    assert rec.body == body.encode()
    assert rec.headers["webhook-event-id"] == event_id
    assert rec.headers["webhook-event-type"] == "order.created"
    row = eventually(lambda: cassandra_session.execute(
        "SELECT tenant_id, object_version FROM events WHERE event_id=%s", (event_id,)).one(),
        timeout=60, what="event row")
    assert row.tenant_id == tenant_id and row.object_version == 2


def test_only_the_control_plane_may_aim_an_event_at_one_endpoint(settings, grpc_channel, receiver, delivery_job):
    """`target_endpoint_id` skips subscription matching, so a CDC record claiming
    one (with no proof, or a made-up one) is dead-lettered, not sent to an endpoint that never
    subscribed to its type; the control plane's own test event still reaches its endpoint."""
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    orders_path = f"/ep/{tenant_id}/orders-only"
    orders = _endpoint(grpc_channel, api_key, receiver.base_url + orders_path, ["order.*"])
    aimed = {**_valid_fields(tenant_id), "target_endpoint_id": orders}
    forged = {**_valid_fields(tenant_id), "target_endpoint_id": orders, "target_proof": "ab" * 32}
    cases = {_enc(aimed): "no proof", _enc(forged): "made-up proof"}
    produce(settings, list(cases))
    letters = _dlq_letters(settings, cases)
    for raw in cases:
        assert letters[raw]["reason"] == "untrusted_target", letters[raw]
        assert orders in letters[raw]["detail"]

    cp = rpc.ControlPlaneStub(grpc_channel)
    ping = cp.SendTestEvent(pb.GetEndpointRequest(endpoint_id=orders), metadata=auth(api_key))
    (rec,) = receiver.wait_for(orders_path, 1, timeout=90)
    assert rec.headers["webhook-event-id"] == ping.event_id  # the ping, and nothing the records aimed
    time.sleep(2)
    assert len(receiver.requests(orders_path)) == 1


def test_an_event_id_another_tenant_used_is_refused_not_merged(settings, grpc_channel, receiver, delivery_job):
    """Dedupe is by (tenant, event_id). A second tenant's event reusing an id is
    not a duplicate to drop silently, and must not share the first one's history rows (payload
    row, deliveries-by-event): it is dead-lettered as a conflict, the first delivered once."""
    first_tenant, first_key = new_tenant(grpc_channel, settings)
    other_tenant, other_key = new_tenant(grpc_channel, settings)
    first_path, other_path = f"/ep/{first_tenant}/conflict", f"/ep/{other_tenant}/conflict"
    _endpoint(grpc_channel, first_key, receiver.base_url + first_path, ["invoice.*"])
    _endpoint(grpc_channel, other_key, receiver.base_url + other_path, ["invoice.*"])
    shared_id = f"evt_{uuid.uuid4().hex}"
    first = {**_valid_fields(first_tenant), "event_id": shared_id, "payload": '{"tenant":"first"}'}
    produce(settings, [_enc(first)], keys=[shared_id])
    (rec,) = receiver.wait_for(first_path, 1, timeout=90)
    assert rec.body == b'{"tenant":"first"}'

    reused = _enc({**_valid_fields(other_tenant), "event_id": shared_id, "payload": '{"tenant":"other"}'})
    again = _enc(first)  # the first tenant's own duplicate: dropped as before, no letter
    produce(settings, [reused, again], keys=[shared_id, shared_id])
    # Refused after parsing, so the letter carries the event as parsed (re-encoded), not its bytes.
    found = read_dead_letters(settings, lambda original: "reused" if shared_id.encode() in original
                              and other_tenant.encode() in original else None, 1, timeout=90)
    assert "reused" in found, "no dead letter for the reused event id within 90 s"
    letter = found["reused"]
    assert letter["reason"] == "event_id_conflict" and shared_id in letter["detail"]
    parsed = parse_event(base64.b64decode(letter["original_base64"]), settings.ingest.max_payload_bytes)
    assert (parsed.tenant_id, parsed.event_id, parsed.payload) == (other_tenant, shared_id, b'{"tenant":"other"}')
    assert first_tenant not in letter["detail"]  # the letter does not tell one tenant about another
    time.sleep(2)
    assert receiver.requests(other_path) == [] and len(receiver.requests(first_path)) == 1
