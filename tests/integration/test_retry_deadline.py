"""The absolute retry deadline on the real stack. The session job keeps the product's 24 h; this
module submits a second job (own topics, own control plane) whose deadline is a few seconds, so a
delivery to an endpoint that keeps failing visibly ends `expired` rather than retrying forever,
and its tenant's operations endpoint hears of it (``webhooks.delivery.exhausted``; the other
operational events: test_operational_events.py)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from cassandra.cluster import Session

from control_plane.rpc.api import pb, rpc
from core import operational_events as ops
from core.settings import Settings
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.operational import Tenant
from tests.support.stack_fixtures import second_stack

pytestmark = pytest.mark.integration

DEADLINE_S = 5


@pytest.fixture(scope="module")
def deadline_stack(job_env: dict[str, str]) -> Iterator[tuple[Settings, str, Session]]:
    with second_stack(job_env, "test-deadline", {
            "WEBHOOKS_DISPATCH__RETRY_DEADLINE_S": str(DEADLINE_S),
            "WEBHOOKS_DISPATCH__MAX_ATTEMPTS": "100",
            "WEBHOOKS_DISPATCH__RETRY_CAP_S": "1",
            "WEBHOOKS_DISPATCH__BREAKER_FAILURE_THRESHOLD": "100"}) as stack:
        yield stack


def test_failing_delivery_expires_at_the_deadline(deadline_stack, receiver):
    import grpc

    settings, address, cassandra_session = deadline_stack
    with grpc.insecure_channel(address) as channel:
        tenant_id, api_key = new_tenant(channel, settings)
        path = f"/ep/deadline-{tenant_id}"
        receiver.set_behaviour(path, "503")
        endpoint_id = rpc.ControlPlaneStub(channel).CreateEndpoint(
            pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["job.*"]),
            metadata=auth(api_key)).endpoint.endpoint_id
        ev = event(tenant_id, "job.failed", b'{"j":1}')
        produce(settings, [ev.to_json()], keys=[ev.event_id])

    from core.records import delivery_id_for

    did = delivery_id_for(ev.event_id, endpoint_id)

    def expired():
        row = cassandra_session.execute(
            "SELECT status, attempt_count, auto_retry_active, created_at, updated_at FROM delivery_history "
            "WHERE delivery_id=%s LIMIT 1", (did,)).one()
        return row if row is not None and row.status == "expired" else None

    row = eventually(expired, timeout=60, what="delivery expired at its deadline")
    assert row.auto_retry_active is False
    assert row.attempt_count >= 2  # it was retried until the deadline, not given up early
    requests = receiver.requests(path)
    # No attempt starts after the deadline (a small margin for clock reads).
    created_s = row.created_at.replace(tzinfo=datetime.UTC).timestamp()  # the driver returns naive UTC
    assert all(r.received_at <= created_s + DEADLINE_S + 0.5 for r in requests), \
        [round(r.received_at - created_s, 2) for r in requests]


def test_a_delivery_past_its_deadline_gives_delivery_exhausted(deadline_stack, receiver):
    import grpc

    settings, address, _session = deadline_stack
    with grpc.insecure_channel(address) as channel:
        t = Tenant(settings, channel, receiver, "deadline")
        biz = t.endpoint("biz", ["invoice.*"], "503")
        t.send(1)
        body = t.wait_event(ops.DELIVERY_EXHAUSTED, biz.endpoint_id, outcome="expired")
        assert body["data"]["attempts"] >= 2 and body["data"]["last_status"] in (503, None)
