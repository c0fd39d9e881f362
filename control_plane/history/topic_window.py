"""Every record a Kafka topic received in a window of broker time, read once by a throwaway consumer.

Reconciliation reads the events topic this way and a tenant's account the dead-letter topic:
offsets for the window's two ends (``offsets_for_times``), each partition read up to the end's
offset (to the partition's end when nothing arrived after the window), nothing committed. The
last offsets may be control records that ``poll`` never returns, so a partition is also done
once the consumer's position reached its end; a partition that stops short raises.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from confluent_kafka import Consumer, Message, TopicPartition

# Empty polls in a row after which a partition that has not reached its end is given up on.
_QUIET_POLLS = 10


class TopicMissing(RuntimeError):
    """The topic does not exist (or its metadata carries an error)."""


class WindowShort(RuntimeError):
    """Partitions stopped before the window's end: the read would be incomplete."""

    def __init__(self, topic: str, partitions: list[int]) -> None:
        super().__init__(f"topic {topic}: partitions {partitions} stopped short of the window's end")
        self.partitions = partitions


def records(bootstrap_servers: str, topic: str, since_ms: int, until_ms: int, reader: str) -> Iterator[Message]:
    """The records of ``topic`` from the first at or after ``since_ms`` to the last before the
    first at or after ``until_ms``, in partition order; ``reader`` names the consumer group's
    prefix (the group is unique per call and commits nothing)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers,
                         "group.id": f"{reader}-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            raise TopicMissing(f"topic {topic}: {meta.error if meta is not None else 'does not exist'}")
        parts = sorted(meta.partitions)
        starts = consumer.offsets_for_times([TopicPartition(topic, p, since_ms) for p in parts], timeout=10)
        ends = consumer.offsets_for_times([TopicPartition(topic, p, until_ms) for p in parts], timeout=10)
        stop: dict[int, int] = {}
        assign = []
        for start, end in zip(starts, ends, strict=True):
            high = consumer.get_watermark_offsets(TopicPartition(topic, start.partition), timeout=10)[1]
            last = end.offset if end.offset >= 0 else high  # none at or after the end: to the partition's end
            if 0 <= start.offset < last:
                stop[start.partition] = last
                assign.append(TopicPartition(topic, start.partition, start.offset))
        consumer.assign(assign)
        quiet = 0
        while stop:
            msg = consumer.poll(1.0)
            if msg is None:
                for tp in consumer.position([TopicPartition(topic, p) for p in stop]):
                    if tp.offset >= stop[tp.partition]:
                        del stop[tp.partition]
                quiet += 1
                if stop and quiet >= _QUIET_POLLS:
                    raise WindowShort(topic, sorted(stop))
                continue
            quiet = 0
            if msg.error() is not None:
                raise RuntimeError(f"topic {topic}: {msg.error()}")
            p = msg.partition()
            if p in stop and msg.offset() + 1 >= stop[p]:
                del stop[p]
            yield msg
    finally:
        consumer.close()
