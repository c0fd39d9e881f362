"""What the crash tests and the fault matrix (`make chaos`) share: endpoints on the recording
receiver, the duplicate bound, the history check that explains duplicates, a TaskManager kill, and
the per-fault verdict (:class:`FaultResult`) with its report.

A verdict is durable counts, not a demo: reconciliation of the fault's tenants reports no gap and
every expected delivery final (lost = 0); every duplicate is explained by attempt rows; and the
figures the brief asks for -- the oldest age a new delivery reached before its first request,
retry amplification, healthy tenants' first-attempt p99 during the fault.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import struct
import subprocess
import threading
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from cassandra.query import PreparedStatement
from confluent_kafka import Producer

from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, Settings
from stack.flink_jobs import rest, wait_all_running
from tests.support.behaviours import Ok, Slow, Status
from tests.support.figures import p99
from tests.support.helpers import (
    account_and_report,
    account_mismatches,
    create_endpoints,
    event,
    eventually,
    eventually_tolerant,
    new_tenant,
    produce,
    reconcile,
)
from tests.support.receiver import Receiver, Recording

RUN = REPO_ROOT / ".run"

# Every verdict of this pytest session, for the report the session writes at its end (conftest).
RESULTS: list[FaultResult] = []


# -- endpoints and bounds ------------------------------------------------------------------------------

def endpoints(grpc_channel, settings: Settings, receiver: Receiver, n: int, prefix: str,  # type: ignore[no-untyped-def]
              behaviour: str | None = None) -> tuple[str, list[str]]:
    """A new tenant with ``n`` endpoints for `order.*` at /ep/<prefix>-<tenant>-<i>."""
    tenant_id, api_key = new_tenant(grpc_channel, settings)
    paths = [f"/ep/{prefix}-{tenant_id}-{i}" for i in range(n)]
    if behaviour is not None:
        for path in paths:
            receiver.set_behaviour(path, behaviour)
    return tenant_id, create_endpoints(grpc_channel, api_key, [f"{receiver.base_url}{p}" for p in paths], ["order.*"])


def in_flight_limit(settings: Settings, n_endpoints: int, default_max_in_flight: int | None = None) -> int:
    """Most requests of one tenant's ``n_endpoints`` the job can have in flight at once: the tenant
    quota (per dispatcher instance) or every endpoint's own cap, whichever is smaller."""
    d, p = settings.dispatch, settings.flink.parallelism
    per_endpoint = default_max_in_flight or d.default_max_in_flight
    return min(p * d.tenant_max_in_flight, n_endpoints * per_endpoint)


