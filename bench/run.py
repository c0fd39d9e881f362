"""End-to-end delivery benchmark on the local stack: rates, first-attempt latency and the CPU per
delivery of every process on the delivery path (stack/cpu.py), with a report (bench/report_md.py).

    python -m bench.run [--events 2000 --endpoints 10 --tenants 1 --raw-duration 5 --catalog ...]

One run, loopback only, bounded in count and time:

1. a standalone receiver (`tests.support.receiver`, count mode) on OS-chosen ports;
2. the raw aiohttp POST rate to that receiver (`bench.raw_http`), the ceiling on this box now;
3. unique topics and keyspace, the run's control plane (a process of its own), T tenants x M
   endpoints (with ``--catalog``, each tenant first catalogues the bench's event type through the
   EventCatalog API, so fan-out validates every bench event: bench/catalog.py), and a bench job
   (`stack/job.sh submit`, job name `webhooks-bench-<id>`) on the running Flink cluster;
4. a warm-up burst of ``--warm-events`` (5,000) at full speed, reported but not counted: a fresh
   stack's JVMs compile their hot paths there; then N events produced at full speed (each
   matching all M endpoints of its tenant); deliveries/s and first-attempt latency (produce call
   -> request received) from the receiver's recordings; the same through the transactional
   outbox (`--outbox`, on by default: one PostgreSQL transaction per event, latency from its
   COMMIT), with a PostgreSQL cluster and a Kafka Connect worker of the run's own;
5. CPU of every stack process on the delivery path (TaskManagers, JobManager, Kafka, Cassandra,
   the run's control plane; PostgreSQL and Connect in the outbox phases) sampled from /proc, and
   Cassandra's own count of the writes to the run's keyspace over the full-speed phase
   (bench/cassandra_writes.py);
6. a phase paced at half the sustained rate; then, with the job still running and no traffic, the
   CPU of every process of the stack over ``--idle-seconds`` (30; 0 skips it);
7. the full-speed and half-load phases again through the outbox, and a fairness phase (tenant A
   with 1,000 hanging endpoints loaded first, healthy tenant B measured against its own baseline);
   all on by default; they come after the idle sample because the hanging tenant's retries go on;
8. the job is cancelled, the receiver and the control plane stopped by pid, topics and keyspace deleted.

The last line is the comparable summary (a `bench-outbox:` line before it gives the outbox path's,
a `bench-idle:` line the idle stack's cores by process, a `bench-idle-threads:` line the same by
thread with the JVMs' JIT compilers and collectors apart, a `catalog:` line whether fan-out validated
the events, a `schema_check:` line what that validation costs per event, a `tracing:` line whether
the run's job and control plane traced, at what ratio); `.run/bench/report.md` and its charts say
where the time and the CPU went.

``--tracing-ratio R`` turns tracing on for the run's job and control plane (off otherwise, whatever
the stack was started with), head-sampling at R (docs/operating.md, tracing); the outbox phases'
producer writes its spans too. It needs the stack's Jaeger (`make up TRACING=1`), whose CPU then
counts as a group of the delivery path (``jaeger``): the collector's share of tracing's cost. The
cost per delivery is the difference of ``cpu_ms_per_delivery`` from a run without it, side by side:

    bench: deliveries_per_s=N raw_http_per_s=N ratio=R p50_first_attempt_ms=N p99_first_attempt_ms=N
           half_p50_first_attempt_ms=N half_p99_first_attempt_ms=N cpu_ms_per_delivery=X
           client_cpu_ms_per_request=X cpu_per_client_request=R cassandra_writes_per_delivery=W
           idle_cores=C steal_pct=S

* ``cpu_ms_per_delivery``: the delivery path's CPU (step 5) over the full-speed phase's deliveries;
* ``client_cpu_ms_per_request``: the raw phase's aiohttp client's CPU (this process, the receiver
  being another) over its responses: what one HTTP request alone costs here;
* ``cpu_per_client_request``: the first over the second, the same run's CPU per delivery in raw
  client requests (comparable across machines and runs of different speed);
* ``cassandra_writes_per_delivery``: the server's writes to the run's keyspace (one per table and
  partition updated; a single-partition batch on one table is one) over the full-speed phase's
  deliveries, from before its first event until the counts stop moving after its last delivery;
* ``idle_cores``: CPU seconds over wall seconds of every stack process (each .run/<part>/pid and
  the run's control plane) with no traffic; ``nan`` with ``--idle-seconds 0``;
* ``steal_pct``: the share of the machine's CPU time its hypervisor gave to someone else over the
  full-speed phase (/proc/stat). On a shared VM this is what moves a run's figures ~2x: read a
  run with tens of percent of steal as that machine state's, not the code's.

(The raw HTTP rate and the ratio stay for comparison with earlier runs; the yardstick is now the
CPU per delivery and the latency of what users would pick instead: docs/performance.md.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from bench import cassandra_writes, profilers, raw_http, report_md, schema_validation
from bench import catalog as bench_catalog
from bench.results import Costs, PhaseResult
from control_plane.rpc.api import pb, rpc
from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, Settings
from core.spans import Tracer
from core.tracing_settings import TracingSettings
from outbox.producer import write_event
from stack import cpu
from stack.flink_jobs import cancel, extra_taskmanagers, job_sh, wait_all_running
from stack.isolation import harness_cluster, isolated_env, keyspace_session, settings_with
from stack.outbox_relay import OutboxRelay, free_port
from stack.topics import create_topics
from tests.support.receiver import ReceiverControl
from tracing import tracer

RUN = REPO_ROOT / ".run"
CERTS = RUN / "certs"
PY = str(REPO_ROOT / ".venv/bin/python")
EVENT_TYPE = "bench.event"
# The schema versions bench events carry when their tenant has no catalog: what each path always
# stamped (the direct producer a date, the outbox's write_event its default), kept so a default
# run stays comparable with earlier ones. With --catalog both carry bench_catalog.EVENT_VERSION.
UNCATALOGUED_VERSION = "2026-01-01"
UNCATALOGUED_OUTBOX_VERSION = "1"
# Endpoint creations in flight at once (the control plane serves 16 requests at a time).
CREATE_CONCURRENCY = 12
# A phase gives up when no delivery arrived for this long (--stall-timeout).
STALL_S = 30.0


def say(msg: str) -> None:
    print(f"[bench] {msg}", flush=True)


# ---- receiver subprocess ------------------------------------------------------------------------

@dataclass
class ReceiverProc:
    proc: subprocess.Popen[str]
    base_url: str
    control: ReceiverControl


@contextmanager
def receiver_process() -> Iterator[ReceiverProc]:
    """The standalone receiver in count mode; ports 0 so the OS picks free ones (no races)."""
    cmd = [PY, "-m", "tests.support.receiver", "--port", "0", "--control-port", "0", "--record", "count",
           "--cert", str(CERTS / "server.pem"), "--key", str(CERTS / "server.key")]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "receiver url=https://127.0.0.1:P control=http://127.0.0.1:Q"
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        if "url" not in fields:
            raise RuntimeError(f"receiver did not start: {line!r}")
        yield ReceiverProc(proc, fields["url"], ReceiverControl(fields["control"], timeout=60))
    finally:
        stop(proc, timeout_s=10)


def stop(proc: subprocess.Popen[Any], timeout_s: float) -> None:
    """By its pid: SIGTERM (the receiver and the control plane shut down cleanly on it), then
    SIGKILL if it is still there after ``timeout_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ---- settings, topics, control plane, job ---------------------------------------------------------

