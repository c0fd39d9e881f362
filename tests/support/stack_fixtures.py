"""Fixtures for tests against the real local stack (Kafka, Cassandra, Flink) that `make test`
starts. A service that is down fails the test; nothing here skips.

Isolation: the session submits its own delivery job with its own topics (suffix per run) and a
development egress allowance for the loopback receiver, and runs an in-process gRPC control
plane publishing to those topics. Tests use their own tenant and endpoint ids.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cassandra.cluster import Session
from confluent_kafka.admin import AdminClient

from core.settings import REPO_ROOT, Settings
from operators.history_store import CassandraHistory
from stack.flink_jobs import cancel, job_sh, wait_all_running
from stack.isolation import isolated_env, keyspace_session, settings_with
from stack.outbox_relay import OutboxRelay
from stack.topics import create_topics
from tests.support.receiver import Receiver

RUN = REPO_ROOT / ".run"
RUN_ID = uuid.uuid4().hex[:8]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session", autouse=True)
def fault_report() -> Iterator[None]:
    """After the session: the fault matrix's report (.run/chaos/report.md) and its summary line,
    if any fault ran (tests/support/faults.py)."""
    yield
    from tests.support.chaos_cluster import MATRIX, STACK, cluster_summary
    from tests.support.faults import RESULTS, RUN, summary, write_report

    matrix = [r for r in RESULTS if r.matrix == "chaos"]
    if matrix:
        path = write_report(matrix)
        print(f"\n{summary(matrix)}\nreport: {path}")
    # `make chaos-cluster`'s faults (tests/support/chaos_cluster.py): their own report and line.
    cluster = [r for r in RESULTS if r.matrix == MATRIX]
    if cluster:
        line = cluster_summary(cluster)
        path = write_report(cluster, title=f"Cluster fault matrix (stack: {STACK})", last_line=line, out=RUN / MATRIX)
        print(f"\n{line}\nstack: {STACK}; report: {path}")


@pytest.fixture(scope="session")
def certs() -> Path:
    out = RUN / "certs"
    subprocess.run([str(REPO_ROOT / ".venv/bin/python"), "-m", "stack.certs", "--out", str(out)],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def receiver(certs: Path) -> Iterator[Receiver]:
    rx = Receiver(record="full")
    rx.start("127.0.0.1", _free_port(), str(certs / "server.pem"), str(certs / "server.key"))
    yield rx
    rx.stop()


@pytest.fixture(scope="session")
def listen_port() -> int:
    """A port the session's job may deliver to besides the receiver's: `webhookctl listen`'s in
    test_readme_tour (the stack's LOCAL_RECEIVERS allows 8443, which a developer's listener may hold)."""
    return _free_port()


@pytest.fixture(scope="session")
def job_env(receiver: Receiver, certs: Path, listen_port: int) -> dict[str, str]:
    """Environment (WEBHOOKS_*) of this session's delivery job and control plane."""
    port = int(receiver.base_url.rsplit(":", 1)[1])
    return {
        **isolated_env(f"test-t{RUN_ID}", own_keyspace=True),
        "WEBHOOKS_KAFKA__PARTITIONS": "2",
        "WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS": '["127.0.0.1/32"]',
        "WEBHOOKS_EGRESS__ALLOWED_PORTS": json.dumps([443, port, listen_port]),
        "WEBHOOKS_DISPATCH__CA_BUNDLE": str(certs / "ca.pem"),
        # Short schedules so retries, the breaker and timeouts are observable within a test.
        "WEBHOOKS_DISPATCH__RETRY_BASE_S": "0.5",
        "WEBHOOKS_DISPATCH__RETRY_CAP_S": "2",
        "WEBHOOKS_DISPATCH__MAX_ATTEMPTS": "4",
        "WEBHOOKS_DISPATCH__CONNECT_TIMEOUT_S": "1",
        "WEBHOOKS_DISPATCH__TOTAL_TIMEOUT_S": "2",
        "WEBHOOKS_DISPATCH__BREAKER_OPEN_S": "2",
        # A small memory window: every burst of the suite goes through the overflow queue in
        # keyed state, and the fault tests restore it.
        "WEBHOOKS_DISPATCH__MEMORY_WINDOW": "40",
        "WEBHOOKS_DISPATCH__PAGE_SIZE": "16",
        "WEBHOOKS_FLINK__CHECKPOINT_INTERVAL_MS": "2000",
        "WEBHOOKS_CONTROL_PLANE__CONFIG_CLOCK_INTERVAL_MS": "100",
        # The API answers every config change one lease after Kafka confirmed it, and the suite
        # makes hundreds of them one after another: half the product's lease. The promise is
        # the same at any lease (control_plane.publishing.configs); what a shorter one costs is
        # slack for the clock tick's trip to fan-out before an event waits for the next tick:
        # lease - skew = 400 ms, four tick intervals.
        "WEBHOOKS_CONTROL_PLANE__CONFIG_LEASE_MS": "500",
        # The archive tier's store (docs/archive.md): this session's own directory.
        "WEBHOOKS_ARCHIVE__URI": str(RUN / f"archive-{RUN_ID}"),
    }


