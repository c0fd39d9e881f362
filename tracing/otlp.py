"""The OpenTelemetry SDK behind :class:`core.spans.SpanSink`: spans the core built, exported by OTLP
over HTTP (protobuf) through a BatchSpanProcessor. The only module that imports the SDK, and only
:func:`tracing.tracer` imports it, when tracing is on.

The core decides every id, time and attribute (the attempt's span id is already in the request's
``traceparent`` when the span is exported), so spans are handed to the processor finished, as
``ReadableSpan``: no SDK tracer, sampler or context is involved.

One sink per process and configuration: a TaskManager's Python interpreter runs every fan-out and
dispatcher subtask of every job it holds, and they share one batch queue and one export thread.
The queue is bounded (``tracing.max_queued_spans``): when the backend is slow or down, spans are
dropped -- a delivery is never slowed for one. At the process's exit the queue is flushed.
"""

from __future__ import annotations

import atexit
import logging
import threading

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace import SpanKind as OtelKind

from core.spans import Span, SpanKind
from core.tracing_settings import TracingSettings

log = logging.getLogger(__name__)

SCOPE = InstrumentationScope("webhooks-platform")
_KINDS = {SpanKind.INTERNAL: OtelKind.INTERNAL, SpanKind.SERVER: OtelKind.SERVER, SpanKind.CLIENT: OtelKind.CLIENT,
          SpanKind.PRODUCER: OtelKind.PRODUCER, SpanKind.CONSUMER: OtelKind.CONSUMER}
# Only sampled spans are ever built (core.trace_context.begin).
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)
# Requests to the collector: a batch that cannot be sent within this is dropped.
EXPORT_TIMEOUT_S = 10


def readable(span: Span, resource: Resource) -> ReadableSpan:
    """The SDK's form of a finished span."""
    ctx = span.context
    parent = (None if span.parent_span_id is None
              else SpanContext(ctx.trace_id, span.parent_span_id, is_remote=True, trace_flags=_SAMPLED))
    return ReadableSpan(
        name=span.name,
        context=SpanContext(ctx.trace_id, ctx.span_id, is_remote=False, trace_flags=_SAMPLED),
        parent=parent,
        resource=resource,
        attributes=span.attributes,
        kind=_KINDS[span.kind],
        status=_UNSET if span.error is None else Status(StatusCode.ERROR, span.error),
        start_time=span.start_ns,
        end_time=span.end_ns,
        instrumentation_scope=SCOPE,
    )


class OtlpSpans:
    """A :class:`core.spans.SpanSink`: a bounded queue, batches sent by OTLP/HTTP from a thread."""

    def __init__(self, settings: TracingSettings, service_name: str, exporter: SpanExporter | None = None) -> None:
        self.service_name = service_name
        self._resource = Resource.create({"service.name": service_name})
        self._processor = BatchSpanProcessor(
            exporter or OTLPSpanExporter(endpoint=settings.traces_url, timeout=EXPORT_TIMEOUT_S),
            max_queue_size=settings.max_queued_spans,
            schedule_delay_millis=settings.export_delay_ms,
            max_export_batch_size=min(512, settings.max_queued_spans))
        self._failed = False

    def export(self, span: Span) -> None:
        try:
            self._processor.on_end(readable(span, self._resource))
        except Exception:  # noqa: BLE001 -- a span is never worth a delivery; said once
            if not self._failed:
                self._failed = True
                log.exception("a span of %s could not be queued for export (said once)", self.service_name)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Send what is queued now; False if it did not all go within ``timeout_s``."""
        return bool(self._processor.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        self._processor.shutdown()


_SINKS: dict[tuple[str, str, int, int], OtlpSpans] = {}
_LOCK = threading.Lock()


def sink(settings: TracingSettings, service_name: str) -> OtlpSpans:
    """This process's sink for ``service_name`` (made on first use, shared after)."""
    key = (settings.traces_url, service_name, settings.export_delay_ms, settings.max_queued_spans)
    with _LOCK:
        found = _SINKS.get(key)
        if found is None:
            if not _SINKS:
                atexit.register(shutdown_all)
            found = _SINKS[key] = OtlpSpans(settings, service_name)
            log.info("tracing on: %s spans to %s (OTLP/HTTP)", service_name, settings.traces_url)
        return found


def shutdown_all() -> None:
    """Flush and stop every sink of this process (at exit: a CLI's spans are not lost)."""
    with _LOCK:
        sinks = list(_SINKS.values())
        _SINKS.clear()
    for s in sinks:
        s.shutdown()
