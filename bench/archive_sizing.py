"""Archive tier sizing and throughput: bytes per delivery in Cassandra and in Parquet, on the
bench's payload, and what letting the hot rows go costs (a TTL rewrite vs a partition DELETE).

    .venv/bin/python -m bench.archive_sizing [--events 5000] [--body-bytes 1536] [--random-body]

A keyspace of its own. Two arrival hours five days ago get the same history, written by the
job's own history store (operators/history_store.py): each event to two endpoints, 10 % of the
deliveries retried once (the brief's peak: 2,315 retries per 23,148 deliveries), the bench's
~1.5 KB body. Then, with Cassandra's files flushed and compacted before each measurement
(nodetool through JMX, sizes summed from the keyspace's data directory):

* Cassandra bytes per delivery: every history table of the keyspace (events, delivery_history,
  the endpoint indexes, snapshots), replication factor 1;
* the archiver on hour A: archive (rows/s), verify, release (TTL rewrite) times, and the Parquet
  bytes per delivery by kind from the manifest;
* one archiver shard of ``--shards`` (0/N) on hour B: its share of the hour and how fast;
* hour B let go by DELETE instead (one partition tombstone per delivery and per event, at a
  timestamp above the job's status bands): the bytes each way adds as written (flushed) and
  after a major compaction (what is left until the expired cells / tombstones are purged, after
  gc_grace_seconds).

The last line is the comparable summary (``archive-bench: ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from cassandra.cluster import Session

from bench.raw_http import make_body
from control_plane.archive_store import ArchiveStore
from control_plane.archiver import Archiver
from core.archive_settings import ArchiveSettings
from core.dispatch import AttemptRecord, Intent
from core.fanout import FanoutSnapshot, NewDelivery
from core.records import EventRecord, delivery_id_for
from core.settings import REPO_ROOT, Settings
from operators.history_store import BAND_US, CassandraHistory
from stack.isolation import isolated_env, keyspace_session, settings_with

HOUR_MS = 3_600_000
CASSANDRA_DATA = REPO_ROOT / ".run" / "cassandra" / "data"


def nodetool(*args: str) -> None:
    jpms = subprocess.run(["bash", "-c", "sed -n '/^JPMS=(/,/^)/p' stack/cassandra.sh | grep -v 'JPMS=(\\|^)'"],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    port = os.environ.get("WEBHOOKS_CASSANDRA_JMX_PORT", "7199")
    subprocess.run(["java", *jpms, "-cp", str(REPO_ROOT / "stack/.jars/cassandra/*"),
                    "org.apache.cassandra.tools.NodeTool", "-h", "127.0.0.1", "-p", port, *args],
                   check=True, capture_output=True, timeout=600)


def table_bytes(keyspace: str, compact: bool) -> dict[str, int]:
    """On-disk bytes of each table's files, flushed first (and compacted into one file each)."""
    nodetool("flush", keyspace)
    if compact:
        nodetool("compact", keyspace)
    out: dict[str, int] = {}
    for table_dir in (CASSANDRA_DATA / keyspace).iterdir():
        name = table_dir.name.rsplit("-", 1)[0]
        out[name] = sum(f.stat().st_size for f in table_dir.rglob("*") if f.is_file() and "snapshots" not in f.parts)
    return out


