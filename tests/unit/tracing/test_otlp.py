"""tracing/otlp.py: the core's spans handed to the OpenTelemetry SDK as they were built (ids,
parent, kind, times, status, attributes, the service), and encoded as OTLP; one sink per process
and configuration; a span that cannot be queued is dropped, never raised."""

from __future__ import annotations

from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind as OtelKind
from opentelemetry.trace import StatusCode

from core.spans import Span, SpanKind
from core.trace_context import TraceContext
from core.tracing_settings import TracingSettings
from tracing import otlp, tracer

CTX = TraceContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x1111, True)
PARENT = 0x00F067AA0BA902B7


def _span(error: str | None = None, parent: int | None = PARENT) -> Span:
    return Span("webhook attempt", CTX, parent, SpanKind.CLIENT, 1_000, 2_000,
                {"http.response.status_code": 503, "webhooks.delivery.id": "dlv_1"}, error)


def _sink() -> tuple[otlp.OtlpSpans, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return otlp.OtlpSpans(TracingSettings(enabled=True, export_delay_ms=10), "webhooks-test", exporter), exporter


def test_a_span_reaches_the_exporter_as_the_core_built_it() -> None:
    sink, exporter = _sink()
    sink.export(_span(error="HTTP 503"))
    assert sink.flush()
    (got,) = exporter.get_finished_spans()
    assert (got.context.trace_id, got.context.span_id, got.context.trace_flags.sampled) == (
        CTX.trace_id, CTX.span_id, True)
    assert got.parent is not None and got.parent.span_id == PARENT and got.parent.trace_id == CTX.trace_id
    assert (got.name, got.kind, got.start_time, got.end_time) == ("webhook attempt", OtelKind.CLIENT, 1_000, 2_000)
    assert got.status.status_code is StatusCode.ERROR and got.status.description == "HTTP 503"
    assert dict(got.attributes or {}) == {"http.response.status_code": 503, "webhooks.delivery.id": "dlv_1"}
    assert got.resource.attributes["service.name"] == "webhooks-test"
    sink.shutdown()


def test_a_root_has_no_parent_and_no_error_leaves_the_status_unset() -> None:
    sink, exporter = _sink()
    sink.export(_span(parent=None))
    sink.flush()
    (got,) = exporter.get_finished_spans()
    assert got.parent is None and got.status.status_code is StatusCode.UNSET
    sink.shutdown()


def test_the_sdks_form_encodes_as_otlp() -> None:
    from opentelemetry.sdk.resources import Resource

    request = encode_spans([otlp.readable(_span(), Resource.create({"service.name": "s"}))])
    (span,) = request.resource_spans[0].scope_spans[0].spans
    assert span.trace_id == CTX.trace_id.to_bytes(16, "big")
    assert span.span_id == CTX.span_id.to_bytes(8, "big")
    assert span.parent_span_id == PARENT.to_bytes(8, "big")


def test_a_span_that_cannot_be_queued_is_dropped_not_raised(caplog: Any) -> None:
    sink, _ = _sink()
    sink.shutdown()  # a processor that is shut down refuses spans
    sink._processor = None  # type: ignore[assignment]  # and one that is gone raises inside
    sink.export(_span())
    sink.export(_span())
    assert sum("could not be queued" in r.message for r in caplog.records) == 1  # said once


def test_one_sink_per_process_and_configuration() -> None:
    on = TracingSettings(enabled=True, otlp_endpoint="http://127.0.0.1:9")  # nothing listens: never flushed here
    a = tracer(on, "svc-a")
    b = tracer(on, "svc-a")
    c = tracer(on, "svc-b")
    assert a is not None and b is not None and c is not None
    assert a.sink is b.sink and a.sink is not c.sink
    assert tracer(TracingSettings(), "svc-a") is None
