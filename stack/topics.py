"""Create the platform's Kafka topics (idempotent), or check that the broker answers.

`python -m stack.topics --check [--brokers N]` exits 0 once the broker serves metadata (naming N
brokers); without --check it creates the topics named in the settings, at the settings'
replication factor and min.insync.replicas. webhooks.endpoints is compacted (latest config per
endpoint) and single-partition, so the config clock heartbeat orders after every config
published before it. Tests and the benchmark create their own per-run topics with the same specs.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import AdminClient, NewTopic

from core.settings import KafkaSettings, load_settings


def topic_specs(k: KafkaSettings) -> list[NewTopic]:
    rf = k.replication_factor
    # Every topic: an acks=all write is answered once this many replicas have it (the cluster
    # topology: 2 of 3, so one broker down loses nothing acknowledged and writes go on).
    durable = {"min.insync.replicas": str(k.min_insync_replicas)}
    return [
        # The broker stamps each event's arrival (LogAppendTime): fan-out compares it with the
        # config clock, and a delivery's deadline counts from it -- the producers' clocks
        # (CreateTime, any application host's) decide neither. Set it on real clusters too.
        NewTopic(k.events_topic, num_partitions=k.partitions, replication_factor=rf,
                 config={**durable, "message.timestamp.type": "LogAppendTime"}),
        NewTopic(
            k.endpoints_topic,
            num_partitions=1,
            replication_factor=rf,
            config={**durable, "cleanup.policy": "compact", "min.compaction.lag.ms": "60000",
                    "segment.ms": "3600000"},
        ),
        NewTopic(k.replays_topic, num_partitions=k.partitions, replication_factor=rf, config=durable),
        NewTopic(k.signals_topic, num_partitions=1, replication_factor=rf, config=durable),
        NewTopic(k.dlq_topic, num_partitions=1, replication_factor=rf,
                 config={**durable, "retention.ms": str(30 * 24 * 3600 * 1000)}),
        # The archive's source of truth until the writer commits (docs/archive.md): kept at
        # least as long as the hot rows (archive.hot_ttl_s, checked by the settings), so an
        # archive outage within that budget loses nothing.
        NewTopic(k.archive_facts_topic, num_partitions=k.partitions, replication_factor=rf,
                 config={**durable, "retention.ms": str(k.archive_facts_retention_ms)}),
    ]


def create_topics(k: KafkaSettings) -> list[str]:
    """Create whichever of the settings' topics are missing; returns the names created."""
    admin = AdminClient({"bootstrap.servers": k.bootstrap_servers, "socket.timeout.ms": 3000})
    existing = set(admin.list_topics(timeout=10).topics)
    wanted = [t for t in topic_specs(k) if t.topic not in existing]
    created = []
    for topic, fut in (admin.create_topics(wanted, operation_timeout=30) if wanted else {}).items():
        try:
            fut.result()
            created.append(topic)
        except Exception as exc:  # created meanwhile by someone else is fine; anything else is not
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    return created


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", default=load_settings().kafka.bootstrap_servers)
    p.add_argument("--check", action="store_true")
    p.add_argument("--brokers", type=int, default=1, help="with --check: how many brokers must answer")
    args = p.parse_args()
    if args.check:
        admin = AdminClient({"bootstrap.servers": args.bootstrap, "socket.timeout.ms": 3000})
        return 0 if len(admin.list_topics(timeout=3).brokers) >= args.brokers else 1
    try:
        for topic in create_topics(load_settings().kafka):
            print(f"created topic {topic}")
    except Exception as exc:
        print(f"could not create topics: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