def write_hour(history: CassandraHistory, hour_ms: int, events: int, body: bytes, random_body: bool) -> int:
    waits = []
    n_deliveries = 0
    for n in range(events):
        tenant = f"t-bench-{n % 20}"
        arrived = hour_ms + 1000 + n * (3_000_000 // max(events, 1))
        payload = os.urandom(len(body) // 2).hex().encode() if random_body else body
        e = EventRecord(event_id=f"evt_{uuid.uuid4().hex}", tenant_id=tenant, event_type="bench.event",
                        schema_version="2026-01-01", object_id="obj_bench", object_version=1,
                        occurred_at_ms=arrived, payload=payload)
        eps = (f"ep-{tenant}-1", f"ep-{tenant}-2")
        waits.append(history.write_snapshot(FanoutSnapshot(e.event_id, tenant, arrived, tuple((p, 1) for p in eps))))
        for k, ep in enumerate(eps):
            d = NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep, tenant_id=tenant,
                            endpoint_config_version=1, created_at_ms=arrived, expires_at_ms=arrived + 86_400_000)
            n_deliveries += 1
            i1 = Intent(1, str(uuid.uuid1()))
            waits.append(history.persist(d, i1, write_event=k == 0))
            if n_deliveries % 10 == 0:
                i2 = Intent(2, str(uuid.uuid1()))
                waits.append(history.record(d, _attempt(i1, arrived + 80, "retry", "pending", 503), 1, i2))
                waits.append(history.record(d, _attempt(i2, arrived + 5100, "succeeded", "succeeded", 200), 2, None))
            else:
                waits.append(history.record(d, _attempt(i1, arrived + 80, "succeeded", "succeeded", 200), 1, None))
        if len(waits) > 2000:
            _wait(history, waits)
    _wait(history, waits)
    return n_deliveries


def _attempt(i: Intent, at_ms: int, outcome: str, status: str, http: int) -> AttemptRecord:
    return AttemptRecord(
        intent=i, sent=True, started_at_ms=at_ms - 60, finished_at_ms=at_ms, http_status=http, outcome=outcome,
        error_class=None if http == 200 else "http_5xx", detail="", manual=False, delivery_status=status,
        next_attempt_at_ms=at_ms + 5000 if status == "pending" else None, auto_retry_active=status == "pending",
        url="https://hooks.example.com/in", endpoint_config_version=1, latency_ms=60, signing_key_versions=(1,),
        response_sha256="e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", response_prefix="ok")


def _wait(history: CassandraHistory, waits: list[Any]) -> None:
    history.flush()
    for c in waits:
        while not c.done():
            time.sleep(0.002)
        c.result()
    waits.clear()


def delete_hour(session: Session, hour_ms: int) -> int:
    """Hour B let go by partition DELETE: above every band the job writes in (its succeeded status
    sits two bands ahead), which is what makes this the wrong tool (see control_plane/archiver.py)."""
    ts = (int(time.time() * 1000)) * 1000 + 3 * BAND_US
    d_hist = session.prepare("DELETE FROM delivery_history USING TIMESTAMP ? WHERE delivery_id=?")
    d_event = session.prepare("DELETE FROM events USING TIMESTAMP ? WHERE event_id=?")
    q = session.prepare("SELECT event_id, endpoints FROM fanout_snapshots WHERE hour=? AND bucket=?")
    n = 0
    for bucket in range(16):
        for s in session.execute(q, (hour_ms, bucket)):
            session.execute(d_event, (ts, s.event_id))
            for ep in s.endpoints:
                session.execute(d_hist, (ts, delivery_id_for(s.event_id, ep)))
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--body-bytes", type=int, default=1536)
    ap.add_argument("--random-body", action="store_true", help="incompressible payloads (hex of random bytes)")
    ap.add_argument("--shards", type=int, default=4,
                    help="also time one archiver shard of this many (shard 0/N) on hour B: its share of the hour")
    args = ap.parse_args()
    settings: Settings = settings_with(isolated_env(f"archbench-{uuid.uuid4().hex[:6]}", own_keyspace=True))
    ks = settings.cassandra.keyspace
    body = make_body(args.body_bytes)
    hour_a = (int(time.time() * 1000) - 5 * 86_400_000) // HOUR_MS * HOUR_MS
    hour_b = hour_a - HOUR_MS
    root = Path(REPO_ROOT / ".run" / "bench" / f"archive-{uuid.uuid4().hex[:6]}")
    with keyspace_session(settings) as session:
        session.set_keyspace(ks)
        history = CassandraHistory(settings.cassandra)
        t0 = time.monotonic()
        n = write_hour(history, hour_a, args.events, body, args.random_body)
        write_hour(history, hour_b, args.events, body, args.random_body)
        history.close()
        print(f"wrote 2 x {n} deliveries in {time.monotonic() - t0:.1f} s")
        hot = table_bytes(ks, compact=True)
        total = sum(hot.values())
        print("cassandra bytes by table (both hours):", {k: v for k, v in sorted(hot.items()) if v})

        archive = ArchiveSettings(uri=str(root), pushgateway="")
        a = Archiver(archive, settings.cassandra.history_ttl_s, session, ArchiveStore.from_settings(archive))
        t = time.monotonic()
        manifest = a.archive(hour_a)
        t_archive = time.monotonic() - t
        assert manifest is not None  # one process, every bucket: the hour is complete
        t = time.monotonic()
        problems = a.verify(hour_a)
        t_verify = time.monotonic() - t
        assert not problems, problems
        t = time.monotonic()
        a._releaser.release(manifest, archive.release_ttl_s, settings.cassandra.history_ttl_s, int(time.time() * 1000))
        t_release = time.monotonic() - t
        # Added bytes as written (flushed, before any compaction could merge them with what they
        # shadow), then after a major compaction.
        ttl_flushed = sum(table_bytes(ks, compact=False).values()) - total
        base = sum(table_bytes(ks, compact=True).values())
        ttl_compacted = base - total
        # One shard of N on hour B (archived only: the DELETE below lets it go): each shard pages
        # through all the hour's snapshots but reads only its buckets' history, so its rate
        # against its share of the deliveries says how far N processes divide the work.
        shard_root = root.with_name(root.name + "-shard")
        shard_settings = archive.model_copy(update={"uri": str(shard_root)})
        shard = Archiver(shard_settings, settings.cassandra.history_ttl_s, session,
                         ArchiveStore.from_settings(shard_settings), (0, args.shards))
        t = time.monotonic()
        shard.archive(hour_b)
        t_shard = time.monotonic() - t
        shard_n = sum(int(json.loads(p.read_text())["counts"]["deliveries"]) for p in shard_root.rglob("part.json"))
        t = time.monotonic()
        delete_hour(session, hour_b)
        t_delete = time.monotonic() - t
        del_flushed = sum(table_bytes(ks, compact=False).values()) - base
        del_compacted = sum(table_bytes(ks, compact=True).values()) - base

    by_kind: dict[str, int] = {}
    for f in manifest.files:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + f.bytes
    parquet = sum(by_kind.values())
    cass_pd = total / (2 * n)
    print(f"parquet bytes by kind (hour A, {len(manifest.files)} files):", by_kind)
    print(f"archive {n / t_archive:.0f} deliveries/s ({t_archive:.1f} s), verify {t_verify:.1f} s, "
          f"release by TTL rewrite {t_release:.1f} s, by DELETE {t_delete:.1f} s")
    print(f"shard 0/{args.shards} on hour B: {shard_n} of {n} deliveries in {t_shard:.1f} s "
          f"({shard_n / t_shard:.0f} deliveries/s of its share; one process on all: {n / t_archive:.0f}/s)")
    print(f"archive-bench: deliveries={n} body_bytes={len(body)} random_body={args.random_body} "
          f"cassandra_bytes_per_delivery={cass_pd:.0f} parquet_bytes_per_delivery={parquet / n:.0f} "
          f"archive_deliveries_per_s={n / t_archive:.0f} verify_deliveries_per_s={n / t_verify:.0f} "
          f"release_deliveries_per_s={n / t_release:.0f} "
          f"ttl_rewrite_added_bytes_per_delivery={ttl_flushed / n:.0f}/{ttl_compacted / n:.0f} "
          f"delete_added_bytes_per_delivery={del_flushed / n:.0f}/{del_compacted / n:.0f} (flushed/compacted)")


if __name__ == "__main__":
    main()
