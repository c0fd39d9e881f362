"""Backlog benchmark: N deliveries pending behind one failing endpoint, a TaskManager kill, recovery.

    python -m bench.backlog [--pending 1000000] [--healthy-rate 20 --healthy-endpoints 4 ...]

One run on the running local stack (`make up`), loopback only, every wait bounded in time, with
the isolation of `bench.run` plus a Cassandra keyspace of its own (own topics, consumer group,
keyspace and job name; its own receiver subprocess):

1. tenant "backlog" with ONE endpoint whose receiver path answers 503 (its breaker opens and
   holds the backlog), and a healthy tenant with a few endpoints answering 200; a bench job on the
   cluster (whatever state backend the cluster is configured with);
2. the healthy tenant gets a steady small rate all along (--healthy-rate deliveries/s); its
   first-attempt latency (produce call -> first request at the receiver) is reported per phase:
   before (no backlog), build (backlog being ingested: the events topic is shared, so this is
   mostly ingest lag), during (backlog sitting in state), restore (from 2 s before the
   TaskManager kill until the healthy tenant's new deliveries arrive within max(1 s, 3 x its
   before-p99) again), restored (then, for --restored-seconds, endpoint still failing), after
   (the drain);
3. N events for the failing endpoint, produced in batches; pending = rows of the run's
   `endpoint_deliveries` for that endpoint (written by the dispatcher as each delivery is
   persisted into keyed state, all still pending since the endpoint only answers 503);
4. once N are pending: TaskManager RSS (with children, from /proc) and JVM heap used (Flink REST),
   the first checkpoint triggered after that (full state size, duration), state bytes per
   pending delivery, per job and for the dispatch vertex, and the bytes the incremental
   checkpoints uploaded from the start of the build up to that checkpoint;
5. SIGKILL of the TaskManager's process group, `stack/flink.sh start`, time until every vertex
   is RUNNING again with a start time after the kill (restore_s), and until the healthy tenant is
   served normally again (a restored job re-reads every pending delivery's durable record first);
6. the failing path answers 200: drain rate until every expected delivery_id has been answered
   200 at least once (lost = 0; duplicates = 200-answered requests beyond one per delivery), and
   Cassandra's rows for the endpoint all `succeeded`;
7. the job is cancelled, its checkpoints removed (--keep-state keeps them), the receiver stopped
   by pid, the control plane stopped, topics and keyspace deleted -- also on errors and Ctrl-C.

For the run the breaker's open period is shortened (--probe-max-s, default 10 s instead of up to
600 s), so the recovered endpoint is probed, and the drain starts, within seconds.

The last line is the comparable summary:

    backlog: pending=N tm_rss_mb=.. heap_mb=.. checkpoint_mb=.. checkpoint_s=.. state_bytes_per_pending=..
    restore_s=.. drain_per_s=.. lost=0 duplicates=.. healthy_p99_ms_before=.. during=.. after=..
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cassandra.cluster import Session
from cassandra.query import SimpleStatement
from confluent_kafka import Producer

from bench import raw_http
from bench.raw_http import percentile
from bench.run import (
    CERTS,
    PY,
    RUN,
    Tenant,
    bench_env,
    bench_job,
    control_plane,
    create_tenant,
    receiver_process,
    topics,
)
from core.history_buckets import HISTORY_BUCKETS
from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, Settings
from stack import cpu
from stack.cassandra_schema import apply
from stack.flink_jobs import rest
from stack.isolation import harness_cluster, isolated_env, settings_with
from tests.support.receiver import ReceiverControl

EVENT_TYPE = "bench.backlog"
PHASES = ("before", "build", "during", "restore", "restored", "after")


def say(msg: str) -> None:
    print(f"[backlog] {msg}", flush=True)


# ---- isolation: a keyspace of the run's own ------------------------------------------------------

@contextmanager
def own_keyspace(settings: Settings) -> Iterator[Session]:
    """The run's keyspace with the project's schema; dropped at the end, also after an error."""
    c = settings.cassandra
    cluster = harness_cluster(settings)
    try:
        session = cluster.connect()
        apply(session, c.keyspace, c.replication_factor)
        try:
            yield session
        finally:
            try:
                session.execute(f"DROP KEYSPACE IF EXISTS {c.keyspace}", timeout=120)
                say(f"dropped keyspace {c.keyspace}")
            except Exception as e:  # cleanup is best effort; report and go on
                say(f"dropping keyspace {c.keyspace} failed: {e}")
    finally:
        cluster.shutdown()


def remove_job_state(job_name: str, job_id: str | None) -> None:
    """Delete this run's checkpoints (stack/job.sh keeps them under .run/flink/state-<job name>),
    once the job is no longer running; only that one directory."""
    if job_id:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, KeyError, ValueError):
                if rest(f"/jobs/{job_id}")["state"] in ("CANCELED", "FAILED", "FINISHED"):
                    break
            time.sleep(1)
    state = RUN / "flink" / f"state-{job_name}"
    if state.is_dir() and state.name.startswith("state-webhooks-backlog-"):
        shutil.rmtree(state, ignore_errors=True)
        say(f"removed {state}")


# ---- the TaskManager's memory and the job's checkpoints -------------------------------------------

def tm_rss_mb() -> float:
    """RSS of every TaskManager the stack started, with its children (MB)."""
    return cpu.ticks_and_rss_kb(cpu.pids_of(_taskmanagers()["taskmanagers"]))[1] / 1024


def _taskmanagers() -> dict[str, list[Path]]:
    """The pid files of every TaskManager the stack scripts started (flink-tm, and flink-tm-N
    from add-tm), as the one sampling group the backlog bench watches."""
    return {"taskmanagers": cpu.stack_groups(RUN)["taskmanagers"]}


def tm_heap_mb() -> tuple[float, float]:
    """(JVM heap used, heap max) summed over the registered TaskManagers (MB), from Flink REST."""
    used = cap = 0.0
    for tm in rest("/taskmanagers")["taskmanagers"]:
        # A list of {id, value} (rest() is typed for the usual objects).
        metrics: Any = rest(f"/taskmanagers/{tm['id']}/metrics?get=Status.JVM.Memory.Heap.Used,"
                            "Status.JVM.Memory.Heap.Max")
        values = {m["id"]: float(m["value"]) for m in metrics}
        used += values.get("Status.JVM.Memory.Heap.Used", 0.0)
        cap += values.get("Status.JVM.Memory.Heap.Max", 0.0)
    return used / 2**20, cap / 2**20


@dataclass
class MemoryPeak:
    rss_mb: float = 0.0
    heap_mb: float = 0.0
    heap_max_mb: float = 0.0

    def sample(self) -> None:
        self.rss_mb = max(self.rss_mb, tm_rss_mb())
        with contextlib.suppress(OSError, KeyError, ValueError):
            used, cap = tm_heap_mb()
            self.heap_mb, self.heap_max_mb = max(self.heap_mb, used), cap


@dataclass(frozen=True)
class Checkpoint:
    id: int
    trigger_ms: int
    state_size: int  # full state (with RocksDB incremental: every file the checkpoint refers to)
    checkpointed_size: int  # what this checkpoint uploaded (incremental)
    duration_ms: int
    dispatch_state_size: int  # the dispatch vertex's part
    dispatch_checkpointed_size: int
    failed_so_far: int


def _vertex_ids(job_id: str, needle: str) -> set[str]:
    return {v["id"] for v in rest(f"/jobs/{job_id}")["vertices"] if needle in v["name"]}


def latest_checkpoint(job_id: str) -> Checkpoint | None:
    stats = rest(f"/jobs/{job_id}/checkpoints")
    done = (stats.get("latest") or {}).get("completed")
    if not done:
        return None
    details = rest(f"/jobs/{job_id}/checkpoints/details/{done['id']}")
    dispatch = _vertex_ids(job_id, "dispatch (per endpoint)")
    tasks = [t for vid, t in (details.get("tasks") or {}).items() if vid in dispatch]
    return Checkpoint(id=done["id"], trigger_ms=done["trigger_timestamp"], state_size=done["state_size"],
                      checkpointed_size=done["checkpointed_size"], duration_ms=done["end_to_end_duration"],
                      dispatch_state_size=sum(t["state_size"] for t in tasks),
                      dispatch_checkpointed_size=sum(t["checkpointed_size"] for t in tasks),
                      failed_so_far=stats["counts"]["failed"])


class Uploads:
    """Bytes the job's checkpoints uploaded (checkpointed_size; with incremental checkpoints the
    new files only), summed over completed checkpoints after a baseline. Flink's REST history
    keeps only the last few checkpoints, so poll it at least every few checkpoint intervals."""

    def __init__(self, job_id: str, after_id: int) -> None:
        self.job_id, self.after_id = job_id, after_id
        self.seen: set[int] = set()
        self.bytes = 0
        self.max_duration_ms = 0

    def poll(self) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            for c in rest(f"/jobs/{self.job_id}/checkpoints").get("history") or []:
                if c["status"] == "COMPLETED" and c["id"] > self.after_id and c["id"] not in self.seen:
                    self.seen.add(c["id"])
                    self.bytes += c["checkpointed_size"]
                    self.max_duration_ms = max(self.max_duration_ms, c["end_to_end_duration"])


def checkpoint_after(job_id: str, after_ms: int, timeout_s: float, uploads: Uploads) -> Checkpoint | None:
    """The first completed checkpoint triggered at or after `after_ms`; None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        uploads.poll()
        with contextlib.suppress(OSError, KeyError, ValueError):
            cp = latest_checkpoint(job_id)
            if cp is not None and cp.trigger_ms >= after_ms:
                return cp
        time.sleep(1)
    return None


