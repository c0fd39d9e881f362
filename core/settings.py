"""One typed settings object for the job, the control plane, the scripts and the tests.

Defaults run the local stack started by `make run`; every field can be overridden with an
environment variable prefixed `WEBHOOKS_` (nested fields use `__`, e.g.
`WEBHOOKS_DISPATCH__CONNECT_TIMEOUT_S=2`). Validation fails at start-up with a message that names
the field, so a typo in a deployment is caught before any event is read.
"""

from __future__ import annotations

import base64
import functools
import socket
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# ArchiveSettings is in a module of its own so that a TaskManager still running the Python
# modules of an earlier job can unpickle settings carrying it: pickle imports the new module,
# while a class added here would be looked up in the TaskManager's older copy of this one.
from core.archive_settings import ArchiveSettings
from core.secrets import Keyring
from core.tracing_settings import TracingSettings

REPO_ROOT = Path(__file__).resolve().parent.parent


class KafkaSettings(BaseModel):
    bootstrap_servers: str = "127.0.0.1:9092"
    events_topic: str = "webhooks.events"
    endpoints_topic: str = "webhooks.endpoints"
    replays_topic: str = "webhooks.replays"
    dlq_topic: str = "webhooks.events.dlq"
    signals_topic: str = "webhooks.endpoint-signals"
    # The delivery job's history facts for the archive (core/archive_facts.py).
    archive_facts_topic: str = "webhooks.archive.facts"
    archive_facts_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, gt=0)
    consumer_group: str = "webhooks-delivery-job"
    # Partitions for the event topics when the scripts create them; a real cluster sets its own.
    partitions: int = Field(default=4, ge=1)
    # Replicas of every topic the scripts create, and how many must have a write before an
    # acks=all producer (all of ours) is answered. The cluster topology (stack/topologies/
    # cluster.env) sets 3 and 2: one broker may be lost with nothing acknowledged lost.
    replication_factor: int = Field(default=1, ge=1)
    min_insync_replicas: int = Field(default=1, ge=1)
    # Longest the broker holds a fetch that found nothing (fetch.max.wait.ms), for the control
    # plane's endpoint-signal consumer, whose records are not on an event's way to its first
    # attempt. A fetch is answered as soon as a record is there, so this only sets how often an
    # idle consumer asks (Kafka's 500 ms: twice a second, all day). The job's sources keep Kafka's
    # 500 ms: after a broker dies, the partitions that moved to another broker join a consumer's
    # fetch only when its fetch in flight there returns, up to this long later; and a restart of
    # the job waits for every source's fetch in flight as it cancels the tasks (docs/operating.md,
    # recovery timelines).
    control_fetch_max_wait_ms: int = Field(default=5_000, ge=1)
    # How clients find a partition's new leader after a broker dies (docs/operating.md, recovery
    # timelines). A client learns it from a metadata refresh; it asks for one when a connection
    # fails, and reconnects with a back-off that grows to reconnect_backoff_max_ms. librdkafka's
    # own ceiling is 10 s (the Java client's 1 s), so the control plane's clock ticks could wait
    # up to ~10 s past the moment a new leader was elected. metadata_refresh_ms is librdkafka's
    # backstop (topic.metadata.refresh.interval.ms, 5 min by default): a metadata request for its
    # topics at least this often. The Java clients (the job's sources and sinks, the outbox
    # relay's producer) need none: every failed connection and every disconnect asks for new
    # metadata at once (Kafka's NetworkClient), so they keep metadata.max.age.ms at 5 min; a
    # periodic refresh on each of them was background work of every idle job (docs/operating.md).
    reconnect_backoff_max_ms: int = Field(default=1_000, ge=100)
    metadata_refresh_ms: int = Field(default=5_000, ge=1_000)

    def librdkafka_failover(self) -> dict[str, int]:
        """The properties above, for a confluent-kafka (librdkafka) client's configuration."""
        return {"reconnect.backoff.max.ms": self.reconnect_backoff_max_ms,
                "topic.metadata.refresh.interval.ms": self.metadata_refresh_ms}

    def java_failover(self) -> dict[str, str]:
        """The reconnect back-off for a Java client (the job's Kafka sources and sinks, the outbox
        relay's producer); no periodic metadata refresh (above)."""
        return {"reconnect.backoff.max.ms": str(self.reconnect_backoff_max_ms)}

    @model_validator(mode="after")
    def _min_insync_within_replicas(self) -> KafkaSettings:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(f"kafka.min_insync_replicas ({self.min_insync_replicas}) exceeds "
                             f"kafka.replication_factor ({self.replication_factor}): no write could succeed")
        return self


