"""Create the platform's Kafka topics (idempotent), or check that the broker answers.

`python -m stack.topics --check` exits 0 once the broker serves metadata; without --check it
creates the topics named in the settings. webhooks.endpoints is compacted (latest config per
endpoint) and single-partition, so the config clock heartbeat orders after every config
published before it.
"""

from __future__ import annotations

import argparse
import sys

from confluent_kafka.admin import AdminClient, NewTopic

from core.settings import load_settings


def topic_specs(partitions: int) -> list[NewTopic]:
    s = load_settings().kafka
    return [
        NewTopic(s.events_topic, num_partitions=partitions, replication_factor=1),
        NewTopic(
            s.endpoints_topic,
            num_partitions=1,
            replication_factor=1,
            config={"cleanup.policy": "compact", "min.compaction.lag.ms": "60000",
                    "segment.ms": "3600000"},
        ),
        NewTopic(s.replays_topic, num_partitions=partitions, replication_factor=1),
        NewTopic(s.signals_topic, num_partitions=1, replication_factor=1),
        NewTopic(s.dlq_topic, num_partitions=1, replication_factor=1,
                 config={"retention.ms": str(30 * 24 * 3600 * 1000)}),
    ]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", default=load_settings().kafka.bootstrap_servers)
    p.add_argument("--check", action="store_true")
    args = p.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap, "socket.timeout.ms": 3000})
    md = admin.list_topics(timeout=3)
    if args.check:
        return 0 if md.brokers else 1
    existing = set(md.topics)
    wanted = [t for t in topic_specs(load_settings().kafka.partitions) if t.topic not in existing]
    for topic, fut in admin.create_topics(wanted, operation_timeout=30).items() if wanted else []:
        try:
            fut.result()
            print(f"created topic {topic}")
        except Exception as exc:  # already exists after a race is fine; anything else is not
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                print(f"could not create topic {topic}: {exc}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
