"""The archive writer's CPU per archived delivery, offline: no Kafka, no object store server.

    .venv/bin/python -m bench.archive_writer_cpu [--events 3000] [--endpoints 10] [--tenants 1]
                                                 [--repeat 5] [--profile]

`make bench-archive` measures the writer process on the real stack (all its CPU over a phase,
divided by the deliveries it archived); this measures the writer's own work without the stack, in
seconds, so a change to it can be compared back to back:

* the facts of the same phase -- ``--events`` events x ``--endpoints`` endpoints, the bench's
  1,536-byte JSON body, ``--retried`` of the deliveries failing their first attempt (503) and
  succeeding on the second -- built with the job's own builders (core/archive_facts.py, called as
  operators/history_store.py calls them, with its write times) and grouped into records as the
  dispatcher sends them: one record per call, a delivery's creation (with its event's row, for
  the event's first delivery) in one, the attempts and status writes a harvest pass finds
  finished (1-3 deliveries of one endpoint) in another;
* fed to the writer's own loop (control_plane/archive/writer.py: poll, buffer, roll every
  ``archive.roll_facts`` facts) from an in-memory consumer, into a local-directory archive store;
* the audit's reading of the same hour's archive (control_plane/archive/audit.py ``archived_hour``:
  commit records, key columns, reduced by key), its part that does not talk to Cassandra.

Process CPU (``time.process_time``) per delivery: the median and the best of ``--repeat`` runs
after one warm-up run (the machine's noise only ever adds CPU), each run on a fresh directory;
``--profile`` then prints where one more run's writer time goes (cProfile, by own time).

Not in these figures, but in the stack's: the Kafka consumer's own work (librdkafka's fetch
thread) and an S3 upload's (the AWS SDK inside pyarrow) in the writer process.

The last line is the comparable summary: ``archive-writer-bench: cpu_ms_per_delivery=...``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import pstats
import random
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from control_plane.archive.audit import archived_hour
from control_plane.archive.store import ArchiveStore
from control_plane.archive.writer import ArchiveWriter
from core import archive_facts
from core import archive_layout as layout
from core.dispatch import AttemptRecord, Intent, new_attempt_id
from core.fanout import NewDelivery
from core.records import EventRecord, delivery_id_for
from core.settings import ArchiveSettings
from operators.history_store import BAND_US, status_write_ts

# A phase inside one hour, so the figures do not depend on where an hour boundary falls.
START_MS = int(datetime(2026, 11, 29, 19, 5, tzinfo=UTC).timestamp() * 1000)
DELIVERIES_PER_S = 1000  # the bench's order of magnitude on this machine
EVENT_TYPE = "bench.delivery"
URL = "https://127.0.0.1:8443/in"
RESPONSE = b"ok"


def make_body(n_bytes: int) -> bytes:
    """The bench's body (bench/raw_http.py): a JSON object of exactly ``n_bytes``."""
    frame = b'{"type":"bench.raw_http","data":""}'
    return frame[:-2] + b"x" * max(0, n_bytes - len(frame)) + frame[-2:]


@dataclass(frozen=True)
class Phase:
    records: list[bytes]  # one per dispatcher call, in the order the job sends them
    deliveries: int
    facts: int
    record_bytes: int


def _attempt(number: int, started_ms: int, http: int, status: str, rng: random.Random) -> AttemptRecord:
    latency = rng.randint(5, 60)
    ok = http == 200
    return AttemptRecord(
        intent=Intent(number, new_attempt_id(started_ms, rng)), sent=True, started_at_ms=started_ms,
        finished_at_ms=started_ms + latency, http_status=http, outcome="succeeded" if ok else "retry",
        error_class=None if ok else "http_5xx", detail="", manual=False, delivery_status=status,
        next_attempt_at_ms=None if ok else started_ms + latency + 5000, auto_retry_active=not ok, url=URL,
        endpoint_config_version=1, latency_ms=latency, response_sha256=hashlib.sha256(RESPONSE).hexdigest(),
        response_prefix=RESPONSE.decode(), signing_key_versions=(1,))