def bench_env(run_id: str, receiver_port: int, partitions: int) -> dict[str, str]:
    """WEBHOOKS_* for this run's job and control plane: own topics, loopback egress allowance."""
    return {
        # A keyspace of its own: the stack's control plane reconciles its keyspace's recent
        # deliveries every 10 minutes, which would land in the next run's measurement
        # (docs/performance-log.md, the bench itself).
        **isolated_env(f"bench-{run_id}", own_keyspace=True),
        "WEBHOOKS_KAFKA__PARTITIONS": str(partitions),
        "WEBHOOKS_EGRESS__DEV_ALLOW_CIDRS": '["127.0.0.1/32"]',
        "WEBHOOKS_EGRESS__ALLOWED_PORTS": json.dumps([receiver_port]),
        "WEBHOOKS_DISPATCH__CA_BUNDLE": str(CERTS / "ca.pem"),
        # Hanging endpoints in the fairness phase must give up within the run.
        "WEBHOOKS_DISPATCH__CONNECT_TIMEOUT_S": "2",
        "WEBHOOKS_DISPATCH__TOTAL_TIMEOUT_S": "5",
        # The periodic reconciler reads every delivery of its window: not part of what is measured.
        "WEBHOOKS_CONTROL_PLANE__RECONCILE_INTERVAL_S": "0",
    }


@contextmanager
def topics(settings: Settings) -> Iterator[None]:
    k = settings.kafka
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    names = create_topics(k)
    try:
        yield
    finally:
        for fut in admin.delete_topics(names).values():
            try:
                fut.result()
            except Exception as e:  # cleanup is best effort; report and go on
                say(f"deleting a topic failed: {e}")


@contextmanager
def control_plane(settings: Settings) -> Iterator[grpc.Channel]:
    from control_plane.server import build

    c = settings.cassandra
    cluster = harness_cluster(settings)
    server = None
    try:
        server = build(settings, cluster.connect(c.keyspace), port=0)
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        grpc.channel_ready_future(channel).result(timeout=10)
        yield channel
        channel.close()
    finally:
        if server is not None:
            server.stop(grace_s=2)
        cluster.shutdown()


def control_plane_env(env: dict[str, str], port: int) -> dict[str, str]:
    """The run's env for its control plane process: its gRPC API on ``port``, no /metrics, and no
    console or HTTP API (the stack's control plane serves them on their default ports: binding them
    again failed)."""
    return {**env, "WEBHOOKS_CONTROL_PLANE__PORT": str(port), "WEBHOOKS_CONTROL_PLANE__METRICS_PORT": "0",
            "WEBHOOKS_CONTROL_PLANE__CONSOLE_PORT": "0", "WEBHOOKS_CONTROL_PLANE__HTTP_PORT": "0"}


@contextmanager
def control_plane_process(env: dict[str, str], pid_file: Path, timeout_s: float = 60) -> Iterator[grpc.Channel]:
    """The run's control plane as a process of its own (`python -m control_plane.server`), so its
    CPU is measured apart from the load generator's; stopped by its pid."""
    port = free_port()
    log = pid_file.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PY, "-m", "control_plane.server"], cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **control_plane_env(env, port)})
    pid_file.write_text(str(proc.pid))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"the bench control plane did not start; see {log}") from None
        yield channel
    finally:
        channel.close()
        stop(proc, timeout_s=15)
        pid_file.unlink(missing_ok=True)


@contextmanager
def bench_job(env: dict[str, str], timeout_s: float = 180) -> Iterator[str]:
    """Submit the job with this run's env, wait until every vertex runs, cancel it at the end."""
    job_sh(env, "submit", timeout_s)
    job_id = job_sh(env, "id").strip()
    try:
        wait_all_running(job_id, timeout_s)
        yield job_id
    finally:
        cancel(job_id)
        say(f"cancelled job {job_id}")