def duplicate_bound(settings: Settings, n_endpoints: int, default_max_in_flight: int | None = None) -> int:
    """What a restored job may send again: requests in flight when the state it restores was taken
    (or sent after it), plus finished ones whose records were not yet durable. Those records sit
    in the open history batch (lingering up to history_batch_linger_ms) or in the one being
    written before it: two batches, i.e. 2 x history_batch_max_statements // 4 deliveries (a sent
    attempt's record is at least 4 statements: status, status by endpoint, attempt row, attempt by
    endpoint). The first version of this bound counted one batch; a loaded CI run (Cassandra
    behind, every duplicate explained by its attempt rows) re-sent 121 against its 114. More than
    two batches behind would mean Cassandra acknowledging slower than a batch fills. Everything
    recorded is found final by the restored job's CHECK and not sent again."""
    batch = settings.flink.parallelism * (settings.cassandra.history_batch_max_statements // 4)
    return in_flight_limit(settings, n_endpoints, default_max_in_flight) + 2 * batch


def requests_by_delivery(receiver: Receiver, expected: set[str]) -> Counter[str]:
    return Counter(r.webhook_id for r in receiver.requests() if r.webhook_id in expected)


def accepted(rec: Recording) -> bool:
    """The receiver processed this request and answers it 2xx (its answer may never arrive: a
    crash can come first)."""
    b = rec.behaviour
    code = 200 if isinstance(b, Ok) else b.code if isinstance(b, Slow | Status) else None
    return code is not None and 200 <= code < 300


def duplicates_by_delivery(receiver: Receiver, expected: set[str]) -> Counter[str]:
    """Requests a receiver saw for a delivery after one it had accepted: what an at-least-once
    receiver has to dedupe by webhook-id (retries after a 429 or a timeout are not duplicates)."""
    seen: set[str] = set()
    dups: Counter[str] = Counter()
    for r in sorted((r for r in receiver.requests() if r.webhook_id in expected), key=lambda r: r.received_at):
        assert r.webhook_id is not None
        if r.webhook_id in seen:
            dups[r.webhook_id] += 1
        elif accepted(r):
            seen.add(r.webhook_id)
    return dups


def wait_all_reached(receiver: Receiver, expected: set[str], timeout: float) -> Counter[str]:
    """Every expected delivery reached the receiver (lost = 0 from its side)."""
    def missing() -> set[str]:
        return expected - set(requests_by_delivery(receiver, expected))

    try:
        eventually(lambda: not missing() or None, timeout=timeout, interval=1,
                   what=f"all {len(expected)} deliveries at the receiver")
    except AssertionError:
        raise AssertionError(f"lost: {len(missing())} of {len(expected)} deliveries never reached the "
                             f"receiver (e.g. {sorted(missing())[:3]})") from None
    return requests_by_delivery(receiver, expected)


def _attempt_rows(cassandra_session: Session, statement: PreparedStatement, ids: list[str]) -> dict[str, Any]:
    """``statement`` (bound to one delivery_id) run for every delivery: delivery_id -> its rows."""
    results = execute_concurrent_with_args(cassandra_session, statement, [(d,) for d in ids],
                                           concurrency=64, raise_on_first_error=True)
    return {d: res.result_or_exc for d, res in zip(ids, results, strict=True)}


def history_shortfall(cassandra_session: Session, requests: Counter[str],
                      timeout: float = 30) -> dict[str, tuple[int, int]]:
    """Deliveries whose `attempts` rows are fewer than the requests the receiver saw for them:
    delivery_id -> (attempt rows, requests). Polls while history writes land; {} when explained."""
    count = cassandra_session.prepare("SELECT count(*) FROM delivery_history WHERE delivery_id=?"
                                      " AND attempt_number > 0")
    ids = list(requests)
    last: dict[str, tuple[int, int]] | None = None

    def explained() -> bool | None:
        nonlocal last
        rows = {d: r.one()[0] for d, r in _attempt_rows(cassandra_session, count, ids).items()}
        last = {d: (rows[d], requests[d]) for d in ids if rows[d] < requests[d]}
        return not last or None

    with contextlib.suppress(AssertionError):
        eventually_tolerant(explained, timeout=timeout, interval=2, what="attempt rows for every request")
    assert last is not None, "could not read the attempts table"
    return last


def after_timeouts(cassandra_session: Session, duplicates: Counter[str]) -> int:
    """Duplicates a recorded timeout explains: the receiver processed the request but answered
    after ``total_timeout_s`` (the tests run with 2 s; a receiver holding its 200 for 1.5 s
    crosses it when a restored job competes for the CPU), so the attempt row says `timeout` and
    the retry is an at-least-once duplicate of a slow answer, not a re-send the crash caused.
    Per delivery: at most one per timeout row (a fault test's deliveries all end in a later
    attempt, so every timeout row was followed by a request)."""
    if not duplicates:
        return 0
    errors = cassandra_session.prepare("SELECT error_class FROM delivery_history WHERE delivery_id=?"
                                       " AND attempt_number > 0")
    timeouts = {d: sum(1 for r in rows if r.error_class == "timeout")
                for d, rows in _attempt_rows(cassandra_session, errors, list(duplicates)).items()}
    return sum(min(n, timeouts[d]) for d, n in duplicates.items())


def shortfall_message(shortfall: dict[str, tuple[int, int]], requests: Counter[str]) -> str:
    missing_rows = sum(n - rows for rows, n in shortfall.values())
    return (f"history does not explain the duplicates: {len(shortfall)} deliveries have fewer attempt "
            f"rows than requests ({missing_rows} requests without a row, of {sum(requests.values())}); "
            f"e.g. (rows, requests) {sorted(shortfall.items())[:3]}")


# -- faults the project injects -------------------------------------------------------------------------

def kill_taskmanager(job_id: str) -> int:
    """SIGKILL the stack's TaskManager (its process group, as an OOM kill or a lost host would),
    start a new one, and wait until every task of the job was redeployed after the kill. Returns
    the kill time (ms)."""
    tm_pid = int((RUN / "flink-tm" / "pid").read_text())
    killed_at_ms = int(time.time() * 1000)
    try:
        os.killpg(tm_pid, signal.SIGKILL)
        # Until it is gone: a JVM still exiting counts as running, and the start below would
        # then only say so (a local run of faults 1-4 was left without a TaskManager).
        eventually(lambda: not _alive(tm_pid) or None, timeout=30, interval=0.2, what=f"TaskManager {tm_pid} gone")
    finally:  # whatever happens, leave a TaskManager running
        restarted = subprocess.run(["bash", str(REPO_ROOT / "stack/flink.sh"), "start"], check=True,
                                   capture_output=True, text=True)
    assert "starting flink taskmanager" in restarted.stdout, restarted.stdout

    # Flink notices the lost TaskManager, then redeploys every task on the new one from the last
    # checkpoint: wait for tasks started after the kill, not for the stale RUNNING status.
    def redeployed():  # type: ignore[no-untyped-def]
        d = rest(f"/jobs/{job_id}")
        return d["state"] == "RUNNING" and all(
            v["status"] == "RUNNING" and v["start-time"] > killed_at_ms for v in d["vertices"]) or None

    eventually_tolerant(redeployed, timeout=180, interval=1, what="job restored on the new TaskManager")
    wait_all_running(job_id, timeout=60)
    return killed_at_ms


def _alive(pid: int) -> bool:
    """As stack/lib.sh's pid_alive: the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stack_part(script: str, *actions: str) -> None:
    for action in actions:
        out = subprocess.run(["bash", str(REPO_ROOT / "stack" / script), action], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, f"{script} {action}:\n{out.stdout}\n{out.stderr}"


def sigkill_part(part: str) -> None:
    """SIGKILL a server the stack scripts started (by the pid they recorded)."""
    pid = int((RUN / part / "pid").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# -- the healthy tenant beside a fault ------------------------------------------------------------------

class SteadyTenant:
    """A healthy tenant producing at a fixed rate while a fault runs, for its first-attempt p99."""

    def __init__(self, grpc_channel, settings: Settings, receiver: Receiver, name: str,  # type: ignore[no-untyped-def]
                 per_s: float = 10.0) -> None:
        self.tenant_id, self.endpoint_ids = endpoints(grpc_channel, settings, receiver, 1, f"healthy-{name}")
        self.path = f"/ep/healthy-{name}-{self.tenant_id}-0"  # its endpoint on the receiver
        self._settings, self._receiver, self._per_s = settings, receiver, per_s
        self.produced: dict[str, float] = {}  # delivery_id -> produce time
        # delivery_id -> when Kafka acknowledged it: a fault of Kafka itself delays the
        # acknowledgement, which the latency from the produce time includes.
        self.acked_at: dict[str, float] = {}
        self.first_at: dict[str, float] = {}  # delivery_id -> its first request, once p99_ms() has run
        # One long-lived producer, as an outbox relay keeps: a new idempotent producer's first
        # records reach consumers only after the broker's fetch wait (~500 ms, see docs/performance-log.md).
        # It finds a dead broker's partitions on their new leaders as the platform's clients do.
        self._producer = Producer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                                   "enable.idempotence": True, "linger.ms": 0,
                                   **settings.kafka.librdkafka_failover()})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"steady-{name}")

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(1 / self._per_s):
            e = event(self.tenant_id, "order.created", f'{{"steady":{n}}}'.encode())
            at = time.time()
            acked: list[float | None] = []  # when acknowledged; None: refused
            self._producer.produce(self._settings.kafka.events_topic, key=e.event_id.encode(), value=e.to_json(),
                                   on_delivery=lambda err, _m, acked=acked: acked.append(
                                       time.time() if err is None else None))
            self._producer.flush(10)
            # Kafka may be the fault: what was not acknowledged is not counted.
            if len(acked) == 1 and acked[0] is not None:
                delivery_id = delivery_id_for(e.event_id, self.endpoint_ids[0])
                self.produced[delivery_id] = at
                self.acked_at[delivery_id] = acked[0]
            n += 1

    def __enter__(self) -> SteadyTenant:
        self.warm_up()
        self._thread.start()
        return self

    def warm_up(self, timeout: float = 120) -> None:
        """One uncounted event, delivered before the counted ones start: the figure is the fault's,
        not the new tenant's first configs on their way to the job or a just-started job's first
        connections."""
        e = event(self.tenant_id, "order.created", b'{"steady":"warm-up"}')
        self._producer.produce(self._settings.kafka.events_topic, key=e.event_id.encode(), value=e.to_json())
        self._producer.flush(30)
        wait_all_reached(self._receiver, {delivery_id_for(e.event_id, self.endpoint_ids[0])}, timeout)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def p99_ms(self, timeout: float = 120) -> float:
        """Stops producing (the fault and its recovery are over), then waits for every event the
        tenant produced: its deliveries are counted for loss too."""
        self.__exit__()
        produced = dict(self.produced)
        assert produced, "the healthy tenant produced nothing"
        wait_all_reached(self._receiver, set(produced), timeout)
        first = first_request_at(self._receiver, set(produced))
        self.first_at = first
        figure = p99((first[d] - produced[d]) * 1000 for d in produced)
        assert figure is not None
        return figure

    def slowest(self, at_s: float, n: int = 8) -> str:
        """The slowest first attempts (after :meth:`p99_ms`): when each was produced, relative to
        ``at_s`` (the fault), and how long it waited -- which part of a fault the p99 is."""
        waits = sorted(((self.first_at[d] - t, t - at_s) for d, t in self.produced.items() if d in self.first_at),
                       reverse=True)[:n]
        return ", ".join(f"{w:.1f} s (produced at {rel:+.1f} s)" for w, rel in waits)


def first_request_at(receiver: Receiver, ids: set[str]) -> dict[str, float]:
    first: dict[str, float] = {}
    for r in receiver.requests():
        if r.webhook_id in ids and (r.webhook_id not in first or r.received_at < first[r.webhook_id]):
            first[r.webhook_id] = r.received_at
    return first


# -- the verdict ------------------------------------------------------------------------------------

@dataclass
class FaultResult:
    fault: str
    expected: int
    succeeded: int
    final_other: int  # failed or expired: final, not lost
    gaps: int
    duplicates: int
    duplicate_bound: int  # on the duplicates the fault caused: those not explained by a timeout
    unexplained_duplicates: int
    max_oldest_new_age_s: float
    retry_amplification: float
    healthy_p99_ms: float | None
    series: list[tuple[float, int, float]] = field(default_factory=list)  # (s since start, deliveries/s, oldest age s)
    note: str = ""
    after_timeouts: int = 0  # duplicates that followed an attempt recorded as a timeout
    # Figures where a tenant's account (TenantAccount.GetAccount) and reconciliation disagree.
    account_mismatches: int = 0
    # From the fault to deliveries resuming for every endpoint with work (None: not measured).
    pause_s: float | None = None
    # The report it joins: .run/<matrix>/ (`make chaos`, or `make chaos-cluster`'s).
    matrix: str = "chaos"
    # Bounds the verdict holds the figures to (None: reported only): the healthy tenant's
    # first-attempt p99 and the pause (tests/support/figures.py says why each is what it is).
    healthy_p99_bound_ms: float | None = None
    pause_bound_s: float | None = None

    @property
    def lost(self) -> int:
        return self.expected - self.succeeded - self.final_other

    @property
    def caused(self) -> int:
        """Duplicates the fault caused (those no recorded timeout explains): what the bound is on."""
        return self.duplicates - self.after_timeouts

    def over_bounds(self) -> list[str]:
        """Each figure beyond its bound, named with both numbers (empty: none)."""
        over = []
        if self.healthy_p99_bound_ms is not None and (
                self.healthy_p99_ms is None or self.healthy_p99_ms > self.healthy_p99_bound_ms):
            figure = "none" if self.healthy_p99_ms is None else f"{self.healthy_p99_ms:.0f} ms"
            over.append(f"healthy p99 {figure} > {self.healthy_p99_bound_ms:.0f} ms")
        if self.pause_bound_s is not None and (self.pause_s is None or self.pause_s > self.pause_bound_s):
            figure = "none" if self.pause_s is None else f"{self.pause_s:.1f} s"
            over.append(f"pause {figure} > {self.pause_bound_s:g} s")
        return over

    @property
    def passed(self) -> bool:
        return (self.lost == 0 and self.gaps == 0 and self.unexplained_duplicates == 0
                and self.caused <= self.duplicate_bound and self.account_mismatches == 0
                and not self.over_bounds())

    def line(self) -> str:
        healthy = "-" if self.healthy_p99_ms is None else f"{self.healthy_p99_ms:.0f}"
        if self.healthy_p99_bound_ms is not None:
            healthy += f" (bound {self.healthy_p99_bound_ms:.0f})"
        pause = "" if self.pause_s is None else f" pause_s={self.pause_s:.1f}"
        if self.pause_bound_s is not None:
            pause += f" (bound {self.pause_bound_s:g})"
        over = self.over_bounds()
        return (f"fault {self.fault}: {'PASS' if self.passed else 'FAIL'}"
                + (f" ({'; '.join(over)})" if over else "") + f" expected={self.expected} "
                f"lost={self.lost} gaps={self.gaps} duplicates={self.duplicates} "
                f"(after a timeout {self.after_timeouts}; bound {self.duplicate_bound} on the rest) "
                f"unexplained={self.unexplained_duplicates} max_oldest_new_age_s={self.max_oldest_new_age_s:.1f} "
                f"retry_amplification={self.retry_amplification:.2f} healthy_p99_ms={healthy}{pause}"
                + (f" -- {self.note}" if self.note else ""))


def verdict(fault: str, grpc_channel, settings: Settings, receiver: Receiver,  # type: ignore[no-untyped-def]
            cassandra_session: Session, tenant_ids: list[str], since_ms: int, produced: dict[str, float],
            bound: int, healthy: SteadyTenant | None = None, timeout: float = 180, final_statuses: bool = False,
            note: str = "", pause_s: float | None = None, matrix: str = "chaos",
            healthy_p99_bound_ms: float | None = None, pause_bound_s: float | None = None) -> FaultResult:
    """Wait for the fault's deliveries, then measure. ``produced``: delivery_id -> produce time of
    its event. ``final_statuses``: the fault's deliveries may end failed/expired (a hanging tenant)
    instead of reaching the receiver; they still must all be final. The bounds make the healthy
    tenant's p99 and the pause part of the verdict (tests/support/figures.py)."""
    expected = set(produced)
    if not final_statuses:
        wait_all_reached(receiver, expected, timeout)
    counts: Counter[str] = Counter()
    gaps: list[str] = []

    def settled() -> bool | None:
        counts.clear()
        gaps.clear()
        for tenant_id in tenant_ids:
            r = reconcile(grpc_channel, settings, tenant_id, since_ms)
            counts.update(dict(r.counts))
            gaps.extend(f"{g.kind} {g.id}" for g in r.gaps)
        done = counts["succeeded"] + counts["failed"] + counts["expired"]
        return (not gaps and counts["deliveries_expected"] == done == len(expected)) or None

    with contextlib.suppress(AssertionError):  # the verdict reports what was found
        eventually(settled, timeout=timeout, interval=2, what=f"{fault}: a clean, final reconciliation")
    # Each tenant's own account of the window must tell the same story as reconciliation.
    mismatches = [f"{tenant_id}: {m}" for tenant_id in tenant_ids
                  for m in account_mismatches(*account_and_report(grpc_channel, settings, tenant_id, since_ms))]
    if mismatches:
        note += f"; account: {mismatches[:5]}"
    requests = requests_by_delivery(receiver, expected)
    shortfall = history_shortfall(cassandra_session, requests) if requests else {}
    first = first_request_at(receiver, expected)
    ages = [first[d] - produced[d] for d in first]
    duplicates = duplicates_by_delivery(receiver, expected)
    result = FaultResult(
        fault=fault, expected=len(expected), succeeded=counts["succeeded"],
        final_other=counts["failed"] + counts["expired"], gaps=len(gaps),
        duplicates=sum(duplicates.values()), duplicate_bound=bound,
        after_timeouts=after_timeouts(cassandra_session, duplicates),
        unexplained_duplicates=sum(n - rows for rows, n in shortfall.values()),
        # Requests the receivers saw per delivery: retries, re-sends after a crash, manual replays.
        max_oldest_new_age_s=max(ages, default=0.0), retry_amplification=sum(requests.values()) / max(1, len(expected)),
        healthy_p99_ms=healthy.p99_ms() if healthy is not None else None,
        series=_series(receiver, expected, produced), note=note + (f"; gaps: {gaps[:5]}" if gaps else ""),
        pause_s=pause_s, matrix=matrix, account_mismatches=len(mismatches),
        healthy_p99_bound_ms=healthy_p99_bound_ms, pause_bound_s=pause_bound_s)
    print("\n" + result.line())
    _record(result)
    RESULTS.append(result)
    return result


def _series(receiver: Receiver, expected: set[str], produced: dict[str, float]) -> list[tuple[float, int, float]]:
    """Per second since the first produce: deliveries first reached, and the age of the oldest
    delivery produced but not yet reached (the queue age a new delivery would see)."""
    if not produced:
        return []
    t0 = min(produced.values())
    first = first_request_at(receiver, expected)
    end = max([*first.values(), *produced.values()])
    out = []
    for s in range(int(end - t0) + 2):
        t = t0 + s
        rate = sum(1 for v in first.values() if t - 1 < v <= t)
        waiting = [produced[d] for d in expected if produced[d] <= t and first.get(d, float("inf")) > t]
        out.append((float(s), rate, t - min(waiting) if waiting else 0.0))
    return out


# -- the report (.run/chaos/) -------------------------------------------------------------------------

REPORT_DIR = RUN / "chaos"


def _record(result: FaultResult) -> None:
    out = RUN / result.matrix  # REPORT_DIR for `make chaos`
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{result.fault}.json").write_text(json.dumps(asdict(result)))
    _chart(result, out / f"{result.fault}.png")


def summary(results: list[FaultResult]) -> str:
    passed = sum(r.passed for r in results)
    return (f"chaos: faults={len(results)} passed={passed} lost={sum(max(0, r.lost) for r in results)} "
            f"unexplained_duplicates={sum(r.unexplained_duplicates for r in results)} "
            f"max_oldest_new_age_s={max((r.max_oldest_new_age_s for r in results), default=0):.1f} "
            f"retry_amplification={max((r.retry_amplification for r in results), default=0):.2f}")


def write_report(results: list[FaultResult], title: str = "Fault matrix", last_line: str | None = None,
                 out: Path = REPORT_DIR) -> Path:
    """The report of ``results`` in ``out``, headed by ``last_line`` (default: `summary`)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", "", last_line or summary(results), "",
             "| fault | verdict | expected | lost | gaps | duplicates (after a timeout; bound on the rest) | "
             "unexplained | oldest new age s | retry amplification | healthy p99 ms |", "|---" * 10 + "|"]
    for r in results:
        lines.append(f"| {r.fault} | {'PASS' if r.passed else 'FAIL'} | {r.expected} | {r.lost} | {r.gaps} | "
                     f"{r.duplicates} ({r.after_timeouts}; {r.duplicate_bound}) | {r.unexplained_duplicates} | "
                     f"{r.max_oldest_new_age_s:.1f} | {r.retry_amplification:.2f} | "
                     f"{'-' if r.healthy_p99_ms is None else round(r.healthy_p99_ms)}"
                     f"{'' if r.healthy_p99_bound_ms is None else f' (bound {r.healthy_p99_bound_ms:.0f})'} |")
    lines.append("")
    for r in results:
        peak_rate = max((s[1] for s in r.series), default=0)
        peak_age = max((s[2] for s in r.series), default=0.0)
        lines += [f"## {r.fault}", "", r.note or "", "", f"![{r.fault}]({r.fault}.png)", "",
                  f"Top: deliveries first reaching the receiver per second (peak {peak_rate}/s); bottom: age of "
                  f"the oldest delivery produced and not yet sent (peak {peak_age:.1f} s); x: {len(r.series)} s "
                  "from the fault's first event.", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path


def _chart(r: FaultResult, path: Path, width: int = 480, height: int = 240) -> None:
    """Two stacked line charts (delivery rate, oldest age) as a PNG, written without a plotting
    library: a white canvas, axes, and one polyline each."""
    px = bytearray(b"\xff" * (width * height * 3))

    def dot(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            px[i:i + 3] = bytes(rgb)

    def line(x0: int, y0: int, x1: int, y1: int, rgb: tuple[int, int, int]) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            dot(x0 + (x1 - x0) * k // n, y0 + (y1 - y0) * k // n, rgb)

    panels = [([s[1] for s in r.series], (31, 119, 180)), ([s[2] for s in r.series], (214, 39, 40))]
    half = height // 2
    for p, (values, rgb) in enumerate(panels):
        top, bottom, left, right = p * half + 8, (p + 1) * half - 8, 8, width - 8
        line(left, bottom, right, bottom, (0, 0, 0))
        line(left, top, left, bottom, (0, 0, 0))
        if len(values) < 2:
            continue
        peak = max(values) or 1
        pts = [(left + (right - left) * i // (len(values) - 1), bottom - int((bottom - top) * v / peak))
               for i, v in enumerate(values)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
            line(x0, y0, x1, y1, rgb)
    raw = b"".join(b"\x00" + bytes(px[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def produce_events(settings: Settings, tenant_id: str, endpoint_ids: list[str], n: int,
                   event_type: str = "order.shipped") -> tuple[list[EventRecord], dict[str, float]]:
    """Produce ``n`` events for the tenant; returns them and delivery_id -> produce time."""
    events = [event(tenant_id, event_type, f'{{"k":{i}}}'.encode()) for i in range(n)]
    at = time.time()
    produce(settings, [e.to_json() for e in events], keys=[e.event_id for e in events])
    return events, {delivery_id_for(e.event_id, ep): at for e in events for ep in endpoint_ids}