# ---- traffic --------------------------------------------------------------------------------------

def _event(tenant_id: str, body: bytes) -> EventRecord:
    return EventRecord(event_id=f"evt_{uuid.uuid4().hex}", tenant_id=tenant_id, event_type=EVENT_TYPE,
                       schema_version="2026-01-01", object_id="obj_backlog", object_version=1,
                       occurred_at_ms=int(time.time() * 1000), payload=body)


def _producer(settings: Settings, **extra: Any) -> Producer:
    return Producer({"bootstrap.servers": settings.kafka.bootstrap_servers, "enable.idempotence": True,
                     "linger.ms": 2, **extra})


def _produce(p: Producer, topic: str, ev: EventRecord) -> None:
    for _ in range(600):  # the local queue is full: let it drain (bounded: ~60 s)
        try:
            p.produce(topic, value=ev.to_json(), key=ev.event_id)
            return
        except BufferError:
            p.poll(0.1)
    raise RuntimeError("the Kafka producer's queue stayed full for 60 s")


class HealthyTraffic:
    """A steady rate of events for the healthy tenant from a thread (its own long-lived producer,
    so the backlog's batches never queue in front of it); each delivery is labelled with the
    phase current at its produce call."""

    def __init__(self, settings: Settings, tenant: Tenant, body: bytes, deliveries_per_s: float) -> None:
        self.settings, self.tenant, self.body = settings, tenant, body
        self.events_per_s = deliveries_per_s / len(tenant.endpoints)
        self.phase = "warm"
        self.produced: dict[str, tuple[float, str]] = {}  # delivery_id -> (produce time, phase)
        self._lock = threading.Lock()
        self._producer = _producer(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthy-traffic", daemon=True)

    def __enter__(self) -> HealthyTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(timeout=10)
            self._producer.flush(30)

    def _run(self) -> None:
        begin, i = time.monotonic(), 0
        while not self._stop.is_set():
            delay = begin + i / self.events_per_s - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                break
            if delay < -1.0:  # fell behind (a stall): keep the rate, do not burst to catch up
                begin, i = time.monotonic(), 0
            ev = _event(self.tenant.tenant_id, self.body)
            now, phase = time.time(), self.phase
            _produce(self._producer, self.settings.kafka.events_topic, ev)
            self._producer.poll(0)
            with self._lock:
                for endpoint_id, _ in self.tenant.endpoints:
                    self.produced[delivery_id_for(ev.event_id, endpoint_id)] = (now, phase)
            i += 1

    def snapshot(self) -> dict[str, tuple[float, str]]:
        with self._lock:
            return dict(self.produced)


def produce_backlog(settings: Settings, tenant: Tenant, n: int, body: bytes, batch: int,
                    rate_per_s: float) -> tuple[set[str], float]:
    """n events for the backlog tenant (one endpoint), in batches each flushed to Kafka; paced when
    rate_per_s > 0. Returns the expected delivery ids and the seconds it took."""
    p = _producer(settings, **{"linger.ms": 20, "queue.buffering.max.messages": 500_000})
    endpoint_id = tenant.endpoints[0][0]
    expected: set[str] = set()
    begin = time.monotonic()
    for start in range(0, n, batch):
        for i in range(start, min(n, start + batch)):
            if rate_per_s:
                delay = begin + i / rate_per_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            ev = _event(tenant.tenant_id, body)
            _produce(p, settings.kafka.events_topic, ev)
            expected.add(delivery_id_for(ev.event_id, endpoint_id))
            if i % 1000 == 0:
                p.poll(0)
        if p.flush(120) != 0:
            raise RuntimeError("Kafka did not acknowledge every backlog event within 120 s")
        say(f"  produced {len(expected)}/{n} backlog events ({time.monotonic() - begin:.0f}s)")
    return expected, time.monotonic() - begin


# ---- pending deliveries in Cassandra --------------------------------------------------------------

def _days(since: float) -> list[dt.date]:
    first = dt.datetime.fromtimestamp(since - 60, dt.UTC).date()
    last = dt.datetime.now(dt.UTC).date()
    return [first + dt.timedelta(days=k) for k in range((last - first).days + 1)]


def count_pending(session: Session, keyspace: str, tenant: Tenant, since: float) -> int:
    """Rows of the endpoint's endpoint_deliveries partitions (one per UTC day and bucket)."""
    endpoint_id = tenant.endpoints[0][0]
    stmt = SimpleStatement(f"SELECT count(*) FROM {keyspace}.endpoint_deliveries "
                           "WHERE tenant_id=%s AND endpoint_id=%s AND day=%s AND bucket=%s", fetch_size=5000)
    return sum(session.execute(stmt, (tenant.tenant_id, endpoint_id, day, b), timeout=180).one()[0]
               for day in _days(since) for b in range(HISTORY_BUCKETS))


def wait_pending(session: Session, keyspace: str, tenant: Tenant, since: float, n: int,
                 timeout_s: float, uploads: Uploads) -> int:
    deadline = time.monotonic() + timeout_s
    seen, last_report = 0, 0.0
    while True:
        uploads.poll()
        t0 = time.monotonic()
        try:
            seen = count_pending(session, keyspace, tenant, since)
        except Exception as e:  # a slow count under load: try again, within the deadline
            say(f"  counting pending deliveries failed ({type(e).__name__}: {e}); retrying")
        took = time.monotonic() - t0
        if seen >= n or time.monotonic() > deadline:
            return seen
        if time.monotonic() - last_report > 10:
            say(f"  ... {seen}/{n} deliveries pending ({time.time() - since:.0f}s since the first backlog event)")
            last_report = time.monotonic()
        time.sleep(min(10.0, max(2.0, 2 * took)))


def reconcile(session: Session, keyspace: str, tenant: Tenant, since: float, expected: set[str],
              timeout_s: float) -> tuple[int, int]:
    """(rows not 'succeeded', expected deliveries without a row) for the endpoint, polled until
    clean (status writes travel in batches) or the timeout."""
    endpoint_id = tenant.endpoints[0][0]
    stmt = SimpleStatement(f"SELECT delivery_id, status FROM {keyspace}.endpoint_deliveries "
                           "WHERE tenant_id=%s AND endpoint_id=%s AND day=%s AND bucket=%s", fetch_size=5000)
    deadline = time.monotonic() + timeout_s
    while True:
        status: dict[str, str | None] = {}
        for day in _days(since):
            for b in range(HISTORY_BUCKETS):
                for row in session.execute(stmt, (tenant.tenant_id, endpoint_id, day, b), timeout=180):
                    status[row.delivery_id] = row.status
        not_ok = sum(1 for d in expected if d in status and status[d] != "succeeded")
        missing = len(expected - status.keys())
        if (not_ok == 0 and missing == 0) or time.monotonic() > deadline:
            return not_ok, missing
        time.sleep(3)


# ---- restore after a TaskManager SIGKILL ----------------------------------------------------------

@dataclass
class RestoreResult:
    seconds: float
    restored_checkpoint: int | None


def kill_and_restore(job_id: str, timeout_s: float) -> RestoreResult:
    """SIGKILL the TaskManager's process group (like tests/faults/test_recovery.py), start a
    new one, and time until every vertex runs again with a start time after the kill."""
    tm_pid = int((RUN / "flink-tm" / "pid").read_text())
    killed_at_ms = int(time.time() * 1000)
    started = time.monotonic()
    try:
        os.killpg(tm_pid, signal.SIGKILL)
        say(f"killed the TaskManager process group {tm_pid}")
        time.sleep(1)
    finally:  # whatever happens, leave a TaskManager running
        out = subprocess.run(["bash", str(REPO_ROOT / "stack/flink.sh"), "start"], capture_output=True,
                             text=True, timeout=180)
        say(f"restarted the TaskManager: {out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr}")
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, KeyError, ValueError):
            d = rest(f"/jobs/{job_id}")
            if d["state"] == "RUNNING" and all(v["status"] == "RUNNING" and v["start-time"] > killed_at_ms
                                               for v in d["vertices"]):
                seconds = time.monotonic() - started
                restored = (rest(f"/jobs/{job_id}/checkpoints").get("latest") or {}).get("restored") or {}
                return RestoreResult(seconds, restored.get("id"))
            if d["state"] in ("FAILED", "CANCELED", "FINISHED"):
                raise RuntimeError(f"job {job_id} ended ({d['state']}) instead of restoring")
        time.sleep(0.5)
    raise RuntimeError(f"job {job_id} not running again {timeout_s:.0f}s after the TaskManager kill")