def _result(d: NewDelivery, r: AttemptRecord, attempt_count: int) -> list[archive_facts.Fact]:
    """The facts of operators/history_store.py ``record``: the attempt row, then the status."""
    assert r.intent is not None and r.delivery_status is not None
    return [archive_facts.attempt_fact(d, r, r.finished_at_ms * 1000 + BAND_US),
            archive_facts.status_fact(d, r, attempt_count, status_write_ts(r.delivery_status, r.finished_at_ms))]


def phase(n_events: int, n_endpoints: int, n_tenants: int, body_bytes: int, retried: float,
          seed: int = 7) -> Phase:
    """The facts records of one phase, deterministic for a seed."""
    rng = random.Random(seed)
    body = make_body(body_bytes)
    tenants = [f"t-bench-{i:03d}-{rng.getrandbits(32):08x}" for i in range(n_tenants)]
    endpoints = {t: [f"ep_{rng.getrandbits(96):024x}" for _ in range(n_endpoints)] for t in tenants}
    calls: list[list[archive_facts.Fact]] = []
    finished: dict[str, list[list[archive_facts.Fact]]] = {}  # endpoint -> attempt results not yet harvested
    deliveries = 0
    for i in range(n_events):
        tenant = tenants[i % n_tenants]
        at = START_MS + deliveries * 1000 // DELIVERIES_PER_S
        event = EventRecord(event_id=f"evt_{rng.getrandbits(128):032x}", tenant_id=tenant, event_type=EVENT_TYPE,
                            schema_version="1", object_id="obj_bench", object_version=1, occurred_at_ms=at - 3,
                            payload=body)
        for j, ep in enumerate(endpoints[tenant]):
            d = NewDelivery(delivery_id=delivery_id_for(event.event_id, ep), event=event, endpoint_id=ep,
                            tenant_id=tenant, endpoint_config_version=1, created_at_ms=at,
                            expires_at_ms=at + 86_400_000)
            deliveries += 1
            created = [archive_facts.created_fact(d, at * 1000)]
            if j == 0:  # the event's first delivery claims its row
                created.append(archive_facts.event_fact(event, at))
            calls.append(created)
            started = at + rng.randint(1, 20)
            waiting = finished.setdefault(ep, [])
            if rng.random() < retried:
                first = _attempt(1, started, 503, "pending", rng)
                waiting.append(_result(d, first, 1))
                waiting.append(_result(d, _attempt(2, (first.next_attempt_at_ms or 0) + 1, 200, "succeeded", rng), 2))
            else:
                waiting.append(_result(d, _attempt(1, started, 200, "succeeded", rng), 1))
            while len(waiting) >= rng.randint(1, 3):  # a harvest pass over the endpoint
                calls.append([f for r in waiting[:3] for f in r])
                del waiting[:3]
    calls.extend([f for r in waiting for f in r] for waiting in finished.values() if waiting)
    records = [archive_facts.encode(c) for c in calls]
    return Phase(records, deliveries, sum(len(c) for c in calls), sum(len(r) for r in records))


class _Message:
    __slots__ = ("_offset", "_value", "_ts")

    def __init__(self, offset: int, value: bytes, ts: int) -> None:
        self._offset, self._value, self._ts = offset, value, ts

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, self._ts)


class _Consumer:
    """Hands out the phase's records as confluent-kafka's consumer does: message objects made by
    each consume call (none held between calls), up to 1,000 at a time."""

    def __init__(self, records: list[bytes]) -> None:
        self._records = records
        self._at = 0

    @property
    def drained(self) -> bool:
        return self._at >= len(self._records)

    def consume(self, num_messages: int = 1, timeout: float = 0) -> list[_Message]:
        at = self._at
        out = [_Message(at + i, r, START_MS) for i, r in enumerate(self._records[at:at + num_messages])]
        self._at += len(out)
        return out

    def poll(self, timeout: float = 0) -> Any:
        return None

    def assignment(self) -> list[int]:
        return [0]

    def pause(self, partitions: Any) -> None:
        pass

    def resume(self, partitions: Any) -> None:
        pass


