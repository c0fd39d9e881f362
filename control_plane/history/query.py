"""`webhookctl history query`: read-only SQL over one tenant's archived history.

    webhookctl history query --tenant t-acme --since 2026-11-01 [--until 2026-11-08] \\
        "SELECT status, count(*) FROM deliveries GROUP BY status"

An operator's tool: it reads the archive itself (WEBHOOKS_ARCHIVE__*, the writer's settings),
not through the gRPC API. Tables: ``events`` (with the payload bytes), ``deliveries`` (each
delivery's latest state), ``attempts`` -- the columns of control_plane/archive/rows.py, the
Cassandra tables'. The archive is a log of facts (core/archive_facts.py): each table is reduced to
one row per key (the highest ``write_ts``) before the SQL sees it.

Scoping: for each hour of the range only the files the committed segments list for the tenant's
bucket are read (pyarrow, through the archive store), only the tenant's rows kept, and the Arrow
tables handed to an in-memory duckdb whose file system access is off and locked: the SQL cannot
name a file, another tenant's partition or a URL, and nothing (no extension) is ever downloaded.
Only SELECT statements run. Memory: the tenant's rows of the range (columns the SQL does not use
are read too) -- a tool for days of one tenant, not for the fleet.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]

from control_plane.archive.rows import SCHEMAS
from control_plane.archive.store import ArchiveStore, ArchiveUnavailable
from core import archive_facts
from core import archive_layout as layout
from core.settings import Settings

_LOCKED: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False, "autoinstall_known_extensions": False, "autoload_known_extensions": False,
    "lock_configuration": True}


class QueryRefused(Exception):
    """The SQL is not one read-only statement, or the range is not one the archive can hold."""


def tenant_tables(store: ArchiveStore, tenant_id: str, since_ms: int, until_ms: int) -> dict[str, pa.Table]:
    """The tenant's archived facts of the hours in [since, until), by kind (not reduced)."""
    parts: dict[str, list[pa.Table]] = {k: [] for k in layout.KINDS}
    bucket = layout.tenant_bucket(tenant_id)
    for hour in range(layout.hour_start(since_ms), until_ms, layout.HOUR_MS):
        for kind in layout.KINDS:
            parts[kind].append(store.read_kind(hour, bucket, kind, filters=[("tenant_id", "=", tenant_id)]))
    return {k: pa.concat_tables(ts) if ts else SCHEMAS[k].empty_table() for k, ts in parts.items()}


def _reduced(kind: str) -> str:
    """The view of one kind: one row per key, the latest fact (core/archive_facts.latest)."""
    keys = ", ".join(archive_facts.KEYS[kind])
    order = "write_ts DESC" if "write_ts" in SCHEMAS[kind].names else "hour"
    return (f"CREATE TEMP VIEW {kind} AS SELECT * EXCLUDE (_n) FROM (SELECT *, row_number() OVER"
            f" (PARTITION BY {keys} ORDER BY {order}) AS _n FROM _facts_{kind}) WHERE _n = 1")


Result = tuple[list[str], list[tuple[Any, ...]]]


def run_query(store: ArchiveStore, tenant_id: str, since_ms: int, until_ms: int, sql: str) -> Result:
    statements = duckdb.extract_statements(sql)
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        raise QueryRefused("history query runs exactly one SELECT statement")
    if not since_ms < until_ms or until_ms - since_ms > 31 * 86_400_000:
        raise QueryRefused("--since must be before --until, at most 31 days apart")
    tables = tenant_tables(store, tenant_id, since_ms, until_ms)
    con = duckdb.connect(":memory:", config=_LOCKED)
    try:
        for kind, table in tables.items():
            con.register(f"_facts_{kind}", table)
            con.execute(_reduced(kind))
        rel = con.sql(sql)
        return [d[0] for d in rel.description], rel.fetchall()
    finally:
        con.close()


def _when(text: str, now: datetime) -> int:
    """An ISO time (UTC unless it says otherwise) or an age: 7d, 12h."""
    if text[:-1].isdigit() and text[-1] in "dh":
        delta = timedelta(days=int(text[:-1])) if text[-1] == "d" else timedelta(hours=int(text[:-1]))
        return int((now - delta).timestamp() * 1000)
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="command", required=True)
    q = sub.add_parser("query", help="read-only SQL over one tenant's archived history (duckdb)")
    q.add_argument("--tenant", required=True)
    q.add_argument("--since", required=True, help="ISO time or age (7d, 12h)")
    q.add_argument("--until", default="", help="ISO time or age; default now")
    q.add_argument("--json", action="store_true", help="one JSON object per row")
    q.add_argument("sql", help='e.g. "SELECT status, count(*) FROM deliveries GROUP BY status"')


def main(args: argparse.Namespace, settings: Settings | None = None) -> int:
    settings = settings or Settings()
    now = datetime.now(tz=UTC)
    try:
        since = _when(args.since, now)
        until = _when(args.until, now) if args.until else int(now.timestamp() * 1000) + 1
        columns, rows = run_query(ArchiveStore.from_settings(settings.archive), args.tenant, since, until, args.sql)
    except (QueryRefused, ValueError, duckdb.Error, ArchiveUnavailable) as exc:
        print(f"webhookctl history query: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for r in rows:
            print(json.dumps(dict(zip(columns, r, strict=True)), default=_plain))
        return 0
    print("\t".join(columns))
    for r in rows:
        print("\t".join("" if v is None else str(_plain(v)) for v in r))
    return 0


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, datetime):
        return v.isoformat()
    return v

