"""The bench's Cassandra write count (bench/cassandra_writes.py) against the real server: what
moves the counters it reads, in a scratch keyspace of this module's own (dropped after)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType

from bench import cassandra_writes
from core.settings import Settings
from stack.isolation import harness_cluster

pytestmark = pytest.mark.integration

KEYSPACE = f"bench_writes_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def session() -> Iterator[Session]:
    cluster = harness_cluster(Settings())
    try:
        s = cluster.connect()
        s.execute(f"CREATE KEYSPACE {KEYSPACE} WITH replication = "
                  "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
        for table in ("a", "b"):
            s.execute(f"CREATE TABLE {KEYSPACE}.{table} (pk int, ck int, v text, PRIMARY KEY (pk, ck))",
                      timeout=60)
        yield s
        s.execute(f"DROP KEYSPACE IF EXISTS {KEYSPACE}", timeout=60)
    finally:
        cluster.shutdown()


def writes_of(session: Session, do: Callable[[], None]) -> dict[str, int]:
    """The keyspace's writes per table that ``do()`` caused, as the server counts them."""
    before = cassandra_writes.read(session, KEYSPACE)
    do()
    return cassandra_writes.delta(before, cassandra_writes.read(session, KEYSPACE))


def test_each_single_row_insert_is_one_write(session: Session) -> None:
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.a (pk, ck, v) VALUES (?, ?, 'x')")

    def do() -> None:
        for i in range(100):
            session.execute(insert, (i, 0))

    assert writes_of(session, do) == {"a": 100}


def test_a_single_partition_batch_is_one_write_per_table(session: Session) -> None:
    insert_a = session.prepare(f"INSERT INTO {KEYSPACE}.a (pk, ck, v) VALUES (?, ?, 'x')")
    insert_b = session.prepare(f"INSERT INTO {KEYSPACE}.b (pk, ck, v) VALUES (?, ?, 'x')")

    def one_table() -> None:
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for ck in range(10):
            batch.add(insert_a, (7, ck))
        session.execute(batch)

    def two_tables() -> None:
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for ck in range(5):
            batch.add(insert_a, (8, ck))
            batch.add(insert_b, (8, ck))
        session.execute(batch)

    assert writes_of(session, one_table) == {"a": 1}
    assert writes_of(session, two_tables) == {"a": 1, "b": 1}


def test_a_batch_over_three_partitions_is_three_writes(session: Session) -> None:
    insert = session.prepare(f"INSERT INTO {KEYSPACE}.b (pk, ck, v) VALUES (?, ?, 'x')")

    def do() -> None:
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for pk in (1, 2, 3):
            batch.add(insert, (pk, 0))
            batch.add(insert, (pk, 1))
        session.execute(batch)

    assert writes_of(session, do) == {"b": 3}


def test_another_keyspaces_writes_are_not_counted(session: Session) -> None:
    # The bench reads only its run's keyspace: the stack and other runs write to theirs meanwhile.
    other = f"{KEYSPACE}_other"
    session.execute(f"CREATE KEYSPACE {other} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}", timeout=60)
    try:
        session.execute(f"CREATE TABLE {other}.a (pk int PRIMARY KEY, v text)", timeout=60)
        insert = session.prepare(f"INSERT INTO {other}.a (pk, v) VALUES (?, 'x')")

        def do() -> None:
            for i in range(10):
                session.execute(insert, (i,))

        assert writes_of(session, do) == {}
        assert cassandra_writes.read(session, other) == {"a": 10}
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {other}", timeout=60)
