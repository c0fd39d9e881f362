"""Replay windows on the real stack (core/replay_policy.py): a catalogued type's window and a
tenant's rule by type pattern, through the control plane, Kafka, the delivery job and the
recording receiver.

Each test has its own tenants and endpoints; the receiver answers 400 first, so each delivery
ends ``failed`` after one attempt (a replay candidate for single replays and bulk recovery alike).

The "inside the window" replays run under a 1 h window which the test then cuts to 2 s: an
event's first delivery can take more than 2 s to show on a loaded machine, so a 2 s window from
the start would make the inside case a race. A request queued inside the window but read by the
job after it closed is produced on the replays topic as the control plane queues one (with its
closing time), already past it: the job cannot be made to read late on demand.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from control_plane.rpc.api import pb, rpc
from control_plane.rpc.catalog_api import cpb, crpc
from core.records import ReplayRequest, delivery_id_for
from core.settings import Settings
from tests.support.behaviours import Status
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import Receiver

pytestmark = pytest.mark.integration

OPEN, SHORT = "1h", "2s"
SHORT_MS = 2_000


def stamp(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


class Tenant:
    """A tenant, its key and one endpoint at the receiver for user.* and invoice.paid; ``catalog``:
    both types catalogued (version 1.0, any object), so fan-out checks its events."""

    def __init__(self, channel: grpc.Channel, settings: Settings, receiver: Receiver, name: str,
                 catalog: bool) -> None:
        self.settings, self.receiver = settings, receiver
        self.tenant_id, key = new_tenant(channel, settings)
        self.md = auth(key)
        self.admin = auth(settings.control_plane.admin_token.get_secret_value())
        self.api = rpc.ControlPlaneStub(channel)
        self.catalog = crpc.EventCatalogStub(channel)
        self.catalogued = catalog
        if catalog:
            for t in ("user.disabled", "invoice.paid"):
                self.catalog.CreateEventType(cpb.CreateEventTypeRequest(tenant_id=self.tenant_id, name=t),
                                             metadata=self.admin)
                self.catalog.AddSchemaVersion(cpb.AddSchemaVersionRequest(
                    tenant_id=self.tenant_id, name=t, version="1.0", schema_json='{"type": "object"}',
                    examples_json=['{"id": "x"}']), metadata=self.admin)
        self.path = f"/ep/replay-window-{name}-{self.tenant_id}"
        receiver.set_behaviour(self.path, Status(400))
        created = self.api.CreateEndpoint(pb.CreateEndpointRequest(
            url=receiver.base_url + self.path, event_types=["user.*", "invoice.paid"]), metadata=self.md)
        self.endpoint_id = created.endpoint.endpoint_id

    def type_window(self, event_type: str, window: str) -> None:
        self.catalog.UpdateEventType(cpb.UpdateEventTypeRequest(
            tenant_id=self.tenant_id, name=event_type, replay_window=window, update_fields=["replay_window"]),
            metadata=self.admin)

    def rule(self, pattern: str, window: str) -> None:
        self.catalog.SetReplayRule(cpb.SetReplayRuleRequest(tenant_id=self.tenant_id, pattern=pattern,
                                                            replay_window=window), metadata=self.admin)

    def failed_delivery(self, event_type: str) -> str:
        """Emit one event of ``event_type`` and wait for its delivery to fail (the receiver's 400)."""
        ev = event(self.tenant_id, event_type, json.dumps({"id": event_type}).encode())
        if self.catalogued:
            ev = replace(ev, schema_version="1.0")
        produce(self.settings, [ev.to_json()], keys=[ev.event_id])
        did = delivery_id_for(ev.event_id, self.endpoint_id)
        eventually(lambda: self.get(did) if self.get(did).delivery.status == pb.DELIVERY_STATUS_FAILED else None,
                   timeout=90, what=f"{event_type} delivery failed")
        return did

    def get(self, delivery_id: str) -> Any:
        try:
            return self.api.GetDelivery(pb.GetDeliveryRequest(delivery_id=delivery_id), metadata=self.md)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                return pb.DeliveryDetail()
            raise

    def replay(self, delivery_id: str) -> Any:
        return self.api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=delivery_id, reason="test"),
                                       metadata=self.md)

    def refused(self, delivery_id: str) -> str:
        """The FAILED_PRECONDITION text of a replay of ``delivery_id``."""
        with pytest.raises(grpc.RpcError) as info:
            self.replay(delivery_id)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        return str(info.value.details())  # type: ignore[attr-defined]

    def arrivals(self, event_type: str) -> int:
        return sum(1 for r in self.receiver.requests(self.path) if r.headers["webhook-event-type"] == event_type)

    def manual_attempt_arrives(self, delivery_id: str, event_type: str, before: int) -> None:
        self.receiver.wait_for(self.path, before + 1, timeout=60)
        eventually(lambda: any(a.manual and a.outcome != "reserved" for a in self.get(delivery_id).attempts),
                   timeout=60, what="the manual attempt recorded")
        assert self.arrivals(event_type) >= 2


@pytest.fixture
def catalogued(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver, delivery_job: str) -> Tenant:
    return Tenant(grpc_channel, settings, receiver, "catalog", catalog=True)


@pytest.fixture
def uncatalogued(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver, delivery_job: str) -> Tenant:
    return Tenant(grpc_channel, settings, receiver, "rules", catalog=False)


