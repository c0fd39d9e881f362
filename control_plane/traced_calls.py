"""The control plane's calls as spans, when tracing is on: a gRPC server interceptor, and the
HTTP API's span per request (control_plane.httpapi.server calls :func:`http_request_span`).

A caller's ``traceparent`` (gRPC metadata, or the HTTP header) is honoured: the call is its child
span and keeps its sampled decision; without one the call starts a head-sampled trace of its own.
Health checks and reflection are not traced: probes every second would crowd out the calls.
With tracing off neither is installed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from control_plane.metrics import call_code
from core import spans
from core.trace_context import HEADER

UNTRACED_SERVICES = frozenset({"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                               "grpc.reflection.v1.ServerReflection"})


def _code_number(name: str) -> int:
    code = grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNKNOWN)
    return int(code.value[0])


def _incoming(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == HEADER:  # gRPC metadata keys are lower case
            return str(value)
    return None


class RpcTracing(grpc.ServerInterceptor):
    """One server span per unary and server-streaming call, with its final status code."""

    def __init__(self, tracer: spans.Tracer) -> None:
        self._tracer = tracer

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        service, _, method = details.method.lstrip("/").rpartition("/")
        if service in UNTRACED_SERVICES:
            return handler
        incoming = _incoming(details.invocation_metadata)
        tracer = self._tracer

        def export(step: Any, context: grpc.ServicerContext, failed: bool, start_ns: int) -> None:
            code = call_code(context, failed)
            tracer.sink.export(spans.rpc_span(step.span, step.parent_span_id, service=service, method=method,
                                              code=code, code_number=_code_number(code), start_ns=start_ns,
                                              end_ns=time.time_ns()))

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                step, start_ns, failed = tracer.begin(incoming), time.time_ns(), True
                try:
                    out = inner(request, context)
                    failed = False
                    return out
                finally:
                    if step.span is not None:
                        export(step, context, failed, start_ns)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                step, start_ns, failed = tracer.begin(incoming), time.time_ns(), True
                try:
                    yield from inner_stream(request, context)
                    failed = False
                finally:
                    if step.span is not None:
                        export(step, context, failed, start_ns)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler


def http_request_span(tracer: spans.Tracer, incoming: str | None, method: str, route: str | None, status: int,
                      start_ns: int) -> None:
    """The HTTP API's span of one request it answered (started at ``start_ns``)."""
    step = tracer.begin(incoming)
    if step.span is not None:
        tracer.sink.export(spans.http_span(step.span, step.parent_span_id, method=method, route=route,
                                           status=status, start_ns=start_ns, end_ns=time.time_ns()))
