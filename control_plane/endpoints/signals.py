"""Consume the dispatcher's endpoint signals (webhooks.endpoint-signals) and act on them.

A 410 disables the endpoint; with operational events wired (control_plane.endpoints.operational_events),
every signal also becomes the operational event it stands for, and failing / recovered drive
the auto-disable clock.

At-least-once: offsets are committed after the batch is applied, and applying a signal twice is
harmless (the disable is conditional on the config version the 410 was seen under; operational
events have ids derived from the signal, which fan-out dedupes). A signal whose
handling fails (Cassandra down) is never skipped: the consumer seeks back to it, so the next poll
starts there.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from control_plane.endpoints.service import EndpointService
from control_plane.errors import Unavailable
from core.records import EndpointSignal
from core.settings import KafkaSettings

log = logging.getLogger(__name__)


class SignalConsumer:
    def __init__(self, settings: KafkaSettings, endpoints: EndpointService, batch: int = 100,
                 on_signal: Callable[[EndpointSignal], None] | None = None) -> None:
        self._consumer = Consumer({
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.consumer_group}.control-plane-signals",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": settings.control_fetch_max_wait_ms,  # librdkafka's name (core.settings)
            **settings.librdkafka_failover(),
        })
        self._consumer.subscribe([settings.signals_topic])
        self._endpoints = endpoints
        self._batch = batch
        self._on_signal = on_signal

    def poll_once(self) -> int:
        """Apply what is waiting; returns how many signals were applied."""
        try:
            messages = self._consumer.consume(num_messages=self._batch, timeout=0.1)
        except KafkaException as exc:
            raise Unavailable(f"cannot read endpoint signals: {exc}") from exc
        applied = 0
        for m in messages:
            if m.error() is not None:
                log.warning("endpoint-signal consumer: %s", m.error())
                continue
            try:
                signal = EndpointSignal.from_json(m.value() or b"")
            except (ValueError, KeyError, TypeError) as exc:
                log.error("unreadable endpoint signal skipped: %s", exc)
                continue
            try:
                if self._on_signal is not None:
                    self._on_signal(signal)
                elif signal.signal == "gone":
                    changed = self._endpoints.disable_gone(signal)
                    if changed is not None:
                        log.warning("endpoint %s disabled: %s", signal.endpoint_id, signal.detail)
            except Exception:
                # Not applied: the consumer's position is already past it, so go back to it
                # (and keep what was applied before it); the next poll retries from here.
                self._consumer.seek(TopicPartition(m.topic(), m.partition(), m.offset()))
                self._commit_before(m)
                raise
            applied += 1
        if messages:
            self._consumer.commit(asynchronous=False)
        return applied

    def _commit_before(self, m: Message) -> None:
        if m.offset() > 0:
            with contextlib.suppress(KafkaException):  # best effort: re-applying is harmless
                self._consumer.commit(offsets=[TopicPartition(m.topic(), m.partition(), m.offset())],
                                      asynchronous=False)

    def close(self) -> None:
        self._consumer.close()
