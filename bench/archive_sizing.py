"""Archive tier cost: CPU per archived delivery of every process taking part, and bytes.

    .venv/bin/python -m bench.archive_sizing [--events 3000] [--endpoints 10] [--rounds 1]
                                             [--attribute | --no-attribute]

The archive is written once from the stream (docs/archive.md): the job sends its history facts
to Kafka, the archive writer turns them into Parquet on an object store, the audit recounts an
hour against Cassandra's indexes. So the archive's cost is spread over processes, and each is
measured from /proc as `make bench` measures the delivery path (stack/cpu.py):

* the job's share, attributed within the job that writes the facts (``--attribute``, on by
  default when py-spy and the TaskManager's JDK tools are there): the same phase (``--events``
  events x ``--endpoints`` endpoints, the bench's body) is run by two jobs back to back, archive
  facts off then on (``archive.stream``), each on an events topic of its own, and each
  TaskManager is profiled over the facts-on phase (bench/profilers.py: py-spy on its embedded
  interpreter at ``--pyspy-rate`` samples a second, the kernel's thread names, every
  thread's CPU). The facts-on job's share
  is its threads' CPU split by their samples (bench/attribution.py says which frames are the
  facts'): ``python`` (building and encoding the facts, PyFlink's side output in Python),
  ``jvm_task`` (the call into the JVM with each record: the crossing and the chained facts
  sink's writer) and ``producer_thread`` (the TaskManager's Kafka producers' network threads,
  the facts' among them: an upper bound, docs/archive.md#sizing). ``--attribute-off-phases`` profiles and attributes
  the facts-off job alike: a check of what the matchers find with no facts, and an on-off
  difference with the profilers on both sides. Without the profilers the job's share is the
  difference of the TaskManagers' CPU per delivery between the two phases, as it is still
  printed beside it for comparison; the JobManager's and Cassandra's during the phase are on-off
  differences either way (a negative one counted as 0). ``--rounds 2`` alternates off/on twice
  and averages;
* the Kafka broker's share, measured on its own after the phases (bench/facts_broker_cost.py):
  the run's facts replayed into a scratch topic of the same spec with the job's facts producer
  settings and read back with the writer's consumer settings, the broker's CPU over both with no
  job running; its on-off difference during the phases is printed beside it for comparison;
* the archive writer (a process of its own, with its settings' rolls: 100,000 facts or 60 s, on
  S3Proxy, stack/s3proxy.sh) and the object store: all their CPU from the facts phase's start
  until the writer, stopped at the phase's end, rolled and committed the last fact, plus
  Cassandra's over that catch-up;
* the audit of the phase's hours (in this process: its CPU time, plus Cassandra's and the
  object store's meanwhile).

The profilers' own CPU is in their processes (py-spy, jcmd, jfr: children of this one, in no
measured group), except JFR's sampling (``--jfr``, off by default), which runs inside the
TaskManager: in the profiled phases' TaskManager CPU. py-spy still takes a share of the
machine's two cores while it samples (bench/profilers.py, ``PY_SPY_RATE``). Their files stay in
.run/bench-<id>-profiles/<round>-<mode>/.

``release_hot_bytes_per_delivery``: what is written to the hot tier to let a delivery go. No
statement is: hot rows expire by the TTL they were written with. The Cassandra write counts of
the two phases (facts off/on) show the history writes are the same statements.

The last line is the comparable summary (``archive-bench: ...``, ``job_share=attributed`` or
``on-off``); ``delivery_cpu_ms_per_delivery`` is the facts-off phase's whole-stack figure
(`make bench`'s ``cpu_ms_per_delivery`` measures the same thing on its own run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench import attribution, cassandra_writes, facts_broker_cost, profilers, raw_http
from bench import run as bench
from control_plane.archive.audit import AUDITED, Auditor, HourOutcome
from control_plane.archive.store import ArchiveStore
from core import archive_layout as layout
from core.settings import REPO_ROOT, Settings
from stack import cpu
from stack.isolation import keyspace_session, settings_with
from stack.outbox_relay import free_port

PY = str(REPO_ROOT / ".venv/bin/python")


def say(msg: str) -> None:
    print(f"[archive-bench] {msg}", flush=True)


@dataclass
class Round:
    mode: str  # "off" | "on"
    deliveries: int
    cpu_s: dict[str, float]  # per group over the phase
    writes: int  # Cassandra writes to the keyspace over the phase
    catch_up_cpu_s: dict[str, float]  # per group from the phase's end until the writer caught up ("on")
    catch_up_s: float = 0.0
    writer_cpu_s: float = 0.0  # the writer's life after its start-up ("on"): it archived the warm-up's facts too
    writer_start_cpu_s: float = 0.0  # its start-up (interpreter, imports, first connections): once per process
    writer_deliveries: int = 0  # the deliveries whose facts it archived (warm-up burst + phase)
    job: attribution.JobShare | None = None  # the facts' CPU in the job, from its profiles (--attribute)

    def per_delivery(self, group: str) -> float:
        return self.cpu_s.get(group, 0.0) * 1000 / self.deliveries if self.deliveries else 0.0

    @property
    def total_ms(self) -> float:
        return sum(self.cpu_s.values()) * 1000 / self.deliveries if self.deliveries else 0.0


@contextmanager
def s3proxy(run_dir: Path) -> Iterator[tuple[int, Path]]:
    port = free_port()
    env = {**os.environ, "WEBHOOKS_RUN_DIR": str(run_dir), "WEBHOOKS_S3PROXY_PORT": str(port)}

    def script(action: str) -> None:
        subprocess.run([str(REPO_ROOT / "stack/s3proxy.sh"), action], env=env, check=True, capture_output=True,
                       timeout=120)

    script("start")
    try:
        script("ready")
        yield port, run_dir / "s3proxy" / "pid"
    finally:
        script("stop")


@contextmanager
def writer_process(env: dict[str, str], pid_file: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = pid_file.with_suffix(".log")
    with open(log, "w") as out:
        proc = subprocess.Popen([PY, "-m", "control_plane.archive.writer"], cwd=REPO_ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, **env})
    pid_file.write_text(str(proc.pid))
    try:
        yield proc
    finally:
        bench.stop(proc, timeout_s=30)
        pid_file.unlink(missing_ok=True)


def started_cpu_s(proc: subprocess.Popen[bytes], quiet_s: float = 1.0, timeout_s: float = 60) -> float:
    """The CPU a just-started process spent starting: read once it spent at most a tick in
    ``quiet_s`` (the writer, started, waits on its consumer's poll)."""
    deadline = time.monotonic() + timeout_s
    last, _ = cpu.ticks_and_rss_kb([proc.pid])
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now, _ = cpu.ticks_and_rss_kb([proc.pid])
        if now - last <= 1:
            return now / cpu.CLK_TCK
        last = now
    raise RuntimeError(f"the archive writer (pid {proc.pid}) was still busy {timeout_s:.0f}s after it started")


def facts_end(settings: Settings) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": "archive-bench-probe"})
    try:
        topic = settings.kafka.archive_facts_topic
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def writer_committed(settings: Settings) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": settings.archive.writer_group})
    try:
        topic = settings.kafka.archive_facts_topic
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {tp.partition: max(tp.offset, 0)
                for tp in c.committed([TopicPartition(topic, p) for p in parts], timeout=10)}
    finally:
        c.close()


def taskmanager_pids() -> list[int]:
    return [pid for f in cpu.stack_groups(bench.RUN)["taskmanagers"] if (pid := cpu.pid_from(f)) is not None]


def attribution_tools(wanted: bool | None) -> profilers.Tools | None:
    """The profilers when the attribution runs: asked for (``--attribute``: fail when one is
    missing), or by default when they are all there."""
    if wanted is False:
        return None
    try:
        return profilers.find_tools(taskmanager_pids())
    except profilers.ToolsMissing as e:
        if wanted:
            raise SystemExit(f"archive-bench: --attribute: {e}") from None
        say(f"the job's share is not attributed ({e}): it is the facts-on minus facts-off difference")
        return None


def run(args: argparse.Namespace) -> int:
    body = raw_http.make_body(args.body_bytes)
    run_id = uuid.uuid4().hex[:8]
    tools = attribution_tools(args.attribute)
    subprocess.run([PY, "-m", "stack.certs", "--out", str(bench.CERTS)], check=True, capture_output=True)
    rounds: list[Round] = []
    with ExitStack() as stack:
        rxp = stack.enter_context(bench.receiver_process())
        rx = rxp.control
        port = int(rxp.base_url.rsplit(":", 1)[1])
        env = bench.bench_env(f"arch-{run_id}", port, args.partitions)
        s3_port, s3_pid = stack.enter_context(s3proxy(bench.RUN / f"bench-{run_id}-s3"))
        env.update({"WEBHOOKS_ARCHIVE__URI": f"s3://archive/bench-{run_id}", "WEBHOOKS_ARCHIVE__S3_ENDPOINT":
                    f"127.0.0.1:{s3_port}", "WEBHOOKS_ARCHIVE__S3_SCHEME": "http",
                    "WEBHOOKS_ARCHIVE__S3_ACCESS_KEY": "local-identity",
                    "WEBHOOKS_ARCHIVE__S3_SECRET_KEY": "local-credential", "WEBHOOKS_ARCHIVE__PUSHGATEWAY": "",
                    "WEBHOOKS_ARCHIVE__WRITER_GROUP": f"archive-bench-{run_id}",
                    "WEBHOOKS_ARCHIVE__ROLL_S": str(args.roll_s)})
        settings = settings_with(env)
        ks = stack.enter_context(keyspace_session(settings))
        read_writes = lambda: cassandra_writes.read(ks, settings.cassandra.keyspace)  # noqa: E731
        stack.enter_context(bench.topics(settings))
        cp_pid = bench.RUN / f"bench-{run_id}-control-plane.pid"
        channel = stack.enter_context(bench.control_plane_process(env, cp_pid))
        bench.EXTRA_GROUPS["control-plane"] = [cp_pid]
        bench.EXTRA_GROUPS["s3proxy"] = [s3_pid]
        writer_pid = bench.RUN / f"bench-{run_id}-archive-writer.pid"
        bench.EXTRA_GROUPS["archive-writer"] = [writer_pid]
        tenants = [bench.create_tenant(channel, settings, rxp.base_url, args.endpoints, "arch")]
        say(f"S3Proxy 127.0.0.1:{s3_port}; {args.endpoints} endpoints")
        modes = ["off", "on"] * args.rounds
        for i, mode in enumerate(modes):
            m_env = {**env, "WEBHOOKS_ARCHIVE__STREAM": "true" if mode == "on" else "false",
                     "WEBHOOKS_KAFKA__EVENTS_TOPIC": f"{settings.kafka.events_topic}.{i}",
                     "WEBHOOKS_KAFKA__CONSUMER_GROUP": f"{settings.kafka.consumer_group}-{i}",
                     "WEBHOOKS_FLINK__JOB_NAME": f"{env['WEBHOOKS_FLINK__JOB_NAME']}-{mode}-{i}"}
            m_settings = settings_with(m_env)
            stack.enter_context(bench.topics(m_settings))  # its events topic, deleted at the end
            with ExitStack() as round_stack:
                job_id = round_stack.enter_context(bench.bench_job(m_env))
                writer = round_stack.enter_context(writer_process(env, writer_pid)) if mode == "on" else None
                writer_start_cpu_s = started_cpu_s(writer) if writer is not None else 0.0
                say(f"round {i + 1}/{len(modes)}: archive facts {mode}, job {job_id}")
                bench.warm_up(m_settings, rx, tenants, body, timeout_s=120)
                warm = 0
                if args.warm_events:
                    warm = bench.phase(f"warm-{mode}-{i}", m_settings, rx, tenants, args.warm_events, body,
                                       args.timeout)[0].delivered
                before = cassandra_writes.settled(read_writes)
                # The facts-on phase profiled; the facts-off one too with --attribute-off-phases (the
                # matchers' check, and an on-off difference with the profilers on both sides).
                no_profiles: list[profilers.TaskManagerProfile] = []
                profiling = (profilers.profiled(tools, taskmanager_pids(), bench.RUN / f"bench-{run_id}-profiles" /
                                                f"{i}-{mode}", f"archive-bench-{run_id}-{i}", args.pyspy_rate, args.jfr)
                             if tools and (mode == "on" or args.attribute_off_phases) else nullcontext(no_profiles))
                with profiling as profiles:
                    r, _ = bench.phase(f"facts-{mode}-{i}", m_settings, rx, tenants, args.events, body,
                                       args.timeout)
                writes = sum(cassandra_writes.delta(before, cassandra_writes.settled(read_writes)).values())
                catch_up: dict[str, float] = {}
                waited = writer_cpu_s = 0.0
                if writer is not None:
                    # The writer's and the store's work after the phase: stopped (SIGTERM), it rolls
                    # what it holds and commits, rather than waiting for its roll timer.
                    t0 = time.monotonic()
                    with cpu.StackSampler(bench._groups) as sampler:
                        end = facts_end(m_settings)
                        writer.terminate()
                        # Its whole life's CPU from the kernel: /proc loses an exiting process's last ticks.
                        _, _, usage = os.wait4(writer.pid, 0)
                        writer.returncode = 0
                    catch_up, waited = dict(sampler.usage.cpu_s), time.monotonic() - t0
                    catch_up.pop("archive-writer", None)
                    writer_cpu_s = usage.ru_utime + usage.ru_stime - writer_start_cpu_s
                    if writer_committed(m_settings) != end:
                        raise RuntimeError("the archive writer stopped before committing every fact")
                r.usage.cpu_s.pop("archive-writer", None)  # counted whole, from the kernel (writer_cpu_s)
                # Read after the catch-up's measurement: reading a recording costs CPU.
                job = (profilers.job_share(profiles, m_settings.kafka.archive_facts_topic)
                       if profiles else None)
                rounds.append(Round(mode, r.delivered, dict(r.usage.cpu_s), writes, catch_up, waited, writer_cpu_s,
                                    writer_start_cpu_s, writer_deliveries=r.delivered + warm, job=job))
                say(f"round {i + 1} ({mode}): {r.delivered} deliveries, {r.usage.summary(r.delivered)}"
                    + (f"; writer caught up {waited:.1f}s after, its start-up {writer_start_cpu_s:.2f}s of CPU"
                       " (once per process, not in its figure)" if mode == "on" else ""))
                if job is not None:
                    say(f"round {i + 1} ({mode}): job share attributed ms/delivery: "
                        f"{attribution.ms_line(job, r.delivered)}")

        # The audit of the hours the phases wrote, as the hourly audit would run it.
        store = ArchiveStore.from_settings(settings.archive)
        auditor = Auditor(settings.archive, ks, store)
        now = int(time.time() * 1000)
        hours = range(layout.hour_start(now - 2 * 3_600_000), now, layout.HOUR_MS)
        # What the writer wrote (before the repair below adds the facts-off phases').
        parquet = sum(f.bytes for h in hours for b in layout.ALL_BUCKETS for c in store.commits(h, b)
                      for f in c.files)
        # The facts-off phases' deliveries have no facts: the audit would list them missing, as it
        # should, and compare every endpoint id by id. The hourly audit's normal case is an hour
        # archived whole, so they are written from their hot rows first (the audit's --repair,
        # not measured), and the audit then must pass.
        for h in hours:
            t0 = time.monotonic()
            repaired = auditor.repair(h)
            if repaired:
                say(f"repair {time.strftime('%H:00Z', time.gmtime(h / 1000))}: the facts-off phases' {repaired} "
                    f"deliveries written from their hot rows in {time.monotonic() - t0:.1f}s (not measured)")

        def audits(by_id: bool) -> tuple[list[HourOutcome], float]:
            """The audit of every hour, and its CPU: this process's, Cassandra's and the store's."""
            t_cpu = time.process_time()
            with cpu.StackSampler(bench._groups) as sampler:
                out = [auditor.audit(h, now, by_id=by_id) for h in hours]
            return out, time.process_time() - t_cpu + sum(sampler.usage.cpu_s.get(g, 0.0)
                                                          for g in ("cassandra", "s3proxy"))

        outcomes, audit_cpu_s = audits(by_id=False)
        audited = sum(o.counts.get("listed", 0) for o in outcomes)
        # The same audit comparing every endpoint id by id (--by-id: how the audit compared before
        # counting): the count-first audit's before/after in one run.
        by_id, by_id_cpu_s = audits(by_id=True)
        if any(o.state != AUDITED for o in by_id):
            raise RuntimeError("the audit by id failed an hour the count-first audit passed")
        say(f"audit: {audit_cpu_s * 1000 / max(audited, 1):.4f} ms of CPU per delivery counting per endpoint, "
            f"{by_id_cpu_s * 1000 / max(audited, 1):.4f} listing every id (--by-id), over {audited} deliveries")
        for o in outcomes:
            if o.counts.get("listed"):
                say(f"audit {time.strftime('%H:00Z', time.gmtime(o.hour_ms / 1000))}: {o.state} {o.counts} "
                    f"{o.detail[:160]}".rstrip())
        failed = [o for o in outcomes if o.state != AUDITED]
        if failed:
            raise RuntimeError(f"the audit failed {len(failed)} hour(s) archived whole: {failed[0].detail[:300]}")
        facts = facts_broker_cost.read_all(settings.kafka.bootstrap_servers, settings.kafka.archive_facts_topic)
        records, fact_bytes = len(facts), sum(len(value) for _, value in facts)
        # The broker's facts cost on its own: the run's facts replayed as the job's sink sent them
        # and read as the writer reads them, with no job running (bench/facts_broker_cost.py).
        replayed = facts_broker_cost.measure(settings, bench._groups, facts)
        say(f"facts replayed to the broker: {replayed.records} records, {replayed.bytes} B in "
            f"{replayed.seconds:.1f}s, broker CPU {replayed.cpu_s:.2f}s")

    offs = [r for r in rounds if r.mode == "off"]
    ons = [r for r in rounds if r.mode == "on"]
    archived = sum(r.deliveries for r in ons)
    audit = audit_cpu_s * 1000 / audited if audited else 0.0  # per delivery the audit read
    broker = replayed.cpu_s * 1000 / sum(r.writer_deliveries for r in ons)
    cost = archive_cost(offs, ons, audit, broker)
    # Each off/on pair on its own: the on-off difference is between two jobs, and jobs differ by
    # more than the facts cost; the spread of the pairs shows how much.
    pairs = [archive_cost([off], [on], audit, broker).total for off, on in zip(offs, ons, strict=True)]
    delivery = sum(r.total_ms for r in offs) / len(offs)
    writes_off = sum(r.writes for r in offs) / sum(r.deliveries for r in offs)
    writes_on = sum(r.writes for r in ons) / archived
    shares, own = cost.shares, cost.own
    on_off = f"job (TaskManagers on-off)={shares['taskmanagers']:.3f}"
    if cost.job_attributed is not None:
        profiled_off = all(r.job is not None for r in offs)
        # With only the facts-on phase profiled, JFR's own CPU in the TaskManager is in its side alone.
        which = "both phases profiled" if profiled_off else "the facts-on phase profiled"
        on_line = attribution.ms_line(summed([r.job for r in ons]), archived)
        print(f"archive-bench: job share attributed ms/delivery: {on_line}; "
              f"TaskManagers on-off for comparison ({which})={shares['taskmanagers']:.4f}", flush=True)
        if profiled_off:
            off_line = attribution.ms_line(summed([r.job for r in offs]), sum(r.deliveries for r in offs))
            print(f"archive-bench: the facts-off job attributed alike (what the matchers find with no facts), "
                  f"ms/delivery: {off_line}", flush=True)
        on_off = (f"job (attributed)={cost.job_attributed:.3f} "
                  f"job (TaskManagers on-off, {which}, for comparison, not summed)={shares['taskmanagers']:.3f}")
    print(f"archive-bench: per archived delivery, ms of CPU: {on_off} "
          f"jobmanager={max(shares['jobmanager'], 0.0):.3f} kafka (facts replayed)={broker:.3f} "
          f"(on-off for comparison, not summed: {shares['kafka']:.3f}) "
          f"cassandra={max(shares['cassandra'], 0.0):.3f} (on-off {shares['cassandra']:.3f}) "
          f"catch-up={cost.kafka_catch_up:.3f} writer={own['archive-writer']:.3f} s3proxy={own['s3proxy']:.3f} "
          f"audit={audit:.3f}; Cassandra writes per delivery off={writes_off:.2f} on={writes_on:.2f}; "
          f"facts {records} records, {fact_bytes / archived:.0f} B/delivery on Kafka; "
          f"Parquet {parquet / archived:.0f} B/delivery", flush=True)
    if len(pairs) > 1:
        print("archive-bench: per off/on pair, archive_cpu_ms_per_delivery=" + ",".join(f"{p:.3f}" for p in pairs)
              + f" (min {min(pairs):.3f}, max {max(pairs):.3f})", flush=True)
    x = cost.total
    print(f"archive-bench: archive_cpu_ms_per_delivery={x:.3f} release_hot_bytes_per_delivery=0 "
          f"delivery_cpu_ms_per_delivery={delivery:.3f} ratio={x / delivery if delivery else float('nan'):.3f} "
          f"deliveries_off={sum(r.deliveries for r in offs)} deliveries_on={archived} rounds={args.rounds} "
          f"job_share={'attributed' if cost.job_attributed is not None else 'on-off'}", flush=True)
    return 0


def summed(shares: list[attribution.JobShare | None]) -> attribution.JobShare:
    total = attribution.JobShare()
    for s in shares:
        if s is not None:
            total = total.plus(s)
    return total


@dataclass(frozen=True)
class Cost:
    """The archive's CPU of a set of rounds, ms per archived delivery."""
    total: float
    shares: dict[str, float]  # facts on - off, by group
    own: dict[str, float]  # the writer's and the object store's, whole
    kafka_catch_up: float  # Cassandra's over the writer's catch-up (Kafka's is in the replay)
    job_attributed: float | None  # the facts' CPU in the job, from its profiles; None: not profiled


def archive_cost(offs: list[Round], ons: list[Round], audit: float, broker: float) -> Cost:
    """The archive's CPU of these rounds. The job's part is the attributed one when every facts-on
    round was profiled, else the TaskManagers' on-off difference; the broker's is ``broker``, from
    the facts' replay (ms per archived delivery); the JobManager's and Cassandra's during the phase
    are on-off differences, a negative one counted as 0: the facts path sends Cassandra nothing
    (the write counts per delivery of both phases show it), so a difference is noise, and noise
    is not subtracted from the archive's cost."""
    archived = sum(r.deliveries for r in ons)

    def avg(rs: list[Round], group: str) -> float:
        return sum(r.per_delivery(group) for r in rs) / len(rs)

    shares = {g: avg(ons, g) - avg(offs, g) for g in ("taskmanagers", "jobmanager", "kafka", "cassandra")}
    written = sum(r.writer_deliveries for r in ons)
    own = {"archive-writer": sum(r.writer_cpu_s for r in ons) * 1000 / written,
           "s3proxy": sum(r.cpu_s.get("s3proxy", 0.0) + r.catch_up_cpu_s.get("s3proxy", 0.0) for r in ons) * 1000
           / written}
    kafka_catch_up = sum(r.catch_up_cpu_s.get("cassandra", 0.0) for r in ons) * 1000 / archived
    attributed = (sum(r.job.cpu_s for r in ons if r.job is not None) * 1000 / archived
                  if ons and all(r.job is not None for r in ons) else None)
    job = shares["taskmanagers"] if attributed is None else attributed
    others = broker + max(shares["jobmanager"], 0.0) + max(shares["cassandra"], 0.0)
    return Cost(job + others + sum(own.values()) + kafka_catch_up + audit, shares, own, kafka_catch_up, attributed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.archive_sizing", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=3000, help="events per measured phase")
    ap.add_argument("--endpoints", type=int, default=10, help="endpoints of the tenant (each event matches all)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--body-bytes", type=int, default=raw_http.DEFAULT_BODY_BYTES)
    ap.add_argument("--warm-events", type=int, default=1000, help="a burst before each measured phase, not counted")
    ap.add_argument("--rounds", type=int, default=1, help="facts off then on, this many times (averaged)")
    ap.add_argument("--roll-s", type=float, default=60.0, help="the writer's archive.roll_s for the run")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--attribute", action=argparse.BooleanOptionalAction, default=None,
                    help="attribute the job's share from profiles of each facts-on phase (py-spy, a thread "
                         "dump, per-thread CPU); default: when the tools are there; --attribute fails without them")
    ap.add_argument("--attribute-off-phases", action="store_true",
                    help="profile the facts-off phases too: what the matchers find with no facts, and an on-off "
                         "difference with the profilers on both sides")
    ap.add_argument("--jfr", action="store_true",
                    help="also record JDK Flight Recorder execution samples on each TaskManager: counts that "
                         "describe the JVM side of the crossing (in no figure); off by default: a TaskManager "
                         "died once while recording")
    ap.add_argument("--pyspy-rate", type=int, default=profilers.PY_SPY_RATE,
                    help="py-spy's samples per second (its cost grows with the TaskManager's threads)")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