# ---- the drain ----------------------------------------------------------------------------------

@dataclass
class DrainResult:
    delivered: int  # distinct expected delivery ids answered 200
    lost: int
    duplicates: int  # 200-answered requests beyond one per delivery
    rejected: int  # requests answered 503 over the whole run (first tries and breaker probes)
    first_ok_after_switch_s: float
    drain_s: float  # first to last 200 of a distinct delivery
    per_s: float
    sustained_per_s: float  # middle 80 % of the distinct first 200s


def drain(rx: ReceiverControl, path: str, expected: set[str], timeout_s: float) -> DrainResult:
    base = rx.counts().get(path, 0)
    switched = time.time()
    rx.set_behaviour(path, "ok")
    say(f"switched {path} to 200 (it had {base} requests, all answered 503)")
    deadline = time.monotonic() + timeout_s
    last_report = last_verify = 0.0
    while time.monotonic() < deadline:
        got = rx.counts().get(path, 0) - base
        if got >= len(expected) and time.monotonic() - last_verify > 10:
            last_verify = time.monotonic()
            ok = {r.webhook_id for r in rx.requests(path) if r.behaviour.kind == "ok"}
            if expected <= ok:
                break
        if time.monotonic() - last_report > 10:
            say(f"  ... {got}/{len(expected)} requests since the switch "
                f"({(got / (time.time() - switched)) if time.time() > switched else 0:.0f}/s)")
            last_report = time.monotonic()
        time.sleep(1)
    else:
        say(f"  drain timed out after {timeout_s:.0f}s: counting what arrived")
    first_ok: dict[str, float] = {}
    ok_requests = rejected = 0
    for r in rx.requests(path):
        if r.behaviour.kind != "ok":
            rejected += 1
            continue
        ok_requests += 1
        if r.webhook_id in expected and (r.webhook_id not in first_ok or r.received_at < first_ok[r.webhook_id]):
            first_ok[r.webhook_id] = r.received_at
    times = sorted(first_ok.values())
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    lo, hi = int(len(times) * 0.1), int(len(times) * 0.9) - 1
    mid = times[hi] - times[lo] if len(times) >= 10 else 0.0
    return DrainResult(delivered=len(first_ok), lost=len(expected - first_ok.keys()),
                       duplicates=ok_requests - len(first_ok), rejected=rejected,
                       first_ok_after_switch_s=(times[0] - switched) if times else float("nan"),
                       drain_s=span, per_s=(len(times) - 1) / span if span > 0 else 0.0,
                       sustained_per_s=(hi - lo) / mid if mid > 0 else 0.0)