# ---- tenants and endpoints ------------------------------------------------------------------------

@dataclass(frozen=True)
class Tenant:
    tenant_id: str
    endpoints: list[tuple[str, str]]  # (endpoint_id, receiver path)
    schema_version: str | None = None  # the catalogued version its events carry; None: no catalog


def _auth(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")]


def create_tenant(channel: grpc.Channel, settings: Settings, base_url: str, n_endpoints: int,
                  label: str, catalog_body: bytes | None = None) -> Tenant:
    """A tenant with ``n_endpoints`` endpoints; with ``catalog_body``, the bench's event type is
    catalogued first (bench.catalog), with that payload as the version's example."""
    admin = rpc.AdminStub(channel)
    admin_token = settings.control_plane.admin_token.get_secret_value()
    md = _auth(admin_token)
    tenant_id = f"ten_bench_{label}_{uuid.uuid4().hex[:8]}"
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant_id, name=f"bench {label}"), metadata=md)
    if catalog_body is not None:
        bench_catalog.catalogue(channel, admin_token, tenant_id, EVENT_TYPE, catalog_body)
    key = admin.CreateApiKey(pb.CreateApiKeyRequest(tenant_id=tenant_id, description="bench"), metadata=md)
    cp = rpc.ControlPlaneStub(channel)

    def create(i: int) -> tuple[str, str]:
        path = f"/bench/{tenant_id}/{i}"
        created = cp.CreateEndpoint(
            pb.CreateEndpointRequest(url=base_url + path, description=f"bench {i}", event_types=["bench.*"]),
            metadata=_auth(key.api_key))
        return created.endpoint.endpoint_id, path

    # Concurrently: the API answers a config change one config lease (1 s) after Kafka confirmed
    # it, so a thousand endpoints created one after another would take a thousand seconds.
    with ThreadPoolExecutor(max_workers=CREATE_CONCURRENCY) as pool:
        endpoints = list(pool.map(create, range(n_endpoints)))
    return Tenant(tenant_id, endpoints, bench_catalog.EVENT_VERSION if catalog_body is not None else None)


# ---- producing and measuring ----------------------------------------------------------------------

@dataclass
class Sent:
    """Expected deliveries of one phase: webhook-id -> (produce time, tenant, path), and the paths."""
    produced_at: dict[str, tuple[float, str, str]] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    first_produce: float = 0.0
    last_produce: float = 0.0


def _event(t: Tenant, body: bytes) -> EventRecord:
    return EventRecord(event_id=f"evt_{uuid.uuid4().hex}", tenant_id=t.tenant_id, event_type=EVENT_TYPE,
                       schema_version=t.schema_version or UNCATALOGUED_VERSION, object_id="obj_bench",
                       object_version=1, occurred_at_ms=int(time.time() * 1000), payload=body)


_PRODUCERS: dict[str, Producer] = {}


def _producer(bootstrap_servers: str) -> Producer:
    """One long-lived producer per run, like a real outbox relay. Measured here: the first
    ~0.5 s of records from a *new* idempotent producer reach consumers only after the broker's
    fetch wait (500 ms), although acknowledged at once; a producer per phase put that
    into every phase's first-attempt p99. The warm-up phase is the first to use it."""
    p = _PRODUCERS.get(bootstrap_servers)
    if p is None:
        p = _PRODUCERS[bootstrap_servers] = Producer(
            {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 2})
    return p


def _paced(tenants: list[Tenant], n_events: int, rate_per_s: float | None) -> Iterator[Tenant]:
    """The tenant of each of n_events, round-robin, each no sooner than its turn at rate_per_s
    (None: at full speed)."""
    begin = time.time()
    for i in range(n_events):
        if rate_per_s:
            delay = begin + i / rate_per_s - time.time()
            if delay > 0:
                time.sleep(delay)
        yield tenants[i % len(tenants)]


def _expect(sent: Sent, event_id: str, t: Tenant, at: float) -> None:
    for endpoint_id, path in t.endpoints:
        sent.produced_at[delivery_id_for(event_id, endpoint_id)] = (at, t.tenant_id, path)


def produce(settings: Settings, tenants: list[Tenant], n_events: int, body: bytes,
            rate_per_s: float | None = None) -> Sent:
    """n_events round-robin over tenants, at full speed or paced; the produce-call time is the
    start of each delivery's latency (it includes the producer's few ms of batching)."""
    p = _producer(settings.kafka.bootstrap_servers)
    sent = Sent(paths=[path for t in tenants for _, path in t.endpoints])
    begin = time.time()
    for t in _paced(tenants, n_events, rate_per_s):
        ev = _event(t, body)
        now = time.time()
        p.produce(settings.kafka.events_topic, value=ev.to_json(), key=ev.event_id)
        p.poll(0)
        _expect(sent, ev.event_id, t, now)
    if p.flush(60) != 0:
        raise RuntimeError("Kafka did not acknowledge every event")
    sent.first_produce, sent.last_produce = begin, time.time()
    return sent


