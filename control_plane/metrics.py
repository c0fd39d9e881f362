"""The control plane's Prometheus series, served on 127.0.0.1 by the standalone server.

- ``webhooks_cp_rpc_total{method, code}`` and ``webhooks_cp_rpc_seconds{method}``: every gRPC call
  by method and status code (methods are the API's fixed set; unknown methods are not counted).
- ``webhooks_cp_loop_last_success_timestamp_seconds{loop}`` and
  ``webhooks_cp_loop_failures_total{loop}``: the background loops (config clock, republisher,
  endpoint signals, reconciler). ``time() - ..{loop="config-clock"}`` is the publish lag the
  job's fan-out sees.
- ``webhooks_reconcile_gaps{kind}`` and ``webhooks_reconcile_runs_total``: the periodic
  reconciler's last report.

Series are process-wide (prometheus_client's default registry): tests that build several servers
in one process share them, and only the standalone server exposes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
from prometheus_client import Counter, Gauge, Histogram, start_http_server

RPCS = Counter("webhooks_cp_rpc", "gRPC calls by method and status code", ["method", "code"])
RPC_SECONDS = Histogram("webhooks_cp_rpc_seconds", "gRPC call duration", ["method"],
                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
# The HTTP API (control_plane.httpapi.server): by RPC ("-" when no route matched), and HTTP status.
HTTP_REQUESTS = Counter("webhooks_cp_http", "HTTP API requests by RPC and HTTP status", ["method", "status"])
HTTP_SECONDS = Histogram("webhooks_cp_http_seconds", "HTTP API request duration", ["method"],
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LOOP_OK = Gauge("webhooks_cp_loop_last_success_timestamp_seconds", "last successful step of a loop", ["loop"])
LOOP_FAILURES = Counter("webhooks_cp_loop_failures", "failed steps of a background loop", ["loop"])
RECONCILE_GAPS = Gauge("webhooks_reconcile_gaps", "gaps found by the last periodic reconciliation", ["kind"])
RECONCILE_RUNS = Counter("webhooks_reconcile_runs", "periodic reconciliations completed")


def serve(host: str, port: int) -> None:
    """Expose /metrics on host:port (a daemon thread)."""
    start_http_server(port, addr=host)


def http_request(method: str, status: int, seconds: float) -> None:
    HTTP_REQUESTS.labels(method, str(status)).inc()
    HTTP_SECONDS.labels(method).observe(seconds)


def loop_step(name: str, ok: bool) -> None:
    if ok:
        LOOP_OK.labels(name).set(time.time())
    else:
        LOOP_FAILURES.labels(name).inc()


def reconciled(gap_counts: Mapping[str, int]) -> None:
    for kind, n in gap_counts.items():
        RECONCILE_GAPS.labels(kind).set(n)
    RECONCILE_RUNS.inc()


def call_code(context: grpc.ServicerContext, failed: bool) -> str:
    """The status code name a call ended with (what abort()/set_code() set; OK or UNKNOWN else)."""
    code = context.code()  # set by abort()/set_code(); None when the handler just returned
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


class RpcMetrics(grpc.ServerInterceptor):
    """Counts and times every unary and server-streaming call by method and final status."""

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                start, failed = time.perf_counter(), True
                try:
                    out = inner(request, context)
                    failed = False
                    return out
                finally:
                    self._observe(method, call_code(context, failed), start)

            return grpc.unary_unary_rpc_method_handler(unary, handler.request_deserializer,
                                                       handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                start, failed = time.perf_counter(), True
                try:
                    yield from inner_stream(request, context)
                    failed = False
                finally:
                    self._observe(method, call_code(context, failed), start)

            return grpc.unary_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                        handler.response_serializer)
        return handler

    @staticmethod
    def _observe(method: str, code: str, start: float) -> None:
        RPCS.labels(method, code).inc()
        RPC_SECONDS.labels(method).observe(time.perf_counter() - start)