# ---- the healthy tenant's latency -----------------------------------------------------------------

@dataclass
class Healthy:
    latencies: dict[str, list[float]] = field(default_factory=dict)  # phase -> sorted seconds
    produced: dict[str, int] = field(default_factory=dict)  # phase -> deliveries produced
    missing: int = 0
    duplicates: int = 0

    def p(self, phase: str, q: float) -> float:
        return percentile(self.latencies.get(phase, []), q) * 1000

    def line(self, phase: str) -> str:
        lat = self.latencies.get(phase, [])
        return (f"{phase:>8}: {len(lat):5d}/{self.produced.get(phase, 0):<5d} delivered  "
                f"p50={self.p(phase, 50):6.0f} ms  p99={self.p(phase, 99):6.0f} ms  max={self.p(phase, 100):6.0f} ms")


def wait_healthy(rx: ReceiverControl, traffic: HealthyTraffic, timeout_s: float) -> None:
    """Until every healthy delivery produced reached the receiver at least once (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen = {r.webhook_id for _, path in traffic.tenant.endpoints for r in rx.requests(path)}
        if seen >= traffic.snapshot().keys():
            return
        time.sleep(1)


def caught_up(rx: ReceiverControl, traffic: HealthyTraffic, threshold_s: float, timeout_s: float) -> float:
    """Wait until the healthy tenant is served normally again: every delivery produced 2-5 s ago
    arrived within `threshold_s`. Returns the seconds waited (timeout_s if it never did)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        now = time.time()
        window = {d: t for d, (t, _) in traffic.snapshot().items() if now - 5 <= t <= now - 2}
        first: dict[str, float] = {}
        for _, path in traffic.tenant.endpoints:
            for r in rx.requests(path):
                if r.webhook_id in window:
                    first[r.webhook_id] = min(r.received_at, first.get(r.webhook_id, r.received_at))
        if window and all(d in first and first[d] - t <= threshold_s for d, t in window.items()):
            return time.monotonic() - started
        time.sleep(2)
    return timeout_s


