"""`webhookctl history query` (control_plane/history/query.py) over an archive written by the
archive writer's own roll in a temporary directory: tenant-scoped, SELECT only, no file access,
each table one row per key however often a fact was archived."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from control_plane.archive.store import ArchiveStore
from control_plane.archive.writer import Buffer, write_segment
from control_plane.cli import main as cli
from control_plane.history.query import QueryRefused, run_query
from core import archive_facts
from core import archive_layout as layout
from core.settings import ArchiveSettings
from tests.support.archive_facts import delivery, history

HOUR = int(datetime(2026, 11, 29, 19, tzinfo=UTC).timestamp() * 1000)
A = "t-acme"
# A tenant in another bucket, so its rows live in other files.
B = next(f"t-other-{i}" for i in range(100) if layout.tenant_bucket(f"t-other-{i}") != layout.tenant_bucket(A))
SEGMENTS: list[str] = []


@pytest.fixture()
def store(tmp_path: Path) -> ArchiveStore:
    s = ArchiveStore.from_settings(ArchiveSettings(uri=str(tmp_path)))
    facts = []
    n = 0
    for tenant, count, outcome in ((A, 3, [(200, "succeeded")]), (A, 1, [(503, "pending"), (503, "failed")]),
                                   (B, 5, [(200, "succeeded")])):
        for _ in range(count):
            facts += history(delivery(tenant, n, HOUR + 1000 + n), outcome)
            n += 1
    # Two segments holding the same facts (a range written again after a crash, under other bounds).
    SEGMENTS.clear()
    for offset in (0, 1):
        buffer = Buffer()
        buffer.add(0, offset, HOUR, archive_facts.encode(facts), 0.0)
        SEGMENTS.append(layout.segment_id(buffer.ranges))
        write_segment(s, buffer)
    return s


def test_a_query_sees_only_its_tenants_rows(store):
    cols, rows = run_query(store, A, HOUR, HOUR + 3_600_000,
                           "SELECT status, count(*) AS n FROM deliveries GROUP BY status ORDER BY status")
    assert (cols, rows) == (["status", "n"], [("failed", 1), ("succeeded", 3)])
    assert run_query(store, A, HOUR, HOUR + 3_600_000, f"SELECT count(*) FROM deliveries WHERE tenant_id = '{B}'")[1] \
        == [(0,)]
    assert run_query(store, B, HOUR, HOUR + 3_600_000, "SELECT count(*) FROM deliveries")[1] == [(5,)]
    # Hours outside the range are not read.
    assert run_query(store, A, HOUR + 3_600_000, HOUR + 7_200_000, "SELECT count(*) FROM deliveries")[1] == [(0,)]


def test_each_table_holds_one_row_per_key_the_latest(store):
    assert run_query(store, A, HOUR, HOUR + 3_600_000, "SELECT count(*), count(DISTINCT delivery_id) FROM deliveries"
                     )[1] == [(4, 4)]
    assert run_query(store, A, HOUR, HOUR + 3_600_000, "SELECT count(*) FROM attempts")[1] == [(5,)]
    assert run_query(store, B, HOUR, HOUR + 3_600_000, "SELECT count(*), min(octet_length(payload)) > 0 FROM events"
                     )[1] == [(5, True)]


def test_another_tenants_partition_cannot_be_read_by_naming_its_file(store, tmp_path):
    other = tmp_path / layout.data_path(HOUR, layout.tenant_bucket(B), "deliveries", SEGMENTS[0])
    assert other.exists()
    for sql in (f"SELECT * FROM read_parquet('{other}')", f"SELECT * FROM '{other}'",
                "SELECT * FROM read_csv('/etc/passwd')"):
        with pytest.raises(duckdb.PermissionException):
            run_query(store, A, HOUR, HOUR + 3_600_000, sql)


@pytest.mark.parametrize("sql", ["CREATE TABLE x AS SELECT 1", "SELECT 1; SELECT 2", "SET lock_configuration=false",
                                 "INSTALL httpfs", "COPY deliveries TO 'out.csv'"])
def test_only_one_select_runs(store, sql):
    with pytest.raises(QueryRefused):
        run_query(store, A, HOUR, HOUR + 3_600_000, sql)


def test_webhookctl_history_query_prints_rows(store, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WEBHOOKS_ARCHIVE__URI", str(tmp_path))
    code = cli.main(["history", "query", "--tenant", A, "--since", "2026-11-29T19:00Z", "--until", "2026-11-29T20:00Z",
                     "SELECT status, count(*) AS n FROM deliveries GROUP BY status ORDER BY status"])
    assert code == 0
    assert capsys.readouterr().out == "status\tn\nfailed\t1\nsucceeded\t3\n"
    assert cli.main(["history", "query", "--tenant", A, "--since", "7d", "DROP TABLE deliveries"]) == 2
