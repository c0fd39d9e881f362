"""Apply the CQL schema in cassandra/schema/ (file-name order), or check Cassandra answers.

Re-applying is harmless: the keyspace and every table use IF NOT EXISTS. The keyspace's
replication factor is the settings' (cassandra.replication_factor: 3 in the cluster topology). `--keyspace` lets tests
build a private keyspace with the same tables.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from cassandra.cluster import Cluster, Session

from core.settings import REPO_ROOT, load_settings

SCHEMA_DIR = REPO_ROOT / "cassandra" / "schema"


def connect() -> tuple[Cluster, Session]:
    s = load_settings().cassandra
    cluster = Cluster(s.contact_points, port=s.port, connect_timeout=3, control_connection_timeout=3)
    return cluster, cluster.connect()


def statements(path: Path) -> list[str]:
    text = re.sub(r"--[^\n]*", "", path.read_text())
    return [stmt.strip() for stmt in text.split(";") if stmt.strip()]


def apply(session: Session, keyspace: str, replication_factor: int) -> int:
    session.execute(
        f"CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = "
        f"{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}"
    )
    session.set_keyspace(keyspace)
    count = 0
    for path in sorted(SCHEMA_DIR.glob("*.cql")):
        for stmt in statements(path):
            session.execute(stmt, timeout=60)
            count += 1
    return count


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true", help="exit 0 when Cassandra answers CQL")
    p.add_argument("--nodes", type=int, default=1, help="with --check: how many nodes must be up in the ring")
    p.add_argument("--keyspace", default=load_settings().cassandra.keyspace)
    args = p.parse_args()
    cluster, session = connect()
    try:
        if args.check:
            session.execute("SELECT release_version FROM system.local")
            # A ring is ready for an RF 3 keyspace and quorum writes once every node is up in
            # the driver's view (gossip reached it and its native port answers).
            up = [h for h in cluster.metadata.all_hosts() if h.is_up]
            return 0 if len(up) >= args.nodes else 1
        n = apply(session, args.keyspace, load_settings().cassandra.replication_factor)
        print(f"schema applied to keyspace {args.keyspace}: {n} statements")
        return 0
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