def _latencies(rx: ReceiverControl, traffic: HealthyTraffic, phase: str) -> list[float]:
    return measure_healthy(rx, traffic).latencies.get(phase, [])


def measure_healthy(rx: ReceiverControl, traffic: HealthyTraffic) -> Healthy:
    produced_all = traffic.snapshot()
    first: dict[str, float] = {}
    requests = 0
    for _, path in traffic.tenant.endpoints:
        for r in rx.requests(path):
            if r.webhook_id in produced_all:
                requests += 1
                if r.webhook_id not in first or r.received_at < first[r.webhook_id]:
                    first[r.webhook_id] = r.received_at
    h = Healthy(missing=len(produced_all) - len(first), duplicates=requests - len(first))
    for did, (produced, phase) in produced_all.items():
        h.produced[phase] = h.produced.get(phase, 0) + 1
        if did in first:
            h.latencies.setdefault(phase, []).append(first[did] - produced)
    for lat in h.latencies.values():
        lat.sort()
    return h


# ---- the run ------------------------------------------------------------------------------------

def others_running() -> list[str]:
    """Other benchmarks or test runs on this machine (2 shared cores): their figures and ours
    would both be wrong."""
    me = {os.getpid(), os.getppid()}
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    busy = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if int(pid) not in me and ("pytest" in args or "bench." in args) and "bench.backlog" not in args:
            busy.append(line.strip()[:160])
    return busy


def warm_up(rx: ReceiverControl, settings: Settings, healthy: Tenant, body: bytes, timeout_s: float) -> None:
    """One event for the healthy tenant until each of its endpoints answered: configs broadcast."""
    p = _producer(settings)
    paths = [path for _, path in healthy.endpoints]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _produce(p, settings.kafka.events_topic, _event(healthy.tenant_id, body))
        p.flush(30)
        for _ in range(40):
            counts = rx.counts()
            if all(counts.get(path, 0) > 0 for path in paths):
                return
            time.sleep(0.5)
    raise RuntimeError(f"warm-up: the healthy endpoints got nothing within {timeout_s:.0f}s")