@pytest.fixture(scope="session")
def settings(job_env: dict[str, str]) -> Settings:
    return settings_with(job_env)


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: Settings) -> str:
    admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    assert admin.list_topics(timeout=10).brokers, "Kafka is not answering on " + settings.kafka.bootstrap_servers
    create_topics(settings.kafka)
    return settings.kafka.bootstrap_servers


@pytest.fixture(scope="session")
def cassandra_session(settings: Settings) -> Iterator[Session]:
    """This session's own keyspace (same schema as the stack's), dropped at the end."""
    with keyspace_session(settings) as session:
        yield session


@pytest.fixture(scope="session")
def control_plane_server(settings: Settings, cassandra_session: Session, kafka_bootstrap: str) -> Iterator[Any]:
    """The real gRPC control plane, in process, publishing to this session's topics."""
    from control_plane.server import build

    server = build(settings, cassandra_session, port=0)
    server.start()
    yield server
    server.stop(grace_s=2)


@pytest.fixture(scope="session")
def control_plane(control_plane_server: Any) -> str:
    return f"127.0.0.1:{control_plane_server.port}"


@pytest.fixture(scope="session")
def http_api_base(control_plane_server: Any) -> Iterator[str]:
    """The same control plane's HTTP+JSON API (control_plane.httpapi.server), on a port of its own."""
    from control_plane.httpapi import server as http_api

    server = http_api.serve(control_plane_server.http, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.port}"
    server.stop()


@pytest.fixture(scope="session")
def grpc_channel(control_plane: str) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(control_plane)
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()


@pytest.fixture(scope="session")
def delivery_job(settings: Settings, job_env: dict[str, str], kafka_bootstrap: str,
                 control_plane: str) -> Iterator[str]:
    """This session's delivery job on the real Flink cluster; yields its job id."""
    job_sh(job_env, "submit")
    job_id = job_sh(job_env, "id").strip()
    assert job_id
    try:
        wait_all_running(job_id)
    except BaseException:
        cancel(job_id)  # a job that never ran must not restart-loop on the shared cluster
        raise
    yield job_id
    # Fault tests stop/restore the job, so cancel whatever incarnation of it runs now.
    for jid in {job_id, job_sh(job_env, "id").strip()} - {""}:
        cancel(jid)


@pytest.fixture(scope="session")
def relay(job_env: dict[str, str], kafka_bootstrap: str, delivery_job: str) -> Iterator[OutboxRelay]:
    """This session's own outbox (PostgreSQL + Kafka Connect/Debezium, stack/outbox_relay.py)
    streaming to its events topic. Offsets are flushed only every 10 minutes, so a SIGKILL of the
    worker is always "after publishing, before committing the offsets"."""
    r = OutboxRelay(job_env, RUN / f"test-outbox-{RUN_ID}", flush_ms=600_000)
    r.start()
    yield r
    r.stop()


def job_script(job_env: dict[str, str], action: str, timeout: float = 300) -> str:
    """Run stack/job.sh for this session's job; returns its stdout."""
    return job_sh(job_env, action, timeout)


@contextlib.contextmanager
def second_stack(job_env: dict[str, str], run: str,
                 overrides: dict[str, str]) -> Iterator[tuple[Settings, str, Session]]:
    """A second delivery job with settings the session job must not have (a short deadline, a
    tiny quota): its own topics, keyspace and in-process control plane. Yields its settings, the
    control plane's address and a session on its keyspace; cancels and stops both after."""
    env = {**job_env, **isolated_env(f"{run}-{uuid.uuid4().hex[:6]}", own_keyspace=True), **overrides}
    settings = settings_with(env)
    create_topics(settings.kafka)
    from control_plane.server import build

    with keyspace_session(settings) as session:
        server = build(settings, session, port=0)
        server.start()
        job_script(env, "submit")
        job_id = job_script(env, "id").strip()
        wait_all_running(job_id)
        try:
            yield settings, f"127.0.0.1:{server.port}", session
        finally:
            cancel(job_id)
            server.stop(grace_s=2)


# A keyspace of the module's own for tests of the history store: a module defines `own_settings`
# (e.g. settings_with(isolated_env(..., own_keyspace=True))), these give it a session and a store.
@pytest.fixture(scope="module")
def session(own_settings: Settings) -> Iterator[Session]:
    with keyspace_session(own_settings) as s:
        s.set_keyspace(own_settings.cassandra.keyspace)
        yield s


@pytest.fixture(scope="module")
def history(own_settings: Settings, session: Session) -> Iterator[CassandraHistory]:
    h = CassandraHistory(own_settings.cassandra)
    yield h
    h.close()
