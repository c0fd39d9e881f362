"""Watching the events topic from the outbox tests: which event ids reached it, how many times."""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka import Consumer, TopicPartition

from core.settings import Settings


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
        self.headers: dict[str, list[tuple[str, bytes | None]]] = {}  # the last record's, per key

    def poll(self, seconds: float = 1.0) -> Counter[str]:
        deadline = time.time() + seconds
        while time.time() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is None or msg.error() or msg.key() is None:
                continue
            key = msg.key().decode()
            self.counts[key] += 1
            self.values[key] = msg.value()
            self.headers[key] = list(msg.headers() or ())
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
