"""One endpoint whose signing secret does not decrypt holds that endpoint only.

Before the endpoint driver, the decryption error escaped the dispatcher's timer: the job
restarted, met the same secret again and crash-looped, stopping every tenant. Now the endpoint is
held (visibly pending, counted, logged), the job keeps running, other endpoints flow, and a
corrected config releases the held deliveries at once.
"""

from __future__ import annotations

import os
import time

import pytest

from control_plane.rpc.api import pb, rpc
from core.records import EndpointConfig, EndpointStatus, SigningKey, delivery_id_for
from core.secrets import encrypt_secret
from stack.flink_jobs import rest
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.stack_fixtures import job_script

pytestmark = pytest.mark.integration


def _forged(settings, tenant_id: str, endpoint_id: str, url: str, version: int, ciphertext: str) -> bytes:
    return EndpointConfig(
        endpoint_id=endpoint_id, tenant_id=tenant_id, config_version=version, url=url,
        status=EndpointStatus.ACTIVE, event_types=("order.*",),
        signing_keys=(SigningKey(version=1, ciphertext_b64=ciphertext),),
        published_at_ms=int(time.time() * 1000)).to_json()


def test_a_secret_that_does_not_decrypt_holds_one_endpoint_and_the_job_keeps_running(
        settings, job_env, grpc_channel, receiver, delivery_job, cassandra_session):
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    cp = rpc.ControlPlaneStub(grpc_channel)
    ok_path, bad_path = f"/ep/keyok-{tenant_id}", f"/ep/keybad-{tenant_id}"
    ok_id, bad_id = (cp.CreateEndpoint(pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["order.*"]),
                                       metadata=auth(api_key)).endpoint.endpoint_id for path in (ok_path, bad_path))
    job_id = job_script(job_env, "id").strip() or delivery_job
    started = {v["id"]: v["start-time"] for v in rest(f"/jobs/{job_id}")["vertices"]}

    # A config whose key cannot be decrypted (a corrupted row, a wrong master key on one side).
    produce(settings, [_forged(settings, tenant_id, bad_id, receiver.base_url + bad_path, 1000, "AAAAgarbage")],
            keys=[bad_id], topic=settings.kafka.endpoints_topic)
    time.sleep(2)  # the config reaches the dispatcher before the events (it is not what is tested)
    events = [event(tenant_id, "order.created", f'{{"n":{i}}}'.encode()) for i in range(20)]
    produce(settings, [e.to_json() for e in events], keys=[e.event_id for e in events])

    receiver.wait_for(ok_path, 20, timeout=90)
    time.sleep(3)
    assert receiver.requests(bad_path) == [], "nothing may be sent without a valid signature"
    d = rest(f"/jobs/{job_id}")
    assert d["state"] == "RUNNING"
    assert {v["id"]: v["start-time"] for v in d["vertices"]} == started, "the job restarted"
    held = [cassandra_session.execute("SELECT status FROM delivery_history WHERE delivery_id=%s LIMIT 1",
                                      (delivery_id_for(e.event_id, bad_id),)).one() for e in events]
    assert all(r is not None and r.status == "pending" for r in held), "held deliveries stay visible"

    # The fix: a config with a key that decrypts releases the held deliveries at once.
    whsec = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo="
    good = encrypt_secret(settings.master_key_bytes(), whsec, tenant_id=tenant_id, endpoint_id=bad_id,
                          key_version=1, nonce=os.urandom(12))
    produce(settings, [_forged(settings, tenant_id, bad_id, receiver.base_url + bad_path, 1001, good)],
            keys=[bad_id], topic=settings.kafka.endpoints_topic)
    eventually(lambda: len({r.webhook_id for r in receiver.requests(bad_path)}) == 20 or None, timeout=60,
               what="the held endpoint drains after its config is fixed")
