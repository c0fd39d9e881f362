"""Endpoints-topic records the job did not expect, and 410 signals whose handling fails, on the
real stack: a config from a newer control plane (unknown status, unknown fields) is
read as "not active", a record that cannot be read holds its endpoint instead of vanishing, and a
410 signal is never skipped by the control plane's consumer."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from control_plane.endpoints.signals import SignalConsumer
from control_plane.errors import Unavailable
from control_plane.rpc.api import pb, rpc
from core.records import EndpointSignal
from core.settings import Settings
from stack.flink_jobs import operator_metric
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import Receiver

pytestmark = pytest.mark.integration


def published_config(settings: Settings, endpoint_id: str) -> dict:
    """The endpoint's latest record on the endpoints topic, as the control plane published it."""
    c = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": f"t-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        tp = TopicPartition(settings.kafka.endpoints_topic, 0)
        _, high = c.get_watermark_offsets(tp, timeout=10)
        c.assign([TopicPartition(settings.kafka.endpoints_topic, 0, 0)])
        latest = None
        while True:
            m = c.poll(5)
            assert m is not None, "endpoints topic ended early"
            if m.key() == endpoint_id.encode():
                latest = json.loads(m.value())
            if m.offset() >= high - 1:
                break
        assert latest is not None, f"no config for {endpoint_id} on the topic"
        return latest
    finally:
        c.close()


def test_unknown_status_and_fields_read_as_not_active_and_an_unreadable_config_holds_its_endpoint(
    settings: Settings, grpc_channel, receiver: Receiver, delivery_job: str
) -> None:
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/records-{tenant_id}"
    ep = rpc.ControlPlaneStub(grpc_channel).CreateEndpoint(
        pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["rec.*"]), metadata=auth(api_key)).endpoint
    topic, key = settings.kafka.endpoints_topic, ep.endpoint_id

    def send(name: str) -> str:
        e = event(tenant_id, f"rec.{name}", b"{}")
        produce(settings, [e.to_json()], [e.event_id])
        return e.event_id

    def delivered() -> set[str]:
        return {r.headers["webhook-event-id"] for r in receiver.requests(path)}

    first = send("first")
    eventually(lambda: first in delivered(), timeout=60, what="the first event")
    cfg = published_config(settings, key)

    # A newer control plane's config: a status this job does not know, fields it does not know.
    newer = {**cfg, "config_version": 2, "status": "paused_by_billing", "ordering": {"key": "object_id"}}
    produce(settings, [json.dumps(newer).encode()], [key], topic=topic)
    time.sleep(1)  # read by the job (the clock that follows it releases the next event)
    paused = send("while_paused")
    active = {**cfg, "config_version": 3}
    time.sleep(3)
    assert paused not in delivered()  # not active: no delivery for it
    produce(settings, [json.dumps(active).encode()], [key], topic=topic)
    time.sleep(1)
    resumed = send("resumed")
    eventually(lambda: resumed in delivered(), timeout=60, what="an event after the known status returned")
    assert paused not in delivered()

    # A record that cannot be read at all (no url): counted, and the endpoint holds its sends.
    refused_before = operator_metric(delivery_job, "configs_refused")
    broken = {k: v for k, v in {**cfg, "config_version": 4}.items() if k != "url"}
    produce(settings, [json.dumps(broken).encode()], [key], topic=topic)
    eventually(lambda: operator_metric(delivery_job, "configs_refused") > refused_before, timeout=30,
               what="configs_refused to count the unreadable record")
    held = send("held")
    time.sleep(4)
    assert held not in delivered()  # matched with the last readable config, held in dispatch
    produce(settings, [json.dumps({**cfg, "config_version": 5}).encode()], [key], topic=topic)
    eventually(lambda: held in delivered(), timeout=60, what="the held event once a readable config came")


class FlakyEndpoints:
    """The control plane's endpoint service, failing the first disable (Cassandra down)."""

    def __init__(self) -> None:
        self.calls: list[EndpointSignal] = []

    def disable_gone(self, signal: EndpointSignal):  # type: ignore[no-untyped-def]
        self.calls.append(signal)
        if len(self.calls) == 1:
            raise Unavailable("storage unavailable (NoHostAvailable); retry")
        return None


def test_a_410_signal_whose_first_handling_fails_is_applied_by_a_later_poll(settings: Settings,
                                                                            kafka_bootstrap: str) -> None:
    topic = f"test-signals-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for fut in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]).values():
        fut.result(timeout=30)
    k = settings.kafka.model_copy(update={"signals_topic": topic, "consumer_group": f"test-{uuid.uuid4().hex[:8]}"})
    signals = [EndpointSignal(f"ep_{n}", "t_1", 1, "gone", "410 Gone", 1) for n in range(3)]
    produce(settings, [s.to_json() for s in signals], [s.endpoint_id for s in signals], topic=topic)
    endpoints = FlakyEndpoints()
    consumer = SignalConsumer(k, endpoints)  # type: ignore[arg-type]
    try:
        failed = False
        deadline = time.time() + 60
        while len({c.endpoint_id for c in endpoints.calls}) < 3 and time.time() < deadline:
            try:
                consumer.poll_once()
            except Unavailable:
                failed = True
        assert failed, "the first handling did not fail"
        # ep_0 failed once and was handled again; nothing was skipped.
        assert [c.endpoint_id for c in endpoints.calls] == ["ep_0", "ep_0", "ep_1", "ep_2"]
    finally:
        consumer.close()
        admin.delete_topics([topic])
