"""Per-run isolation for tests and the benchmark: their own topics, consumer group and job name,
so they can run beside the `make run` job on the same stack without reading its records."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import DCAwareRoundRobinPolicy, ExponentialReconnectionPolicy

from core.settings import Settings
from stack.cassandra_schema import apply


def isolated_env(run: str, own_keyspace: bool = False) -> dict[str, str]:
    """WEBHOOKS_* overrides naming everything a job and its control plane share after ``run``.

    ``own_keyspace`` also gives them a Cassandra keyspace of their own (see `keyspace_session`):
    a control plane reconciles every endpoint row of its keyspace, so one sharing the stack's
    keyspace would republish (and so disturb) the stack's endpoints, and the stack's theirs.
    """
    env = {
        "WEBHOOKS_KAFKA__EVENTS_TOPIC": f"webhooks.events.{run}",
        "WEBHOOKS_KAFKA__ENDPOINTS_TOPIC": f"webhooks.endpoints.{run}",
        "WEBHOOKS_KAFKA__REPLAYS_TOPIC": f"webhooks.replays.{run}",
        "WEBHOOKS_KAFKA__DLQ_TOPIC": f"webhooks.events.dlq.{run}",
        "WEBHOOKS_KAFKA__SIGNALS_TOPIC": f"webhooks.endpoint-signals.{run}",
        "WEBHOOKS_KAFKA__ARCHIVE_FACTS_TOPIC": f"webhooks.archive.facts.{run}",
        "WEBHOOKS_KAFKA__CONSUMER_GROUP": f"webhooks-{run}",
        "WEBHOOKS_FLINK__JOB_NAME": f"webhooks-{run}",
        # /metrics on 9464 is the stack's control plane's; a run's own one serves none.
        "WEBHOOKS_CONTROL_PLANE__METRICS_PORT": "0",
        # Traced only when the run says so (a test of tracing, `bench.run --tracing-ratio`), never
        # because the stack was started with TRACING=1 (stack/lib.sh, tracing_apply).
        "WEBHOOKS_TRACING__ENABLED": "false",
    }
    if own_keyspace:
        env["WEBHOOKS_CASSANDRA__KEYSPACE"] = "webhooks_" + run.replace("-", "_")
    return env


def harness_cluster(settings: Settings) -> Cluster:
    """A driver Cluster for test and bench harnesses (not the job's or the control plane's): back
    within seconds after a Cassandra restart, and patient with a busy node's schema reads."""
    c = settings.cassandra
    retry = ExponentialReconnectionPolicy(0.5, c.reconnect_max_delay_s, max_attempts=None)
    # The control connection reads the whole schema on connect; the driver gives it 2 s, which a
    # loaded single node missed right after the suite had dropped a keyspace (a CI run failed the
    # setup of test_slot_wait with OperationTimedOut while Cassandra was up).
    # Reads and writes at the settings' consistency, as the job and the control plane do: the
    # archive audit counts an hour through this driver, and at the driver's default (LOCAL_ONE) a
    # replica that missed a quorum write would report a gap that is not there.
    profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(local_dc=c.local_dc),
                               consistency_level=ConsistencyLevel.name_to_value[c.consistency],
                               serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL)
    return Cluster(c.contact_points, port=c.port, reconnection_policy=retry, sockopts=c.sockopts,
                   control_connection_timeout=10, execution_profiles={EXEC_PROFILE_DEFAULT: profile})


@contextlib.contextmanager
def keyspace_session(settings: Settings) -> Iterator[Session]:
    """A session on the settings' keyspace, created with the project's schema and dropped after."""
    c = settings.cassandra
    cluster = harness_cluster(settings)
    try:
        session = cluster.connect()
        apply(session, c.keyspace, c.replication_factor)
        try:
            yield session
        finally:  # a failed run's keyspace is dropped too: each holds ~30 tables on a shared node
            session.execute(f"DROP KEYSPACE IF EXISTS {c.keyspace}", timeout=60)
    finally:
        cluster.shutdown()


def settings_with(env: dict[str, str]) -> Settings:
    """Settings as a process started with these extra environment variables would see them."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Settings()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
