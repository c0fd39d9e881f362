"""The event-type catalog in the delivery job, on the real stack: outbox rows written past the
producer library (raw SQL) -> Debezium -> Kafka -> fan-out, which checks each event against the
catalog the control plane published on the endpoints topic.

NEEDS A TASKMANAGER THAT HAS NOT RUN AN OLDER JOB: PyFlink's thread mode keeps the Python modules
of the first job a TaskManager ran, so on a TaskManager started before operators/fanout.py and
core/schema_check.py changed, fan-out does not check schemas and these tests fail.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest

from control_plane.rpc.api import pb, rpc
from control_plane.rpc.catalog_api import cpb, crpc
from core.records import delivery_id_for
from core.settings import Settings
from outbox.producer import write_event
from stack.flink_jobs import operator_metric
from stack.outbox_relay import OutboxRelay
from tests.support.faults import wait_all_reached
from tests.support.helpers import auth, create_endpoints, eventually, new_tenant, read_dead_letters
from tests.support.receiver import Receiver

pytestmark = pytest.mark.integration

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}, "amount": {"type": "integer"}},
          "required": ["id", "amount"]}
GOOD = {"id": "o1", "amount": 3}


class Tenant:
    """A tenant with a catalog (order.paid 1 and 2 rejecting, order.noted 1 warning) and two
    endpoints for order.*: ``any`` accepts every major, ``v2`` is pinned to major 2."""

    def __init__(self, channel: grpc.Channel, settings: Settings, receiver: Receiver) -> None:
        self.tenant_id, key = new_tenant(channel, settings)
        self.md = auth(key)
        catalog = crpc.EventCatalogStub(channel)
        admin = auth(settings.control_plane.admin_token.get_secret_value())
        for name, enforcement in (("order.paid", "reject"), ("order.noted", "warn")):
            catalog.CreateEventType(cpb.CreateEventTypeRequest(tenant_id=self.tenant_id, name=name,
                                                               enforcement=enforcement), metadata=admin)
            for version in ("1", "2") if name == "order.paid" else ("1",):
                catalog.AddSchemaVersion(cpb.AddSchemaVersionRequest(
                    tenant_id=self.tenant_id, name=name, version=version, schema_json=json.dumps(SCHEMA),
                    examples_json=[json.dumps(GOOD)]), metadata=admin)
        self.paths = {k: f"/ep/catalog-{k}-{self.tenant_id}" for k in ("any", "v2")}
        ids = create_endpoints(channel, key, [receiver.base_url + p for p in self.paths.values()], ["order.*"])
        self.endpoints = dict(zip(self.paths, ids, strict=True))
        catalog.SetEndpointSchemaMajors(cpb.SetEndpointSchemaMajorsRequest(
            endpoint_id=self.endpoints["v2"], schema_majors=[2]), metadata=self.md)


@pytest.fixture(scope="module")
def tenant(grpc_channel: grpc.Channel, settings: Settings, receiver: Receiver) -> Tenant:
    return Tenant(grpc_channel, settings, receiver)


def raw_row(relay: OutboxRelay, tenant_id: str, event_type: str, version: str, payload: Any) -> str:
    """An outbox row inserted without the producer library (so without its schema check)."""
    event_id = f"evt_raw_{uuid.uuid4().hex}"
    with relay.connect() as conn:
        conn.execute("INSERT INTO webhook_outbox (event_id, tenant_id, event_type, schema_version, occurred_at, "
                     "payload) VALUES (%s, %s, %s, %s, %s, %s)",
                     (event_id, tenant_id, event_type, version, datetime.now(UTC), json.dumps(payload).encode()))
    return event_id


def _event_id(original: bytes) -> str | None:
    return str(json.loads(original).get("event_id") or "") or None


def test_an_invalid_row_is_dead_lettered_with_its_pointer_and_the_next_valid_one_is_delivered(
        relay: OutboxRelay, tenant: Tenant, settings: Settings, receiver: Receiver) -> None:
    bad = raw_row(relay, tenant.tenant_id, "order.paid", "1", {"id": "o1", "amount": "3"})
    with relay.connect() as conn:
        good = write_event(conn, tenant.tenant_id, "order.paid", GOOD, schema_version="1")
    wait_all_reached(receiver, {delivery_id_for(good, tenant.endpoints["any"])}, timeout=90)
    letters = read_dead_letters(settings, lambda raw: bad if _event_id(raw) == bad else None, 1)
    letter = letters[bad]
    assert letter["reason"] == "schema_invalid"
    assert (letter["extra"]["pointer"], letter["extra"]["schema_version"]) == ("/amount", "1.0")
    bad_ids = {delivery_id_for(bad, e) for e in tenant.endpoints.values()}
    assert not [r for r in receiver.requests() if r.webhook_id in bad_ids]


def test_an_uncatalogued_version_is_refused_for_a_new_tenant(relay: OutboxRelay, tenant: Tenant,
                                                             settings: Settings, receiver: Receiver) -> None:
    unknown = raw_row(relay, tenant.tenant_id, "order.paid", "7", GOOD)
    letters = read_dead_letters(settings, lambda raw: unknown if _event_id(raw) == unknown else None, 1)
    assert letters[unknown]["reason"] == "schema_unknown"
    assert not [r for r in receiver.requests() if r.webhook_id == delivery_id_for(unknown, tenant.endpoints["any"])]


def test_warn_delivers_the_invalid_event_and_counts_it(relay: OutboxRelay, tenant: Tenant, delivery_job: str,
                                                       receiver: Receiver) -> None:
    before = operator_metric(delivery_job, "events_schema_invalid_delivered")
    noted = raw_row(relay, tenant.tenant_id, "order.noted", "1", {"id": "o1", "amount": "not a number"})
    wait_all_reached(receiver, {delivery_id_for(noted, tenant.endpoints["any"])}, timeout=90)
    eventually(lambda: operator_metric(delivery_job, "events_schema_invalid_delivered") > before, timeout=30,
               what="the warn counter")


def test_an_endpoint_pinned_to_major_2_receives_v2_and_not_v1(relay: OutboxRelay, tenant: Tenant,
                                                               delivery_job: str, receiver: Receiver,
                                                               grpc_channel: grpc.Channel) -> None:
    skipped_before = operator_metric(delivery_job, "skipped_schema_major")
    with relay.connect() as conn:
        v1 = write_event(conn, tenant.tenant_id, "order.paid", GOOD, schema_version="1")
        v2 = write_event(conn, tenant.tenant_id, "order.paid", GOOD, schema_version="2.0")
    any_ep, v2_ep = tenant.endpoints["any"], tenant.endpoints["v2"]
    wait_all_reached(receiver, {delivery_id_for(v1, any_ep), delivery_id_for(v2, any_ep),
                                delivery_id_for(v2, v2_ep)}, timeout=90)
    assert not [r for r in receiver.requests() if r.webhook_id == delivery_id_for(v1, v2_ep)]
    # Flink's REST metrics trail the operator by up to a reporting interval.
    eventually(lambda: operator_metric(delivery_job, "skipped_schema_major") > skipped_before, timeout=30,
               what="the skipped counter")
    # Not silently dropped: the v1 event is in the pinned endpoint's history, skipped, with why.
    api, skipped_id = rpc.ControlPlaneStub(grpc_channel), delivery_id_for(v1, v2_ep)

    def listed_skipped() -> list[Any]:
        # The module's other tests send v1 events too: each is skipped for this endpoint.
        return [d for d in api.ListDeliveries(pb.ListDeliveriesRequest(
            endpoint_id=v2_ep, statuses=[pb.DELIVERY_STATUS_SKIPPED]), metadata=tenant.md).deliveries
            if d.delivery_id == skipped_id]

    [listed] = eventually(listed_skipped, timeout=30, what="the skipped delivery in the listing")
    assert (listed.delivery_id, listed.event_id, listed.status, listed.attempt_count) == (
        skipped_id, v1, pb.DELIVERY_STATUS_SKIPPED, 0)
    detail = api.GetDelivery(pb.GetDeliveryRequest(delivery_id=skipped_id), metadata=tenant.md)
    assert (detail.last_error_class, list(detail.attempts)) == ("schema major 1 not accepted (pinned: 2)", [])
    with pytest.raises(grpc.RpcError) as refused:
        api.ReplayDelivery(pb.ReplayDeliveryRequest(delivery_id=skipped_id, reason="try"), metadata=tenant.md)
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "never meant for this endpoint" in (refused.value.details() or "")