def hold(traffic: HealthyTraffic, phase: str, seconds: float, peak: MemoryPeak | None = None) -> None:
    traffic.phase = phase
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if peak is not None:
            peak.sample()
        time.sleep(min(2.0, max(0.0, end - time.monotonic())))


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    busy = others_running()
    if busy:
        say("WARNING: other benchmarks or tests are running; figures will be disturbed:\n  " + "\n  ".join(busy))
    try:
        rest("/overview")
    except OSError as e:
        say(f"the Flink cluster does not answer ({e}): start the stack with `make up`")
        return 2
    body = raw_http.make_body(args.body_bytes)
    n = args.pending
    run_id = uuid.uuid4().hex[:8]
    subprocess.run([PY, "-m", "stack.certs", "--out", str(CERTS)], check=True, capture_output=True)
    build_timeout = args.build_timeout or 300 + n / 100
    drain_timeout = args.drain_timeout or 300 + n / 50
    with ExitStack() as stack:
        rxp = stack.enter_context(receiver_process())
        rx = rxp.control
        say(f"receiver {rxp.base_url} (pid {rxp.proc.pid})")
        port = int(rxp.base_url.rsplit(":", 1)[1])
        env = {**bench_env(run_id, port, args.partitions), **isolated_env(f"backlog-{run_id}", own_keyspace=True),
               # Probe a failing endpoint at least every --probe-max-s (default up to 600 s), so the
               # recovered endpoint is found, and the drain starts, within the run.
               "WEBHOOKS_DISPATCH__BREAKER_OPEN_S": str(min(5.0, args.probe_max_s)),
               "WEBHOOKS_DISPATCH__BREAKER_MAX_OPEN_S": str(args.probe_max_s)}
        if args.max_in_flight:  # the per-endpoint cap bounds the drain rate (cap / latency)
            env["WEBHOOKS_DISPATCH__DEFAULT_MAX_IN_FLIGHT"] = str(args.max_in_flight)
        settings = settings_with(env)
        keyspace = settings.cassandra.keyspace
        session = stack.enter_context(own_keyspace(settings))
        stack.enter_context(topics(settings))
        channel = stack.enter_context(control_plane(settings))
        backlog = create_tenant(channel, settings, rxp.base_url, 1, "backlog")
        failing_path = backlog.endpoints[0][1]
        rx.set_behaviour(failing_path, "503")
        healthy = create_tenant(channel, settings, rxp.base_url, args.healthy_endpoints, "healthy")
        job_name = settings.flink.job_name
        say(f"tenant {backlog.tenant_id}: 1 endpoint answering 503; tenant {healthy.tenant_id}: "
            f"{args.healthy_endpoints} endpoints answering 200; keyspace {keyspace}; submitting {job_name}")
        job_ref: list[str] = []
        if not args.keep_state:
            stack.callback(lambda: remove_job_state(job_name, job_ref[0] if job_ref else None))
        t0 = time.monotonic()
        job_id = stack.enter_context(bench_job(env))
        job_ref.append(job_id)
        backend = _state_backend(job_id)
        say(f"job {job_id} running after {time.monotonic() - t0:.1f}s; state backend {backend}")
        warm_up(rx, settings, healthy, body, timeout_s=120)
        sampler = stack.enter_context(cpu.StackSampler(_taskmanagers, interval_s=2.0))
        traffic = stack.enter_context(HealthyTraffic(settings, healthy, body, args.healthy_rate))

        hold(traffic, "warm", args.warm_seconds)  # the job's first seconds are not its steady state

        # BEFORE: no backlog.
        before_peak = MemoryPeak()
        hold(traffic, "before", args.phase_seconds, before_peak)
        base_cp = latest_checkpoint(job_id)
        uploads = Uploads(job_id, base_cp.id if base_cp else 0)
        say(f"before: TaskManager rss {before_peak.rss_mb:.0f} MB, heap {before_peak.heap_mb:.0f}"
            f"/{before_peak.heap_max_mb:.0f} MB; checkpoint {_cp_text(base_cp)}")

        # BUILD: N events for the failing endpoint.
        traffic.phase = "build"
        build_started = time.time()
        expected, produce_s = produce_backlog(settings, backlog, n, body, args.batch, args.backlog_rate)
        say(f"produced {n} backlog events in {produce_s:.1f}s; waiting until all are pending")
        pending = wait_pending(session, keyspace, backlog, build_started, n, build_timeout, uploads)
        pending_at = time.time()
        build_s = pending_at - build_started
        say(f"{pending} deliveries pending after {build_s:.0f}s ({pending / build_s:.0f}/s ingested)")
        if pending < n:
            say(f"only {pending}/{n} pending after {build_timeout:.0f}s: measuring what is there")

        # DURING: the backlog sits in state; a checkpoint taken after it was all there.
        during_peak = MemoryPeak()
        traffic.phase = "during"
        cp = checkpoint_after(job_id, int(pending_at * 1000), args.checkpoint_timeout, uploads)
        hold(traffic, "during", max(0.0, args.phase_seconds - (time.time() - pending_at)), during_peak)
        during_peak.sample()
        if cp is None:
            say(f"no checkpoint completed within {args.checkpoint_timeout:.0f}s of the backlog being pending")
        say(f"during: TaskManager rss {during_peak.rss_mb:.0f} MB, heap {during_peak.heap_mb:.0f}"
            f"/{during_peak.heap_max_mb:.0f} MB; checkpoint {_cp_text(cp)}")

        # RESTORE: SIGKILL the TaskManager with the backlog in state. Deliveries produced in the
        # last seconds before the kill are caught by it: they count as the restore's.
        traffic.phase = "restore"
        time.sleep(2)
        restore = kill_and_restore(job_id, args.restore_timeout)
        say(f"every vertex running again {restore.seconds:.1f}s after the kill (checkpoint "
            f"{restore.restored_checkpoint}); waiting until the healthy tenant is served normally")
        before_p99_s = percentile(_latencies(rx, traffic, "before"), 99)
        threshold_s = max(1.0, 3 * before_p99_s)
        catch_up_s = restore.seconds + caught_up(rx, traffic, threshold_s, args.catch_up_timeout)
        say(f"healthy tenant served within {threshold_s:.1f}s again {catch_up_s:.0f}s after the kill")
        restored_peak = MemoryPeak()
        hold(traffic, "restored", args.restored_seconds, restored_peak)
        say(f"restored: TaskManager rss {restored_peak.rss_mb:.0f} MB, heap {restored_peak.heap_mb:.0f} MB")

        # AFTER: the endpoint recovers and the backlog drains.
        traffic.phase = "after"
        drained = drain(rx, failing_path, expected, drain_timeout)
        traffic.stop()
        wait_healthy(rx, traffic, timeout_s=60)
        not_ok, no_row = reconcile(session, keyspace, backlog, build_started, expected, timeout_s=120)
        h = measure_healthy(rx, traffic)
        after_cp = latest_checkpoint(job_id)

    run_s = time.monotonic() - started
    state_per = cp.state_size / pending if cp and pending else 0.0
    incr_per = uploads.bytes / pending if pending else 0.0
    base_size = base_cp.state_size if base_cp else 0
    say("")
    say(f"=== backlog of {pending} deliveries on one endpoint (asked {n}; {backend}), healthy tenant "
        f"{args.healthy_rate:g} deliveries/s over {args.healthy_endpoints} endpoints; run {run_s:.0f}s ===")
    say(f"build: produced in {produce_s:.0f}s, all pending after {build_s:.0f}s ({pending / build_s:.0f}/s)")
    say(f"memory: TaskManager rss {before_peak.rss_mb:.0f} MB before -> {during_peak.rss_mb:.0f} MB with the "
        f"backlog (max {sampler.usage.rss_mb_max.get('taskmanagers', 0.0):.0f} MB over the run); JVM heap used "
        "(highest 2 s sample) "
        f"{before_peak.heap_mb:.0f} -> {during_peak.heap_mb:.0f} MB of {during_peak.heap_max_mb:.0f} MB")
    if cp:
        say(f"checkpoint {cp.id}: full state {cp.state_size / 1e6:.1f} MB (before the backlog "
            f"{base_size / 1e6:.1f} MB), uploaded {cp.checkpointed_size / 1e6:.1f} MB, took "
            f"{cp.duration_ms / 1000:.1f}s; dispatch vertex {cp.dispatch_state_size / 1e6:.1f} MB full, "
            f"{cp.dispatch_checkpointed_size / 1e6:.1f} MB uploaded; failed checkpoints so far {cp.failed_so_far}")
        say(f"state per pending delivery: {state_per:.0f} B full ({(cp.state_size - base_size) / pending:.0f} B "
            f"above the baseline; dispatch vertex {cp.dispatch_state_size / pending:.0f} B); incremental "
            f"checkpoints uploaded {uploads.bytes / 1e6:.1f} MB from the start of the build to this one "
            f"({incr_per:.0f} B per pending delivery; {len(uploads.seen)} checkpoints, the longest "
            f"{uploads.max_duration_ms / 1000:.1f}s)")
    if after_cp:
        say(f"after the drain: checkpoint {after_cp.id} full state {after_cp.state_size / 1e6:.1f} MB, "
            f"failed checkpoints {after_cp.failed_so_far}")
    say(f"restore after TaskManager SIGKILL: {restore.seconds:.1f}s until every vertex ran again "
        f"(checkpoint {restore.restored_checkpoint}); the healthy tenant's new deliveries arrived within "
        f"{threshold_s:.1f}s again {catch_up_s:.0f}s after the kill")
    say(f"drain: {drained.delivered}/{len(expected)} delivered, first 200 {drained.first_ok_after_switch_s:.1f}s "
        f"after the switch, {drained.per_s:.0f}/s over {drained.drain_s:.0f}s (middle 80 % "
        f"{drained.sustained_per_s:.0f}/s; the endpoint's cap: {settings.dispatch.default_max_in_flight} in flight)"
        f"; lost {drained.lost}, duplicates {drained.duplicates}, "
        f"503s answered over the run {drained.rejected}")
    say(f"cassandra: {not_ok} rows of the endpoint not 'succeeded', {no_row} expected deliveries without a row")
    say(f"healthy tenant first-attempt latency (missing {h.missing}, repeats {h.duplicates}):")
    for phase in PHASES:
        say("  " + h.line(phase))
    print(f"backlog: pending={pending} tm_rss_mb={during_peak.rss_mb:.0f} heap_mb={during_peak.heap_mb:.0f} "
          f"checkpoint_mb={(cp.state_size / 1e6 if cp else 0):.1f} "
          f"checkpoint_s={(cp.duration_ms / 1000 if cp else 0):.2f} state_bytes_per_pending={state_per:.0f} "
          f"restore_s={restore.seconds:.1f} drain_per_s={drained.per_s:.0f} lost={drained.lost} "
          f"duplicates={drained.duplicates} healthy_p99_ms_before={h.p('before', 99):.0f} "
          f"during={h.p('during', 99):.0f} after={h.p('after', 99):.0f}", flush=True)
    clean = drained.lost == 0 and not_ok == 0 and no_row == 0 and pending >= n and h.missing == 0
    return 0 if clean else 1


