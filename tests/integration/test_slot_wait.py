"""A tenant at its in-flight quota on the real stack. This module submits a second job (own
topics, own control plane) whose tenant quota is one request, so one endpoint's slow request
makes another endpoint of the same tenant wait for the slot. The waiting endpoint is *parked*
(it re-checks for a grant without a full pass, see ``Dispatcher._still_parked``); it must not
send while the quota is full, and must take the slot soon after it frees -- within its slot-wait
back-off (at most ~1 s), not at the next forced full pass (5 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from control_plane.rpc.api import pb, rpc
from core.settings import Settings
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.stack_fixtures import second_stack

pytestmark = pytest.mark.integration

SLOW_S = 2.5


@pytest.fixture(scope="module")
def quota_one_stack(job_env: dict[str, str]) -> Iterator[tuple[Settings, str]]:
    with second_stack(job_env, "test-quota", {"WEBHOOKS_DISPATCH__TENANT_MAX_IN_FLIGHT": "1",
                                              "WEBHOOKS_DISPATCH__TOTAL_TIMEOUT_S": "10"}) as (settings, address, _):
        yield settings, address


def test_endpoint_waiting_on_the_tenant_quota_takes_the_slot_when_it_frees(quota_one_stack, receiver):
    import grpc

    settings, address = quota_one_stack
    with grpc.insecure_channel(address) as channel:
        tenant_id, api_key = new_tenant(channel, settings)
        cp = rpc.ControlPlaneStub(channel)
        holder, waiter = f"/ep/quota-hold-{tenant_id}", f"/ep/quota-wait-{tenant_id}"
        receiver.set_behaviour(holder, f"slow {SLOW_S}")
        for path, types in ((holder, ["hold.*"]), (waiter, ["wait.*"])):
            cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=types),
                              metadata=auth(api_key))

        first = event(tenant_id, "hold.started", b'{"h":1}')
        produce(settings, [first.to_json()], keys=[first.event_id])
        held = eventually(lambda: receiver.requests(holder), timeout=60, interval=0.1,
                          what="the slow request started")[0]
        second = event(tenant_id, "wait.started", b'{"w":1}')
        produce(settings, [second.to_json()], keys=[second.event_id])
        waited = eventually(lambda: receiver.requests(waiter), timeout=60, interval=0.1,
                            what="the waiting delivery sent")[0]

    freed_at = held.received_at + SLOW_S  # the holder's answer; its slot frees at the next harvest
    # The quota held: nothing went to the waiter while the holder's request was in flight.
    assert waited.received_at >= freed_at - 0.05, round(waited.received_at - held.received_at, 2)
    # Picked up within the back-off, not at the next forced full pass (5 s after parking).
    assert waited.received_at - freed_at < 2.0, round(waited.received_at - freed_at, 2)
