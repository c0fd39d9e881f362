"""The Kafka Connect worker's rendered properties (stack/connect_config.py): its producer (the
outbox relay's, Debezium's records to the events topic) carries the platform clients' reconnect
back-off (and, like every Java client of the platform, no periodic metadata refresh), and the
connector's file carries none of them."""

from __future__ import annotations

from pathlib import Path

from core.settings import KafkaSettings, Settings
from stack.connect_config import render


def _props(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def test_the_relays_producer_takes_the_clients_failover_settings(tmp_path: Path):
    settings = Settings(kafka=KafkaSettings(reconnect_backoff_max_ms=700, metadata_refresh_ms=3000))
    render(settings, tmp_path, flush_ms=1000)
    worker = _props(tmp_path / "worker.properties")
    assert worker["producer.reconnect.backoff.max.ms"] == "700"
    assert "producer.metadata.max.age.ms" not in worker  # Kafka's 5 min: a Java client refreshes on a failed connection
    assert worker["producer.acks"] == "all"  # the template's own lines are kept
    assert not any(k.startswith("producer.") for k in _props(tmp_path / "outbox-connector.properties"))
