"""Deleting an endpoint -- by the API (a `deleted` config) or by a tombstone written straight to
the compacted endpoints topic -- ends its pending deliveries visibly as failed, and later events
are not fanned out to it. The job keeps running through both, and through a tombstone for a key
it never saw."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from tests.support.helpers import auth, deliveries_of, delivery_row, event, eventually, new_tenant, produce

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("how", ["api", "tombstone"])
def test_deleted_endpoint_fails_pending_and_gets_nothing_new(how, settings, grpc_channel, receiver, delivery_job,
                                                             cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    path = f"/ep/delete-{how}-{tenant_id}"
    receiver.set_behaviour(path, "500")  # keeps the delivery pending, retrying
    endpoint_id = cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["user.*"]),
                                    metadata=auth(api_key)).endpoint.endpoint_id
    ev = event(tenant_id, "user.created", b'{"u":1}')
    produce(settings, [ev.to_json()], keys=[ev.event_id])
    receiver.wait_for(path, 1, timeout=90)
    did = delivery_id_for(ev.event_id, endpoint_id)

    if how == "api":
        cp.DeleteEndpoint(pb.GetEndpointRequest(endpoint_id=endpoint_id), metadata=auth(api_key))
    else:
        p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
        p.produce(settings.kafka.endpoints_topic, key=b"ep_never_seen", value=None)
        p.produce(settings.kafka.endpoints_topic, key=endpoint_id.encode(), value=None)
        assert p.flush(10) == 0

    def failed():
        row = delivery_row(cassandra_session, did)
        return row if row is not None and row.status == "failed" else None

    row = eventually(failed, timeout=60, what="pending delivery failed after deletion")
    assert row.auto_retry_active is False

    receiver.set_behaviour(path, "200")
    seen = len(receiver.requests(path))
    later = event(tenant_id, "user.updated", b'{"u":2}')
    produce(settings, [later.to_json()], keys=[later.event_id])
    time.sleep(5)
    assert len(receiver.requests(path)) == seen, "a deleted endpoint must not get new events"
    assert deliveries_of(cassandra_session, later.event_id, [endpoint_id]) == []
