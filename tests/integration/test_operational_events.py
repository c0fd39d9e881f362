"""Operational events on the real stack: a tenant's operations endpoint (subscribed to
``webhooks.*``) receives signed ``webhooks.*`` events about its other endpoints -- failing then
recovered, disabled by a 410 with its reason, deliveries exhausted (retries ended; the deadline
passed: test_retry_deadline.py, on its job with a short deadline) -- none about itself when it
fails too, none twice across a TaskManager kill, and auto-disable with a short window (warnings,
then disabled; dry-run only warns); an operator's disable while Kafka is out of the control
plane's reach, announced once Kafka is back.

The session job's schedule (conftest): 4 attempts, breaker opens after 5 failures for 2 s.
The control plane's auto-disable loop runs every 5 s (control_plane.auto_disable_interval_s).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from cassandra.cluster import Session
from confluent_kafka.admin import AdminClient

from control_plane.endpoints.operational_events import PENDING_GRACE_MS
from control_plane.publishing.publisher import KafkaPublisher, PublishError
from control_plane.rpc.api import pb
from core import operational_events as ops
from protogen.webhooks.v1 import operations_pb2 as opb
from tests.support.helpers import auth, eventually, read_dead_letters
from tests.support.operational import Endpoint, Tenant

pytestmark = pytest.mark.integration


def _occurrence(body: dict[str, Any]) -> tuple[str, ...]:
    """What one operational event is about: two different ids for one of these is a double emission."""
    d = body["data"]
    return (body["type"], body["endpoint_id"], str(d.get("reason", "")), str(d.get("share", "")),
            str(d.get("delivery_id", "")))


def assert_no_event_twice(t: Tenant, at: Endpoint | None = None) -> None:
    ids: dict[tuple[str, ...], set[str]] = defaultdict(set)
    for webhook_id, body in t.received(at):
        ids[_occurrence(body)].add(body["event_id"])
        assert webhook_id  # the delivery id, which receivers dedupe on
    doubled = {k: v for k, v in ids.items() if len(v) > 1}
    assert not doubled, f"operational events emitted twice: {doubled}"


def test_a_failing_endpoint_gives_failing_then_recovered(settings, grpc_channel, receiver, delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "flap")
    biz = t.endpoint("biz", ["invoice.*"], "503")
    t.send(6)  # 5 consecutive failures open the breaker
    failing = t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, reason=ops.BREAKER_OPENED)
    assert failing["tenant_id"] == t.tenant_id and failing["event_id"].startswith("evt_ops_")
    receiver.set_behaviour(biz.path, "ok")
    t.send(1)  # held behind the open breaker: its probe succeeds
    t.wait_event(ops.ENDPOINT_RECOVERED, biz.endpoint_id)
    assert_no_event_twice(t)


def test_a_410_disables_with_its_reason(settings, grpc_channel, receiver, delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "gone")
    biz = t.endpoint("biz", ["invoice.*"], "gone")
    t.send(1)
    body = t.wait_event(ops.ENDPOINT_DISABLED, biz.endpoint_id, reason=ops.GONE)
    assert "410" in body["data"]["detail"]
    assert t.status(biz) == pb.ENDPOINT_STATUS_DISABLED


def test_retries_that_end_without_success_give_delivery_exhausted(settings, grpc_channel, receiver, delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "exhaust")
    biz = t.endpoint("biz", ["invoice.*"], "404")  # permanent: one attempt, then failed
    (event_id,) = t.send(1)
    body = t.wait_event(ops.DELIVERY_EXHAUSTED, biz.endpoint_id)
    assert body["data"]["event_id"] == event_id
    assert (body["data"]["outcome"], body["data"]["last_status"], body["data"]["attempts"]) == ("failed", 404, 1)


def test_an_operations_endpoint_that_fails_produces_no_events_about_itself(settings, grpc_channel, receiver,
                                                                            delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "opsfail", ops_behaviour="503")
    observer = t.endpoint("observer", ["webhooks.*"], "ok")  # sees every operational event of the tenant
    biz = t.endpoint("biz", ["invoice.*"], "503")
    t.send(6)
    t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, at=observer)
    # The failing operations endpoint is retried (4 attempts per event: at least one event's
    # worth), opens its own breaker and exhausts its deliveries: none of that may become an event.
    eventually(lambda: len(receiver.requests(t.ops.path)) >= 4 or None, timeout=150,
               what="the operations endpoint retried and failed")
    time.sleep(15)  # exhaustion and breaker signals reach the control plane; nothing may follow
    about = {body["endpoint_id"] for _, body in t.received(observer)}
    assert t.ops.endpoint_id not in about and observer.endpoint_id not in about, about
    assert about == {biz.endpoint_id}
    # Bounded: the events about biz, each retried at most 4 times -- no amplification.
    distinct = {body["event_id"] for _, body in t.received(observer)}
    assert len(receiver.requests(t.ops.path)) <= 4 * len(distinct)


def test_auto_disable_warns_then_disables(settings, grpc_channel, receiver, delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "auto")
    # The sweep runs every 5 s: two of them between the warning (12 s) and the disable (24 s).
    t.set_auto_disable(window_s=24, warn_at=[0.5])
    biz = t.endpoint("biz", ["invoice.*"], "503")
    t.send(6)
    t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, reason=ops.BREAKER_OPENED)
    warning = t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, reason=ops.AUTO_DISABLE_WARNING, timeout=60)
    assert warning["data"]["share"] == 0.5 and warning["data"]["dry_run"] is False
    disabled = t.wait_event(ops.ENDPOINT_DISABLED, biz.endpoint_id, reason=ops.AUTO_DISABLED, timeout=60)
    assert "auto_disabled" in disabled["data"]["detail"]
    assert t.status(biz) == pb.ENDPOINT_STATUS_DISABLED
    versions = t.cp.ListEndpointVersions(pb.GetEndpointRequest(endpoint_id=biz.endpoint_id),
                                         metadata=auth(t.api_key)).versions
    assert versions[0].changed_by == "auto-disable"
    # Enabling it again resets the count: no disable within the first half of a new window.
    t.cp.EnableEndpoint(pb.GetEndpointRequest(endpoint_id=biz.endpoint_id), metadata=auth(t.api_key))
    t.wait_event(ops.ENDPOINT_ENABLED, biz.endpoint_id)
    # Longer than a sweep, which would disable it again had the enable not restarted the clock;
    # shorter than the new window's half (its own warning, at the same share, comes 12 s after).
    time.sleep(7)
    assert t.status(biz) == pb.ENDPOINT_STATUS_ACTIVE
    assert_no_event_twice(t)


def test_auto_disable_dry_run_only_warns(settings, grpc_channel, receiver, delivery_job):
    t = Tenant(settings, grpc_channel, receiver, "dry")
    t.set_auto_disable(window_s=20, warn_at=[0.5], dry_run=True)
    biz = t.endpoint("biz", ["invoice.*"], "503")
    t.send(6)
    t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, reason=ops.AUTO_DISABLE_WARNING, dry_run=True, timeout=60)
    t.wait_event(ops.ENDPOINT_FAILING, biz.endpoint_id, reason=ops.AUTO_DISABLE_DRY_RUN, timeout=60)
    time.sleep(6)
    assert t.status(biz) == pb.ENDPOINT_STATUS_ACTIVE
    assert not [b for _, b in t.received() if b["type"] == ops.ENDPOINT_DISABLED]


@pytest.mark.chaos_full
def test_a_taskmanager_kill_emits_no_operational_event_twice(settings, grpc_channel, receiver, delivery_job,
                                                              job_env):
    from tests.support.faults import kill_taskmanager
    from tests.support.stack_fixtures import job_script

    t = Tenant(settings, grpc_channel, receiver, "tmkill")
    flapping = [t.endpoint(f"biz{i}", ["invoice.*"], "503") for i in range(3)]
    t.send(6)
    t.wait_event(ops.ENDPOINT_FAILING, flapping[0].endpoint_id, reason=ops.BREAKER_OPENED)
    # Killed while breakers are open and deliveries are being exhausted: the job restores from
    # a checkpoint and observes some of it again.
    kill_taskmanager(job_script(job_env, "id").strip())
    for ep in flapping:
        receiver.set_behaviour(ep.path, "ok")
    t.send(3)
    for ep in flapping:
        t.wait_event(ops.ENDPOINT_RECOVERED, ep.endpoint_id, timeout=180)
    time.sleep(10)
    assert_no_event_twice(t)


def test_the_api_reserves_the_prefix_and_keeps_the_setting(settings, grpc_channel, receiver, delivery_job):
    from control_plane.rpc.catalog_api import cpb, crpc

    t = Tenant(settings, grpc_channel, receiver, "api")
    md = auth(t.api_key)
    default = t.operations.GetAutoDisable(opb.GetAutoDisableRequest(), metadata=md)
    assert (default.is_default, default.window_seconds, list(default.warn_at)) == (True, 5 * 86400, [0.5, 0.7, 0.9])
    got = t.operations.SetAutoDisable(opb.SetAutoDisableRequest(window_seconds=3600, dry_run=True), metadata=md)
    assert (got.is_default, got.window_seconds, got.dry_run) == (False, 3600, True)
    assert t.operations.GetAutoDisable(opb.GetAutoDisableRequest(), metadata=md).window_seconds == 3600
    with pytest.raises(grpc.RpcError) as bad:
        t.operations.SetAutoDisable(opb.SetAutoDisableRequest(warn_at=[0.9, 0.5]), metadata=md)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    names = [x.name for x in t.operations.ListOperationalEventTypes(opb.ListOperationalEventTypesRequest(),
                                                                     metadata=md).types]
    assert names == sorted(ops.CATALOG)
    admin_md = auth(settings.control_plane.admin_token.get_secret_value())
    with pytest.raises(grpc.RpcError) as reserved:
        crpc.EventCatalogStub(grpc_channel).CreateEventType(
            cpb.CreateEventTypeRequest(tenant_id=t.tenant_id, name="webhooks.mine"), metadata=admin_md)
    assert reserved.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A producer cannot emit them: the job dead-letters a webhooks.* event without the platform's proof.
    everything = t.endpoint("all", ["*", "webhooks.*"], "ok")
    (forged,) = t.send(1, event_type=ops.ENDPOINT_DISABLED)
    letters = read_dead_letters(settings, lambda raw: forged if forged.encode() in raw else None, 1)
    assert letters[forged]["reason"] == "untrusted_operational"
    assert receiver.requests(everything.path) == []


class CutOffPublisher(KafkaPublisher):
    """The real publisher, which can be cut off from Kafka: every publish fails while ``down``."""

    down = False

    def _send(self, topic: str, key: str, value: bytes) -> None:
        if self.down:
            raise PublishError(f"{topic}: injected: Kafka unreachable")
        super()._send(topic, key, value)


@dataclass
class CutOff:
    settings: Any
    publisher: CutOffPublisher
    channel: grpc.Channel
    session: Session

    def pending(self, endpoint_id: str) -> list[Any]:
        rows = self.session.execute("SELECT endpoint_id, event_id, record FROM pending_operational_events "
                                    "WHERE bucket = 0")
        return [r for r in rows if r.endpoint_id == endpoint_id]


@pytest.fixture
def cut_off(settings: Any, kafka_bootstrap: str, delivery_job: str) -> Iterator[CutOff]:
    """A second control plane on the session's topics (the session job delivers what it publishes)
    whose publisher can be cut off from Kafka. A keyspace of its own, so the session's control
    plane (a healthy replica) does not publish its pending events; a signals topic and consumer
    group of its own, so it takes none of the session's signals."""
    from control_plane.server import build
    from stack.isolation import keyspace_session
    from stack.topics import create_topics

    suffix = uuid.uuid4().hex[:6]
    kafka = settings.kafka.model_copy(update={"signals_topic": f"{settings.kafka.signals_topic}.cutoff-{suffix}",
                                              "consumer_group": f"{settings.kafka.consumer_group}-cutoff-{suffix}"})
    cassandra = settings.cassandra.model_copy(update={"keyspace": f"{settings.cassandra.keyspace}_cutoff"})
    cp = settings.control_plane.model_copy(update={"auto_disable_interval_s": 1.0})
    local = settings.model_copy(update={"kafka": kafka, "cassandra": cassandra, "control_plane": cp})
    create_topics(kafka)
    try:
        with keyspace_session(local) as session:
            session.set_keyspace(cassandra.keyspace)
            publisher = CutOffPublisher(kafka, delivery_timeout_s=10)
            server = build(local, session, publisher=publisher, port=0)
            server.start()
            channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
            try:
                grpc.channel_ready_future(channel).result(timeout=10)
                yield CutOff(local, publisher, channel, session)
            finally:
                channel.close()
                server.stop(grace_s=2)
    finally:
        AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).delete_topics([kafka.signals_topic])