@pytest.fixture
def bystander(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver, delivery_job: str) -> Tenant:
    return Tenant(grpc_channel, settings, receiver, "other", catalog=False)


def test_a_catalogued_types_window_allows_replays_inside_it_and_refuses_them_after(
        catalogued: Tenant, bystander: Tenant) -> None:
    t = catalogued
    t.type_window("user.disabled", OPEN)
    did = t.failed_delivery("user.disabled")
    t.receiver.set_behaviour(t.path, "ok")
    before = len(t.receiver.requests(t.path))
    t.replay(did)  # inside the window: arrives
    t.manual_attempt_arrives(did, "user.disabled", before)

    t.type_window("user.disabled", SHORT)
    time.sleep(SHORT_MS / 1000)
    refusal = t.refused(did)
    assert refusal.startswith("replay not allowed: catalog user.disabled: replay window 2s (closed at ")
    detail = t.get(did)
    assert detail.replay_refusal == refusal  # what the console shows instead of the form
    assert len(detail.attempts) == 2  # the history stays whole

    # Another tenant's delivery of the same type, as old, replays as before.
    b = bystander
    other = b.failed_delivery("user.disabled")
    time.sleep(SHORT_MS / 1000)
    b.receiver.set_behaviour(b.path, "ok")
    before = len(b.receiver.requests(b.path))
    b.replay(other)
    b.manual_attempt_arrives(other, "user.disabled", before)
    assert b.get(other).replay_refusal == ""


def test_a_bulk_recovery_replays_what_the_window_allows_and_reports_the_rest(catalogued: Tenant) -> None:
    t = catalogued
    t.type_window("user.disabled", SHORT)
    start = int(time.time() * 1000) - 1000
    closed = t.failed_delivery("user.disabled")
    allowed = t.failed_delivery("invoice.paid")
    time.sleep(SHORT_MS / 1000)
    t.receiver.set_behaviour(t.path, "ok")
    before = len(t.receiver.requests(t.path))
    progress = list(t.api.RecoverFailedDeliveries(pb.RecoverFailedDeliveriesRequest(
        endpoint_id=t.endpoint_id, start_time=stamp(start), end_time=stamp(int(time.time() * 1000) + 1000),
        reason="window test"), metadata=t.md))
    last = progress[-1]
    assert (last.done, last.total, last.replayed, last.not_allowed) == (True, 1, 1, 1)
    assert dict(last.not_allowed_by_rule) == {"catalog user.disabled: replay window 2s": 1}
    t.manual_attempt_arrives(allowed, "invoice.paid", before)
    time.sleep(3)  # time for a wrong replay to arrive too
    assert t.arrivals("user.disabled") == 1  # its first attempt only
    assert not any(a.manual for a in t.get(closed).attempts)
    assert not t.get(closed).replays  # skipped before anything was audited or queued


def test_a_request_the_job_reads_after_the_window_closed_is_refused_and_recorded(
        catalogued: Tenant, settings: Settings) -> None:
    t = catalogued
    t.type_window("user.disabled", SHORT)
    did = t.failed_delivery("user.disabled")
    t.receiver.set_behaviour(t.path, "ok")
    now = int(time.time() * 1000)
    request = ReplayRequest(delivery_id=did, tenant_id=t.tenant_id, endpoint_id=t.endpoint_id,
                            requested_by="key_test", requested_at_ms=now - SHORT_MS, request_id="rpl_late_1",
                            replay_closes_at_ms=now - 1, replay_rule="catalog user.disabled: replay window 2s")
    produce(settings, [request.to_json()], keys=[did], topic=settings.kafka.replays_topic)

    def refusal_row() -> Any:
        rows = [r for r in t.get(did).replays if r.action == "refused"]
        return rows[0] if rows else None

    row = eventually(refusal_row, timeout=60, what="the job's refusal in the delivery's history")
    assert row.request_id == "rpl_late_1/refused" and row.requested_by == "key_test"
    assert row.reason.startswith("replay not allowed: catalog user.disabled: replay window 2s (closed at ")
    assert "the delivery job read the request at" in row.reason
    time.sleep(3)
    assert t.arrivals("user.disabled") == 1 and len(t.get(did).attempts) == 1  # never sent


def test_a_tenant_pattern_rule_without_a_catalog_works_the_same(uncatalogued: Tenant, bystander: Tenant) -> None:
    t = uncatalogued
    t.rule("user.*", OPEN)
    did = t.failed_delivery("user.disabled")
    invoice = t.failed_delivery("invoice.paid")
    t.receiver.set_behaviour(t.path, "ok")
    before = len(t.receiver.requests(t.path))
    t.replay(did)
    t.manual_attempt_arrives(did, "user.disabled", before)

    t.rule("user.*", SHORT)
    time.sleep(SHORT_MS / 1000)
    assert t.refused(did).startswith("replay not allowed: tenant rule user.*: replay window 2s (closed at ")
    before = len(t.receiver.requests(t.path))
    t.replay(invoice)  # not matched by the pattern: the 30-day history
    t.manual_attempt_arrives(invoice, "invoice.paid", before)

    b = bystander  # no rule of its own: the other tenant's rule does not reach it
    other = b.failed_delivery("user.disabled")
    time.sleep(SHORT_MS / 1000)
    b.receiver.set_behaviour(b.path, "ok")
    before = len(b.receiver.requests(b.path))
    b.replay(other)
    b.manual_attempt_arrives(other, "user.disabled", before)
