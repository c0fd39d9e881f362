"""Cassandra down for a while: the job must not send a delivery whose record is not durable, must
back off instead of failing, and must deliver and record everything once Cassandra is back."""

from __future__ import annotations

import subprocess
import time

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from core.settings import REPO_ROOT
from tests.support.helpers import auth, event, eventually, eventually_tolerant, new_tenant, produce

pytestmark = pytest.mark.integration


def _cassandra(action: str) -> None:
    out = subprocess.run(["bash", str(REPO_ROOT / "stack/cassandra.sh"), action], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, f"cassandra.sh {action}:\n{out.stdout}\n{out.stderr}"


def test_history_outage_delays_but_never_loses_deliveries(settings, grpc_channel, receiver, delivery_job,
                                                          cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    path = f"/ep/outage-{tenant_id}"
    created = rpc.ControlPlaneStub(grpc_channel).CreateEndpoint(
        pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["order.*"]), metadata=auth(api_key))
    endpoint_id = created.endpoint.endpoint_id
    time.sleep(1)  # let the config reach the job before the outage

    _cassandra("stop")
    try:
        events = [event(tenant_id, "order.paid", f'{{"n":{i}}}'.encode()) for i in range(5)]
        produce(settings, [e.to_json() for e in events], keys=[e.event_id for e in events])
        time.sleep(10)
        assert receiver.requests(path) == [], "a delivery was sent before its record was durable"
    finally:
        _cassandra("start")
        _cassandra("ready")

    expected = {delivery_id_for(e.event_id, endpoint_id) for e in events}
    eventually(lambda: {r.webhook_id for r in receiver.requests(path)} >= expected or None, timeout=150,
               what="all deliveries after Cassandra came back")

    def all_recorded():
        rows = [cassandra_session.execute("SELECT status, attempt_count FROM delivery_history WHERE delivery_id=%s"
                                          " LIMIT 1",
                                          (d,)).one() for d in expected]
        return all(r is not None and r.status == "succeeded" for r in rows) or None

    # the test's own session reconnects too: a NoHostAvailable meanwhile is "not yet"
    eventually_tolerant(all_recorded, timeout=90, what="every delivery recorded as succeeded")
