"""Fan-out's dedupe state expires on RocksDB, the backend the stack (and production) runs, and what it forgets does not
become a second request: a second job whose dedupe window is a few seconds dedupes a re-publish inside the window,
fans out one after it again, and the dispatcher then reads the delivery's durable record and does not send what is
already final."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from cassandra.cluster import Session

from control_plane.rpc.api import pb, rpc
from core.fanout import HOUR_MS, snapshot_partition
from core.records import delivery_id_for
from core.settings import Settings
from stack.flink_jobs import rest
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.stack_fixtures import second_stack

pytestmark = pytest.mark.integration

TTL_S = 4
QUIET_S = 5


@pytest.fixture(scope="module")
def short_dedupe(job_env: dict[str, str]) -> Iterator[tuple[Settings, str, Session]]:
    with second_stack(job_env, "test-dedupe", {"WEBHOOKS_FLINK__DEDUPE_TTL_S": str(TTL_S)}) as stack:
        yield stack


def fanouts(session: Session, event_id: str) -> list[int]:
    """Arrival times of fan-out's decisions for this event (one fanout_snapshots row each)."""
    now = int(time.time() * 1000)
    out = []
    for hour_of in (now - HOUR_MS, now):
        hour, bucket = snapshot_partition(event_id, hour_of)
        out += [int(r.arrived_at.timestamp() * 1000) for r in session.execute(
            "SELECT event_id, arrived_at FROM fanout_snapshots WHERE hour=%s AND bucket=%s", (hour, bucket))
            if r.event_id == event_id]
    return sorted(out)


def test_a_republish_after_the_dedupe_window_is_fanned_out_again_and_not_resent(short_dedupe, receiver):
    import grpc

    settings, address, session = short_dedupe
    conf = {c["key"]: c["value"] for c in rest("/jobmanager/config")}
    assert conf.get("state.backend.type") == "rocksdb"  # what this test is about
    with grpc.insecure_channel(address) as channel:
        tenant_id, api_key = new_tenant(channel, settings)
        path = f"/ep/dedupe-{tenant_id}"
        endpoint_id = rpc.ControlPlaneStub(channel).CreateEndpoint(
            pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["invoice.*"]),
            metadata=auth(api_key)).endpoint.endpoint_id
    ev = event(tenant_id, "invoice.paid", b'{"n":1}')
    did = delivery_id_for(ev.event_id, endpoint_id)
    produce(settings, [ev.to_json()], keys=[ev.event_id])
    receiver.wait_for(path, 1, timeout=90)
    first = eventually(lambda: fanouts(session, ev.event_id) or None, timeout=30, what="fan-out's decision")

    produce(settings, [ev.to_json()], keys=[ev.event_id])  # inside the window: deduped
    time.sleep(2)
    assert fanouts(session, ev.event_id) == first

    time.sleep(TTL_S + 1)
    produce(settings, [ev.to_json()], keys=[ev.event_id])  # after it: the state has expired
    eventually(lambda: len(fanouts(session, ev.event_id)) == 2 or None, timeout=60,
               what="fan-out deciding again once its dedupe state expired")
    time.sleep(QUIET_S)
    assert len(receiver.requests(path)) == 1, "a delivery final in history was sent again"
    rows = list(session.execute("SELECT attempt_number, outcome FROM delivery_history WHERE delivery_id=%s"
                                " AND attempt_number > 0 ORDER BY attempt_number ASC", (did,)))
    assert [(r.attempt_number, r.outcome) for r in rows] == [(1, "succeeded")]
