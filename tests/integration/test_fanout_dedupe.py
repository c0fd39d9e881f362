"""Fan-out on the real stack: a duplicate publish of one event record creates one delivery and one
request; an event goes to exactly the tenant's endpoints whose filter matches it (exact and
prefix.*), never to a non-matching one nor to another tenant's endpoint."""

from __future__ import annotations

import time

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from tests.support.helpers import auth, deliveries_of, delivery_row, event, eventually, new_tenant, produce

pytestmark = pytest.mark.integration

QUIET_S = 5  # how long "nothing more arrives" is watched for


def _endpoint(grpc_channel, api_key: str, url: str, event_types: list[str]) -> str:
    cp = rpc.ControlPlaneStub(grpc_channel)
    created = cp.CreateEndpoint(pb.CreateEndpointRequest(url=url, event_types=event_types), metadata=auth(api_key))
    return created.endpoint.endpoint_id


def _by_event(cassandra_session, event_id: str, endpoint_ids: list[str]) -> list:
    return deliveries_of(cassandra_session, event_id, endpoint_ids)


def test_duplicate_publish_yields_one_delivery_and_one_request(settings, grpc_channel, receiver, delivery_job,
                                                               cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/{tenant_id}/dup"
    endpoint_id = _endpoint(grpc_channel, api_key, receiver.base_url + path, ["invoice.paid"])

    ev = event(tenant_id, "invoice.paid", b'{"dup":true}')
    raw = ev.to_json()
    produce(settings, [raw, raw], keys=[ev.event_id, ev.event_id])  # the relay published twice

    (first,) = receiver.wait_for(path, 1, timeout=90)
    assert first.headers["webhook-id"] == delivery_id_for(ev.event_id, endpoint_id)
    time.sleep(QUIET_S)
    assert len(receiver.requests(path)) == 1, "the duplicate record must not be delivered again"

    rows = eventually(lambda: _by_event(cassandra_session, ev.event_id, [endpoint_id]), timeout=60,
                      what="the delivery row")
    assert [(r.endpoint_id, r.delivery_id) for r in rows] == [(endpoint_id, delivery_id_for(ev.event_id, endpoint_id))]
    d = eventually(lambda: (r := delivery_row(cassandra_session, rows[0].delivery_id)) and r.attempt_count and r,
                   timeout=60, what="the delivery's outcome")
    assert d.attempt_count == 1


def test_event_goes_to_matching_endpoints_of_its_tenant_only(settings, grpc_channel, receiver, delivery_job,
                                                             cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    other_tenant, other_key = new_tenant(grpc_channel, settings)
    base = receiver.base_url + f"/ep/{tenant_id}"
    exact = _endpoint(grpc_channel, api_key, base + "/exact", ["invoice.paid"])
    prefix = _endpoint(grpc_channel, api_key, base + "/prefix", ["invoice.*"])
    nomatch = _endpoint(grpc_channel, api_key, base + "/nomatch", ["order.*", "invoice.refunded"])
    other_path = f"/ep/{other_tenant}/other"
    other = _endpoint(grpc_channel, other_key, receiver.base_url + other_path, ["invoice.paid", "*"])

    ev = event(tenant_id, "invoice.paid", b'{"fan":"out"}')
    produce(settings, [ev.to_json()], keys=[ev.event_id])

    (r_exact,) = receiver.wait_for(f"/ep/{tenant_id}/exact", 1, timeout=90)
    (r_prefix,) = receiver.wait_for(f"/ep/{tenant_id}/prefix", 1, timeout=90)
    assert r_exact.headers["webhook-id"] == delivery_id_for(ev.event_id, exact)
    assert r_prefix.headers["webhook-id"] == delivery_id_for(ev.event_id, prefix)

    candidates = [exact, prefix, nomatch, other]
    rows = eventually(lambda: (r := _by_event(cassandra_session, ev.event_id, candidates)) and len(r) >= 2 and r,
                      timeout=60, what="two delivery rows")
    time.sleep(QUIET_S)
    rows = _by_event(cassandra_session, ev.event_id, candidates)
    assert sorted(r.endpoint_id for r in rows) == sorted([exact, prefix])
    assert {r.tenant_id for r in rows} == {tenant_id}
    assert nomatch not in {r.endpoint_id for r in rows} and other not in {r.endpoint_id for r in rows}
    assert receiver.requests(f"/ep/{tenant_id}/nomatch") == []
    assert receiver.requests(other_path) == [], "another tenant's endpoint must never get this event"
