"""What the archive's integration tests share: the archive writer's service loop in a thread,
its consumer group's committed offsets against the facts topic's end, and an S3 server of a
test's own."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from control_plane.archive.store import ArchiveStore
from control_plane.archive.writer import ArchiveWriter, consumer_config
from core.settings import REPO_ROOT, ArchiveSettings, Settings


def partitions(s: Settings) -> list[int]:
    c = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": "probe"})
    try:
        return sorted(c.list_topics(s.kafka.archive_facts_topic, timeout=10).topics[s.kafka.archive_facts_topic]
                      .partitions)
    finally:
        c.close()


def end_offsets(s: Settings) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": "probe"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(s.kafka.archive_facts_topic, p), timeout=10)[1]
                for p in partitions(s)}
    finally:
        c.close()


def committed(s: Settings, group: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": group})
    try:
        tps = c.committed([TopicPartition(s.kafka.archive_facts_topic, p) for p in partitions(s)], timeout=10)
        return {tp.partition: max(tp.offset, 0) for tp in tps}
    finally:
        c.close()


class WriterThread:
    """The archive writer's service loop in a thread, with a consumer group of its own."""

    def __init__(self, s: Settings, archive: ArchiveSettings) -> None:
        self.settings = s.model_copy(update={"archive": archive.model_copy(
            update={"writer_group": f"arch-writer-{uuid.uuid4().hex[:8]}"})})
        self.stop = threading.Event()
        self.consumer = Consumer(consumer_config(self.settings, self.settings.archive.writer_group))
        self.writer = ArchiveWriter(self.consumer, ArchiveStore.from_settings(self.settings.archive),
                                    self.settings.archive, s.kafka.archive_facts_topic, wait=self.stop.wait)
        self.consumer.subscribe([s.kafka.archive_facts_topic], on_revoke=self.writer.on_revoke)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self.stop.is_set() and self.writer.step():
                pass
        except BaseException as exc:  # noqa: BLE001 -- the test reports it
            self.error = exc

    def __enter__(self) -> WriterThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.consumer.close()

    def caught_up(self, timeout: float = 90) -> None:
        want = end_offsets(self.settings)
        deadline = time.monotonic() + timeout
        while committed(self.settings, self.settings.archive.writer_group) != want:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"writer not caught up to {want}"
            time.sleep(0.2)


class S3Server:
    """A real S3-compatible server (S3Proxy) of this module's own, started and stopped by the
    project's script (stack/s3proxy.sh) in a run directory of its own."""

    def __init__(self, run_dir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.run_dir = run_dir
        self.data = run_dir / "s3proxy" / "data"

    def script(self, action: str) -> None:
        env = {**os.environ, "WEBHOOKS_RUN_DIR": str(self.run_dir), "WEBHOOKS_S3PROXY_PORT": str(self.port)}
        subprocess.run([str(REPO_ROOT / "stack/s3proxy.sh"), action], env=env, check=True, capture_output=True,
                       timeout=120)

    def settings(self, prefix: str) -> dict[str, Any]:
        return {"uri": f"s3://archive/{prefix}", "s3_endpoint": f"127.0.0.1:{self.port}", "s3_scheme": "http",
                "s3_access_key": "local-identity", "s3_secret_key": "local-credential"}