@dataclass(frozen=True)
class Run:
    writer_s: float
    audit_s: float
    files: int
    parquet_bytes: int
    segments: int


def run_once(p: Phase, roll_facts: int, root: str, profile: cProfile.Profile | None = None) -> Run:
    store = ArchiveStore.from_settings(ArchiveSettings(uri=root))
    consumer = _Consumer(p.records)
    settings = ArchiveSettings(uri=root, roll_facts=roll_facts, roll_s=3600, pushgateway="")
    w = ArchiveWriter(consumer, store, settings, "facts", commit=False, clock=lambda: 0.0)
    # Each part starts from a collected heap, not from what the part before left: when the last
    # full collection ran decides when the next one does, and so what a part pays for it.
    gc.collect()
    t0 = time.process_time()
    if profile is not None:
        profile.enable()
    while not consumer.drained:
        w.step()
    if w.buffer.ranges:
        w.roll()  # what a stopped writer does with what it holds
    if profile is not None:
        profile.disable()
    writer_s = time.process_time() - t0
    gc.collect()
    t0 = time.process_time()
    hour = archived_hour(store, layout.hour_start(START_MS))
    hour.counts()
    audit_s = time.process_time() - t0
    if hour.deliveries.num_rows != p.deliveries:
        raise AssertionError(f"{hour.deliveries.num_rows} deliveries archived of {p.deliveries}")
    stored = hour.stored
    return Run(writer_s, audit_s, len(stored), sum(s.bytes or 0 for s in stored), w.segments)


def runs(p: Phase, roll_facts: int, repeat: int) -> Iterator[Run]:
    for _ in range(repeat + 1):  # the first warms up
        with tempfile.TemporaryDirectory(prefix="archive-writer-bench-") as root:
            yield run_once(p, roll_facts, root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.archive_writer_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--endpoints", type=int, default=10, help="per tenant: deliveries per event")
    parser.add_argument("--tenants", type=int, default=1, help="1 as in `make bench-archive`; more spreads the"
                        " facts over tenant buckets (more, smaller files)")
    parser.add_argument("--body-bytes", type=int, default=1536)
    parser.add_argument("--retried", type=float, default=0.1, help="share of deliveries retried once")
    parser.add_argument("--roll-facts", type=int, default=ArchiveSettings().roll_facts)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="then print one more run's profile (cProfile)")
    args = parser.parse_args(argv)

    p = phase(args.events, args.endpoints, args.tenants, args.body_bytes, args.retried)
    print(f"[archive-writer-bench] {p.deliveries} deliveries, {p.facts} facts in {len(p.records)} records"
          f" ({p.record_bytes / p.deliveries:.0f} B per delivery); rolls of {args.roll_facts} facts", flush=True)
    measured = list(runs(p, args.roll_facts, args.repeat))[1:]
    if args.profile:  # after the runs: what the first one imported lazily is not in it
        prof = cProfile.Profile()
        with tempfile.TemporaryDirectory(prefix="archive-writer-bench-") as root:
            run_once(p, args.roll_facts, root, prof)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        print(out.getvalue(), flush=True)
    per = 1000 / p.deliveries
    writer = sorted(r.writer_s * per for r in measured)
    audit = sorted(r.audit_s * per for r in measured)
    last = measured[-1]
    print(f"[archive-writer-bench] writer ms per delivery, each run: {' '.join(f'{v:.4f}' for v in writer)}")
    print(f"[archive-writer-bench] audit (its archive side) ms per delivery, each run:"
          f" {' '.join(f'{v:.4f}' for v in audit)}")
    print(f"archive-writer-bench: cpu_ms_per_delivery={statistics.median(writer):.4f} best={writer[0]:.4f}"
          f" audit_keys_ms_per_delivery={statistics.median(audit):.4f} deliveries={p.deliveries}"
          f" facts={p.facts} segments={last.segments} files={last.files}"
          f" parquet_bytes_per_delivery={last.parquet_bytes / p.deliveries:.0f} runs={len(measured)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