def produce_outbox(relay: OutboxRelay, tenants: list[Tenant], n_events: int, body: bytes,
                   rate_per_s: float | None = None) -> Sent:
    """The same events through the transactional outbox: one producer transaction each, as an
    application commits one business change at a time; a delivery's latency starts when its
    transaction's COMMIT returned (outbox -> WAL -> Debezium -> Kafka -> job -> receiver)."""
    sent = Sent(paths=[path for t in tenants for _, path in t.endpoints])
    begin = time.time()
    with relay.connect() as conn:
        for t in _paced(tenants, n_events, rate_per_s):
            event_id = write_event(conn, t.tenant_id, EVENT_TYPE, body,
                                   schema_version=t.schema_version or UNCATALOGUED_OUTBOX_VERSION,
                                   tracer=PRODUCER_TRACER)
            conn.commit()
            _expect(sent, event_id, t, time.time())
    sent.first_produce, sent.last_produce = begin, time.time()
    return sent


def wait_and_measure(rx: ReceiverControl, sent: Sent, timeout_s: float, wait_paths: list[str] | None = None,
                     stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep,
                     say: Callable[[str], None] = say) -> PhaseResult:
    """Wait until the expected count arrived on `wait_paths` (default: all), then read recordings.

    Gives up when nothing new arrived for ``stall_s`` (a stuck job) or after ``timeout_s`` in all.
    A fixed wait alone cut a slow machine's full-speed phase short: its CPU was measured over part
    of the work and the half-load phase then started behind the remainder, its latencies measuring
    that queue (docs/performance-log.md, the bench itself)."""
    paths = wait_paths or sent.paths
    wanted = set(paths)
    expected_on_wait = sum(1 for _, _, path in sent.produced_at.values() if path in wanted)
    start = clock()
    seen, last_seen, progress_at = 0, -1, start
    last_report, last_confirm = start - 10, start - 10
    while True:
        now = clock()
        counts = rx.counts()
        seen = sum(counts.get(p, 0) for p in paths)
        if seen != last_seen:
            last_seen, progress_at = seen, now
        if seen >= expected_on_wait and now - last_confirm > 2:
            # Counts include repeats and an earlier phase's deliveries still draining to the same
            # endpoints: done when this phase's own deliveries have all arrived.
            last_confirm = now
            result = measure(rx, sent, paths, expected_on_wait)
            if result.delivered >= expected_on_wait:
                return result
        if now - progress_at >= stall_s or now - start >= timeout_s:
            break
        if now - last_report > 5:
            say(f"  ... {seen}/{expected_on_wait} requests received")
            last_report = now
        sleep(0.25)
    why = f"nothing new for {stall_s:.0f}s" if now - progress_at >= stall_s else f"{timeout_s:.0f}s in all"
    say(f"  gave up after {now - start:.0f}s ({why}) with {seen}/{expected_on_wait}: measuring what arrived")
    return measure(rx, sent, paths, expected_on_wait)


def measure(rx: ReceiverControl, sent: Sent, paths: list[str], expected: int) -> PhaseResult:
    first: dict[str, float] = {}
    requests = 0
    for path in paths:
        for rec in rx.requests(path):
            wid = rec.webhook_id
            if wid not in sent.produced_at:
                continue  # an earlier phase's delivery still draining to the same endpoint
            requests += 1
            if wid not in first or rec.received_at < first[wid]:
                first[wid] = rec.received_at
    by_tenant: dict[str, list[float]] = {}
    latencies = []
    pairs = []
    for wid, arrived in first.items():
        produced, tenant, _ = sent.produced_at[wid]
        latencies.append(arrived - produced)
        pairs.append((produced, arrived, tenant))
        by_tenant.setdefault(tenant, []).append(arrived - produced)
    return PhaseResult(expected=expected, delivered=len(first), duplicates=requests - len(first),
                       latencies_s=sorted(latencies), arrivals=sorted(first.values()),
                       produce_s=sent.last_produce - sent.first_produce, latencies_by_tenant=by_tenant,
                       pairs=sorted(pairs))


def report(name: str, r: PhaseResult) -> None:
    say(f"{name}: delivered {r.delivered}/{r.expected} (+{r.duplicates} repeats), "
        f"produced in {r.produce_s:.2f}s")
    say(f"{name}: sustained {r.sustained_per_s:.0f} deliveries/s (middle 80%), "
        f"end-to-end {r.end_to_end_per_s:.0f}/s")
    say(f"{name}: first attempt latency p50={r.p(50):.0f} ms p90={r.p(90):.0f} ms p99={r.p(99):.0f} ms "
        f"max={r.p(100):.0f} ms")
    say(f"{name}: {r.usage.summary(r.delivered)}")


def warm_up(settings: Settings, rx: ReceiverControl, tenants: list[Tenant], body: bytes,
            timeout_s: float) -> None:
    """One event per tenant until every endpoint answered: configs are broadcast, the job is warm."""
    deadline = time.monotonic() + timeout_s
    while True:
        sent = produce(settings, tenants, len(tenants), body)
        r = wait_and_measure(rx, sent, timeout_s=min(30.0, max(1.0, deadline - time.monotonic())))
        if r.delivered == len(sent.produced_at):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm-up: {r.delivered}/{len(sent.produced_at)} delivered")
    rx.clear()


def confirm_validating(settings: Settings, tenants: list[Tenant], body: bytes, timeout_s: float) -> None:
    """With --catalog: one event per tenant off the schema must come back as a schema_invalid dead
    letter, showing the job's fan-out has the catalog and validates (bench.catalog says why)."""
    p = _producer(settings.kafka.bootstrap_servers)
    waiting = set()
    for t in tenants:
        ev = _event(t, bench_catalog.off_schema(body))
        p.produce(settings.kafka.events_topic, value=ev.to_json(), key=ev.event_id)
        waiting.add(ev.event_id)
    if p.flush(60) != 0:
        raise RuntimeError("Kafka did not acknowledge the catalog probes")
    # The run's own dead-letter topic, from its start: nothing else of the run is refused.
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                         "group.id": f"bench-probe-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([settings.kafka.dlq_topic])
    deadline = time.monotonic() + timeout_s
    try:
        while waiting and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.value():
                waiting.discard(bench_catalog.refused_event_id(msg.value()))
    finally:
        consumer.close()
    if waiting:
        raise RuntimeError(f"--catalog: {len(waiting)} of {len(tenants)} probe(s) off the schema not dead-lettered "
                           f"within {timeout_s:.0f}s: the job's fan-out does not validate (a TaskManager still "
                           "running Python modules loaded before the catalog check?)")


