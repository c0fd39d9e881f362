"""The spans of one delivery's trace, as values: names, ids, times, attributes, status.

Built here, exported elsewhere: a :class:`SpanSink` (the OpenTelemetry adapter,
``tracing.otlp``) turns each :class:`Span` into OTLP. Nothing here imports the SDK, so the core
stays pure and tracing that is off costs no import.

The trace of a delivery, and which process records each span::

    outbox write        PRODUCER  the producer (outbox.producer.write_event)
    └── fan-out         CONSUMER  the job: the event read from the events topic, matched
        ├── webhook attempt   CLIENT    the job: one span per HTTP request, its status
        └── webhook attempt   CLIENT    (a retry: a sibling, with its attempt number)

The receiver gets the attempt span's traceparent, so its own spans hang below the attempt. The
control plane's calls are spans of their own traces (``rpc_span``, ``http_span``), continuing a
traceparent the caller sent.

Attribute names follow OpenTelemetry's semantic conventions where one exists (``http.*``,
``rpc.*``, ``messaging.*``, ``error.type``); the platform's own are under ``webhooks.``. None holds
a URL, a payload or a header value: an endpoint's URL may carry a credential.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from core.trace_context import HeadSampler, RandomBits, Step, TraceContext, begin

if TYPE_CHECKING:  # values read, never built here: the producer library imports no more of the core
    from core.fanout import NewDelivery
    from core.outcomes import HttpResult
    from core.records import EventRecord

MS = 1_000_000  # ns per ms

AttributeValue = str | bool | int | float


class SpanKind(enum.Enum):
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"
    PRODUCER = "producer"
    CONSUMER = "consumer"


@dataclass(frozen=True, slots=True)
class Span:
    """One finished span. ``error``: the span's status is an error, for this reason (None: unset)."""

    name: str
    context: TraceContext
    parent_span_id: int | None
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    error: str | None = None


class SpanSink(Protocol):
    """Where finished spans go. Never blocks and never raises: a span that cannot be exported is
    dropped, never a delivery."""

    def export(self, span: Span) -> None: ...


@dataclass(frozen=True)
class Tracer:
    """What a traced process holds: where its spans go, how a trace starts, where ids come from.
    A process with tracing off holds none (``None``), and every traced step is one ``if`` away."""

    sink: SpanSink
    sampler: HeadSampler
    rng: RandomBits

    def begin(self, incoming: str | None) -> Step:
        """This process's step in the trace ``incoming`` names, or in a new one (trace_context.begin)."""
        return begin(incoming, self.sampler, self.rng)


# Span names: low cardinality, what a trace view lists.
OUTBOX_WRITE = "outbox write"
FAN_OUT = "fan-out"
ATTEMPT = "webhook attempt"


def outbox_span(ctx: TraceContext, parent_span_id: int | None, *, event_id: str, tenant_id: str, event_type: str,
                start_ns: int, end_ns: int) -> Span:
    """The producer's row in the outbox table, written in its transaction (the span ends at the
    insert: whether the transaction commits is the application's to say)."""
    return Span(OUTBOX_WRITE, ctx, parent_span_id, SpanKind.PRODUCER, start_ns, end_ns, {
        "db.system.name": "postgresql",
        "db.collection.name": "webhook_outbox",
        "webhooks.event.id": event_id,
        "webhooks.tenant.id": tenant_id,
        "webhooks.event.type": event_type,
    })


def fan_out_span(ctx: TraceContext, parent_span_id: int | None, *, event: EventRecord, topic: str, arrived_ms: int,
                 decided_ms: int, endpoints: int, skipped: int = 0, degraded: bool = False,
                 refused: str | None = None) -> Span:
    """From the event's arrival on the events topic (its Kafka time) to fan-out's decision: which
    endpoints get a delivery. ``refused``: the catalog refused the event (dead-lettered, none)."""
    return Span(FAN_OUT, ctx, parent_span_id, SpanKind.CONSUMER, arrived_ms * MS, max(arrived_ms, decided_ms) * MS, {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "webhooks.event.id": event.event_id,
        "webhooks.tenant.id": event.tenant_id,
        "webhooks.event.type": event.event_type,
        "webhooks.fanout.endpoints": endpoints,
        "webhooks.fanout.skipped": skipped,
        "webhooks.fanout.degraded": degraded,
    }, refused)


def attempt_span(ctx: TraceContext, parent_span_id: int | None, *, delivery: NewDelivery, attempt: int,
                 manual: bool, config_version: int, result: HttpResult, latency_ms: int, start_ns: int,
                 end_ns: int) -> Span:
    """One HTTP request of a delivery and what the receiver answered. An error unless 2xx: a
    redirect, a refusal and a failure to connect all leave the delivery undelivered."""
    attributes: dict[str, AttributeValue] = {
        "http.request.method": "POST",
        "webhooks.attempt.number": attempt,
        "webhooks.attempt.manual": manual,
        "webhooks.attempt.latency_ms": latency_ms,
        "webhooks.delivery.id": delivery.delivery_id,
        "webhooks.endpoint.id": delivery.endpoint_id,
        "webhooks.endpoint.config_version": config_version,
        "webhooks.tenant.id": delivery.tenant_id,
        "webhooks.event.id": delivery.event.event_id,
        "webhooks.event.type": delivery.event.event_type,
    }
    error: str | None = None
    if result.status is not None:
        attributes["http.response.status_code"] = result.status
        if not 200 <= result.status < 300:
            error = f"HTTP {result.status}"
            attributes["error.type"] = str(result.status)
    else:
        why = result.error.value if result.error is not None else "no response"
        error = f"{why}: {result.detail}" if result.detail else why
        attributes["error.type"] = why
    return Span(ATTEMPT, ctx, parent_span_id, SpanKind.CLIENT, start_ns, max(start_ns, end_ns), attributes, error)


def rpc_span(ctx: TraceContext, parent_span_id: int | None, *, service: str, method: str, code: str,
             code_number: int, start_ns: int, end_ns: int) -> Span:
    """One gRPC call the control plane served; an error unless its status is OK."""
    return Span(f"{service}/{method}", ctx, parent_span_id, SpanKind.SERVER, start_ns, max(start_ns, end_ns), {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": method,
        "rpc.grpc.status_code": code_number,
    }, None if code == "OK" else code)


def http_span(ctx: TraceContext, parent_span_id: int | None, *, method: str, route: str | None, status: int,
              start_ns: int, end_ns: int) -> Span:
    """One request the control plane's HTTP API served (``route``: the template it matched, None
    when none did). A server's error is its 5xx; a 4xx is the client's."""
    attributes: dict[str, AttributeValue] = {"http.request.method": method, "http.response.status_code": status}
    if route is not None:
        attributes["http.route"] = route
    error = None
    if status >= 500:
        error = f"HTTP {status}"
        attributes["error.type"] = str(status)
    return Span(f"{method} {route}" if route else method, ctx, parent_span_id, SpanKind.SERVER, start_ns,
                max(start_ns, end_ns), attributes, error)
