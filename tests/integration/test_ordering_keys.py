"""Ordering keys end to end on the real stack: an endpoint ordered by object id,
a failing head holding only its key, deliveries arriving out of order, a stop-with-savepoint and
restore in the middle, the blocked key listed by the API, and an operator's skip releasing it."""

from __future__ import annotations

import time

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import EventRecord, delivery_id_for
from stack.flink_jobs import rest, wait_all_running
from tests.support.behaviours import when_header
from tests.support.helpers import auth, eventually, new_tenant, produce
from tests.support.stack_fixtures import job_script

pytestmark = pytest.mark.integration


def obj_event(tenant_id: str, n: int, object_id: str, version: int) -> EventRecord:
    return EventRecord(event_id=f"evt_ord_{tenant_id}_{n}", tenant_id=tenant_id, event_type="invoice.updated",
                       schema_version="2026-01-01", object_id=object_id, object_version=version,
                       occurred_at_ms=int(time.time() * 1000), payload=f'{{"v":{version}}}'.encode())


def test_a_failing_head_holds_its_key_through_a_restore_until_an_operator_skips_it(
        settings, job_env, grpc_channel, receiver, delivery_job, cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    path = f"/ep/{tenant_id}/ordered"
    ep = cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["invoice.*"],
                                                    ordering_key="object_id"), metadata=auth(api_key)).endpoint
    assert ep.ordering_key == "object_id"
    a1, a2, a3 = (obj_event(tenant_id, v, "inv_a", v) for v in (1, 2, 3))
    b1 = obj_event(tenant_id, 4, "inv_b", 1)
    ids = {e.event_id: delivery_id_for(e.event_id, ep.endpoint_id) for e in (a1, a2, a3, b1)}
    # The head of inv_a answers 503 and asks for 20 s: its key stays blocked long enough to look.
    receiver.set_behaviour(path, when_header("webhook-event-id", a1.event_id, 503, retry_after=20))

    def seen(e: EventRecord) -> list[float]:
        return [r.received_at for r in receiver.requests(path) if r.headers.get("webhook-event-id") == e.event_id]

    produce(settings, [a1.to_json()], keys=[a1.event_id])
    eventually(lambda: seen(a1) or None, timeout=90, what="the head's first attempt")
    # Later versions of inv_a arrive out of order (3 before 2), with another object's update.
    produce(settings, [e.to_json() for e in (a3, a2, b1)], keys=[e.event_id for e in (a3, a2, b1)])
    eventually(lambda: seen(b1) or None, timeout=60, what="the other key's delivery")

    def blocked() -> pb.BlockedKey | None:
        keys = cp.ListBlockedKeys(pb.ListBlockedKeysRequest(endpoint_id=ep.endpoint_id), metadata=auth(api_key)).keys
        return keys[0] if keys else None

    key = eventually(blocked, timeout=30, what="inv_a listed as blocked")
    assert (key.ordering_key, key.head_delivery_id, key.head_object_version) == ("inv_a", ids[a1.event_id], 1)
    assert key.attempts >= 1 and key.last_http_status == 503 and key.blocked_since.seconds > 0
    assert not seen(a2) and not seen(a3), "a later version went while its head was failing"

    # Stop with a savepoint and restore: the held deliveries and the key's head come back from
    # keyed state; nothing of inv_a goes meanwhile.
    job_script(job_env, "stop")
    out = job_script(job_env, "submit")
    assert "resuming" in out, out
    job_id = job_script(job_env, "id").strip()
    wait_all_running(job_id)
    assert rest(f"/jobs/{job_id}/checkpoints")["latest"]["restored"] is not None
    time.sleep(3)  # time for anything the restore would wrongly release
    assert not seen(a2) and not seen(a3), "a later version went after the restore while its head was failing"

    head_requests = len(seen(a1))
    skipped = cp.SkipOrderingHead(pb.SkipOrderingHeadRequest(
        endpoint_id=ep.endpoint_id, ordering_key="inv_a", delivery_id=ids[a1.event_id],
        reason="poison update, fixed by hand"), metadata=auth(api_key))
    assert skipped.delivery_id == ids[a1.event_id]
    eventually(lambda: (seen(a2) and seen(a3)) or None, timeout=60, what="inv_a released after the skip")
    assert max(seen(a2)) < min(seen(a3)), "version 2 must be answered before version 3 is sent"
    assert len(seen(a1)) == head_requests, "the skipped head was sent again"
    assert len(seen(a2)) == len(seen(a3)) == 1

    def failed() -> pb.DeliveryDetail | None:
        d = cp.GetDelivery(pb.GetDeliveryRequest(delivery_id=ids[a1.event_id]), metadata=auth(api_key))
        return d if d.delivery.status == pb.DELIVERY_STATUS_FAILED else None

    detail = eventually(failed, timeout=30, what="the skipped head recorded failed")
    assert detail.attempts[-1].outcome == "not_sent"  # its reserved row closed: no request was made
    assert [(r.action, r.reason) for r in detail.replays] == [("skip", "poison update, fixed by hand")]
    rows = cassandra_session.execute("SELECT outcome, requested_by, request_id FROM delivery_history"
                                     " WHERE delivery_id=%s AND attempt_number > 0 ORDER BY attempt_number ASC",
                                     (ids[a1.event_id],))
    assert any(r.request_id == skipped.request_id and r.requested_by for r in rows), "history names the skip"
    eventually(lambda: blocked() is None or None, timeout=30, what="inv_a no longer listed")