def test_an_operator_s_disable_during_a_kafka_outage_is_announced_once_kafka_is_back(cut_off: CutOff, receiver,
                                                                                      delivery_job):
    t = Tenant(cut_off.settings, cut_off.channel, receiver, "cutoff")
    biz = t.endpoint("biz", ["invoice.*"], "ok")
    cut_off.publisher.down = True
    try:
        disabled = t.cp.DisableEndpoint(pb.GetEndpointRequest(endpoint_id=biz.endpoint_id),
                                        metadata=auth(t.api_key))
        assert disabled.status == pb.ENDPOINT_STATUS_DISABLED  # committed; its config and event wait for Kafka
        assert len(cut_off.pending(biz.endpoint_id)) == 1
        # Past the grace period, sweeps (every second here) find it owed and fail to publish it.
        time.sleep(PENDING_GRACE_MS / 1000 + 5)
        assert len(cut_off.pending(biz.endpoint_id)) == 1
        assert not [b for _, b in t.received() if b["type"] == ops.ENDPOINT_DISABLED]
    finally:
        cut_off.publisher.down = False
    body = t.wait_event(ops.ENDPOINT_DISABLED, biz.endpoint_id, timeout=90, reason=ops.OPERATOR)
    assert body["data"]["detail"].startswith("disabled by ") and body["data"]["config_version"] == 2
    assert body["event_id"] == ops.event_id(biz.endpoint_id, "disabled", "2")
    eventually(lambda: cut_off.pending(biz.endpoint_id) == [] or None, timeout=30, what="the pending row deleted")
    time.sleep(10)  # more sweeps: nothing more
    got = [(webhook_id, b) for webhook_id, b in t.received()  # each verified with the endpoint's secret
           if b["type"] == ops.ENDPOINT_DISABLED and b["endpoint_id"] == biz.endpoint_id]
    assert len(got) == 1, got
    assert_no_event_twice(t)
