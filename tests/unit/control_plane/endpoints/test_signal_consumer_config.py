"""The control plane's endpoint-signal consumer long-polls the broker: an idle consumer asks once
per ``kafka.control_fetch_max_wait_ms``, not Kafka's default two times a second (the broker answers at
once when a signal is there, so it costs no latency)."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.endpoints import signals
from core.settings import KafkaSettings


class _Recorder:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def subscribe(self, topics: list[str]) -> None:
        self.topics = topics


@pytest.mark.parametrize("wait_ms", [KafkaSettings().control_fetch_max_wait_ms, 1234])
def test_the_signal_consumer_waits_at_the_broker_as_long_as_the_settings_say(monkeypatch, wait_ms):
    monkeypatch.setattr(signals, "Consumer", _Recorder)
    consumer = signals.SignalConsumer(KafkaSettings(control_fetch_max_wait_ms=wait_ms), endpoints=None)  # type: ignore[arg-type]
    assert consumer._consumer.config["fetch.wait.max.ms"] == wait_ms


def test_the_default_wait_is_five_seconds_not_kafkas_half_second():
    assert KafkaSettings().control_fetch_max_wait_ms == 5000