def _state_backend(job_id: str) -> str:
    """The job's state backend and checkpoint mode, as Flink reports them."""
    with contextlib.suppress(OSError, KeyError, ValueError):
        conf = rest(f"/jobs/{job_id}/checkpoints/config")
        return f"{conf['state_backend']}, checkpoints every {conf['interval'] / 1000:g}s"
    return "unknown"


def _cp_text(cp: Checkpoint | None) -> str:
    if cp is None:
        return "none yet"
    return (f"{cp.id} full {cp.state_size / 1e6:.1f} MB, uploaded {cp.checkpointed_size / 1e6:.2f} MB, "
            f"{cp.duration_ms / 1000:.1f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.backlog", description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=1_000_000,
                    help="deliveries to hold behind the failing endpoint (the job ingests a few hundred "
                         "per second on 2 cores: 1,000,000 takes ~40 min to build; try 50000)")
    ap.add_argument("--batch", type=int, default=10_000, help="backlog events per produced (and flushed) batch")
    ap.add_argument("--backlog-rate", type=float, default=0.0,
                    help="backlog events/s (0: as fast as Kafka takes them; the job ingests at its own pace)")
    ap.add_argument("--healthy-rate", type=float, default=20.0, help="healthy tenant's deliveries/s")
    ap.add_argument("--healthy-endpoints", type=int, default=4, help="healthy tenant's endpoints (each event "
                                                                     "goes to all of them)")
    ap.add_argument("--partitions", type=int, default=2, help="partitions of the run's events topic")
    ap.add_argument("--body-bytes", type=int, default=raw_http.DEFAULT_BODY_BYTES)
    ap.add_argument("--warm-seconds", type=float, default=10.0, help="healthy traffic before the before phase")
    ap.add_argument("--catch-up-timeout", type=float, default=900.0,
                    help="max seconds to wait, after the restore, for the healthy tenant to be served normally")
    ap.add_argument("--phase-seconds", type=float, default=30.0,
                    help="length of the before phase, and the least length of the during phase")
    ap.add_argument("--restored-seconds", type=float, default=15.0,
                    help="after the restore, how long the endpoint keeps failing before it recovers")
    ap.add_argument("--probe-max-s", type=float, default=10.0,
                    help="the run's breaker_max_open_s: longest wait between probes of the failing endpoint")
    ap.add_argument("--build-timeout", type=float, default=0.0,
                    help="max seconds until all are pending (0: 300 + pending/100)")
    ap.add_argument("--checkpoint-timeout", type=float, default=300.0,
                    help="max seconds for a checkpoint after the backlog is pending")
    ap.add_argument("--restore-timeout", type=float, default=600.0)
    ap.add_argument("--max-in-flight", type=int, default=0,
                    help="requests in flight per endpoint for the run (0: the platform default, 8)")
    ap.add_argument("--drain-timeout", type=float, default=0.0, help="max seconds for the drain (0: 300 + pending/50)")
    ap.add_argument("--keep-state", action="store_true", help="keep the run's checkpoints under .run/flink/")
    args = ap.parse_args(argv)
    if min(args.pending, args.batch, args.healthy_endpoints, args.partitions) < 1 or args.healthy_rate <= 0:
        ap.error("--pending, --batch, --healthy-endpoints, --partitions and --healthy-rate must be positive")
    # A SIGTERM ends the run like Ctrl-C: the job is cancelled, receiver and TaskManager left sane.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
