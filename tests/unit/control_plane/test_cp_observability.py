"""control_plane/metrics.py's interceptor on a real in-process gRPC server, and the rendering of
`webhookctl stats` (control_plane/history/stats.py)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from control_plane import metrics
from control_plane.history.stats import JobHealth, render


def _ok(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _missing(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
    raise AssertionError("abort returns by raising")


def _crash(request: bytes, context: grpc.ServicerContext) -> bytes:
    raise RuntimeError("a bug")


def _stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
    yield b"1"
    yield b"2"


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[metrics.RpcMetrics()])
    handlers = {"Ok": grpc.unary_unary_rpc_method_handler(_ok),
                "Missing": grpc.unary_unary_rpc_method_handler(_missing),
                "Crash": grpc.unary_unary_rpc_method_handler(_crash),
                "Stream": grpc.unary_stream_rpc_method_handler(_stream)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Svc", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    server.stop(0)


def _count(method: str, code: str) -> float:
    return metrics.RPCS.labels(method, code)._value.get()


CALLS = [
    # method, kind, status code counted
    ("Ok", "unary", "OK"),
    ("Missing", "unary", "NOT_FOUND"),
    ("Crash", "unary", "UNKNOWN"),
    ("Stream", "stream", "OK"),
]


@pytest.mark.parametrize(("method", "kind", "code"), CALLS)
def test_each_call_is_counted_with_its_final_status(channel: grpc.Channel, method: str, kind: str, code: str) -> None:
    before = _count(method, code)
    seconds_before = metrics.RPC_SECONDS.labels(method)._sum.get()
    call: Any = (channel.unary_unary if kind == "unary" else channel.unary_stream)(f"/test.Svc/{method}")
    try:
        out = call(b"x", timeout=5)
        if kind == "stream":
            assert list(out) == [b"1", b"2"]
    except grpc.RpcError as err:
        assert err.code().name == code  # type: ignore[attr-defined]
    assert _count(method, code) == before + 1
    assert metrics.RPC_SECONDS.labels(method)._sum.get() > seconds_before


def test_loops_and_reconciliation_set_their_series() -> None:
    metrics.loop_step("config-clock", ok=True)
    metrics.loop_step("config-clock", ok=False)
    assert metrics.LOOP_OK.labels("config-clock")._value.get() > 0
    assert metrics.LOOP_FAILURES.labels("config-clock")._value.get() >= 1
    metrics.reconciled({"missing_delivery": 2, "orphaned": 0})
    assert metrics.RECONCILE_GAPS.labels("missing_delivery")._value.get() == 2


def test_stats_render_one_block_per_job_and_the_alerts() -> None:
    jobs = {"webhooks-delivery": JobHealth(
        values={"created": 12.5, "amplification": 1.25, "success": 0.98, "p50": 0.21, "p99": 0.48,
                "oldest_new": 0.3, "oldest_parked": 42.0, "oldest_retry": 65.0, "breakers_open": 1.0},
        attempts={"2xx": 12.0, "5xx": 1.5, "4xx": 0.0}, pending={"new": 3.0, "retry": 17.0},
        failing=[("ep_b", 3.0, 2.0), ("ep_a", 9.0, 40.0)])}
    text = render(jobs, ["FirstAttemptObjectiveMissed (webhooks-delivery)"])
    assert "job webhooks-delivery" in text
    assert "attempts 13.5/s (2xx 12.0  5xx 1.5)" in text  # classes with no traffic are left out
    assert "success 98.0 %" in text and "p99 0.480 s" in text and "breakers open 1" in text
    assert "new 3   retry 17" in text and "fan-out lag p99      -" in text  # a missing series shows "-"
    assert text.endswith("alerts firing: FirstAttemptObjectiveMissed (webhooks-delivery)")
    assert "top failing          ep_a (9 failures in a row, 40 pending); ep_b (3" in text  # worst first
    assert render({}, []).startswith("no delivery job has reported metrics yet")
    assert "no per-endpoint series" in render({"j": JobHealth()}, [])
