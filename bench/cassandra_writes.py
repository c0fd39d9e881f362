"""Cassandra's own count of the writes to one keyspace: the server's counters, not the code's idea
of what it wrote.

Cassandra counts a local write each time it applies one table's update of one partition (the
table's write latency timer), so a single-partition unlogged batch of several statements on one
table is one write and the same batch over two tables is two. Cassandra 4.0+ serves those
counters, cumulative since the node started, in the virtual table
``system_views.local_write_latency`` (one row per keyspace and table): a plain CQL read on the
bench's own session, no JMX or nodetool. On this single node (replication factor 1) local writes
are all the writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cassandra.cluster import Session

# Every keyspace's tables: a few hundred rows at most. Filtered here rather than in CQL, which
# would need ALLOW FILTERING on half of the (keyspace, table) partition key.
QUERY = "SELECT keyspace_name, table_name, count FROM system_views.local_write_latency"

Counts = dict[str, int]


def table_counts(rows: Iterable[Any], keyspace: str) -> Counts:
    """The cumulative write count of each table of ``keyspace`` in the virtual table's rows."""
    return {r.table_name: int(r.count) for r in rows if r.keyspace_name == keyspace}


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> Counts:
    """Writes per table between two readings, tables with none left out; a table missing from
    ``before`` (created in between) counts from zero."""
    moved = {t: n - before.get(t, 0) for t, n in after.items()}
    return {t: n for t, n in sorted(moved.items()) if n}


def read(session: Session, keyspace: str) -> Counts:
    return table_counts(session.execute(QUERY, timeout=10), keyspace)


def settled(read: Callable[[], Counts], quiet_s: float = 2.0, timeout_s: float = 30.0,
            clock: Callable[[], float] = time.monotonic,
            sleep: Callable[[float], None] = time.sleep) -> Counts:
    """The counts once they have not moved for ``quiet_s`` (at most ``timeout_s``): a delivery's
    history writes land after its request arrived (the dispatcher batches them), so counts read
    the moment a phase's last request arrived would miss its last writes."""
    start = clock()
    last = read()
    still_since = start
    while clock() - still_since < quiet_s and clock() - start < timeout_s:
        sleep(0.5)
        now = read()
        if now != last:
            last, still_since = now, clock()
    return last