def raw_ceiling(base_url: str, concurrency: int, duration_s: float, body: bytes) -> raw_http.Result:
    ctx = ssl.create_default_context(cafile=str(CERTS / "ca.pem"))
    return asyncio.run(raw_http.run(base_url + "/raw", ctx, concurrency, duration_s, 1_000_000, body))


# ---- phases ---------------------------------------------------------------------------------------

def phase(name: str, settings: Settings, rx: ReceiverControl, tenants: list[Tenant], n_events: int,
          body: bytes, timeout_s: float, rate: float | None = None,
          wait_paths: list[str] | None = None, relay: OutboxRelay | None = None) -> tuple[PhaseResult, Sent]:
    """One measured phase; through ``relay``'s outbox when given, else straight to Kafka."""
    rx.clear()
    with cpu.StackSampler(_groups) as sampler:
        if relay is not None:
            sent = produce_outbox(relay, tenants, n_events, body, rate)
        else:
            sent = produce(settings, tenants, n_events, body, rate)
        r = wait_and_measure(rx, sent, timeout_s, wait_paths, stall_s=PHASE_STALL_S)
    r.usage = sampler.usage
    report(name, r)
    PHASES[name] = r
    if LATENCY_DIR is not None:
        # For looking into a tail: is it a few stalls (slow deliveries bunched in time) or spread?
        out = LATENCY_DIR / f"{name}.csv"
        out.write_text("produced_s,arrived_s,latency_ms,tenant\n" + "".join(
            f"{p:.3f},{a:.3f},{(a - p) * 1000:.0f},{t}\n" for p, a, t in r.pairs))
        say(f"{name}: per-delivery latencies in {out}")
    return r, sent


def fairness(settings: Settings, rx: ReceiverControl, channel: grpc.Channel, base_url: str,
             healthy: Tenant, args: argparse.Namespace, body: bytes, rate: float) -> None:
    """Tenant A: many hanging endpoints; tenant B (healthy): its p99 alone vs alongside A."""
    hanging = create_tenant(channel, settings, base_url, args.fair_hanging_endpoints, "hang",
                            body if args.catalog else None)
    for _, path in hanging.endpoints:
        rx.set_behaviour(path, "hang")
    n_b = max(10, int(rate * args.fair_seconds))
    base, _ = phase("fair-baseline", settings, rx, [healthy], n_b, body, args.timeout, rate)
    # Load A's endpoints first: a small burst gives every hanging endpoint deliveries that hold
    # its in-flight slots until the request timeout, then retries and breaker probes. (Pacing A's
    # events at B's rate would multiply them by A's endpoint count and measure an overload of the
    # whole platform, not the isolation of a hanging tenant.)
    produce(settings, [hanging], args.fair_a_events, body)
    time.sleep(args.fair_settle_seconds)
    loaded_started = time.monotonic()
    loaded, _ = phase("fair-loaded", settings, rx, [healthy], n_b, body, args.timeout, rate)
    # Isolation must not become starvation: A's requests reaching its endpoints during the phase
    # (the phase cleared the recordings when it started). At its quota of Q slots and a timeout
    # of T seconds A can have at most Q/T requests/s start; parked endpoints must pick up freed
    # slots promptly to get near that.
    counts = rx.counts()
    a_requests = sum(counts.get(path, 0) for _, path in hanging.endpoints)
    d = settings.dispatch
    say(f"fair-loaded: tenant A requests {a_requests / (time.monotonic() - loaded_started):.1f}/s "
        f"(its quota of {d.tenant_max_in_flight} and the {d.total_timeout_s:g} s timeout allow at most "
        f"{d.tenant_max_in_flight / d.total_timeout_s:.1f}/s)")
    b = healthy.tenant_id
    say(f"fairness: tenant B p99 alone={base.p(99, b):.0f} ms, with hanging tenant A "
        f"({args.fair_hanging_endpoints} endpoints)={loaded.p(99, b):.0f} ms; "
        f"B p50 {base.p(50, b):.0f} -> {loaded.p(50, b):.0f} ms")