class CassandraSettings(BaseModel):
    contact_points: list[str] = ["127.0.0.1"]
    port: int = 9042
    keyspace: str = "webhooks"
    local_dc: str = "datacenter1"
    # Replication for the keyspace the scripts create; production uses NetworkTopologyStrategy.
    replication_factor: int = Field(default=1, ge=1)
    history_ttl_s: int = Field(default=30 * 24 * 3600, gt=0)
    # Longest wait between the driver's reconnection tries after Cassandra went away. The
    # driver's default backs off to 600 s: after a short outage every client (the dispatcher,
    # the control plane, tests) stayed unavailable for minutes after Cassandra was back.
    reconnect_max_delay_s: float = Field(default=5.0, gt=0)
    # The dispatcher's history reads and writes (all idempotent: explicit write timestamps, no
    # counters) go to a second replica when the first has not answered within this delay. A node
    # that hangs (a long GC, SIGSTOP) keeps its connections open, so without it every request it
    # coordinates waits out the 10 s request timeout, and the one history batch in flight holds
    # back every write behind it (docs/operating.md, faults beyond one node: a hung node). Only
    # with more than one node at the job's start (the local stack has one). 0: off.
    speculative_delay_ms: int = Field(default=500, ge=0)
    # Consistency of every history write and of the reads that drive decisions (the dispatcher's
    # check before re-sending, replay loads; the control plane's reads). LOCAL_QUORUM survives one
    # replica down per DC at RF 3 and reads what a quorum acknowledged; LOCAL_ONE would let a
    # restored dispatcher read a replica that missed the "succeeded" write and send again.
    # Lightweight transactions (IF NOT EXISTS) use LOCAL_SERIAL.
    consistency: Literal["ONE", "LOCAL_ONE", "QUORUM", "LOCAL_QUORUM", "EACH_QUORUM", "TWO", "THREE", "ALL"] = (
        "LOCAL_QUORUM")
    # Delivery writes in flight from one operator instance (buffered or sent); more only queues.
    max_concurrent_writes: int = Field(default=1024, ge=1)
    # History writes of many deliveries travel as one unlogged batch (operators/write_batcher.py):
    # sent when it holds this many statements (4 per finished attempt) or ~bytes, when no earlier
    # batch is in flight, or when its oldest write has waited linger_ms (why 20 ms:
    # docs/performance-log.md, Cassandra history writes). 1 statement = one request per write.
    # Bytes stay under Cassandra's default batch_size_fail_threshold (50 KiB); larger payloads go
    # by a request of their own.
    history_batch_max_statements: int = Field(default=200, ge=1)
    history_batch_max_bytes: int = Field(default=40 * 1024, ge=1024)
    history_batch_linger_ms: int = Field(default=20, ge=0)
    # With nothing in flight a batch still waits until this long after the previous one left
    # (bounded by linger_ms); a write after a quiet spell goes at once. Sent whenever the last
    # one had come back (0), each request carried about one delivery's writes at full speed; a
    # paced batch carries several, and one pass harvests their completions together, for a few
    # ms of light-load latency (docs/performance-log.md, a minimum interval between batches).
    history_batch_min_interval_ms: int = Field(default=10, ge=0)
    # The same while the dispatcher is catching up (dispatch.catch_up_late_ms): its deliveries
    # are late already, and fewer, fuller batches leave it more CPU to drain the backlog.
    history_batch_catch_up_interval_ms: int = Field(default=20, ge=0)
    history_batch_inline_payload_bytes: int = Field(default=8 * 1024, ge=0)

    @property
    def sockopts(self) -> list[tuple[int, int, int]]:
        """Socket options for every driver connection. TCP_NODELAY: the Python driver does not set
        it, and a request written in more than one piece (a creation batch of a few deliveries with
        their payloads) then waited for the kernel's delayed ACK, most of the first-attempt latency
        at light load (docs/performance-log.md, TCP_NODELAY)."""
        return [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class DispatchSettings(BaseModel):
    connect_timeout_s: float = Field(default=5.0, gt=0)
    total_timeout_s: float = Field(default=15.0, gt=0)
    max_response_bytes: int = Field(default=64 * 1024, ge=0)
    max_header_bytes: int = Field(default=16 * 1024, ge=1024)
    # Requests in flight per endpoint unless the endpoint sets its own cap.
    default_max_in_flight: int = Field(default=8, ge=1)
    # Requests in flight per tenant across all of its endpoints (one operator instance). It also
    # bounds the CPU a tenant's hanging endpoints can take (each timeout costs a retry with a new
    # TLS handshake and a history write); `make bench`'s fairness phase measures it
    # (docs/performance-log.md, figures once kept in code comments).
    tenant_max_in_flight: int = Field(default=64, ge=1)
    # Requests in flight for one operator instance: the HTTP pool size.
    max_in_flight: int = Field(default=512, ge=1)
    # Retry schedule: exponential with full jitter, capped, bounded count, absolute deadline.
    retry_base_s: float = Field(default=5.0, gt=0)
    retry_cap_s: float = Field(default=3600.0, gt=0)
    max_attempts: int = Field(default=20, ge=1)
    retry_deadline_s: float = Field(default=24 * 3600.0, gt=0)
    max_retry_after_s: float = Field(default=3600.0, gt=0)
    # Circuit breaker: consecutive failures that open it, and how long it stays open.
    breaker_failure_threshold: int = Field(default=5, ge=1)
    breaker_fast_failure_threshold: int = Field(default=2, ge=1)
    breaker_open_s: float = Field(default=30.0, gt=0)
    breaker_max_open_s: float = Field(default=600.0, gt=0)
    # Deliveries created (Kafka time) before the dispatcher opened, plus this much clock skew
    # between producers/brokers and TaskManagers, read their durable record before being sent
    # (after a restore the topic is re-read from the checkpoint). Every such read costs two
    # Cassandra reads, so a wide skew makes a burst produced just after the job started pay them
    # for every delivery (docs/performance-log.md, figures once kept in code comments).
    restore_check_skew_ms: int = Field(default=1_000, ge=0)
    # How long a manual replay may wait for its endpoint (disabled, no slot) before it ends
    # visibly as "not sent" with an attempt row saying why.
    manual_wait_s: float = Field(default=60.0, gt=0)
    # How long past its deadline a delivery whose history write or read keeps failing stays in
    # the dispatcher's memory; then it is let go (counter expired_unrecorded), still pending in
    # history, and reconciliation's sweeper redrives it (checked first).
    storage_give_up_s: float = Field(default=3600.0, gt=0)
    # Payload bytes the dispatcher keeps in memory (by event) for requests; keyed state drops a
    # payload once its event row is durable, and an evicted one is read back from Cassandra.
    payload_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    # Deliveries one endpoint keeps in the dispatcher's memory; a backlog beyond it waits in keyed
    # state and comes back page_size at a time (the cost of each: docs/operating.md, backlog capacity).
    memory_window: int = Field(default=20_000, ge=2)
    page_size: int = Field(default=1_000, ge=1)
    # How often the dispatcher harvests finished requests (processing-time timer) of an endpoint
    # with up to three in flight; an endpoint with more is looked at less often, up to
    # harvest_busy_max_ms (operators/io_tracker.py: each look finds several then, and costs
    # the same). Setting both equal gives a fixed interval.
    harvest_interval_ms: int = Field(default=10, ge=1)
    harvest_busy_max_ms: int = Field(default=40, ge=1)
    # Catch-up (core/catch_up.py): when a new delivery reaches the dispatcher catch_up_late_ms
    # after its event's Kafka time, the dispatcher is behind its input; until no late one has
    # come for catch_up_hold_ms it looks at I/O in flight every catch_up_harvest_interval_ms
    # and history batches wait cassandra.history_batch_catch_up_interval_ms, trading ~10 ms of a
    # late delivery's latency for the CPU that drains the backlog sooner. 250 ms: above the
    # light-load p99, so light load stays at the fast pace, and low enough that a load between the
    # two paces' capacities does not swing between them (docs/performance-log.md, catch-up).
    catch_up_late_ms: int = Field(default=250, ge=1)
    catch_up_hold_ms: int = Field(default=2000, ge=0)
    catch_up_harvest_interval_ms: int = Field(default=20, ge=1)
    # How long the dispatcher keeps an endpoint's driver in memory once it holds nothing (0: drop
    # it at once). A delivery arriving meanwhile finds it instead of rebuilding it from keyed state.
    idle_driver_keep_ms: int = Field(default=2000, ge=0)
    # Per-endpoint metric series (pending, consecutive failures, breaker open; label
    # endpoint_id) for `webhookctl stats`' top failing endpoints. Off by default: one series set
    # per endpoint ever held by the job, so only where endpoints number in the thousands.
    per_endpoint_metrics: bool = False
    # Extra CA bundle the dispatcher trusts (tests use a locally generated CA). None = system CAs.
    ca_bundle: Path | None = None
    user_agent: str = "webhooks-dispatcher/1"


class EgressSettings(BaseModel):
    allowed_ports: list[int] = [443]
    # Development only: CIDRs allowed despite the public-unicast rule (e.g. 127.0.0.0/8 for
    # local receivers). Empty by default; the job and control plane log loudly when it is not.
    dev_allow_cidrs: list[str] = []


class FlinkSettings(BaseModel):
    rest_address: str = "127.0.0.1"
    rest_port: int = 8081
    parallelism: int = Field(default=1, ge=1)
    # Key groups of the job's keyed state: the most subtasks it can ever be rescaled to from a
    # savepoint, fixed for the state's life (changing it needs a state migration). None: Flink's
    # own choice (128 at these parallelisms, or the restored savepoint's), which is what every
    # existing savepoint of the single-node stack was taken with. The cluster topology sets 256
    # for the brief's peak: several key groups per subtask keep the busiest near the mean, with
    # room to rescale (docs/operating.md, max parallelism 256; docs/performance.md, scale-out sheet).
    max_parallelism: int | None = Field(default=None, ge=1, le=32768)
    checkpoint_interval_ms: int = Field(default=5000, ge=100)
    # Dedupe memory for event_ids: longer than any replay window of the events topic.
    dedupe_ttl_s: int = Field(default=7 * 24 * 3600, gt=0)
    # Connector jars shipped with the job (pipeline.jars); empty = already in the cluster's lib/.
    pipeline_jars: list[str] = []
    job_name: str = "webhooks-delivery"
    # Where this job's checkpoints go (file://, s3://, hdfs://); None = the cluster's default.
    checkpoint_dir: str | None = None
    # thread: Python runs inside the TaskManager JVM, no hop to a Python process per record
    # (docs/performance-log.md, figures once kept in code comments).
    python_execution_mode: str = "thread"
    # Longest a network buffer between operators waits to fill before it is sent, on the event
    # path (parse -> fan-out -> dispatch). Flink's default (100 ms) is paid at each exchange when
    # traffic is light, which was most of the first-attempt latency. 0 is Flink's "flush after
    # every record": each record's buffer goes as it is written and the task has no output
    # flusher. A flusher wakes at its period whatever the traffic, while sending per record costs
    # only while records flow (docs/performance-log.md, buffer timeout 0). A cluster
    # whose exchanges cross machines at high rates may prefer a few ms, to batch network sends.
    buffer_timeout_ms: int = Field(default=0, ge=0)
    # The same for every other exchange (endpoint configs and clock ticks, replay requests, dead
    # letters, the table planner's). They carry a few records a second, so per-record sends cost
    # nothing, and no flusher wakes for them either.
    control_buffer_timeout_ms: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _parallelism_within_max(self) -> FlinkSettings:
        if self.max_parallelism is not None and self.parallelism > self.max_parallelism:
            raise ValueError(f"flink.parallelism ({self.parallelism}) exceeds flink.max_parallelism "
                             f"({self.max_parallelism})")
        return self


DEV_ADMIN_TOKEN = "dev-admin-token"
DEV_MASTER_KEY = base64.b64encode(b"dev-master-key-not-for-production"[:32]).decode()


class ControlPlaneSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 50051
    # Admin credential that creates tenants and API keys. Dev default; production mode refuses it.
    admin_token: SecretStr = SecretStr(DEV_ADMIN_TOKEN)
    # The gRPC API's server certificate chain and key (PEM). Both or neither; neither serves
    # plaintext, which only dev mode allows (and logs loudly).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    secret_rotation_overlap_s: int = Field(default=24 * 3600, ge=0)
    # How long an endpoint's ownership challenge can be answered (then ResendChallenge).
    challenge_ttl_s: int = Field(default=3600, ge=10)
    # The config clock's lease (control_plane.publishing.configs, core.fanout): a config change is
    # acknowledged by the API this long after Kafka confirmed it (a failed publish: this plus
    # hold_scan_interval_ms after the failure), and every event committed after the
    # acknowledgement is matched against it. Each tick carries it, so the job needs no copy.
    config_lease_ms: int = Field(default=1_000, gt=0)
    # How often the config clock ticks on the endpoints topic. A tick read covers events arriving
    # until its value + lease - skew, so ticks every lease/4 leave ~3/4 of a lease for the tick's
    # trip (Kafka, the parse vertex, the broadcast) before an event would wait. Time-driven cost:
    # each tick is a Kafka produce and one broadcast element per fan-out subtask, all day.
    config_clock_interval_ms: int = Field(default=250, ge=10)
    # How far any control plane's clock may run ahead of the events' Kafka timestamps (and of
    # the other replicas'): fan-out takes it off every tick's horizon. Read by the job.
    config_clock_skew_ms: int = Field(default=100, ge=0)
    # The job's degraded mode: with no clock tick read for this long (control plane down or being
    # deployed), fan-out releases held events with the configs it has read (metric
    # events_released_without_clock). Well inside the brief's 10 s first-attempt objective.
    config_clock_stale_after_ms: int = Field(default=5_000, ge=100)
    republish_interval_s: float = Field(default=5.0, gt=0)
    # How often the clock re-reads other replicas' durable holds (config_holds); 0: every tick.
    # See control_plane.publishing.configs for the trade.
    hold_scan_interval_ms: int = Field(default=1000, ge=0)
    # Reconciliation: a pending delivery due longer ago than this whose endpoint no job reports
    # holding (the dispatcher reports every 30 s, and passes at least every breaker_max_open_s)
    # is orphaned, and --repair re-queues it.
    reconcile_overdue_after_s: int = Field(default=900, ge=1)
    # The periodic reconciler: every this many seconds (0: off), the same checks over the last
    # reconcile_window_s of arrivals, ending reconcile_settle_s ago (events still in flight are not
    # gaps); gaps are logged as a warning with their counts. Its cost grows with the deliveries in
    # the window (about three point reads each), so benchmarks turn it off.
    reconcile_interval_s: float = Field(default=600.0, ge=0)
    # How often the control plane looks at failing endpoints' auto-disable clocks
    # (control_plane.endpoints.operational_events): warnings and disables are at most this late.
    auto_disable_interval_s: float = Field(default=5.0, gt=0)
    reconcile_window_s: int = Field(default=3600, ge=60)
    reconcile_settle_s: int = Field(default=120, ge=0)
    # Prometheus /metrics of the standalone server (control_plane.metrics), on `host`; 0: off.
    metrics_port: int = Field(default=9464, ge=0)
    # Crash tests only: a point at which the server SIGKILLs itself (control_plane.faults).
    kill_at: str = ""
    # The web console (control_plane.console), HTTP on `host`; 0: off. console_url: the address
    # browsers use (portal links start with it; https:// makes its cookies Secure); "" =
    # http://host:console_port. console_frame_ancestors: origins that may frame it (the portal).
    console_port: int = Field(default=8090, ge=0)
    # The HTTP+JSON API (control_plane.httpapi.server: the gRPC services' routes, /v1/openapi.json),
    # HTTP on `host`; 0: off. Idempotency-Key answers are kept idempotency_ttl_s, at most
    # idempotency_max_entries of them (per replica; the oldest go first).
    http_port: int = Field(default=8088, ge=0)
    idempotency_ttl_s: int = Field(default=86_400, ge=60)
    idempotency_max_entries: int = Field(default=10_000, ge=100)
    console_url: str = ""
    console_frame_ancestors: list[str] = []
    # Where the console reads the jobs' health and the breaker gauges ("": it does not).
    prometheus_url: str = "http://127.0.0.1:9090"

    @model_validator(mode="after")
    def _ticks_fit_in_the_lease(self) -> ControlPlaneSettings:
        # A tick must be followed by the next before its horizon (value + lease - skew) is
        # reached, or events wait for ticks even while the control plane is well.
        if self.config_clock_interval_ms + self.config_clock_skew_ms >= self.config_lease_ms:
            raise ValueError(
                f"control_plane.config_clock_interval_ms ({self.config_clock_interval_ms}) plus "
                f"config_clock_skew_ms ({self.config_clock_skew_ms}) must be below config_lease_ms "
                f"({self.config_lease_ms}); a quarter of the lease or less leaves room for the tick's trip")
        return self


class IngestSettings(BaseModel):
    max_payload_bytes: int = Field(default=256 * 1024, ge=1)


class OutboxSettings(BaseModel):
    """The producer side: the PostgreSQL database that holds the transactional outbox, and the
    Debezium connector that streams it to the events topic (stack/connect.sh)."""

    # libpq connection string of the producer database. The local stack's cluster trusts
    # 127.0.0.1 (like its Kafka and Cassandra); a deployment passes credentials here.
    dsn: str = "host=127.0.0.1 port=55432 dbname=webhooks user=webhooks"
    # Created by the migration, before any row exists, so the WAL of every outbox insert is kept
    # until Debezium confirms it -- the connector never needs a data snapshot.
    slot_name: str = "webhooks_outbox"
    publication_name: str = "webhooks_outbox"
    # Published rows older than this are deleted by housekeeping (outbox.housekeeping). Debezium
    # reads inserts from the WAL, so deleting a row never loses its event; the retention is how
    # far back a re-snapshot could still recover rows if the slot itself were ever lost.
    retention_s: int = Field(default=24 * 3600, ge=60)
    connect_rest_port: int = 8083


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="WEBHOOKS_", env_nested_delimiter="__", extra="forbid"
    )

    # dev: what `make run` starts, development defaults allowed. production: the process refuses
    # to start with any of them (the dev master key or one not read from a file, the dev admin
    # token, dev_allow_cidrs, plaintext gRPC), naming the setting -- see production_problems().
    mode: Literal["dev", "production"] = "dev"
    kafka: KafkaSettings = KafkaSettings()
    cassandra: CassandraSettings = CassandraSettings()
    dispatch: DispatchSettings = DispatchSettings()
    egress: EgressSettings = EgressSettings()
    flink: FlinkSettings = FlinkSettings()
    control_plane: ControlPlaneSettings = ControlPlaneSettings()
    ingest: IngestSettings = IngestSettings()
    outbox: OutboxSettings = OutboxSettings()
    archive: ArchiveSettings = ArchiveSettings()
    tracing: TracingSettings = TracingSettings()
    # AES-256-GCM key (base64 of 32 bytes) that encrypts signing secrets at rest. The dev default
    # only exists so `make run` works; a deployment must set WEBHOOKS_MASTER_KEY.
    master_key: SecretStr = SecretStr(DEV_MASTER_KEY)
    # The master key's id, recorded in every secret it seals (core.secrets.Keyring).
    master_key_id: str = "k1"
    # Master-key rotation: earlier keys by id, which still open what they sealed until
    # `webhookctl master-key reencrypt` has moved every secret to the current key; then remove
    # them. JSON in the environment: WEBHOOKS_RETIRED_MASTER_KEYS='{"k1": "<base64>"}'.
    retired_master_keys: dict[str, SecretStr] = {}
    # A file holding the key(s) instead (e.g. a mounted secret), read where it is used: with it,
    # the job graph shipped to TaskManagers carries no key at all -- each TaskManager reads the
    # file at this path on its own machine. Takes precedence over the three settings above. One
    # base64 line (that key, id master_key_id), or a keyring: lines of "<id> <base64>", the first
    # line the current key, the others retired.
    master_key_file: Path | None = None
    run_dir: Path = REPO_ROOT / ".run"

    @field_validator("master_key")
    @classmethod
    def _master_key_is_32_bytes(cls, v: SecretStr) -> SecretStr:
        _key_bytes("master_key", v.get_secret_value())
        return v

    @model_validator(mode="after")
    def _no_dev_defaults_in_production(self) -> Settings:
        cp = self.control_plane
        if (cp.tls_cert_file is None) != (cp.tls_key_file is None):
            raise ValueError("control_plane.tls_cert_file and control_plane.tls_key_file go together: "
                             "set both or neither")
        self.master_keyring()  # a missing or malformed key file, a bad id: fails here, at start-up
        if self.mode == "production" and (problems := self.production_problems()):
            raise ValueError("mode=production refuses development defaults: " + "; ".join(problems))
        return self

    def production_problems(self) -> list[str]:
        """Each development default still in force, named by its setting (empty: none)."""
        cp = self.control_plane
        problems = []
        if self.master_key_file is None:
            # From the environment the key would also travel, pickled, inside the job graph.
            problems.append("master_key_file is unset (production reads the master key from a file on each "
                            "machine, never from the job graph: set WEBHOOKS_MASTER_KEY_FILE)")
        elif self.master_key_bytes() == base64.b64decode(DEV_MASTER_KEY):
            problems.append(f"master_key_file {self.master_key_file} holds the development key")
        if cp.admin_token.get_secret_value() in ("", DEV_ADMIN_TOKEN):
            problems.append("control_plane.admin_token is the development token "
                            "(set WEBHOOKS_CONTROL_PLANE__ADMIN_TOKEN)")
        if self.egress.dev_allow_cidrs:
            problems.append("egress.dev_allow_cidrs is set (private addresses reachable despite the SSRF policy)")
        if cp.tls_cert_file is None:
            problems.append("control_plane.tls_cert_file/tls_key_file are unset (the gRPC API would be plaintext)")
        return problems

    @model_validator(mode="after")
    def _archive_budget(self) -> Settings:
        a = self.archive
        if a.stream and a.hot_ttl_s > self.cassandra.history_ttl_s:
            raise ValueError(f"archive.hot_ttl_s ({a.hot_ttl_s}) exceeds cassandra.history_ttl_s")
        if a.stream and self.kafka.archive_facts_retention_ms < a.hot_ttl_s * 1000:
            raise ValueError(f"kafka.archive_facts_retention_ms ({self.kafka.archive_facts_retention_ms}) is shorter"
                             f" than archive.hot_ttl_s ({a.hot_ttl_s} s): facts the writer has not archived would"
                             " leave Kafka while their hot rows still stand in for them")
        if a.stream and a.hot_ttl_s <= self.dispatch.retry_deadline_s:
            raise ValueError("archive.hot_ttl_s must exceed dispatch.retry_deadline_s: a delivery's attempts"
                             " stay hot while it may still be retried")
        return self

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> Settings:
        d = self.dispatch
        if d.connect_timeout_s > d.total_timeout_s:
            raise ValueError("dispatch.connect_timeout_s must not exceed dispatch.total_timeout_s")
        if d.retry_base_s > d.retry_cap_s:
            raise ValueError("dispatch.retry_base_s must not exceed dispatch.retry_cap_s")
        return self

    def master_key_bytes(self) -> bytes:
        """The current master key (what seals new secrets)."""
        return self.master_keyring().current

    def master_keyring(self) -> Keyring:
        """Every configured master key by id; the current one seals, all of them open."""
        if self.master_key_file is None:
            keys = {self.master_key_id: _key_bytes("master_key", self.master_key.get_secret_value())}
            for key_id, key in self.retired_master_keys.items():
                keys.setdefault(key_id, _key_bytes(f"retired_master_keys[{key_id}]", key.get_secret_value()))
            return _keyring(self.master_key_id, keys, "master_key_id/retired_master_keys")
        where = f"master_key_file {self.master_key_file}"
        try:
            lines = [line.split() for line in self.master_key_file.read_text().splitlines() if line.strip()]
        except OSError as exc:
            raise ValueError(f"{where}: {exc.strerror}") from None
        if len(lines) == 1 and len(lines[0]) == 1:
            return _keyring(self.master_key_id, {self.master_key_id: _key_bytes(where, lines[0][0])}, where)
        if not lines or any(len(parts) != 2 for parts in lines):
            raise ValueError(f"{where} must hold one base64 key, or lines of '<id> <base64>'")
        keys = {}
        for key_id, text in lines:
            if key_id in keys:
                raise ValueError(f"{where} names master key {key_id!r} twice")
            keys[key_id] = _key_bytes(f"{where} ({key_id})", text)
        return _keyring(lines[0][0], keys, where)


