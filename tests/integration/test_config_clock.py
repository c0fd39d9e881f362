"""Fan-out holds an event until the config clock has passed the event's time, so configs
published before that time are matched even when the job reads the event first."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from control_plane.api import pb, rpc
from tests.integration.helpers import auth, event, new_tenant

pytestmark = pytest.mark.integration


def test_event_is_held_until_configs_up_to_its_time_are_read(settings, grpc_channel, receiver, delivery_job):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/clock-{tenant_id}"
    ev = event(tenant_id, "report.ready", b'{"held":true}')
    # The event's Kafka timestamp is 6 s ahead: for the job it "happened" after configs published
    # in the next 6 s, although it reads the event first.
    stamp_ms = int(time.time() * 1000) + 6_000
    p = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers})
    p.produce(settings.kafka.events_topic, key=ev.event_id.encode(), value=ev.to_json(), timestamp=stamp_ms)
    assert p.flush(10) == 0
    time.sleep(2)  # the job has read the event by now, and holds it
    assert receiver.requests(path) == []
    rpc.ControlPlaneStub(grpc_channel).CreateEndpoint(
        pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["report.*"]), metadata=auth(api_key))

    (rec,) = receiver.wait_for(path, 1, timeout=60)
    assert rec.headers["webhook-event-id"] == ev.event_id
    # Released only once the clock passed the event's time, not before.
    assert rec.received_at * 1000 >= stamp_ms - 500
