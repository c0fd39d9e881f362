"""control_plane/traced_calls.py: each gRPC call and HTTP API request a span, continuing the
caller's traceparent; health checks untraced."""

from __future__ import annotations

import contextlib
import random
from collections import namedtuple
from typing import Any

import grpc
import pytest

from control_plane.traced_calls import RpcTracing, http_request_span
from core.spans import Span, SpanKind, Tracer
from core.trace_context import HeadSampler, parse

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
Details = namedtuple("Details", "method invocation_metadata")


class MemorySpans:
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def export(self, span: Span) -> None:
        self.spans.append(span)


class Context:
    def __init__(self, code: grpc.StatusCode | None = None) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code


def _call(method: str, metadata: tuple[tuple[str, str], ...], behaviour: Any, context: Context,
          ratio: float = 1.0) -> list[Span]:
    spans = MemorySpans()
    interceptor = RpcTracing(Tracer(spans, HeadSampler(ratio), random.Random(2)))
    handler = interceptor.intercept_service(lambda _d: grpc.unary_unary_rpc_method_handler(behaviour),
                                            Details(method, metadata))
    with contextlib.suppress(RuntimeError):  # a failing call raises on, its span exported
        handler.unary_unary("request", context)
    return spans.spans


def test_a_call_continues_the_callers_trace_with_its_status() -> None:
    (span,) = _call("/webhooks.v1.ControlPlane/GetEndpoint", (("traceparent", TRACEPARENT),), lambda r, c: "answer",
                    Context(), ratio=0.0)
    caller = parse(TRACEPARENT)
    assert span.context.trace_id == caller.trace_id and span.parent_span_id == caller.span_id
    assert (span.name, span.kind, span.error) == ("webhooks.v1.ControlPlane/GetEndpoint", SpanKind.SERVER, None)
    assert span.attributes["rpc.grpc.status_code"] == 0


@pytest.mark.parametrize(("context", "error", "number"), [
    (Context(grpc.StatusCode.NOT_FOUND), "NOT_FOUND", 5),
    (Context(), "UNKNOWN", 2),  # raised without a status
])
def test_a_failed_call_is_an_error_span(context: Context, error: str, number: int) -> None:
    def fail(_r: Any, _c: Any) -> None:
        raise RuntimeError("boom")

    (span,) = _call("/webhooks.v1.Admin/CreateTenant", (), fail, context)
    assert span.error == error and span.attributes["rpc.grpc.status_code"] == number
    assert span.parent_span_id is None  # no caller's trace: a root


def test_health_checks_are_not_traced_and_unsampled_calls_record_nothing() -> None:
    assert _call("/grpc.health.v1.Health/Check", (), lambda r, c: "ok", Context()) == []
    assert _call("/webhooks.v1.ControlPlane/ListEndpoints", (), lambda r, c: "ok", Context(), ratio=0.0) == []


def test_an_http_request_is_a_server_span_named_by_its_route() -> None:
    spans = MemorySpans()
    http_request_span(Tracer(spans, HeadSampler(1.0), random.Random(2)), TRACEPARENT, "POST", "/v1/webhook-endpoints",
                      201, start_ns=1)
    (span,) = spans.spans
    assert span.name == "POST /v1/webhook-endpoints" and span.parent_span_id == parse(TRACEPARENT).span_id
    assert span.attributes["http.route"] == "/v1/webhook-endpoints" and span.error is None
