"""Create and migrate the producer database: ``python -m outbox.migrate`` (idempotent).

Applies ``outbox/sql/NNN_*.sql`` in order, each once, recorded in ``schema_migrations``; then makes
sure the publication and the logical replication slot Debezium reads exist. The slot is created
here, before any outbox row can be written, because a slot only keeps WAL from the moment it
exists: a connector that created its own slot on first start would never see rows committed
before then, and would need a data snapshot to find them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from core.settings import OutboxSettings, load_settings

SQL_DIR = Path(__file__).resolve().parent / "sql"


def ensure_database(dsn: str) -> None:
    """Create the DSN's database if it is missing (connecting to the cluster's ``postgres`` db)."""
    params = conninfo_to_dict(dsn)
    dbname = str(params.get("dbname") or "postgres")
    try:
        psycopg.connect(dsn, connect_timeout=5).close()
        return
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
    with psycopg.connect(make_conninfo(dsn, dbname="postgres"), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def apply_migrations(conn: psycopg.Connection) -> list[str]:
    """Apply every SQL file not yet recorded; returns the versions applied now."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version text PRIMARY KEY,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    conn.commit()
    applied = []
    for path in sorted(SQL_DIR.glob("*.sql")):
        version = path.stem
        with conn.transaction():
            # One migrator at a time (two `make run`s at once must not both apply a file).
            conn.execute("LOCK TABLE schema_migrations IN EXCLUSIVE MODE")
            if conn.execute("SELECT 1 FROM schema_migrations WHERE version = %s", (version,)).fetchone():
                continue
            conn.execute(path.read_text())  # type: ignore[arg-type]  # our own checked-in file
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
        applied.append(version)
    return applied


def ensure_replication(conn: psycopg.Connection, settings: OutboxSettings) -> list[str]:
    """The publication (which tables pgoutput streams) and the slot (how far Debezium has read)."""
    conn.autocommit = True
    made = []
    if not conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (settings.publication_name,)).fetchone():
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE webhook_outbox").format(
            sql.Identifier(settings.publication_name)))
        made.append(f"publication {settings.publication_name}")
    if not conn.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (settings.slot_name,)).fetchone():
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (settings.slot_name,))
        made.append(f"slot {settings.slot_name}")
    return made


def migrate(settings: OutboxSettings) -> list[str]:
    ensure_database(settings.dsn)
    with psycopg.connect(settings.dsn, connect_timeout=5) as conn:
        done = apply_migrations(conn)
        done += ensure_replication(conn, settings)
    return done


def main() -> int:
    p = argparse.ArgumentParser(description="create/migrate the outbox database (idempotent)")
    p.add_argument("--dsn", default=None, help="libpq connection string (default: settings outbox.dsn)")
    args = p.parse_args()
    settings = load_settings().outbox
    if args.dsn:
        settings = settings.model_copy(update={"dsn": args.dsn})
    try:
        done = migrate(settings)
    except psycopg.Error as exc:
        print(f"outbox migration failed: {exc}", file=sys.stderr)
        return 1
    print("outbox: " + (", ".join(done) if done else "up to date"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