def for_taskmanagers(settings: Settings) -> Settings:
    """The settings the job ships to its TaskManagers (pickled into the job graph): without the
    secrets no operator uses there -- the admin token, and the producer database's DSN, which may
    carry a password. The dispatcher decrypts signing secrets with the master key: with
    master_key_file set, each TaskManager reads it from that file and the graph carries none;
    otherwise the key itself travels in the graph (dev; documented in the production checklist)."""
    update: dict[str, object] = {
        "control_plane": settings.control_plane.model_copy(update={"admin_token": SecretStr("")}),
        "outbox": settings.outbox.model_copy(update={"dsn": ""}),
        "archive": settings.archive.model_copy(update={"s3_secret_key": SecretStr("")}),
    }
    if settings.master_key_file is not None:
        update["master_key"] = SecretStr("")
        update["retired_master_keys"] = {}
    return settings.model_copy(update=update)


@functools.lru_cache(maxsize=1)
def load_settings() -> Settings:
    return Settings()


def _key_bytes(where: str, text: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise ValueError(f"{where} must hold base64") from None
    if len(raw) != 32:
        raise ValueError(f"{where} must decode to 32 bytes, got {len(raw)}")
    return raw


def _keyring(current_id: str, keys: dict[str, bytes], where: str) -> Keyring:
    try:
        return Keyring(current_id, keys)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def load_settings_or_exit(program: str) -> Settings:
    """:func:`load_settings` for a process's entry point: an invalid setting (production mode with
    a development default, say) ends it with status 2 and one line per problem naming the
    setting, instead of a traceback."""
    try:
        return load_settings()
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(part) for part in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            print(f"{program}: refusing to start: {where + ': ' if where else ''}{msg}", file=sys.stderr)
        raise SystemExit(2) from None