def outbox_phases(stack: ExitStack, env: dict[str, str], run_id: str, settings: Settings, rx: ReceiverControl,
                  tenants: list[Tenant], body: bytes, args: argparse.Namespace, half_rate: float) -> str:
    """The full-speed phase again, and the half-load one at the same rate, through an outbox of the
    run's own (PostgreSQL + Debezium, stack.outbox_relay); returns the summary line."""
    relay = OutboxRelay(env, RUN / f"bench-outbox-{run_id}", flush_ms=10_000)
    stack.callback(relay.stop)
    relay.start()
    EXTRA_GROUPS.update({"postgres": [relay.run_dir / "postgres/pid"], "connect": [relay.run_dir / "connect/pid"]})
    stack.callback(lambda: [EXTRA_GROUPS.pop(g, None) for g in ("postgres", "connect")])
    say(f"outbox: PostgreSQL + Kafka Connect/Debezium up ({relay.settings.outbox.dsn})")
    warm, _ = phase("outbox-warm", settings, rx, tenants, len(tenants), body, 120, relay=relay)
    if warm.delivered != warm.expected:
        raise RuntimeError(f"outbox warm-up: {warm.delivered}/{warm.expected} delivered")
    full, _ = phase("outbox-max", settings, rx, tenants, args.events, body, args.timeout, relay=relay)
    line = (f"bench-outbox: deliveries_per_s={full.sustained_per_s:.0f} "
            f"p50_first_attempt_ms={full.p(50):.0f} p99_first_attempt_ms={full.p(99):.0f} (from COMMIT)")
    if half_rate > 0:
        n = max(10, min(args.events, int(half_rate * args.half_seconds)))
        half, _ = phase("outbox-half", settings, rx, tenants, n, body, args.timeout, half_rate, relay=relay)
        line += f" half_load_p50_ms={half.p(50):.0f} half_load_p99_ms={half.p(99):.0f}"
    return line


LATENCY_DIR: Path | None = None
PHASE_STALL_S = STALL_S
REPORT_DIR = RUN / "bench"
# Each measured phase by name, for the report; and the run's own processes measured beside the
# stack's (its control plane; its outbox's PostgreSQL and Connect worker when started).
PHASES: dict[str, PhaseResult] = {}
EXTRA_GROUPS: dict[str, list[Path]] = {}
# The outbox phases' producer, when the run traces (the outbox library's spans, in this process).
PRODUCER_TRACER: Tracer | None = None
# The stack's trace collector, counted on the delivery path when the run traces (the idle sample
# counts every stack process already).
COLLECTOR: dict[str, list[Path]] = {}


def tracing_env(ratio: float) -> dict[str, str]:
    """WEBHOOKS_* that turn tracing on at ``ratio`` for the run's job and control plane."""
    return {"WEBHOOKS_TRACING__ENABLED": "true", "WEBHOOKS_TRACING__SAMPLE_RATIO": repr(ratio)}


