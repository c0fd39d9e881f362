"""A transactional outbox of the test session's own: a PostgreSQL cluster and a Kafka Connect worker
running the Debezium connector, both started by the project's scripts (stack/postgres.sh,
stack/connect.sh) in a run directory of their own, on free ports, streaming to the session's events
topic. Fault tests restart, stop and SIGKILL them without touching the `make run` stack's outbox.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, TopicPartition

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
        self.script("postgres.sh", "stop")
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


class TopicWatch:
    """Counts the records per key that reach the events topic after the moment it was made."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.kafka.events_topic
        self.consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers,
                                  "group.id": f"outbox-watch-{time.time_ns()}", "enable.auto.commit": False})
        parts = self.consumer.list_topics(self.topic, timeout=10).topics[self.topic].partitions
        starts = []
        for p in parts:
            _, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
            starts.append(TopicPartition(self.topic, p, high))
        self.consumer.assign(starts)
        self.counts: Counter[str] = Counter()
        self.values: dict[str, bytes] = {}

    def poll(self, seconds: float = 1.0) -> Counter[str]:
        deadline = time.time() + seconds
        while time.time() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() or msg.key() is None:
                continue
            key = msg.key().decode()
            self.counts[key] += 1
            self.values[key] = msg.value()
        return self.counts

    def wait_for(self, keys: set[str], copies: int = 1, timeout: float = 90) -> Counter[str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll(0.5)
            if all(self.counts[k] >= copies for k in keys):
                return self.counts
        short = sorted(k for k in keys if self.counts[k] < copies)
        raise AssertionError(f"{len(short)} of {len(keys)} events not on the topic {copies}x within {timeout}s "
                             f"(e.g. {short[:3]})")

    def close(self) -> None:
        self.consumer.close()
