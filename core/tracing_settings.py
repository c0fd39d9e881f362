"""Settings of distributed tracing (docs/operating.md, tracing): ``Settings.tracing``, env
``WEBHOOKS_TRACING__<FIELD>``.

In a module of its own for the reason ArchiveSettings is: a TaskManager still running an earlier
job's Python modules unpickles the settings of a new job through this module, not through an
older copy of core.settings.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator


class TracingSettings(BaseModel):
    """One trace per delivery: W3C trace context from the outbox to the receiver, spans by OTLP."""

    # Off: no span is built, the OpenTelemetry SDK is never imported, and a traceparent an event
    # carries is passed on to its receivers unchanged (docs/operating.md, tracing).
    enabled: bool = False
    # Head sampling where a trace starts (the outbox library, or fan-out for an event that came
    # without a traceparent): the share of traces recorded, decided from the trace id as
    # OpenTelemetry's TraceIdRatioBased does, so every process decides alike. A traceparent's own
    # sampled flag is honoured wherever one is given.
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    # OTLP over HTTP (protobuf): spans go to <otlp_endpoint>/v1/traces. The local stack's Jaeger
    # listens here (stack/jaeger.sh).
    otlp_endpoint: str = "http://127.0.0.1:4318"
    # How long a finished span may wait in memory before its batch is sent, and how many wait at
    # most (past that, new spans are dropped rather than slowing a delivery down).
    export_delay_ms: int = Field(default=1000, ge=10)
    max_queued_spans: int = Field(default=8192, ge=64)
    # Where people look at traces: `webhookctl events publish` prints <ui_url>/trace/<trace id>.
    ui_url: str = "http://127.0.0.1:16686"
    # service.name of each kind of process, as trace backends group spans.
    job_service_name: str = "webhooks-delivery"
    control_plane_service_name: str = "webhooks-control-plane"
    producer_service_name: str = "webhooks-producer"

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"tracing.otlp_endpoint must be an http:// or https:// URL, got {v!r}")
        return v.rstrip("/")

    @property
    def traces_url(self) -> str:
        """Where OTLP/HTTP spans are posted."""
        return f"{self.otlp_endpoint}/v1/traces"