def check_collector(t: TracingSettings, timeout_s: float = 3.0) -> None:
    """Stop before the run, not after it with every batch of spans refused: something must take
    OTLP/HTTP on the settings' endpoint (the stack's Jaeger: make up TRACING=1)."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(t.otlp_endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "127.0.0.1", port), timeout=timeout_s).close()
    except OSError as exc:
        raise RuntimeError(f"tracing is on but nothing takes OTLP spans at {t.otlp_endpoint} ({exc}): "
                           "start Jaeger with `make up TRACING=1`") from None


def tracing_line(t: TracingSettings) -> str:
    if not t.enabled:
        return "tracing: off"
    return (f"tracing: on sample_ratio={t.sample_ratio:g} otlp={t.traces_url} "
            "(the collector's CPU is the delivery path's group jaeger)")


def _groups() -> dict[str, list[Path]]:
    return cpu.stack_groups(RUN, {**EXTRA_GROUPS, **COLLECTOR})


def measure_idle(seconds: float) -> tuple[cpu.Usage, dict[tuple[str, str], float]]:
    """Every process of the stack (and the run's own) over ``seconds`` of no traffic, in all and
    by thread."""
    say(f"idle: sampling every stack process for {seconds:g}s (job running, no traffic)")
    groups = partial(cpu.whole_stack_groups, RUN, EXTRA_GROUPS)
    (ticks_before, _), t0 = profilers.stack_threads(groups()), time.monotonic()
    with cpu.StackSampler(groups, interval_s=1.0) as sampler:
        time.sleep(seconds)
    ticks_after, names = profilers.stack_threads(groups())
    return sampler.usage, profilers.cores_by_thread_name(ticks_before, ticks_after, names, time.monotonic() - t0)


def idle_line(usage: cpu.Usage) -> str:
    """The idle stack's cores busy, in all and by process, largest first."""
    return (f"bench-idle: cores={usage.cores:.3f} seconds={usage.wall_s:.1f} "
            + " ".join(f"{g}={c:.3f}" for g, c in usage.cores_by_group().items()))


def idle_threads_line(threads: dict[tuple[str, str], float], top: int = 8) -> str:
    """Where the idle stack's cores went by thread: the JVMs' JIT compilers (code the last phase
    made hot, still being compiled: it fades within minutes, so it is not what the idle stack
    costs for ever), their garbage collectors, the rest, then the busiest threads by process."""
    jit = sum(c for (_, name), c in threads.items() if name in profilers.JIT_THREADS)
    gc = sum(c for (_, name), c in threads.items() if name in profilers.GC_THREADS)
    rest = sum(threads.values()) - jit - gc
    busiest = sorted(threads.items(), key=lambda x: (-x[1], x[0]))[:top]
    return (f"bench-idle-threads: jit={jit:.3f} gc={gc:.3f} rest={rest:.3f} | "
            + " ".join(f"{g}:{name.replace(' ', '_')}={c:.3f}" for (g, name), c in busiest))


def run(args: argparse.Namespace) -> int:
    global LATENCY_DIR, PHASE_STALL_S, PRODUCER_TRACER
    PHASE_STALL_S = args.stall_timeout
    started = time.monotonic()
    if args.latency_dir:
        LATENCY_DIR = Path(args.latency_dir)
        LATENCY_DIR.mkdir(parents=True, exist_ok=True)
    body = raw_http.make_body(args.body_bytes)
    run_id = uuid.uuid4().hex[:8]
    subprocess.run([PY, "-m", "stack.certs", "--out", str(CERTS)], check=True, capture_output=True)
    with ExitStack() as stack:
        rxp = stack.enter_context(receiver_process())
        rx = rxp.control
        say(f"receiver {rxp.base_url} (pid {rxp.proc.pid})")

        with cpu.StackSampler(dict) as machine:  # no stack process: only the machine's steal
            raw = raw_ceiling(rxp.base_url, args.raw_concurrency, args.raw_duration, body)
        raw_steal = machine.usage.steal_pct
        say(f"raw aiohttp ceiling: {raw.per_second:.0f} req/s ({raw.ok} ok, {raw.errors} errors, "
            f"concurrency {args.raw_concurrency}, {args.body_bytes} B bodies) | " + " ".join(raw.lines()[2:])
            + f" steal_pct={raw_steal:.0f}")
        rx.clear()

        port = int(rxp.base_url.rsplit(":", 1)[1])
        stack.enter_context(extra_taskmanagers(args.taskmanagers - 1, say))
        env = bench_env(run_id, port, max(args.partitions, args.taskmanagers))
        env["WEBHOOKS_FLINK__PARALLELISM"] = str(args.taskmanagers)
        if args.tracing_ratio is not None:
            env.update(tracing_env(args.tracing_ratio))
        settings = settings_with(env)
        if settings.tracing.enabled:
            check_collector(settings.tracing)
            COLLECTOR["jaeger"] = [RUN / "jaeger/pid"]
            PRODUCER_TRACER = tracer(settings.tracing, settings.tracing.producer_service_name)
        say(tracing_line(settings.tracing))
        ks_session = stack.enter_context(keyspace_session(settings))
        read_writes = partial(cassandra_writes.read, ks_session, settings.cassandra.keyspace)
        stack.enter_context(topics(settings))
        cp_pid = RUN / f"bench-{run_id}-control-plane.pid"
        channel = stack.enter_context(control_plane_process(env, cp_pid))
        EXTRA_GROUPS["control-plane"] = [cp_pid]
        # Catalogued before the job starts: its first event of each tenant is already checked.
        tenants = [create_tenant(channel, settings, rxp.base_url, args.endpoints, str(i),
                                 body if args.catalog else None)
                   for i in range(args.tenants)]
        say(f"{args.tenants} tenant(s) x {args.endpoints} endpoints"
            f"{', bench event type catalogued' if args.catalog else ''}; submitting {env['WEBHOOKS_FLINK__JOB_NAME']}")
        t0 = time.monotonic()
        job_id = stack.enter_context(bench_job(env))
        say(f"job {job_id} running after {time.monotonic() - t0:.1f}s")
        warm_up(settings, rx, tenants, body, timeout_s=120)
        say(f"warm: configs broadcast, one event per tenant delivered ({time.monotonic() - started:.0f}s in)")
        if args.warm_events:
            # Shown, not counted: a freshly started stack's JVMs (Cassandra, Kafka, the TaskManager)
            # are still compiling their hot paths, which a stack running for days has long paid
            # (docs/performance.md, how to run the benches: the warm-up burst).
            phase("warm-burst", settings, rx, tenants, args.warm_events, body, args.timeout)
        if args.catalog:
            confirm_validating(settings, tenants, body, timeout_s=60)
            say("catalog: each tenant's probe off the schema was dead-lettered (schema_invalid): fan-out validates")

        full: PhaseResult | None = None
        half: PhaseResult | None = None
        writes: dict[str, int] | None = None
        idle: cpu.Usage | None = None
        idle_threads: dict[tuple[str, str], float] = {}
        sustained = 0.0
        rate = 0.0
        if args.max:
            # Settled first: the warm-up's history writes are not the phase's.
            before = cassandra_writes.settled(read_writes)
            full, _ = phase("max", settings, rx, tenants, args.events, body, args.timeout)
            writes = cassandra_writes.delta(before, cassandra_writes.settled(read_writes))
            say(f"max: Cassandra counted {sum(writes.values())} writes to {settings.cassandra.keyspace} "
                f"for {full.delivered} deliveries ({', '.join(f'{t} {n}' for t, n in writes.items())})")
            sustained = full.sustained_per_s
        if args.half_load and sustained > 0:
            # Deliveries/s -> events/s: each event fans out to every endpoint of its tenant.
            rate = sustained / 2 / args.endpoints
            n = max(10, min(args.events, int(rate * args.half_seconds)))
            say(f"half load: {rate:.1f} events/s ({rate * args.endpoints:.0f} deliveries/s) for {n} events")
            half, _ = phase("half", settings, rx, tenants, n, body, args.timeout, rate)
        if args.idle_seconds > 0:
            cassandra_writes.settled(read_writes)  # the last phase's history writes are not idle
            idle, idle_threads = measure_idle(args.idle_seconds)
        if args.outbox:
            outbox_line = outbox_phases(stack, env, run_id, settings, rx, tenants, body, args, rate)
        fair_rate = args.fair_rate or sustained / 4  # deliveries/s of the healthy tenant
        if args.fairness and fair_rate > 0:
            fairness(settings, rx, channel, rxp.base_url, tenants[0], args, body,
                     rate=fair_rate / args.endpoints)

    say(f"total run time {time.monotonic() - started:.0f}s")
    lines = []
    if args.outbox:
        direct = (f" | direct to Kafka: half_load_p50_ms={half.p(50):.0f} half_load_p99_ms={half.p(99):.0f}"
                  if half else "")
        lines.append(outbox_line + direct)
    if idle is not None:
        lines.append(idle_line(idle))
        lines.append(idle_threads_line(idle_threads))
    lines.append(bench_catalog.catalog_line(args.catalog, EVENT_TYPE))
    lines.append(tracing_line(settings.tracing))
    lines.append(schema_validation.report_line(body))  # fan-out's catalog check, per event
    costs = None
    if full is not None:
        costs = Costs.of(full, raw, writes, idle)
        lines.append(summary_line(full, half, raw.per_second, costs))
    out = report_md.write(REPORT_DIR, PHASES, lines, raw, vars(args), costs)
    say(f"report: {out}")
    for line in lines:
        print(line, flush=True)
    if full is None:
        return 0
    return 0 if full.delivered == full.expected else 1


def summary_line(full: PhaseResult, half: PhaseResult | None, raw_per_s: float, costs: Costs) -> str:
    """The comparable last line: the figures of earlier runs first, the newer ones after (a figure
    not measured in this run reads ``nan``)."""
    ratio = full.sustained_per_s / raw_per_s if raw_per_s else 0.0
    return (f"bench: deliveries_per_s={full.sustained_per_s:.0f} raw_http_per_s={raw_per_s:.0f} "
            f"ratio={ratio:.3f} p50_first_attempt_ms={full.p(50):.0f} p99_first_attempt_ms={full.p(99):.0f} "
            f"half_p50_first_attempt_ms={half.p(50) if half else 0:.0f} "
            f"half_p99_first_attempt_ms={half.p(99) if half else 0:.0f} "
            f"cpu_ms_per_delivery={costs.cpu_ms_per_delivery:.2f} "
            f"client_cpu_ms_per_request={costs.client_cpu_ms_per_request:.3f} "
            f"cpu_per_client_request={costs.cpu_per_client_request:.1f} "
            f"cassandra_writes_per_delivery={costs.cassandra_writes_per_delivery:.2f} "
            f"idle_cores={costs.idle_cores:.2f} steal_pct={full.usage.steal_pct:.0f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=2000, help="events in the full-speed phase")
    ap.add_argument("--endpoints", type=int, default=10, help="endpoints per tenant (each event matches all)")
    ap.add_argument("--tenants", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=2, help="partitions of the bench events topic")
    ap.add_argument("--taskmanagers", type=int, default=1,
                    help="TaskManagers for the job (extra ones started and stopped by the run); "
                         "the job's parallelism is this number")
    ap.add_argument("--body-bytes", type=int, default=raw_http.DEFAULT_BODY_BYTES)
    ap.add_argument("--raw-concurrency", type=int, default=64)
    ap.add_argument("--raw-duration", type=float, default=5.0, help="seconds of raw HTTP measurement")
    ap.add_argument("--warm-events", type=int, default=5000,
                    help="a full-speed burst of this many events before the measured phases, reported "
                         "but not counted (JIT warm-up of a fresh stack); 0 skips it")
    ap.add_argument("--max", action=argparse.BooleanOptionalAction, default=True,
                    help="the full-speed phase (without it, no summary line; use --fair-rate)")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="max seconds to wait for one phase's deliveries in all (see --stall-timeout)")
    ap.add_argument("--stall-timeout", type=float, default=STALL_S,
                    help="a phase gives up when no delivery arrived for this many seconds")
    ap.add_argument("--half-load", action=argparse.BooleanOptionalAction, default=True,
                    help="paced phase at half the sustained rate")
    ap.add_argument("--half-seconds", type=float, default=15.0)
    ap.add_argument("--idle-seconds", type=float, default=30.0,
                    help="after the direct phases, sample every stack process this long with no "
                         "traffic (idle_cores); 0 skips it (idle_cores=nan)")
    ap.add_argument("--outbox", action=argparse.BooleanOptionalAction, default=True,
                    help="repeat the full-speed and half-load phases through the transactional outbox "
                         "(PostgreSQL -> Debezium -> Kafka) and print a bench-outbox line")
    ap.add_argument("--fairness", action=argparse.BooleanOptionalAction, default=True,
                    help="hanging tenant A vs healthy tenant B")
    ap.add_argument("--fair-hanging-endpoints", type=int, default=1000)
    ap.add_argument("--fair-a-events", type=int, default=2,
                    help="events of the hanging tenant (each goes to all its endpoints)")
    ap.add_argument("--fair-settle-seconds", type=float, default=10.0,
                    help="wait after loading tenant A before measuring tenant B")
    ap.add_argument("--fair-seconds", type=float, default=20.0,
                    help="length of each fairness phase (p99 of ~6,000 deliveries at the default rate)")
    ap.add_argument("--catalog", action=argparse.BooleanOptionalAction, default=False,
                    help="catalogue the bench's event type for every bench tenant before the load, so "
                         "fan-out validates every event against its JSON Schema (bench/catalog.py)")
    ap.add_argument("--latency-dir", help="write each phase's per-delivery latencies here as CSV")
    ap.add_argument("--fair-rate", type=float, default=0.0,
                    help="healthy tenant's deliveries/s (default: a quarter of the full-speed rate)")
    ap.add_argument("--tracing-ratio", type=float, default=None,
                    help="trace the run's job and control plane, head-sampling this share of traces "
                         "(e.g. 0.01; needs `make up TRACING=1`'s Jaeger)")
    args = ap.parse_args(argv)
    if min(args.events, args.endpoints, args.tenants, args.partitions, args.taskmanagers) < 1:
        ap.error("--events, --endpoints, --tenants, --partitions and --taskmanagers must be >= 1")
    if args.idle_seconds < 0:
        ap.error("--idle-seconds must be >= 0 (0 skips the idle sample)")
    if args.tracing_ratio is not None and not 0 <= args.tracing_ratio <= 1:
        ap.error("--tracing-ratio must be within 0..1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
