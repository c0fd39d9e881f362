"""Deliveries and their history facts for the archive's tests, built as the job builds them
(core/archive_facts.py from core records), with fixed times."""

from __future__ import annotations

from typing import Any

from core import archive_facts
from core.dispatch import AttemptRecord, Intent
from core.fanout import NewDelivery
from core.records import EventRecord, delivery_id_for

BAND_US = 365 * 24 * 3600 * 1_000_000  # operators/history_store.py's status band


def delivery(tenant: str, n: int, arrived_ms: int, endpoint: str = "ep-1") -> NewDelivery:
    e = EventRecord(event_id=f"evt_{tenant}_{n:04d}", tenant_id=tenant, event_type="invoice.paid",
                    schema_version="1", object_id=f"inv_{n}", object_version=n, occurred_at_ms=arrived_ms - 5,
                    payload=b'{"id": "inv_%d", "amount": %d}' % (n, n * 100))
    ep = f"{endpoint}-{tenant}"
    return NewDelivery(delivery_id=delivery_id_for(e.event_id, ep), event=e, endpoint_id=ep, tenant_id=tenant,
                       endpoint_config_version=2, created_at_ms=arrived_ms, expires_at_ms=arrived_ms + 86_400_000)


def attempt(number: int, at_ms: int, http: int, status: str | None, manual: bool = False) -> AttemptRecord:
    return AttemptRecord(
        intent=Intent(number, f"att-{number}-{at_ms}"), sent=True, started_at_ms=at_ms - 40, finished_at_ms=at_ms,
        http_status=http, outcome="succeeded" if http == 200 else "retry", error_class=None if http == 200 else
        "http_5xx", detail="", manual=manual, delivery_status=status,
        next_attempt_at_ms=at_ms + 5000 if status == "pending" else None, auto_retry_active=status == "pending",
        url="https://hooks.example.com/in", endpoint_config_version=2, latency_ms=40, signing_key_versions=(1,),
        requested_by="ops@example.com" if manual else "", request_id=f"rpl_{at_ms}" if manual else "")


_BAND = {"pending": 0, "failed": 1, "expired": 1, "succeeded": 2}


def history(d: NewDelivery, statuses: list[tuple[int, str]]) -> list[archive_facts.Fact]:
    """A delivery's facts: created (with its event), then one attempt per (http status, delivery
    status), a second apart."""
    facts = [archive_facts.created_fact(d, d.created_at_ms * 1000),
             archive_facts.event_fact(d.event, d.created_at_ms)]
    for i, (http, status) in enumerate(statuses, start=1):
        at = d.created_at_ms + i * 1000
        r = attempt(i, at, http, status)
        facts.append(archive_facts.attempt_fact(d, r, at * 1000 + BAND_US))
        facts.append(archive_facts.status_fact(d, r, i, at * 1000 + _BAND[status] * BAND_US))
    return facts


class Message:
    """A confluent-kafka message as the writer reads it."""

    def __init__(self, partition: int, offset: int, value: bytes, timestamp_ms: int = 0) -> None:
        self._p, self._o, self._v, self._t = partition, offset, value, timestamp_ms

    def error(self) -> None:
        return None

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def value(self) -> bytes:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (1, self._t)


class FakeConsumer:
    """Hands out queued messages; records commits, pauses and resumes."""

    def __init__(self, messages: list[Message]) -> None:
        self.queue = list(messages)
        self.commits: list[list[tuple[int, int]]] = []
        self.paused = False

    def consume(self, num_messages: int = 1, timeout: float = 0) -> list[Message]:
        if self.paused:
            return []
        out, self.queue = self.queue[:num_messages], self.queue[num_messages:]
        return out

    def poll(self, timeout: float = 0) -> Any:
        return None

    def assignment(self) -> list[int]:
        return [0, 1]

    def pause(self, partitions: Any) -> None:
        self.paused = True

    def resume(self, partitions: Any) -> None:
        self.paused = False

    def commit(self, offsets: Any, asynchronous: bool = True) -> None:
        self.commits.append(sorted((tp.partition, tp.offset) for tp in offsets))
