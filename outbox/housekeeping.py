"""Delete published outbox rows past the retention: ``python -m outbox.housekeeping`` (cron it).

Why deleting is safe: Debezium streams the *insert* from the WAL, not the row from the table, and
the replication slot keeps the WAL until the connector confirms it has published it. So after
commit a row is only a spare copy: it lets a re-snapshot recover events if the slot itself were
ever dropped. Rows are therefore deleted only once they are provably published:

- each run records a mark: (now, the server's current WAL position) in ``outbox_purge_marks``;
- the newest mark the slot has confirmed past, taken at T, proves every transaction committed
  before T was streamed to Kafka;
- a row written before T - retention was committed before T (the retention, a day by default,
  is far longer than any producer transaction), so it is deleted.

With no slot, or a slot that has not confirmed any mark, nothing is deleted. Debezium confirms
the commit of the transaction *before* the newest one it streamed, so a mark is proven only after
later outbox writes; on a quiet database rows simply wait for the next ones.

The connector is configured with ``skipped.operations=u,d,t``, so these deletes produce no change
events (and no tombstones) on the events topic.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

import psycopg

from core.settings import load_settings


def purge_published(conn: psycopg.Connection[Any], slot_name: str, retention: timedelta, batch: int = 10_000) -> int:
    """Delete the rows proven published (see the module doc); returns how many. Deletes go in
    batches so one run never holds a long lock."""
    with conn.transaction():
        conn.execute("INSERT INTO outbox_purge_marks (lsn) VALUES (pg_current_wal_lsn())")
    row = conn.execute(
        "SELECT max(m.taken_at) FROM outbox_purge_marks m, pg_replication_slots s"
        " WHERE s.slot_name = %s AND s.confirmed_flush_lsn >= m.lsn",
        (slot_name,),
    ).fetchone()
    conn.commit()
    proven_at = row[0] if row else None
    if proven_at is None:
        return 0
    cutoff = proven_at - retention
    total = 0
    while True:
        with conn.transaction():
            n = conn.execute(
                "DELETE FROM webhook_outbox WHERE event_id IN (SELECT event_id FROM webhook_outbox"
                " WHERE created_at < %s ORDER BY created_at LIMIT %s)",
                (cutoff, batch),
            ).rowcount
        total += n
        if n < batch:
            break
    with conn.transaction():  # marks older than the one just used prove nothing more
        conn.execute("DELETE FROM outbox_purge_marks WHERE taken_at < %s", (proven_at,))
    return total


def main() -> int:
    p = argparse.ArgumentParser(description="delete published outbox rows older than the retention")
    p.parse_args()
    settings = load_settings().outbox
    with psycopg.connect(settings.dsn, connect_timeout=5) as conn:
        deleted = purge_published(conn, settings.slot_name, timedelta(seconds=settings.retention_s))
        print(f"outbox: deleted {deleted} published rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
