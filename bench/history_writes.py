"""The history writes of N deliveries alone: Cassandra's CPU per delivery without Flink or HTTP.

The full benchmark's CPU per delivery mixes every process on two shared cores, and its
Cassandra share is the largest after the TaskManager. This isolates it: the
dispatcher's own `CassandraHistory` (same statements, same batching) writes each delivery's
creation rows, then its successful first attempt, for ``--events`` events of ``--endpoints``
endpoints, keeping at most ``--in-flight`` deliveries unwritten as the dispatcher's pool does.
Cassandra's CPU (utime + stime of its JVM, /proc) and this process's are divided by the
deliveries. A keyspace of its own, dropped after.

    python -m bench.history_writes [--events 2000 --endpoints 10 --rounds 3]

Last line: ``history_writes: deliveries=N cassandra_cpu_ms_per_delivery=X client_cpu_ms_per_delivery=Y
requests_per_delivery=R statements_per_delivery=S`` (the best of the rounds: the machine's noise
only ever adds CPU).
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path

from core.dispatch import AttemptRecord, Intent
from core.fanout import NewDelivery
from core.records import EventRecord, delivery_id_for
from operators.history_store import CassandraHistory
from operators.write_batcher import Completion
from stack import cpu
from stack.isolation import isolated_env, keyspace_session, settings_with

RUN = Path(__file__).resolve().parents[1] / ".run"


def _deliveries(n_events: int, n_endpoints: int, body: bytes) -> list[tuple[NewDelivery, bool]]:
    """(delivery, writes its event row): the first delivery of each event claims the row."""
    now = int(time.time() * 1000)
    out = []
    for _ in range(n_events):
        e = EventRecord(event_id=f"evt_{uuid.uuid4().hex}", tenant_id="t-bench", event_type="order.paid",
                        schema_version="1", object_id="o1", object_version=1, occurred_at_ms=now, payload=body)
        for j in range(n_endpoints):
            ep = f"ep-bench-{j}"
            out.append((NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep,
                                    tenant_id="t-bench", endpoint_config_version=1, created_at_ms=now,
                                    expires_at_ms=now + 86_400_000), j == 0))
    return out


def _success(i: Intent, at_ms: int) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=True, started_at_ms=at_ms - 20, finished_at_ms=at_ms, http_status=200,
        outcome="succeeded", error_class=None, detail="", manual=False, delivery_status="succeeded",
        next_attempt_at_ms=None, auto_retry_active=False, url="https://127.0.0.1/in",
        endpoint_config_version=1, latency_ms=20, response_sha256="0" * 64, response_prefix="ok",
        signing_key_versions=(1,))


def _unfinished(pending: list[Completion]) -> list[Completion]:
    """The writes still in flight; a failed one ends the run (the figures would be of less work)."""
    for c in pending:
        if c.done() and c.exception() is not None:
            raise RuntimeError(f"history write failed: {c.exception()}")
    return [c for c in pending if not c.done()]


def _wait(h: CassandraHistory, pending: list[Completion], keep: int) -> None:
    """Poll (as the dispatcher does) until at most ``keep`` writes are unfinished."""
    while len(pending) > keep:
        h.flush_if_due()
        pending[:] = _unfinished(pending)
        if len(pending) > keep:
            time.sleep(0.001)


def one_round(h: CassandraHistory, n_events: int, n_endpoints: int, body: bytes, in_flight: int,
              cassandra_pid: int, rate: float) -> tuple[int, float, float, int, int]:
    """Unpaced (``rate`` 0): every creation, then every outcome, as fast as ``in_flight`` allows.
    Paced: one delivery created and the one created ~20 ms earlier recorded every 1/``rate`` s,
    with the dispatcher's flush_if_due every millisecond in between (its passes)."""
    work = _deliveries(n_events, n_endpoints, body)
    batcher = h._batcher  # noqa: SLF001 -- the bench reads the batcher's counts
    requests_before, statements_before = batcher.requests_sent, batcher.statements_sent
    cas0 = cpu.ticks_and_rss_kb(cpu.descendants(cassandra_pid))[0]
    me0 = os.times()
    pending: list[Completion] = []
    created: list[tuple[NewDelivery, Intent]] = []
    if rate <= 0:
        for d, claims in work:  # creation rows (the first attempt's reserved row among them)
            i = Intent(1, str(uuid.uuid1()))
            pending.append(h.persist(d, i, claims))
            created.append((d, i))
            _wait(h, pending, in_flight)
        for d, i in created:  # the first attempt succeeded: its row, the statuses
            pending.append(h.record(d, _success(i, int(time.time() * 1000)), 1, None))
            _wait(h, pending, in_flight)
    else:
        lag = max(1, int(rate * 0.02))  # the outcome of the delivery created ~20 ms ago
        start = time.monotonic()
        for k in range(len(work) + lag):
            due = start + k / rate
            while time.monotonic() < due:
                h.flush_if_due()
                time.sleep(0.001)
            if k < len(work):
                d, claims = work[k]
                i = Intent(1, str(uuid.uuid1()))
                pending.append(h.persist(d, i, claims))
                created.append((d, i))
            if k >= lag:
                d, i = created[k - lag]
                pending.append(h.record(d, _success(i, int(time.time() * 1000)), 1, None))
            h.flush_if_due()
            pending[:] = _unfinished(pending)
    h.flush()
    _wait(h, pending, 0)
    me1 = os.times()
    cas1 = cpu.ticks_and_rss_kb(cpu.descendants(cassandra_pid))[0]
    n = len(work)
    cas_ms = (cas1 - cas0) / cpu.CLK_TCK * 1000 / n
    client_ms = ((me1.user - me0.user) + (me1.system - me0.system)) * 1000 / n
    return (n, cas_ms, client_ms, batcher.requests_sent - requests_before,
            batcher.statements_sent - statements_before)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.history_writes", description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--body-bytes", type=int, default=1536)
    ap.add_argument("--in-flight", type=int, default=512, help="deliveries written at once at most")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=300.0,
                    help="deliveries/s, paced as the dispatcher writes them (0: unpaced, as fast as possible)")
    args = ap.parse_args(argv)
    settings = settings_with(isolated_env(f"histbench-{uuid.uuid4().hex[:8]}", own_keyspace=True))
    cassandra_pid = int((RUN / "cassandra" / "pid").read_text())
    body = b'{"data":"' + b"x" * max(0, args.body_bytes - 11) + b'"}'
    results = []
    with keyspace_session(settings):
        h = CassandraHistory(settings.cassandra)
        try:
            one_round(h, 200, args.endpoints, body, args.in_flight, cassandra_pid, 0)  # warm the driver and JIT
            for r in range(args.rounds):
                n, cas_ms, client_ms, requests, statements = one_round(
                    h, args.events, args.endpoints, body, args.in_flight, cassandra_pid, args.rate)
                results.append((cas_ms, client_ms, requests / n, statements / n))
                print(f"[history_writes] round {r + 1}: {n} deliveries, cassandra {cas_ms:.3f} ms, "
                      f"client {client_ms:.3f} ms, {requests / n:.3f} requests per delivery", flush=True)
        finally:
            h.close()
    best = min(results)
    print(f"history_writes: deliveries={args.events * args.endpoints} cassandra_cpu_ms_per_delivery={best[0]:.3f} "
          f"client_cpu_ms_per_delivery={best[1]:.3f} requests_per_delivery={best[2]:.3f} "
          f"statements_per_delivery={best[3]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
