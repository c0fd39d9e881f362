"""The Kafka broker's CPU for the archive facts, measured on its own: a replay.

The job's facts share the broker with the events, signals and configs, so the broker's facts
cost cannot be read from its CPU during a phase, and the difference between a facts-on and a
facts-off job is smaller than the difference between two jobs. Instead, after the phases, the
facts the run's job wrote are read back and replayed into a scratch topic of the same spec, with
the job's facts producer settings (jobs/delivery_job.py ``ARCHIVE_FACTS_PRODUCER``: few large
batches, acks=all, idempotent), then read once more with the archive writer's consumer settings
(control_plane/archive/writer.py ``consumer_config``): what the broker does for the facts in the
running system -- take them in, store them, serve them to the writer. Its CPU over that, from
/proc like every other figure, with nothing else running on the stack, is the broker's facts cost.

The replaying producer and consumer are this process (not in any measured group): they stand for
the job's sink, attributed separately, and the writer, measured whole.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from control_plane.archive.writer import consumer_config
from core.settings import Settings
from jobs.delivery_job import ARCHIVE_FACTS_PRODUCER
from stack import cpu
from stack.topics import topic_specs


@dataclass(frozen=True)
class BrokerCost:
    records: int
    bytes: int
    cpu_s: float  # the broker's (group "kafka") over the replay: produce, then consume
    seconds: float


def read_all(bootstrap: str, topic: str, timeout_s: float = 300) -> list[tuple[int, bytes]]:
    """Every record of the topic as (partition, value), from its start to its end now."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"facts-cost-probe-{uuid.uuid4().hex[:6]}"})
    try:
        parts = probe.list_topics(topic, timeout=10).topics[topic].partitions
        end = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        probe.close()
    return _consume(bootstrap, topic, end, {"group.id": f"facts-cost-read-{uuid.uuid4().hex[:6]}"}, timeout_s,
                    keep=True)


def _consume(bootstrap: str, topic: str, end: dict[int, int], config: dict[str, object], timeout_s: float,
             keep: bool) -> list[tuple[int, bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  **config})
    c.assign([TopicPartition(topic, p, 0) for p, n in end.items() if n > 0])
    seen = dict.fromkeys(end, 0)
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while any(seen[p] < end[p] for p in end):
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {sum(seen.values())} of {sum(end.values())} records of {topic}")
            for m in c.consume(num_messages=1000, timeout=1.0):
                if m.error():
                    continue
                if keep:
                    out.append((m.partition(), m.value() or b""))
                seen[m.partition()] = m.offset() + 1
    finally:
        c.close()
    return out


def _producer_config(bootstrap: str) -> dict[str, object]:
    """The job's facts producer (a Java KafkaProducer) in librdkafka's names: the same batching,
    acknowledgement and idempotence, so the broker sees requests of the same size and count."""
    linger = ARCHIVE_FACTS_PRODUCER["linger.ms"]
    batch = int(ARCHIVE_FACTS_PRODUCER["batch.size"])
    return {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": int(linger),
            "batch.size": batch, "message.max.bytes": max(batch + (1 << 16), 1_000_000)}


def measure(settings: Settings, groups: Callable[[], dict[str, list]], records: list[tuple[int, bytes]]
            ) -> BrokerCost:
    """Replay ``records`` (partition, value) into a scratch topic like the facts topic and read them
    back as the writer does; the broker's CPU over both."""
    k = settings.kafka
    scratch = f"{k.archive_facts_topic}.cost-{uuid.uuid4().hex[:6]}"
    (spec,) = [t for t in topic_specs(k) if t.topic == k.archive_facts_topic]
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers})
    admin.create_topics([NewTopic(scratch, num_partitions=spec.num_partitions,
                                  replication_factor=spec.replication_factor, config=spec.config)]
                        )[scratch].result(timeout=30)
    try:
        producer = Producer(_producer_config(k.bootstrap_servers))
        end: dict[int, int] = dict.fromkeys(range(spec.num_partitions), 0)
        t0 = time.monotonic()
        with cpu.StackSampler(groups) as sampler:
            for partition, value in records:
                while True:
                    try:
                        producer.produce(scratch, value, partition=partition % spec.num_partitions)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        producer.poll(0.05)
                end[partition % spec.num_partitions] += 1
            if producer.flush(120) != 0:
                raise RuntimeError("the facts replay did not flush")
            reader = {k2: v for k2, v in consumer_config(settings, f"facts-cost-{uuid.uuid4().hex[:6]}").items()
                      if k2 != "bootstrap.servers"}
            _consume(k.bootstrap_servers, scratch, end, reader, 300, keep=False)
        return BrokerCost(len(records), sum(len(v) for _, v in records), sampler.usage.cpu_s.get("kafka", 0.0),
                          time.monotonic() - t0)
    finally:
        admin.delete_topics([scratch])
