"""Failure isolation on the real stack: tenant A's hundreds of hanging endpoints must not stall
tenant B. B's deliveries keep flowing and its first-attempt latency stays near its baseline
(asserted loosely here; `make bench` reports the precise figure)."""

from __future__ import annotations

import statistics
import time

import pytest

from control_plane.rpc.api import pb, rpc
from tests.support.helpers import auth, create_endpoints, event, new_tenant, produce

pytestmark = pytest.mark.integration

HANGING_ENDPOINTS = 200


def _latencies_ms(settings, receiver, tenant_id, paths, n_events: int) -> list[float]:
    """Produce n events for the tenant and return, per request, arrival minus produce time."""
    events = [event(tenant_id, "payment.settled", f'{{"i":{i}}}'.encode()) for i in range(n_events)]
    sent_at = {}
    for e in events:
        sent_at[e.event_id] = time.time()
        produce(settings, [e.to_json()], keys=[e.event_id])
        time.sleep(0.05)
    want = n_events * len(paths)
    deadline = time.time() + 90
    while time.time() < deadline:
        recs = [r for p in paths for r in receiver.requests(p)
                if r.headers.get("webhook-event-id") in sent_at]
        if len(recs) >= want:
            break
        time.sleep(0.2)
    assert len(recs) >= want, f"tenant B got {len(recs)} of {want} deliveries"
    return [(r.received_at - sent_at[r.headers["webhook-event-id"]]) * 1000 for r in recs]


def test_hanging_tenant_does_not_starve_a_healthy_tenant(settings, grpc_channel, receiver, delivery_job):
    cp = rpc.ControlPlaneStub(grpc_channel)
    b_id, b_key = new_tenant(grpc_channel, settings)
    b_paths = []
    for i in range(3):
        path = f"/ep/fair-b-{b_id}-{i}"
        cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["payment.*"]),
                          metadata=auth(b_key))
        b_paths.append(path)
    baseline = _latencies_ms(settings, receiver, b_id, b_paths, 10)

    a_id, a_key = new_tenant(grpc_channel, settings)
    a_paths = [f"/ep/fair-a-{a_id}-{i}" for i in range(HANGING_ENDPOINTS)]
    for path in a_paths:
        receiver.set_behaviour(path, "hang")
    create_endpoints(grpc_channel, a_key, [receiver.base_url + p for p in a_paths], ["payment.*"])
    flood = [event(a_id, "payment.settled", b'{"flood":true}') for _ in range(5)]
    produce(settings, [e.to_json() for e in flood], keys=[e.event_id for e in flood])
    # Let A's 1,000 deliveries occupy the dispatcher (each hangs until the total timeout).
    deadline = time.time() + 60
    while time.time() < deadline and sum(
            len(receiver.requests(f"/ep/fair-a-{a_id}-{i}")) for i in range(0, HANGING_ENDPOINTS, 10)) < 10:
        time.sleep(0.2)

    under_load = _latencies_ms(settings, receiver, b_id, b_paths, 10)
    base_p50, load_p50 = statistics.median(baseline), statistics.median(under_load)
    print(f"tenant B first-attempt latency p50: baseline {base_p50:.0f} ms, "
          f"with {HANGING_ENDPOINTS} hanging endpoints of tenant A {load_p50:.0f} ms")
    # Loose bound: B is neither blocked nor queued behind A's hanging requests. Each holds a slot
    # for the job's total timeout (2 s in the test job), so waiting behind even one wave of them
    # would add at least that much; CPU contention from A's thousand timeouts on a loaded 2-core
    # machine adds less (a CI run measured 635 -> 2,017 ms with its baseline already ~6x a quiet
    # machine's), and 3x the baseline covers a machine slower still.
    timeout_ms = settings.dispatch.total_timeout_s * 1000
    assert load_p50 < max(3 * base_p50, base_p50 + timeout_ms)
