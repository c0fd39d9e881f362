"""The cluster topology (stack/topologies/cluster.env) brought up by the stack scripts, end to end.

`make cluster-check` runs it (marker ``cluster``; `make test` leaves it out): stack/up.sh and
stack/job.sh with TOPOLOGY=cluster, beside whatever stack already runs on this machine -- the
ports of stack/topologies/cluster-beside.env, its own run directory, wiped first so every run
starts the way a fresh clone does -- and stack/down.sh after, which stops it by the pids it
recorded. Through it: an endpoint created on each control-plane replica, events published both ways
(the outbox through Kafka Connect, and straight to Kafka), every one delivered to both endpoints;
then the shape itself: every platform topic at RF 3 with min.insync.replicas=2, Kafka's offsets
topic at RF 3, the keyspace at RF 3, the job at parallelism 2 (max 256) with subtasks on both
TaskManagers; what the cluster costs at idle (stack.cluster_cost, printed); last, the README's tour
as written against it (test_readme_tour.walk_tour).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from control_plane.rpc.api import pb, rpc
from core.records import delivery_id_for
from core.settings import REPO_ROOT, Settings
from outbox.producer import write_event
from stack.isolation import harness_cluster, settings_with
from stack.topics import topic_specs
from tests.e2e.test_readme_tour import README, fresh_terminal, tour_commands, walk_tour
from tests.support.helpers import auth, event, eventually, new_tenant, produce
from tests.support.receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

TOPOLOGIES = REPO_ROOT / "stack" / "topologies"
RUN_DIR = REPO_ROOT / ".run" / "cluster-check"
EVENTS = 20  # per way of publishing


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as stack/lib.sh's load_env_file reads them (no quoting, # comments)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return dict(pairs)  # type: ignore[arg-type]


def script(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    started = time.monotonic()
    out = subprocess.run(["bash", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"\n$ {' '.join(args)}  ({time.monotonic() - started:.0f} s)\n{out.stdout[-3000:]}")
    assert out.returncode == 0, (f"{' '.join(args)} failed ({out.returncode}):\n{out.stdout[-3000:]}\n"
                                 f"{out.stderr[-3000:]}")
    return out.stdout


def wipe(env: dict[str, str]) -> None:
    """What an earlier run left: stopped by its pids, the producer database destroyed, files gone."""
    if RUN_DIR.exists():
        script(env, "stack/down.sh")
        script(env, "stack/postgres.sh", "destroy")
        subprocess.run(["rm", "-rf", str(RUN_DIR)], check=True)


@pytest.fixture(scope="module")
def cluster_env(certs: Path, receiver: Receiver, listen_port: int) -> Iterator[dict[str, str]]:
    port = int((receiver.base_url or "").rsplit(":", 1)[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBHOOKS_", "TOPOLOGY", "LOCAL_RECEIVERS"))}
    # The beside file first: lib.sh keeps what the environment already sets.
    env.update(env_file(TOPOLOGIES / "cluster-beside.env"))
    env.update({
        "WEBHOOKS_RUN_DIR": str(RUN_DIR),
        "TOPOLOGY": "cluster",
        # The tour's switch, with the session receiver's and the tour listener's ports and the
        # test CA (the stack's dev CA, .run/certs, which `webhookctl listen` serves with).
        "LOCAL_RECEIVERS": "1",
        "WEBHOOKS_EGRESS__ALLOWED_PORTS": json.dumps([443, port, listen_port]),
        "WEBHOOKS_DISPATCH__CA_BUNDLE": str(certs / "ca.pem"),
    })
    wipe(env)
    started = time.monotonic()
    try:
        script(env, "stack/up.sh")
        script(env, "stack/job.sh", "submit")
        print(f"\ncluster up with the job running in {time.monotonic() - started:.0f} s")
        yield env
    finally:
        script(env, "stack/status.sh")
        script(env, "stack/down.sh")
        status = script(env, "stack/status.sh")
        assert "running" not in status, status


@pytest.fixture(scope="module")
def cluster_settings(cluster_env: dict[str, str]) -> Settings:
    # The processes read cluster.env through lib.sh; this process reads it the same way.
    return settings_with({**env_file(TOPOLOGIES / "cluster.env"), **cluster_env})


def test_the_cluster_delivers_through_both_control_planes_at_rf3_on_two_taskmanagers(
        cluster_env: dict[str, str], cluster_settings: Settings, receiver: Receiver) -> None:
    s = cluster_settings
    assert receiver.base_url is not None
    assert s.kafka.bootstrap_servers.count(",") == 2 and len(s.cassandra.contact_points) == 3

    # An endpoint created on each replica of the control plane.
    replicas = [grpc.insecure_channel(f"127.0.0.1:{s.control_plane.port + i}") for i in range(2)]
    tenant_id, key = new_tenant(replicas[0], s)
    paths = [f"/cluster-{uuid.uuid4().hex[:8]}-replica{i + 1}" for i in range(2)]
    endpoint_ids = [
        rpc.ControlPlaneStub(ch).CreateEndpoint(
            pb.CreateEndpointRequest(url=receiver.base_url + path, event_types=["order.paid"]),
            metadata=auth(key), timeout=30).endpoint.endpoint_id
        for ch, path in zip(replicas, paths, strict=True)]
    assert len(set(endpoint_ids)) == 2

    # Events both ways: the outbox (PostgreSQL -> Debezium on the Connect worker -> Kafka) and an
    # acks=all producer straight to the events topic.
    with psycopg.connect(s.outbox.dsn) as conn:
        outboxed = {write_event(conn, tenant_id, "order.paid", {"n": i}) for i in range(EVENTS)}
    direct = [event(tenant_id, "order.paid", json.dumps({"n": i}).encode()) for i in range(EVENTS)]
    produce(s, [e.to_json() for e in direct], keys=[e.event_id for e in direct])
    expected = outboxed | {e.event_id for e in direct}

    # Each event to each endpoint once, named by its delivery id (the webhook-id header).
    wanted = {path: {delivery_id_for(e, ep) for e in expected} for path, ep in zip(paths, endpoint_ids, strict=True)}

    def received(path: str) -> set[str]:
        return {r.webhook_id for r in receiver.requests(path) if r.webhook_id}

    eventually(lambda: all(wanted[p] <= received(p) for p in paths), timeout=120, interval=1,
               what="every event delivered to both endpoints")
    for path in paths:
        assert received(path) == wanted[path], f"{path}: unexpected {received(path) - wanted[path]}"

    # Kafka: every platform topic at RF 3 and min.insync.replicas 2; Kafka's own offsets too.
    admin = AdminClient({"bootstrap.servers": s.kafka.bootstrap_servers})
    meta = admin.list_topics(timeout=10)
    assert len(meta.brokers) == 3
    names = [t.topic for t in topic_specs(s.kafka)]
    for name in [*names, "__consumer_offsets"]:
        partitions = meta.topics[name].partitions.values()
        assert {len(p.replicas) for p in partitions} == {3}, name
        assert all(len(p.isrs) == 3 for p in partitions), name
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in names])
    for resource, fut in configs.items():
        assert fut.result()["min.insync.replicas"].value == "2", resource.name

    # Cassandra: three nodes up, the keyspace at RF 3, clients at LOCAL_QUORUM.
    cluster = harness_cluster(s)
    try:
        session = cluster.connect()
        assert sorted(h.address for h in cluster.metadata.all_hosts() if h.is_up) == [
            "127.0.0.1", "127.0.0.2", "127.0.0.3"]
        row = session.execute("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name=%s",
                              (s.cassandra.keyspace,)).one()
        assert row.replication["replication_factor"] == "3", row.replication
    finally:
        cluster.shutdown()
    assert s.cassandra.consistency == "LOCAL_QUORUM"

    # Flink: the job at parallelism 2, max parallelism 256, its keyed subtasks on both TaskManagers.
    rest = f"http://127.0.0.1:{s.flink.rest_port}"
    job_id = script(cluster_env, "stack/job.sh", "id").strip().splitlines()[-1]
    job = _get(f"{rest}/jobs/{job_id}")
    assert job["state"] == "RUNNING" and job["maxParallelism"] == 256, (job["state"], job["maxParallelism"])
    assert len(_get(f"{rest}/taskmanagers")["taskmanagers"]) == 2
    for vertex in job["vertices"]:
        if vertex["name"].startswith(("dispatch", "dedupe")):
            assert vertex["parallelism"] == 2, vertex["name"]
            hosts = {tm["taskmanager-id"] for tm in _get(f"{rest}/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers")
                     ["taskmanagers"]}
            assert len(hosts) == 2, f"{vertex['name']}: subtasks on {hosts}"

    # What it costs with the job running and no traffic (docs/operating.md's figures come from this).
    cost = subprocess.run([str(REPO_ROOT / ".venv/bin/python"), "-m", "stack.cluster_cost", "--seconds", "20"],
                          cwd=REPO_ROOT, env=cluster_env, capture_output=True, text=True, timeout=60)
    print(f"\nidle cost, job running, no traffic:\n{cost.stdout}{cost.stderr}")
    assert cost.returncode == 0


def test_the_readme_tour_works_against_the_cluster(cluster_env: dict[str, str], cluster_settings: Settings,
                                                   listen_port: int) -> None:
    """The README's tour as written, after its `make run LOCAL_RECEIVERS=1` (here: the cluster,
    brought up with that switch by cluster_env), against control-plane replica 1 and the
    cluster's outbox: the listener's verified delivery, `deliveries get`, the replay's attempt 2."""
    commands = tour_commands(README.read_text())
    make = shlex.split(commands.pop(0), comments=True)
    assert make[:2] == ["make", "run"], make
    switch = dict(word.split("=", 1) for word in make[2:])
    assert switch["LOCAL_RECEIVERS"] == cluster_env["LOCAL_RECEIVERS"], (switch, cluster_env["LOCAL_RECEIVERS"])
    s = cluster_settings
    walk_tour(commands, fresh_terminal(s.control_plane.port, s.outbox.dsn, listen_port),
              f"127.0.0.1:{s.control_plane.http_port}")


def _get(url: str) -> dict:  # type: ignore[type-arg]
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)  # type: ignore[no-any-return]
