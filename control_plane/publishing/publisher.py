"""Kafka output of the control plane: endpoint configs, the config clock, replays, test events.

Every publish blocks until the broker's delivery report (or a timeout) so the caller knows the
record is durable before it records "published"; a failure is a :class:`PublishError`, never a
silent drop. The producer is idempotent with acks=all, so its own retries neither duplicate nor
reorder records within a partition, which keeps each config ahead of the clock that follows it.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from core.records import CLOCK_KEY, ConfigClock, EndpointConfig, EventRecord, RedriveRequest, ReplayRequest
from core.settings import KafkaSettings

log = logging.getLogger(__name__)


class PublishError(Exception):
    """The record was not confirmed by Kafka (it may still arrive later)."""


class Publisher(Protocol):
    def publish_config(self, config: EndpointConfig) -> None: ...
    def publish_clock(self, clock: ConfigClock) -> None: ...
    def publish_replay(self, request: ReplayRequest) -> None: ...
    def publish_event(self, event: EventRecord) -> None: ...
    def publish_redrive(self, request: RedriveRequest) -> None: ...
    def close(self) -> None: ...


class KafkaPublisher:
    def __init__(
        self,
        settings: KafkaSettings,
        delivery_timeout_s: float = 10.0,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self._topics = settings
        self._timeout_s = delivery_timeout_s
        self._producer = Producer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "enable.idempotence": True,
                "acks": "all",
                # Clock ticks are what held events wait for: every millisecond here is one of
                # first-attempt latency. Nothing to batch at ~20 small records/s.
                "linger.ms": 0,
                "socket.nagle.disable": True,
                # librdkafka gives up (and reports an error) before our caller stops waiting.
                "message.timeout.ms": int(delivery_timeout_s * 1000 * 0.9),
                # After a broker dies, ticks wait for the new leader: look for it every second.
                **settings.librdkafka_failover(),
                **(extra_config or {}),
            }
        )
        self._stop = threading.Event()
        # Delivery reports are served by poll(); one thread does it for every caller.
        self._poller = threading.Thread(target=self._poll, name="kafka-publisher-poll", daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.1)

    def _send(self, topic: str, key: str, value: bytes) -> None:
        done: Future[None] = Future()

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(PublishError(f"{topic}: {err.str()}"))

        try:
            self._producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
        except (BufferError, KafkaException) as exc:
            raise PublishError(f"{topic}: {exc}") from exc
        try:
            done.result(timeout=self._timeout_s)
        except FutureTimeout:
            raise PublishError(f"{topic}: no delivery report within {self._timeout_s:g} s") from None

    def publish_config(self, config: EndpointConfig) -> None:
        self._send(self._topics.endpoints_topic, config.endpoint_id, config.to_json())

    def publish_clock(self, clock: ConfigClock) -> None:
        self._send(self._topics.endpoints_topic, CLOCK_KEY, clock.to_json())

    def publish_replay(self, request: ReplayRequest) -> None:
        self._send(self._topics.replays_topic, request.delivery_id, request.to_json())

    def publish_event(self, event: EventRecord) -> None:
        self._send(self._topics.events_topic, event.event_id, event.to_json())

    def publish_redrive(self, request: RedriveRequest) -> None:
        # The replays topic: keyed into the dispatcher by endpoint, like a manual replay.
        self._send(self._topics.replays_topic, request.delivery_id, request.to_json())

    def close(self) -> None:
        self._stop.set()
        self._poller.join(timeout=5)
        remaining = self._producer.flush(self._timeout_s)
        if remaining:
            log.warning("kafka publisher closed with %d records unconfirmed", remaining)
