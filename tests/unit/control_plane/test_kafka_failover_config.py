"""After a broker dies, the control plane's Kafka clients find its partitions on their new leaders
as fast as the settings say (core.settings.KafkaSettings.reconnect_backoff_max_ms and
metadata_refresh_ms): the publisher carries the config clock's ticks, which held events wait for,
so librdkafka's own 10 s reconnect ceiling and 5 min metadata refresh must not apply to it."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.endpoints import signals
from control_plane.publishing import publisher
from core.settings import KafkaSettings


class _Recorder:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def subscribe(self, topics: list[str]) -> None:
        self.topics = topics

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0


def test_the_defaults_look_for_a_new_leader_every_second_and_refresh_every_five():
    k = KafkaSettings()
    assert k.librdkafka_failover() == {"reconnect.backoff.max.ms": 1000, "topic.metadata.refresh.interval.ms": 5000}
    # The Java clients ask for metadata on every failed connection: no periodic refresh for them.
    assert k.java_failover() == {"reconnect.backoff.max.ms": "1000"}


@pytest.mark.parametrize(("backoff", "refresh"), [(1000, 5000), (250, 2000)])
def test_the_publisher_and_the_signal_consumer_take_them_from_the_settings(monkeypatch, backoff, refresh):
    monkeypatch.setattr(publisher, "Producer", _Recorder)
    monkeypatch.setattr(signals, "Consumer", _Recorder)
    k = KafkaSettings(reconnect_backoff_max_ms=backoff, metadata_refresh_ms=refresh)
    pub = publisher.KafkaPublisher(k)
    try:
        consumer = signals.SignalConsumer(k, endpoints=None)  # type: ignore[arg-type]
        for config in (pub._producer.config, consumer._consumer.config):  # type: ignore[attr-defined]
            assert config["reconnect.backoff.max.ms"] == backoff
            assert config["topic.metadata.refresh.interval.ms"] == refresh
    finally:
        pub.close()


def test_an_extra_config_still_wins_over_them(monkeypatch):
    monkeypatch.setattr(publisher, "Producer", _Recorder)
    pub = publisher.KafkaPublisher(KafkaSettings(), extra_config={"reconnect.backoff.max.ms": 42})
    try:
        assert pub._producer.config["reconnect.backoff.max.ms"] == 42  # type: ignore[attr-defined]
    finally:
        pub.close()


@pytest.mark.parametrize("field", ["reconnect_backoff_max_ms", "metadata_refresh_ms"])
def test_values_too_small_to_be_meant_are_refused(field):
    with pytest.raises(ValueError, match=field):
        KafkaSettings(**{field: 10})
