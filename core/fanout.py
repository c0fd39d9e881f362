"""Fan-out: which endpoints an event goes to, and when it is safe to decide.

Matching: an event goes to every *active* endpoint of its tenant whose event-type filter accepts
its type. A filter entry is an exact type (``invoice.paid``), a prefix wildcard (``invoice.*``
matches ``invoice.paid`` and ``invoice.line.added`` but not ``invoice``), or ``*`` for all types.

Timing ("config at event time"): endpoint configs and events travel on different topics, so the
job can see an event before the config of an endpoint created just before it. The control plane
publishes a :class:`core.records.ConfigClock` heartbeat on the single-partition endpoints topic;
once the job has read a clock at or after the moment an event arrived, every config published
before that moment has been read too. Until then the event waits (it is held, never dropped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core.records import EndpointConfig, EndpointStatus, EventRecord, delivery_id_for


def filter_accepts(filters: Iterable[str], event_type: str) -> bool:
    for f in filters:
        if f == "*" or f == event_type:
            return True
        if f.endswith(".*") and event_type.startswith(f[:-1]) and len(event_type) > len(f) - 1:
            return True
    return False


def select_endpoints(event: EventRecord, configs: Iterable[EndpointConfig]) -> list[EndpointConfig]:
    """The endpoints this event goes to, in a stable order (by endpoint_id)."""
    chosen = []
    for c in configs:
        if c.tenant_id != event.tenant_id or c.status is not EndpointStatus.ACTIVE:
            continue
        if event.target_endpoint_id is not None:
            if c.endpoint_id == event.target_endpoint_id:
                chosen.append(c)
        elif filter_accepts(c.event_types, event.event_type):
            chosen.append(c)
    return sorted(chosen, key=lambda c: c.endpoint_id)


def newer(current: EndpointConfig | None, incoming: EndpointConfig) -> bool:
    """Configs can be re-published (republisher, replays of the topic): keep the highest version."""
    return current is None or incoming.config_version >= current.config_version


def clock_passed(clock_ms: int | None, arrived_at_ms: int) -> bool:
    return clock_ms is not None and clock_ms >= arrived_at_ms


@dataclass(frozen=True)
class NewDelivery:
    """One logical delivery, created once per (event, endpoint) by fan-out."""

    delivery_id: str
    event: EventRecord
    endpoint_id: str
    tenant_id: str
    endpoint_config_version: int
    created_at_ms: int
    expires_at_ms: int


def deliveries_for(
    event: EventRecord, endpoints: list[EndpointConfig], created_at_ms: int, deadline_ms: int
) -> list[NewDelivery]:
    """created_at is the event's arrival time on the CDC topic (its Kafka timestamp), so a
    re-processed record yields identical delivery rows, deadline included."""
    return [
        NewDelivery(
            delivery_id=delivery_id_for(event.event_id, c.endpoint_id),
            event=event,
            endpoint_id=c.endpoint_id,
            tenant_id=c.tenant_id,
            endpoint_config_version=c.config_version,
            created_at_ms=created_at_ms,
            expires_at_ms=created_at_ms + deadline_ms,
        )
        for c in endpoints
    ]
