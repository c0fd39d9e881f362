"""A transactional outbox of its own for a test session or a benchmark run: a PostgreSQL cluster and
a Kafka Connect worker running the Debezium connector, both started by the project's scripts
(stack/postgres.sh, stack/connect.sh) in a run directory of their own, on free ports, streaming
to the run's events topic. Fault tests restart, stop and SIGKILL them without touching the
`make run` stack's outbox.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg

from core.settings import REPO_ROOT, Settings
from outbox.migrate import migrate
from stack.isolation import settings_with


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OutboxRelay:
    def __init__(self, job_env: dict[str, str], run_dir: Path, flush_ms: int) -> None:
        pg_port = free_port()
        self.run_dir = run_dir
        self.env = {
            **job_env,
            "WEBHOOKS_RUN_DIR": str(run_dir),
            "WEBHOOKS_POSTGRES_PORT": str(pg_port),
            "WEBHOOKS_OUTBOX__DSN": f"host=127.0.0.1 port={pg_port} dbname=webhooks user=webhooks",
            "WEBHOOKS_OUTBOX__CONNECT_REST_PORT": str(free_port()),
            # Offsets (and the slot's confirmed position) are only flushed this often, so a
            # SIGKILL after a publish is "before the offsets were committed".
            "WEBHOOKS_CONNECT_FLUSH_MS": str(flush_ms),
        }
        self.settings: Settings = settings_with(self.env)

    def script(self, name: str, *actions: str, timeout: float = 180) -> None:
        for action in actions:
            out = subprocess.run(["bash", str(REPO_ROOT / "stack" / name), action], capture_output=True, text=True,
                                 timeout=timeout, env={**os.environ, **self.env})
            assert out.returncode == 0, f"{name} {action}:\n{out.stdout}\n{out.stderr}"

    def start(self) -> None:
        self.script("postgres.sh", "start", "ready")
        migrate(self.settings.outbox)
        self.script("connect.sh", "start", "ready")

    def stop(self) -> None:
        self.script("connect.sh", "stop")
        self.script("postgres.sh", "destroy")
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.settings.outbox.dsn, connect_timeout=5)

    def connect_pid_alive(self) -> bool:
        pid_file = self.run_dir / "connect" / "pid"
        if not pid_file.exists():
            return False
        try:
            os.kill(int(pid_file.read_text()), 0)
        except ProcessLookupError:
            return False
        return True
